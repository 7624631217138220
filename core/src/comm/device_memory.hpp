// device_memory.hpp — copies between host memory and CUDA devices' memory.
//
// A backend that takes host memory only (Gloo, MPI) still runs collectives on CUDA tensors: hvd
// stages them through a host buffer (the communicator for one call, the scheduler's fusion
// buffer for fused allreduces). This is the one place that talks to the CUDA runtime for it, and
// an interface so that the staging is unit-tested on machines without a GPU.
#ifndef HVD_CORE_COMM_DEVICE_MEMORY_HPP
#define HVD_CORE_COMM_DEVICE_MEMORY_HPP

#include <cstddef>
#include <cstdint>

#include "hvd/sdk/result.hpp"

namespace hvd::core {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Queues a copy of `bytes` between host memory and `device`'s (either way) on `stream`, a
  // cudaStream_t of that device (null: its default stream), after the work already queued there.
  virtual Status copy(void* dst, const void* src, size_t bytes, int32_t device, void* stream) = 0;
  // Returns once the work queued on `stream` has completed.
  virtual Status synchronize(int32_t device, void* stream) = 0;
  // copy(), then synchronize(): on success the copy has completed.
  Status copy_and_wait(void* dst, const void* src, size_t bytes, int32_t device, void* stream) {
    HVD_RETURN_IF_ERROR(copy(dst, src, bytes, device, stream));
    return synchronize(device, stream);
  }
};

// The CUDA runtime's. In a build without the CUDA toolkit every call fails, saying so.
DeviceMemory& cuda_memory();

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_DEVICE_MEMORY_HPP
