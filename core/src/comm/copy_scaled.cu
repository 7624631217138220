// copy_scaled.cu — one kernel launch copies (and scales) many tensors: the device executor packs
// a fused batch into its fusion buffer and unpacks it with one launch per 1024 tensors, where a
// copy per tensor would cost a launch (a few microseconds) each.
//
// The spans travel in the launch's parameters (24 KiB; CUDA 12.1 raised their limit from 4 KiB
// to 32 KiB on Volta and later), so nothing is copied to the device before the kernel runs.
// blockIdx.y picks the span; the x blocks stride over it, 16 bytes at a time where both ends
// are 16-byte aligned.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "comm/copy_scaled.hpp"

#if CUDART_VERSION < 12010
#error "hvd's copy-and-scale kernel takes 24 KiB of parameters: CUDA 12.1 or later"
#endif

namespace hvd::core {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorsPerThread = 4;  // 16-byte vectors a thread copies in one pass

struct Spans {
  CopySpan span[DeviceMemory::kSpansPerLaunch];
};
static_assert(sizeof(Spans) <= 32764 - 64, "a launch's parameters hold 32764 bytes");

// The host's arithmetic (scheduler.cpp's scale): float for fp16, bf16 and fp32, double for fp64.
// Factor 1 is a plain copy of any dtype (T = unsigned char).
__device__ inline unsigned char scaled(unsigned char x, float) { return x; }
__device__ inline __half scaled(__half x, float f) { return __float2half_rn(__half2float(x) * f); }
__device__ inline __nv_bfloat16 scaled(__nv_bfloat16 x, float f) {
  return __float2bfloat16_rn(__bfloat162float(x) * f);
}
__device__ inline float scaled(float x, float f) { return x * f; }
__device__ inline double scaled(double x, double f) { return x * f; }

template <typename T, typename Factor>
__device__ inline void scale_vector(uint4& v, Factor factor) {
  if constexpr (sizeof(T) > 1) {
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (size_t k = 0; k < 16 / sizeof(T); ++k) e[k] = scaled(e[k], factor);
  }
}

template <typename T, typename Factor>
__global__ void copy_scaled(Spans spans, Factor factor) {
  const CopySpan s = spans.span[blockIdx.y];
  if (s.dst == s.src && Factor(1) == factor) return;
  const T* in = static_cast<const T*>(s.src);
  T* out = static_cast<T*>(s.dst);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(in)) & 15) == 0) {
    constexpr size_t kPerVector = 16 / sizeof(T);
    const size_t vectors = s.count / kPerVector;
    const uint4* in_vectors = reinterpret_cast<const uint4*>(in);
    uint4* out_vectors = reinterpret_cast<uint4*>(out);
    // A thread's loads are all in flight before its first store. The grid gives each thread at
    // most kVectorsPerThread vectors of the longest span, so most spans take one pass.
    size_t i = first;
    for (; i + (kVectorsPerThread - 1) * stride < vectors; i += kVectorsPerThread * stride) {
      uint4 v[kVectorsPerThread];
#pragma unroll
      for (int u = 0; u < kVectorsPerThread; ++u) v[u] = in_vectors[i + u * stride];
#pragma unroll
      for (int u = 0; u < kVectorsPerThread; ++u) {
        scale_vector<T>(v[u], factor);
        out_vectors[i + u * stride] = v[u];
      }
    }
    for (; i < vectors; i += stride) {
      uint4 v = in_vectors[i];
      scale_vector<T>(v, factor);
      out_vectors[i] = v;
    }
    done = vectors * kPerVector;
  }
  for (size_t i = done + first; i < s.count; i += stride) out[i] = scaled(in[i], factor);
}

}  // namespace

int copy_scaled_kernels_status() {
  cudaFuncAttributes attributes{};
  cudaError_t rc = cudaFuncGetAttributes(&attributes, copy_scaled<unsigned char, float>);
  if (rc == cudaSuccess) rc = cudaFuncGetAttributes(&attributes, copy_scaled<__half, float>);
  if (rc != cudaSuccess) (void)cudaGetLastError();
  return rc;
}

int launch_copy_scaled(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                       void* stream) {
  if (count == 0) return cudaSuccess;
  if (count > DeviceMemory::kSpansPerLaunch) return cudaErrorInvalidValue;
  const size_t element = hvd_dtype_size(dtype);
  // A copy moves bytes: its counts become byte counts.
  const size_t unit = factor == 1 ? 1 : element;
  Spans batch{};
  uint64_t longest = 0;
  for (size_t i = 0; i < count; ++i) {
    batch.span[i] = spans[i];
    batch.span[i].count = spans[i].count * (element / unit);
    longest = std::max(longest, spans[i].count * element);
  }
  // Enough blocks for the longest span in one pass, at most 1024: the rest stride.
  const uint64_t vectors = (longest + 15) / 16;
  constexpr uint64_t kPerBlock = uint64_t{kVectorsPerThread} * kThreads;
  const unsigned blocks_x = static_cast<unsigned>(
      std::min<uint64_t>(1024, std::max<uint64_t>(1, (vectors + kPerBlock - 1) / kPerBlock)));
  const dim3 grid(blocks_x, static_cast<unsigned>(count));
  const auto on = static_cast<cudaStream_t>(stream);
  const float f = static_cast<float>(factor);
  if (factor == 1) {
    copy_scaled<unsigned char><<<grid, kThreads, 0, on>>>(batch, f);
  } else {
    switch (dtype) {
      case HVD_FLOAT16:
        copy_scaled<__half><<<grid, kThreads, 0, on>>>(batch, f);
        break;
      case HVD_BFLOAT16:
        copy_scaled<__nv_bfloat16><<<grid, kThreads, 0, on>>>(batch, f);
        break;
      case HVD_FLOAT32:
        copy_scaled<float><<<grid, kThreads, 0, on>>>(batch, f);
        break;
      case HVD_FLOAT64:
        copy_scaled<double><<<grid, kThreads, 0, on>>>(batch, factor);
        break;
      default:
        return cudaErrorInvalidValue;  // the scheduler scales floating dtypes only
    }
  }
  return cudaGetLastError();
}

}  // namespace hvd::core
