// copy_scaled.cu — one kernel launch copies (and scales) many tensors: the device executor packs
// a fused batch into its fusion buffer and unpacks it with one launch per 1024 tensors, where a
// copy per tensor would cost a launch (a few microseconds) each.
//
// The spans travel in the launch's parameters, so nothing is copied to the device before the
// kernel runs: up to 128 spans in 3.6 KiB, more in 28 KiB (CUDA 12.1 raised the limit from 4 KiB
// to 32 KiB on Volta and later). A launch whose parameters pass 4 KiB takes longer from the call
// to completion (hvd-gpu-bench's empty launches), so a batch of up to 128 spans takes the small
// one.
// Each span has a run of blocks of its own (copy_blocks.hpp), which stride over it, 16 bytes at a
// time where both ends are 16-byte aligned; a block finds its run with one warp's two ballots.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "comm/copy_blocks.hpp"
#include "comm/copy_scaled.hpp"

#if CUDART_VERSION < 12010
#error "hvd's copy-and-scale kernel takes 28 KiB of parameters: CUDA 12.1 or later"
#endif

namespace hvd::core {
namespace {

using copy_blocks::kThreads;
using copy_blocks::kVectorsPerThread;

// The parameters of a launch for up to kCapacity spans.
template <uint32_t kCapacity>
struct Spans {
  CopySpan span[kCapacity];
  uint32_t first_block[kCapacity];  // of each span's run (copy_blocks.hpp)
  uint32_t group_first_block[copy_blocks::groups_of(kCapacity)];
  uint32_t count;
};
constexpr uint32_t kFewSpans = 128;
static_assert(sizeof(Spans<kFewSpans>) + 8 <= 4096, "the small launch's parameters: 4 KiB");
static_assert(sizeof(Spans<DeviceMemory::kSpansPerLaunch>) + 8 <= 32764,
              "a launch's parameters hold 32764 bytes");
static_assert(DeviceMemory::kSpansPerLaunch <= copy_blocks::kMaxSpans);
static_assert(kThreads % copy_blocks::kLanes == 0, "the search's ballots take a whole warp");

using copy_blocks::Run;

// copy_blocks::run_of with a warp: each step reads an entry per lane and counts with a ballot
// the lanes at or before the block; the run's end is the next lane's entry, or the next group's
// first. The block's other warps wait for it.
template <uint32_t kCapacity>
__device__ Run run_of_block(const Spans<kCapacity>& spans) {
  __shared__ Run found;
  if (threadIdx.x < copy_blocks::kLanes) {
    constexpr uint32_t kAll = ~0u, kLast = copy_blocks::kLanes - 1;
    const uint32_t lane = threadIdx.x, block = blockIdx.x, none = gridDim.x;
    const uint32_t groups = copy_blocks::groups_of(spans.count);
    const uint32_t group_first = lane < groups ? spans.group_first_block[lane] : none;
    const uint32_t group = __popc(__ballot_sync(kAll, group_first <= block)) - 1;
    const uint32_t next_group_first = __shfl_sync(kAll, group_first, (group + 1) & kLast);
    const uint32_t k = group * copy_blocks::kLanes + lane;
    const uint32_t first = k < spans.count ? spans.first_block[k] : none;
    const uint32_t in_group = __popc(__ballot_sync(kAll, first <= block)) - 1;
    const uint32_t start = __shfl_sync(kAll, first, in_group);
    const uint32_t next = __shfl_sync(kAll, first, (in_group + 1) & kLast);
    if (lane == 0) {
      const uint32_t end = in_group < kLast ? next : group < kLast ? next_group_first : none;
      found = {group * copy_blocks::kLanes + in_group, start, end};
    }
  }
  __syncthreads();
  return found;
}

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

template <typename T, uint32_t kCapacity, typename Factor>
__global__ void copy_scaled(const __grid_constant__ Spans<kCapacity> spans, Factor factor) {
  const Run r = run_of_block(spans);
  const uint32_t run = r.end - r.first;
  const CopySpan s = spans.span[r.span];
  if (s.dst == s.src && Factor(1) == factor) return;
  const T* in = static_cast<const T*>(s.src);
  T* out = static_cast<T*>(s.dst);
  const size_t stride = static_cast<size_t>(run) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x - r.first) * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(in)) & 15) == 0) {
    constexpr size_t kPerVector = 16 / sizeof(T);
    const size_t vectors = s.count / kPerVector;
    const uint4* in_vectors = reinterpret_cast<const uint4*>(in);
    uint4* out_vectors = reinterpret_cast<uint4*>(out);
    // A thread's loads are all in flight before its first store. A span's run gives each thread
    // at most kVectorsPerThread vectors, so spans up to 16 MiB take one pass.
    size_t i = first;
    for (; i + (kVectorsPerThread - 1) * stride < vectors; i += kVectorsPerThread * stride) {
      uint4 v[kVectorsPerThread];
#pragma unroll
      for (uint32_t u = 0; u < kVectorsPerThread; ++u) v[u] = in_vectors[i + u * stride];
#pragma unroll
      for (uint32_t u = 0; u < kVectorsPerThread; ++u) {
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

// One launch for `count` (1 .. kCapacity) spans.
template <uint32_t kCapacity>
int launch(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
           cudaStream_t stream) {
  if (count > kCapacity) return cudaErrorInvalidValue;
  const size_t element = hvd_dtype_size(dtype);
  // A copy moves bytes: its counts become byte counts.
  const size_t unit = factor == 1 ? 1 : element;
  Spans<kCapacity> batch;  // entries past `count` are never read
  batch.count = static_cast<uint32_t>(count);
  uint32_t blocks = 0;  // at most 1024 x 1024
  for (size_t i = 0; i < count; ++i) {
    batch.span[i] = spans[i];
    batch.span[i].count = spans[i].count * (element / unit);
    batch.first_block[i] = blocks;
    if (i % copy_blocks::kLanes == 0) batch.group_first_block[i / copy_blocks::kLanes] = blocks;
    blocks += copy_blocks::blocks_for(spans[i].count * element);
  }
  const dim3 grid(blocks);
  const float f = static_cast<float>(factor);
  if (factor == 1) {
    copy_scaled<unsigned char><<<grid, kThreads, 0, stream>>>(batch, f);
  } else {
    switch (dtype) {
      case HVD_FLOAT16:
        copy_scaled<__half><<<grid, kThreads, 0, stream>>>(batch, f);
        break;
      case HVD_BFLOAT16:
        copy_scaled<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(batch, f);
        break;
      case HVD_FLOAT32:
        copy_scaled<float><<<grid, kThreads, 0, stream>>>(batch, f);
        break;
      case HVD_FLOAT64:
        copy_scaled<double><<<grid, kThreads, 0, stream>>>(batch, factor);
        break;
      default:
        return cudaErrorInvalidValue;  // the scheduler scales floating dtypes only
    }
  }
  return cudaGetLastError();
}

}  // namespace

int copy_scaled_kernels_status() {
  // Launches with more than 4 KiB of parameters need a CUDA 12.1 driver, which a 12.x runtime
  // on an older driver (minor-version compatibility) lacks.
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver < 12010) {
    return cudaErrorInsufficientDriver;
  }
  cudaFuncAttributes attributes{};
  cudaError_t rc = cudaFuncGetAttributes(&attributes, copy_scaled<unsigned char, kFewSpans, float>);
  if (rc == cudaSuccess) {
    rc = cudaFuncGetAttributes(&attributes,
                               copy_scaled<__half, DeviceMemory::kSpansPerLaunch, float>);
  }
  if (rc != cudaSuccess) (void)cudaGetLastError();
  return rc;
}

int launch_copy_scaled(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                       void* stream) {
  if (count == 0) return cudaSuccess;
  if (count > DeviceMemory::kSpansPerLaunch) return cudaErrorInvalidValue;
  const auto on = static_cast<cudaStream_t>(stream);
  return count <= kFewSpans
             ? launch<kFewSpans>(spans, count, dtype, factor, on)
             : launch<DeviceMemory::kSpansPerLaunch>(spans, count, dtype, factor, on);
}

}  // namespace hvd::core
