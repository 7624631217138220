// copy_scaled.cu — one kernel launch copies (and scales) many tensors: the device executor packs
// a fused batch into its fusion buffer and unpacks it with one launch per 128 tensors, where a
// copy per tensor would cost a launch (a few microseconds of host time) each.
//
// The spans travel in the launch's parameters (3 KiB of the 4 KiB allowed), so nothing is copied
// to the device before the kernel runs. blockIdx.y picks the span; the x blocks stride over it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "comm/copy_scaled.hpp"

namespace hvd::core {
namespace {

constexpr int kThreads = 256;

struct Spans {
  CopySpan span[DeviceMemory::kSpansPerLaunch];
};
static_assert(sizeof(Spans) <= 3200, "a launch's parameters hold 4 KiB");

// Bytes as they are: 16 at a time where both ends are 16-byte aligned, then the tail.
__global__ void copy_bytes(Spans spans, size_t element) {
  const CopySpan s = spans.span[blockIdx.y];
  const size_t bytes = s.count * element;
  if (s.dst == s.src) return;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(s.dst) | reinterpret_cast<uintptr_t>(s.src)) & 15) == 0;
  size_t done = 0;
  if (aligned) {
    const size_t vectors = bytes / 16;
    const uint4* in = static_cast<const uint4*>(s.src);
    uint4* out = static_cast<uint4*>(s.dst);
    for (size_t i = first; i < vectors; i += stride) out[i] = in[i];
    done = vectors * 16;
  }
  const unsigned char* in = static_cast<const unsigned char*>(s.src);
  unsigned char* out = static_cast<unsigned char*>(s.dst);
  for (size_t i = done + first; i < bytes; i += stride) out[i] = in[i];
}

// The host's arithmetic (scheduler.cpp's scale): float for fp16, bf16 and fp32, double for fp64.
__device__ inline float scaled(__half x, float f) { return __half2float(x) * f; }
__device__ inline float scaled(__nv_bfloat16 x, float f) { return __bfloat162float(x) * f; }
__device__ inline void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T, typename Factor>
__global__ void copy_and_scale(Spans spans, Factor factor) {
  const CopySpan s = spans.span[blockIdx.y];
  const T* in = static_cast<const T*>(s.src);
  T* out = static_cast<T*>(s.dst);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s.count;
       i += stride) {
    if constexpr (sizeof(T) == 2) {
      store(out + i, scaled(in[i], factor));
    } else {
      out[i] = in[i] * factor;
    }
  }
}

}  // namespace

int copy_scaled_kernels_status() {
  cudaFuncAttributes attributes{};
  cudaError_t rc = cudaFuncGetAttributes(&attributes, copy_bytes);
  if (rc == cudaSuccess) rc = cudaFuncGetAttributes(&attributes, copy_and_scale<__half, float>);
  if (rc != cudaSuccess) (void)cudaGetLastError();
  return rc;
}

int launch_copy_scaled(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                       void* stream) {
  if (count == 0) return cudaSuccess;
  if (count > DeviceMemory::kSpansPerLaunch) return cudaErrorInvalidValue;
  Spans batch{};
  uint64_t longest = 0;
  for (size_t i = 0; i < count; ++i) {
    batch.span[i] = spans[i];
    longest = std::max(longest, spans[i].count);
  }
  const size_t element = hvd_dtype_size(dtype);
  // Enough blocks for the longest span at 4 units a thread (16-byte units for a copy), at most
  // 1024: the rest stride.
  const uint64_t units = factor == 1 ? longest * element / 16 + 1 : longest;
  const unsigned blocks_x = static_cast<unsigned>(
      std::min<uint64_t>(1024, std::max<uint64_t>(1, (units + 4 * kThreads - 1) / (4 * kThreads))));
  const dim3 grid(blocks_x, static_cast<unsigned>(count));
  const auto on = static_cast<cudaStream_t>(stream);
  if (factor == 1) {
    copy_bytes<<<grid, kThreads, 0, on>>>(batch, element);
  } else {
    const float f = static_cast<float>(factor);
    switch (dtype) {
      case HVD_FLOAT16:
        copy_and_scale<__half><<<grid, kThreads, 0, on>>>(batch, f);
        break;
      case HVD_BFLOAT16:
        copy_and_scale<__nv_bfloat16><<<grid, kThreads, 0, on>>>(batch, f);
        break;
      case HVD_FLOAT32:
        copy_and_scale<float><<<grid, kThreads, 0, on>>>(batch, f);
        break;
      case HVD_FLOAT64:
        copy_and_scale<double><<<grid, kThreads, 0, on>>>(batch, factor);
        break;
      default:
        return cudaErrorInvalidValue;  // the scheduler scales floating dtypes only
    }
  }
  return cudaGetLastError();
}

}  // namespace hvd::core
