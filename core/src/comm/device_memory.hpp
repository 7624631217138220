// device_memory.hpp — copies between host memory and CUDA devices' memory.
//
// A backend that takes host memory only (Gloo, MPI) still runs collectives on CUDA tensors: hvd
// stages them through a host buffer (the communicator for one call, the scheduler's fusion
// buffer for fused allreduces), a StagingBuffer. This is the one place that talks to the CUDA
// runtime for it, and an interface so that the staging is unit-tested on machines without a GPU.
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
  // Page-locked host memory of `bytes` (cudaHostAlloc), or null where the runtime gives none
  // (no driver, no GPU, no memory): copies from and to it run at the link's speed, where
  // pageable memory goes through the driver's own bounce buffer. Released with free_pinned.
  // `device`: where the staged copies go (the allocation is made there, portable to all).
  virtual void* allocate_pinned(size_t bytes, int32_t device) = 0;
  virtual void free_pinned(void* pointer) = 0;
  // copy(), then synchronize(): on success the copy has completed.
  Status copy_and_wait(void* dst, const void* src, size_t bytes, int32_t device, void* stream) {
    HVD_RETURN_IF_ERROR(copy(dst, src, bytes, device, stream));
    return synchronize(device, stream);
  }
};

// The CUDA runtime's. In a build without the CUDA toolkit every call fails, saying so.
DeviceMemory& cuda_memory();

// A host buffer that grows and never shrinks: page-locked (through a DeviceMemory) once it has
// served staging, ordinary memory until then, so that a job of host tensors never touches the
// CUDA runtime. Its contents do not survive a growth. Move-only.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  ~StagingBuffer() { release(); }
  StagingBuffer(StagingBuffer&& other) noexcept;
  StagingBuffer& operator=(StagingBuffer&& other) noexcept;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // At least `bytes`; page-locked through `pin_with` (for copies with `device`) where it is given
  // and the runtime allows (asked once: where it refuses, ordinary memory from then on), and
  // page-locked on every growth once it is. Null when not even ordinary memory was had.
  char* reserve(size_t bytes, DeviceMemory* pin_with = nullptr, int32_t device = 0);
  char* data() const { return data_; }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_by_ != nullptr; }

 private:
  void release();

  char* data_ = nullptr;
  size_t size_ = 0;
  DeviceMemory* pinned_by_ = nullptr;  // what frees data_; null: std::free
  bool pin_refused_ = false;
};

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_DEVICE_MEMORY_HPP
