// device_memory.hpp — the one place that talks to the CUDA runtime, behind an interface so that
// everything built on it is unit-tested on machines without a GPU (tests/unit/fake_gpu.hpp).
//
// Two users: staging, and the device executor.
// - A backend that takes host memory only (Gloo, MPI) still runs collectives on CUDA tensors:
//   hvd stages them through a host buffer (the communicator for one call, the scheduler's fusion
//   buffer for fused allreduces), a StagingBuffer.
// - A backend that takes CUDA memory (NCCL) gets the scheduler's CUDA tensors through the device
//   executor (scheduler/device_executor.hpp): streams, events, device memory and one batched
//   copy-and-scale kernel.
#ifndef HVD_CORE_COMM_DEVICE_MEMORY_HPP
#define HVD_CORE_COMM_DEVICE_MEMORY_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "hvd/sdk/result.hpp"
#include "hvd/types.h"

namespace hvd::core {

// One tensor of a batched copy: `count` elements from src to dst.
struct CopySpan {
  void* dst;
  const void* src;
  uint64_t count;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Queues a copy of `bytes` between host memory and `device`'s (either way) on `stream`, a
  // cudaStream_t of that device (null: its default stream), after the work already queued there.
  virtual Status copy(void* dst, const void* src, size_t bytes, int32_t device, void* stream) = 0;
  // Returns once the work queued on `stream` has completed, or HVD_ERR_TIMEOUT at `deadline` (a
  // collective whose peer died never completes; the caller then aborts its communicator).
  virtual Status synchronize(int32_t device, void* stream,
                             std::chrono::steady_clock::time_point deadline) = 0;
  // Page-locked host memory of `bytes` (cudaHostAlloc), or null where the runtime gives none
  // (no driver, no GPU, no memory): copies from and to it run at the link's speed, where
  // pageable memory goes through the driver's own bounce buffer. Released with free_pinned.
  // `device`: where the staged copies go (the allocation is made there, portable to all).
  virtual void* allocate_pinned(size_t bytes, int32_t device) = 0;
  virtual void free_pinned(void* pointer) = 0;
  // copy(), then synchronize(): on success the copy has completed.
  Status copy_and_wait(void* dst, const void* src, size_t bytes, int32_t device, void* stream,
                       std::chrono::steady_clock::time_point deadline) {
    HVD_RETURN_IF_ERROR(copy(dst, src, bytes, device, stream));
    return synchronize(device, stream, deadline);
  }

  // ---- Work ordered on streams (the device executor's). Events and streams are opaque handles
  // (cudaEvent_t, cudaStream_t) of the device they were created on.
  virtual Result<void*> create_stream(int32_t device) = 0;
  virtual void destroy_stream(void* stream, int32_t device) = 0;
  virtual Result<void*> create_event(int32_t device) = 0;
  virtual void destroy_event(void* event, int32_t device) = 0;
  // The event captures the work queued on `stream` so far: it completes once that has run.
  virtual Status record(void* event, int32_t device, void* stream) = 0;
  // Whether the work `event` captured has run; an error is what went wrong on the device.
  virtual Result<bool> query(void* event, int32_t device) = 0;
  // Work queued on `stream` from now on runs after what `event` captured; the host goes on.
  virtual Status wait_event(int32_t device, void* stream, void* event) = 0;
  // Memory of `device`, or null where none is had, ordered on `stream` (cudaMallocAsync): work
  // queued there from now on may use it. free_device frees it after the work queued on `stream`
  // (cudaFreeAsync), without waiting: neither synchronizes the device, as cudaFree would.
  virtual void* allocate_device(size_t bytes, int32_t device, void* stream) = 0;
  virtual void free_device(void* pointer, int32_t device, void* stream) = 0;
  // Whether hvd's kernels (copy_scaled) have code for `device`: the build's architectures, or a
  // build without a CUDA compiler.
  virtual Status kernels(int32_t device) = 0;
  // The device current on the calling thread (cudaGetDevice): the one a backend that binds a
  // device at creation (NCCL) binds.
  virtual Result<int32_t> current_device() = 0;
  // Queued on `stream` as one kernel launch per kSpansPerLaunch spans: for each span, dst =
  // src x factor. factor 1 copies (any dtype); other factors need a floating dtype, scaled as the
  // host scales (fp16 and bf16 through float). A span's dst may be its src; spans do not overlap
  // one another otherwise.
  virtual Status copy_scaled(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                             int32_t device, void* stream) = 0;
  static constexpr size_t kSpansPerLaunch = 1024;  // what one launch's parameters hold (28 KiB)
};

// An event with what made it: destroyed with its last holder (a fused batch's requests share
// the event that completes them).
class DeviceEvent {
 public:
  DeviceEvent(DeviceMemory& runtime, void* event, int32_t device)
      : runtime_(runtime), event_(event), device_(device) {}
  ~DeviceEvent() { runtime_.destroy_event(event_, device_); }
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  Result<bool> query() const { return runtime_.query(event_, device_); }
  // Work queued on `stream` (of this event's device) from now on runs after this event's.
  Status order(void* stream) const { return runtime_.wait_event(device_, stream, event_); }

 private:
  DeviceMemory& runtime_;
  void* event_;
  int32_t device_;
};

// Device memory that grows and never shrinks, with the stream of its own that its copies and
// uses are ordered on (allocations and frees too: a growth waits for nothing). Its contents do
// not survive a growth. Not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` on `device` through `runtime`; its stream made on first use. An error where
  // neither was had.
  Result<char*> reserve(size_t bytes, DeviceMemory& runtime, int32_t device);
  void* stream() const { return stream_; }

 private:
  void release();

  char* data_ = nullptr;
  size_t size_ = 0;
  DeviceMemory* runtime_ = nullptr;
  int32_t device_ = -1;
  void* stream_ = nullptr;
};

// The CUDA runtime's. In a build without the CUDA toolkit every call fails, saying so.
DeviceMemory& cuda_memory();

// A host buffer that grows and never shrinks: page-locked (through a DeviceMemory) once it has
// served staging, ordinary memory until then (huge pages advised: common/host_memory.hpp, for the
// peers' single-copy reads of the fused allreduce), so that a job of host tensors never touches
// the CUDA runtime. Its contents do not survive a growth. Move-only.
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
