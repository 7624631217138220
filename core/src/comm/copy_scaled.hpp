// copy_scaled.hpp — the batched copy-and-scale kernel's launch (copy_scaled.cu), for the CUDA
// runtime's DeviceMemory::copy_scaled. Plain C++: its callers need no CUDA compiler.
#ifndef HVD_CORE_COMM_COPY_SCALED_HPP
#define HVD_CORE_COMM_COPY_SCALED_HPP

#include <cstddef>

#include "comm/device_memory.hpp"

namespace hvd::core {

// Queues one launch on `stream` (a cudaStream_t of the current device) for up to
// DeviceMemory::kSpansPerLaunch spans; returns the cudaError_t of the launch.
int launch_copy_scaled(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                       void* stream);
// Whether the current device has code for the kernels (cudaFuncGetAttributes): a cudaError_t.
int copy_scaled_kernels_status();

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_COPY_SCALED_HPP
