#include "common/host_memory.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>

namespace hvd::core {

size_t host_allocation_bytes(size_t bytes) {
  if (bytes < kHugePageBytes) return bytes;
  if (bytes > SIZE_MAX - (kHugePageBytes - 1)) return 0;
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

void* allocate_host(size_t bytes) {
  if (bytes < kHugePageBytes) return std::malloc(bytes);
  const size_t size = host_allocation_bytes(bytes);
  if (size == 0 || size > SIZE_MAX - kHugePageBytes) return nullptr;
  // A mapping of its own, so that the advice covers this buffer alone and goes with it: over-map
  // by one huge page, keep the 2 MiB-aligned part, give back the rest.
  void* mapped = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(mapped, aligned - start);
  const uintptr_t tail = start + kHugePageBytes - aligned;  // what is left past the buffer
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  void* p = reinterpret_cast<void*>(aligned);
  // Where the kernel has no THP the advice fails, and the pages are 4 KiB ones.
  (void)madvise(p, size, MADV_HUGEPAGE);
  return p;
}

void free_host(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(p);
  } else {
    munmap(p, host_allocation_bytes(bytes));
  }
}

std::string transparent_huge_pages() {
  // The file reads "always [madvise] never": the bracketed word is the mode.
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "unknown";
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "unknown";
  return line.substr(open + 1, close - open - 1);
}

}  // namespace hvd::core
