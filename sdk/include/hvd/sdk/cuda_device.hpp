// hvd/sdk/cuda_device.hpp — working on a CUDA device for a scope, without side effects on the
// calling thread. Header-only; include it only where the CUDA runtime is (cuda_runtime_api.h).
//
// cudaGetDevice says 0 on a thread that never chose a device, and setting 0 back afterwards
// would create a context on GPU 0 (since CUDA 12, setting a device starts its context): on a
// library's own threads, every rank's memory on one GPU. So the thread's device is restored only
// where the thread had a context of its own.
#ifndef HVD_SDK_CUDA_DEVICE_HPP
#define HVD_SDK_CUDA_DEVICE_HPP

#include <cuda_runtime_api.h>

namespace hvd::sdk {

// Whether this thread has a current CUDA context (the driver's cuCtxGetCurrent, reached through
// the runtime, so that nothing links the driver library).
inline bool thread_has_cuda_context() {
  using GetCurrent = int (*)(void**);  // CUresult cuCtxGetCurrent(CUcontext*)
  static const GetCurrent get_current = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return GetCurrent{nullptr};
    }
    return reinterpret_cast<GetCurrent>(fn);
  }();
  void* context = nullptr;
  return get_current != nullptr && get_current(&context) == 0 && context != nullptr;
}

// The calling thread works on `device` for the object's life (a stream may be used only on its
// device); the thread's own device, where it had chosen one, is restored after. result() is the
// runtime's answer to the switch.
class OnCudaDevice {
 public:
  explicit OnCudaDevice(int device) : device_(device) {
    restore_ = thread_has_cuda_context();
    result_ = cudaGetDevice(&previous_);
    if (result_ == cudaSuccess && previous_ != device) result_ = cudaSetDevice(device);
  }
  ~OnCudaDevice() {
    if (restore_ && result_ == cudaSuccess && previous_ != device_) (void)cudaSetDevice(previous_);
  }
  OnCudaDevice(const OnCudaDevice&) = delete;
  OnCudaDevice& operator=(const OnCudaDevice&) = delete;
  cudaError_t result() const { return result_; }

 private:
  int device_;
  int previous_ = 0;
  bool restore_ = false;
  cudaError_t result_ = cudaSuccess;
};

}  // namespace hvd::sdk

#endif  // HVD_SDK_CUDA_DEVICE_HPP
