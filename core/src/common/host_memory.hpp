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

// A transparent huge page on x86-64 and on arm64 with 4 KiB base pages (with 64 KiB base pages
// it is 512 MiB, and the advice below rarely finds a whole one to use).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// What allocate_host(bytes) reserves: `bytes` rounded up to whole huge pages from
// kHugePageBytes up (0 where that overflows), `bytes` below.
size_t host_allocation_bytes(size_t bytes);

// At least `bytes` of ordinary memory, freed with free_host(p, bytes); null when there is none.
// From kHugePageBytes up: a mapping of its own on a 2 MiB boundary, with the kernel advised to
// back it with transparent huge pages (the advice ends with the mapping); below, malloc.
void* allocate_host(size_t bytes);
void free_host(void* p, size_t bytes);

// The kernel's transparent huge page mode: "always", "madvise" or "never" ("unknown" where the
// kernel does not say).
std::string transparent_huge_pages();

}  // namespace hvd::core

#endif  // HVD_CORE_COMMON_HOST_MEMORY_HPP
