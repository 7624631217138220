// host_memory.hpp — host buffers that other processes on the host copy from.
//
// On one host the backends move a large message with a single copy by cross-memory attach
// (libfabric's shm and Open MPI's shared-memory transport: process_vm_readv), and for each copy
// the kernel pins the sender's pages one page at a time: on 4 KiB pages that work, and the TLB
// misses of the copy, are a large part of a big allreduce; 2 MiB pages all but remove them
// (docs/performance.md, "Huge pages").
#ifndef HVD_CORE_COMMON_HOST_MEMORY_HPP
#define HVD_CORE_COMMON_HOST_MEMORY_HPP

#include <cstddef>
#include <string>

namespace hvd::core {

// The size from which a buffer is worth huge pages: one 2 MiB page.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// At least `bytes` of ordinary memory, freed with std::free; null when there is none. From
// kHugePageBytes up it starts on a 2 MiB boundary and the kernel is advised to back it with
// transparent huge pages (where THP is off, the advice does nothing); below, plain malloc.
void* allocate_host(size_t bytes);

// The kernel's transparent huge page mode: "always", "madvise" or "never" ("unknown" where the
// kernel does not say).
std::string transparent_huge_pages();

}  // namespace hvd::core

#endif  // HVD_CORE_COMMON_HOST_MEMORY_HPP
