// Message buffers in host or CUDA memory, and the data hvd-bench checks results against.
#ifndef HVD_BENCH_BUFFER_HPP
#define HVD_BENCH_BUFFER_HPP

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hvd/hvd.h"
#include "hvd/sdk/result.hpp"

namespace hvd::bench {

// A move-only block of host memory (64-byte aligned; with `huge_pages`, a mapping of whole 2 MiB
// pages, transparent huge pages advised) or CUDA device memory.
class Buffer {
 public:
  static Result<Buffer> allocate(hvd_memory_type memory, int device, size_t bytes,
                                 bool huge_pages = false);
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  char* data() const { return data_; }
  size_t size() const { return bytes_; }
  // Copies between this buffer (at `offset`) and host memory.
  Status upload(const void* host, size_t bytes, size_t offset = 0);
  Status download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  void release();
  hvd_memory_type memory_ = HVD_MEMORY_HOST;
  char* data_ = nullptr;
  size_t bytes_ = 0;
  size_t huge_bytes_ = 0;  // with huge pages: what allocate_host was given
};

// Waits (within HVD_TIMEOUT) for the work queued on the default stream (CUDA), or returns at
// once (host).
Status synchronize(hvd_memory_type memory);

// The CUDA device this rank uses (its local rank, modulo the devices), or why there is none.
Result<int> cuda_device_for(int local_rank);

// Integer-valued element data: exact under every reduction order, for every dtype.
// The value of element i on `rank` as a send buffer of `collective`'s checks (see patterns.cpp).
void fill_allreduce_input(void* out, uint64_t count, hvd_dtype dtype, hvd_reduce_op op, int rank,
                          int size);
void fill_block(void* out, uint64_t count, hvd_dtype dtype, int seed);
// What a correct allreduce returns: every rank's input reduced with the SDK's reference kernels.
void expected_allreduce(void* out, uint64_t count, hvd_dtype dtype, hvd_reduce_op op, int size);
// Elements of `got` that differ from `expected` (bitwise, element by element).
uint64_t count_wrong(const void* got, const void* expected, uint64_t count, hvd_dtype dtype);

}  // namespace hvd::bench

#endif  // HVD_BENCH_BUFFER_HPP
