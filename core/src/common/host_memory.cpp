#include "common/host_memory.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <fstream>

namespace hvd::core {

void* allocate_host(size_t bytes) {
  if (bytes < kHugePageBytes) return std::malloc(bytes);
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = nullptr;
  if (posix_memalign(&p, kHugePageBytes, rounded) != 0) return nullptr;
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice: without THP, 4 KiB pages as before
  return p;
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
