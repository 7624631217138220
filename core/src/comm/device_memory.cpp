#include "comm/device_memory.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#ifdef HVD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "hvd/sdk/cuda_device.hpp"
#endif

namespace hvd::core {
namespace {

#ifdef HVD_WITH_CUDA

Status check(cudaError_t rc, const char* what, int32_t device) {
  if (rc == cudaSuccess) return Status::success();
  // An error raised by an earlier asynchronous call would be reported again by the next one.
  (void)cudaGetLastError();
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
  Status synchronize(int32_t device, void* stream) override {
    const OnDevice on(device);
    HVD_RETURN_IF_ERROR(on.status());
    return check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize",
                 device);
  }
};

#else

class CudaRuntime final : public DeviceMemory {
 public:
  Status copy(void*, const void*, size_t, int32_t, void*) override { return unavailable(); }
  Status synchronize(int32_t, void*) override { return unavailable(); }
  void* allocate_pinned(size_t, int32_t) override { return nullptr; }
  void free_pinned(void*) override {}

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
  if (data_ == nullptr) data_ = static_cast<char*>(std::malloc(want));
  size_ = data_ != nullptr ? want : 0;
  return data_;
}

void StagingBuffer::release() {
  if (data_ == nullptr) return;
  if (pinned_by_ != nullptr) {
    pinned_by_->free_pinned(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
  pinned_by_ = nullptr;
}

}  // namespace hvd::core
