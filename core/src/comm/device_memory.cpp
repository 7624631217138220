#include "comm/device_memory.hpp"

#include <string>

#ifdef HVD_WITH_CUDA
#include <cuda_runtime_api.h>
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

// The calling thread works on `device` for a scope: a stream may be used only on its device, and
// the application's own choice of device on that thread is restored afterwards.
class OnDevice {
 public:
  explicit OnDevice(int32_t device) : device_(device) {
    status_ = check(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (status_.ok() && previous_ != device) {
      status_ = check(cudaSetDevice(device), "cudaSetDevice", device);
    }
  }
  ~OnDevice() {
    if (status_.ok() && previous_ != device_) (void)cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  const Status& status() const { return status_; }

 private:
  int32_t device_;
  int previous_ = 0;
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

 private:
  static Status unavailable() {
    return error(HVD_ERR_UNSUPPORTED, "CUDA memory: this hvd was built without the CUDA toolkit");
  }
};

#endif

}  // namespace

DeviceMemory& cuda_memory() {
  static CudaRuntime runtime;
  return runtime;
}

}  // namespace hvd::core
