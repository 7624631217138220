#include "buffer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "bootstrap/env.hpp"
#include "bootstrap/settings.hpp"
#include "common/host_memory.hpp"
#include "hvd/reduce.h"

#ifdef HVD_BENCH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hvd::bench {
namespace {

#ifdef HVD_BENCH_WITH_CUDA
Status cuda_check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return Status::success();
  return error(HVD_ERR_SYSTEM, std::string(what) + ": " + cudaGetErrorString(rc));
}
#else
Status no_cuda() {
  return error(HVD_ERR_UNSUPPORTED, "hvd-bench was built without the CUDA toolkit");
}
#endif

// Element i of a typed buffer set to the small integer k.
void store(void* out, uint64_t i, int k, hvd_dtype dtype) {
  switch (dtype) {
    case HVD_UINT8:
      static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(k);
      break;
    case HVD_INT8:
      static_cast<int8_t*>(out)[i] = static_cast<int8_t>(k);
      break;
    case HVD_INT32:
      static_cast<int32_t*>(out)[i] = k;
      break;
    case HVD_INT64:
      static_cast<int64_t*>(out)[i] = k;
      break;
    case HVD_FLOAT16:
      static_cast<uint16_t*>(out)[i] = hvd_float_to_float16(static_cast<float>(k));
      break;
    case HVD_BFLOAT16:
      static_cast<uint16_t*>(out)[i] = hvd_float_to_bfloat16(static_cast<float>(k));
      break;
    case HVD_FLOAT32:
      static_cast<float*>(out)[i] = static_cast<float>(k);
      break;
    case HVD_FLOAT64:
      static_cast<double*>(out)[i] = k;
      break;
    default:
      break;
  }
}

}  // namespace

Result<Buffer> Buffer::allocate(hvd_memory_type memory, int device, size_t bytes, bool huge_pages) {
  Buffer b;
  b.memory_ = memory;
  b.bytes_ = bytes;
  const size_t rounded = ((bytes + 63) / 64) * 64 + 64;  // never zero, so data() is not null
  if (memory == HVD_MEMORY_HOST) {
    if (huge_pages) {
      b.huge_bytes_ = std::max(rounded, core::kHugePageBytes);  // a mapping of its own, always
      b.data_ = static_cast<char*>(core::allocate_host(b.huge_bytes_));
    } else {
      b.data_ = static_cast<char*>(std::aligned_alloc(64, rounded));
    }
    if (b.data_ == nullptr) {
      return error(HVD_ERR_SYSTEM, "cannot allocate " + std::to_string(bytes) + " bytes");
    }
    std::memset(b.data_, 0, rounded);  // touch every page before timing
    return b;
  }
#ifdef HVD_BENCH_WITH_CUDA
  HVD_RETURN_IF_ERROR(cuda_check(cudaSetDevice(device), "cudaSetDevice"));
  void* p = nullptr;
  HVD_RETURN_IF_ERROR(cuda_check(cudaMalloc(&p, rounded), "cudaMalloc"));
  b.data_ = static_cast<char*>(p);
  HVD_RETURN_IF_ERROR(cuda_check(cudaMemset(p, 0, rounded), "cudaMemset"));
  return b;
#else
  (void)device;
  return no_cuda();
#endif
}

Buffer::Buffer(Buffer&& other) noexcept
    : memory_(other.memory_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      huge_bytes_(std::exchange(other.huge_bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    memory_ = other.memory_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    huge_bytes_ = std::exchange(other.huge_bytes_, 0);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (data_ == nullptr) return;
  if (memory_ == HVD_MEMORY_HOST && huge_bytes_ > 0) {
    core::free_host(data_, huge_bytes_);
  } else if (memory_ == HVD_MEMORY_HOST) {
    std::free(data_);
  } else {
#ifdef HVD_BENCH_WITH_CUDA
    cudaFree(data_);
#endif
  }
  data_ = nullptr;
}

Status Buffer::upload(const void* host, size_t bytes, size_t offset) {
  if (bytes == 0) return Status::success();
  if (memory_ == HVD_MEMORY_HOST) {
    std::memcpy(data_ + offset, host, bytes);
    return Status::success();
  }
#ifdef HVD_BENCH_WITH_CUDA
  return cuda_check(cudaMemcpy(data_ + offset, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
#else
  return no_cuda();
#endif
}

Status Buffer::download(void* host, size_t bytes, size_t offset) const {
  if (bytes == 0) return Status::success();
  if (memory_ == HVD_MEMORY_HOST) {
    std::memcpy(host, data_ + offset, bytes);
    return Status::success();
  }
#ifdef HVD_BENCH_WITH_CUDA
  return cuda_check(cudaMemcpy(host, data_ + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
#else
  return no_cuda();
#endif
}

Status synchronize(hvd_memory_type memory) {
  if (memory == HVD_MEMORY_HOST) return Status::success();
#ifdef HVD_BENCH_WITH_CUDA
  // Spun on against HVD_TIMEOUT, as nccl-tests does: cudaDeviceSynchronize takes no deadline,
  // and a peer that died leaves NCCL's kernel running forever. The benchmark's CUDA work is all
  // on the default stream.
  static const Result<core::Settings> settings = core::Settings::read(core::process_env());
  HVD_RETURN_IF_ERROR(settings.status());
  const auto deadline = std::chrono::steady_clock::now() + settings->timeout();
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(nullptr);
    if (rc != cudaErrorNotReady) return cuda_check(rc, "cudaStreamQuery");
    if (std::chrono::steady_clock::now() >= deadline) {
      return error(HVD_ERR_TIMEOUT,
                   "the device's work did not complete within HVD_TIMEOUT (a peer may have died)");
    }
  }
#else
  return no_cuda();
#endif
}

Result<int> cuda_device_for(int local_rank) {
#ifdef HVD_BENCH_WITH_CUDA
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);  // leaves `devices` alone on failure
  if (rc != cudaSuccess) {
    return error(HVD_ERR_UNSUPPORTED, std::string("no CUDA device (cudaGetDeviceCount: ") +
                                          cudaGetErrorString(rc) + ")");
  }
  if (devices == 0) return error(HVD_ERR_UNSUPPORTED, "no CUDA device");
  return local_rank % devices;
#else
  (void)local_rank;
  return no_cuda();
#endif
}

void fill_allreduce_input(void* out, uint64_t count, hvd_dtype dtype, hvd_reduce_op op, int rank,
                          int size) {
  for (uint64_t i = 0; i < count; ++i) {
    int k;
    switch (op) {
      case HVD_PRODUCT:  // one 2 per element across the ranks: the product is exactly 2
        k = static_cast<int>(i % static_cast<uint64_t>(size)) == rank ? 2 : 1;
        break;
      case HVD_MIN:
      case HVD_MAX:
        k = static_cast<int>((i * 7 + static_cast<uint64_t>(rank) * 13) % 50);
        break;
      default:  // sum and average: at most 3 x ranks
        k = static_cast<int>((i + static_cast<uint64_t>(rank)) % 4);
        break;
    }
    store(out, i, k, dtype);
  }
}

void fill_block(void* out, uint64_t count, hvd_dtype dtype, int seed) {
  for (uint64_t i = 0; i < count; ++i) {
    store(out, i, static_cast<int>((i * 3 + static_cast<uint64_t>(seed) * 7) % 101), dtype);
  }
}

void expected_allreduce(void* out, uint64_t count, hvd_dtype dtype, hvd_reduce_op op, int size) {
  fill_allreduce_input(out, count, dtype, op, 0, size);
  std::vector<char> other(count * hvd_dtype_size(dtype));
  for (int r = 1; r < size; ++r) {
    fill_allreduce_input(other.data(), count, dtype, op, r, size);
    hvd_reduce(out, out, other.data(), count, dtype, op);
  }
  if (op == HVD_AVERAGE) hvd_divide(out, count, dtype, size);
}

uint64_t count_wrong(const void* got, const void* expected, uint64_t count, hvd_dtype dtype) {
  const size_t element = hvd_dtype_size(dtype);
  const char* a = static_cast<const char*>(got);
  const char* b = static_cast<const char*>(expected);
  if (std::memcmp(a, b, count * element) == 0) return 0;
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * element, b + i * element, element) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace hvd::bench
