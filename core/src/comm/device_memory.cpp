#include "comm/device_memory.hpp"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "common/host_memory.hpp"

#ifdef HVD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "hvd/sdk/cuda_device.hpp"
#ifdef HVD_WITH_CUDA_KERNELS
#include "comm/copy_scaled.hpp"
#endif
#endif

namespace hvd::core {
namespace {

#ifdef HVD_WITH_CUDA

// `clear`: an error raised by an earlier asynchronous call would be reported again by the next
// one, so it is cleared; except where the call may report the application's own earlier error
// (an event's query or record), which is then the application's to see too.
Status check(cudaError_t rc, const char* what, int32_t device, bool clear = true) {
  if (rc == cudaSuccess) return Status::success();
  if (clear) (void)cudaGetLastError();
  return error(HVD_ERR_SYSTEM, std::string(what) + " on CUDA device " + std::to_string(device) +
                                   ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) +
                                   ")");
}

// The calling thread works on `device` for a scope (hvd::sdk::OnCudaDevice), as a Status.
class OnDevice {
 public:
  explicit OnDevice(int32_t device)
      : on_(device), status_(check(on_.result(), "cudaSetDevice", device)) {}
  const Status& status() const { return status_; }

 private:
  sdk::OnCudaDevice on_;
  Status status_;
};

class CudaRuntime final : public DeviceMemory {
 public:
  Status copy(void* dst, const void* src, size_t bytes, int32_t device, void* stream) override {
    if (bytes == 0) return Status::success();
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    // cudaMemcpyDefault: the runtime tells host from device pointers (unified addressing).
    return check(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync", device);
  }
  void* allocate_pinned(size_t bytes, int32_t device) override {
    // On the device staged for: on a thread without one, the runtime would start GPU 0's.
    const OnDevice on(device);
    if (!on.status().ok()) return nullptr;
    void* pointer = nullptr;
    // Portable: pinned for every device of the process (a rank may drive several).
    if (cudaHostAlloc(&pointer, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return pointer;
  }
  void free_pinned(void* pointer) override { (void)cudaFreeHost(pointer); }
  Status synchronize(int32_t device, void* stream,
                     std::chrono::steady_clock::time_point deadline) override {
    // An event polled against the deadline: cudaStreamSynchronize cannot be given one.
    HVD_ASSIGN_OR_RETURN(void* event, create_event(device));
    const DeviceEvent after(*this, event, device);
    HVD_RETURN_IF_ERROR(record(event, device, stream));
    auto pause = std::chrono::microseconds(10);
    for (;;) {
      HVD_ASSIGN_OR_RETURN(const bool ran, after.query());
      if (ran) return Status::success();
      if (std::chrono::steady_clock::now() >= deadline) {
        return error(HVD_ERR_TIMEOUT, "the work queued on a stream of CUDA device " +
                                          std::to_string(device) +
                                          " did not complete within HVD_TIMEOUT");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  Result<void*> create_stream(int32_t device) override {
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    cudaStream_t stream = nullptr;
    // Non-blocking: hvd's work does not wait for the legacy default stream's, nor it for hvd's.
    HVD_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags", device));
    return static_cast<void*>(stream);
  }
  void destroy_stream(void* stream, int32_t device) override {
    const OnDevice on(device);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  Result<void*> create_event(int32_t device) override {
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    cudaEvent_t event = nullptr;
    HVD_RETURN_IF_ERROR(check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                              "cudaEventCreateWithFlags", device));
    return static_cast<void*>(event);
  }
  void destroy_event(void* event, int32_t device) override {
    const OnDevice on(device);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  Status record(void* event, int32_t device, void* stream) override {
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    return check(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord", device, /*clear=*/false);
  }
  Result<bool> query(void* event, int32_t device) override {
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (rc == cudaErrorNotReady) return false;
    HVD_RETURN_IF_ERROR(check(rc, "cudaEventQuery", device, /*clear=*/false));
    return true;
  }
  Status wait_event(int32_t device, void* stream, void* event) override {
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    return check(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent", device);
  }
  void* allocate_device(size_t bytes, int32_t device, void* stream) override {
    const OnDevice on(device);
    if (!on.status().ok()) return nullptr;
    void* pointer = nullptr;
    if (cudaMallocAsync(&pointer, bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return pointer;
  }
  void free_device(void* pointer, int32_t device, void* stream) override {
    const OnDevice on(device);
    (void)cudaFreeAsync(pointer, static_cast<cudaStream_t>(stream));
  }
  Status kernels(int32_t device) override {
#ifndef HVD_WITH_CUDA_KERNELS
    (void)device;
    return error(HVD_ERR_UNSUPPORTED, "this hvd was built without a CUDA compiler: no kernels");
#else
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    return check(
        static_cast<cudaError_t>(copy_scaled_kernels_status()),
        "hvd's copy-and-scale kernel (built for sm_75, sm_80, sm_90 and PTX; a CUDA 12.1 driver)",
        device);
#endif
  }
  Result<int32_t> current_device() override {
    int device = -1;
    HVD_RETURN_IF_ERROR(check(cudaGetDevice(&device), "cudaGetDevice", -1));
    return static_cast<int32_t>(device);
  }
  Status copy_scaled(const CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                     int32_t device, void* stream) override {
#ifndef HVD_WITH_CUDA_KERNELS
    (void)spans, (void)count, (void)dtype, (void)factor, (void)device, (void)stream;
    return error(HVD_ERR_UNSUPPORTED,
                 "the copy-and-scale kernel: this hvd was built without a CUDA compiler");
#else
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    for (size_t first = 0; first < count; first += kSpansPerLaunch) {
      const size_t n = std::min(kSpansPerLaunch, count - first);
      HVD_RETURN_IF_ERROR(check(
          static_cast<cudaError_t>(launch_copy_scaled(spans + first, n, dtype, factor, stream)),
          "the copy-and-scale kernel's launch", device));
    }
    return Status::success();
#endif
  }
};

#else

class CudaRuntime final : public DeviceMemory {
 public:
  Status copy(void*, const void*, size_t, int32_t, void*) override { return unavailable(); }
  Status synchronize(int32_t, void*, std::chrono::steady_clock::time_point) override {
    return unavailable();
  }
  void* allocate_pinned(size_t, int32_t) override { return nullptr; }
  void free_pinned(void*) override {}
  Result<void*> create_stream(int32_t) override { return unavailable(); }
  void destroy_stream(void*, int32_t) override {}
  Result<void*> create_event(int32_t) override { return unavailable(); }
  void destroy_event(void*, int32_t) override {}
  Status record(void*, int32_t, void*) override { return unavailable(); }
  Result<bool> query(void*, int32_t) override { return unavailable(); }
  Status wait_event(int32_t, void*, void*) override { return unavailable(); }
  void* allocate_device(size_t, int32_t, void*) override { return nullptr; }
  void free_device(void*, int32_t, void*) override {}
  Status kernels(int32_t) override { return unavailable(); }
  Result<int32_t> current_device() override { return unavailable(); }
  Status copy_scaled(const CopySpan*, size_t, hvd_dtype, double, int32_t, void*) override {
    return unavailable();
  }

 private:
  static Status unavailable() {
    return error(HVD_ERR_UNSUPPORTED, "CUDA memory: this hvd was built without the CUDA toolkit");
  }
};

#endif

}  // namespace

DeviceMemory& cuda_memory() {
  // Never destroyed: a communicator finalized from a static destructor still frees through it.
  static CudaRuntime* runtime = new CudaRuntime;
  return *runtime;
}

StagingBuffer::StagingBuffer(StagingBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      pinned_by_(std::exchange(other.pinned_by_, nullptr)),
      pin_refused_(other.pin_refused_) {}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pinned_by_ = std::exchange(other.pinned_by_, nullptr);
    pin_refused_ = other.pin_refused_;
  }
  return *this;
}

char* StagingBuffer::reserve(size_t bytes, DeviceMemory* pin_with, int32_t device) {
  // Once pinned, it stays pinned through its growths (host batches share it).
  if (pin_with == nullptr) pin_with = pinned_by_;
  const bool pin = pin_with != nullptr && !pin_refused_;
  if (data_ != nullptr && bytes <= size_ && (pinned() || !pin)) return data_;
  const size_t want = std::max({bytes, size_, size_t{1}});
  release();
  if (pin) {
    data_ = static_cast<char*>(pin_with->allocate_pinned(want, device));
    pinned_by_ = data_ != nullptr ? pin_with : nullptr;
    pin_refused_ = data_ == nullptr;
  }
  size_t have = want;
  if (data_ == nullptr) {
    data_ = static_cast<char*>(allocate_host(want));
    have = host_allocation_bytes(want);  // whole huge pages: a growth within them is free
  }
  size_ = data_ != nullptr ? have : 0;
  return data_;
}

Result<char*> DeviceBuffer::reserve(size_t bytes, DeviceMemory& runtime, int32_t device) {
  if (runtime_ != &runtime || device_ != device) {
    release();
    HVD_ASSIGN_OR_RETURN(stream_, runtime.create_stream(device));
    runtime_ = &runtime;
    device_ = device;
  }
  if (data_ != nullptr && bytes <= size_) return data_;
  const size_t want = std::max({bytes, size_, size_t{1}});
  if (data_ != nullptr) runtime_->free_device(data_, device_, stream_);  // after its last use
  data_ = static_cast<char*>(runtime_->allocate_device(want, device_, stream_));
  size_ = data_ != nullptr ? want : 0;
  if (data_ == nullptr) {
    return error(HVD_ERR_SYSTEM, "no device memory for " + std::to_string(want) +
                                     " bytes on CUDA device " + std::to_string(device_));
  }
  return data_;
}

void DeviceBuffer::release() {
  if (runtime_ == nullptr) return;
  if (data_ != nullptr) runtime_->free_device(data_, device_, stream_);
  runtime_->destroy_stream(stream_, device_);  // its work, the free included, still completes
  data_ = nullptr;
  size_ = 0;
  runtime_ = nullptr;
  stream_ = nullptr;
  device_ = -1;
}

void StagingBuffer::release() {
  if (data_ == nullptr) return;
  if (pinned_by_ != nullptr) {
    pinned_by_->free_pinned(data_);
  } else {
    free_host(data_, size_);
  }
  data_ = nullptr;
  size_ = 0;
  pinned_by_ = nullptr;
}

}  // namespace hvd::core
