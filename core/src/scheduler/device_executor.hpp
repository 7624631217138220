// device_executor.hpp — runs the scheduler's CUDA tensors on a backend that takes CUDA memory
// (NCCL), without the host waiting for the device (docs/scheduler.md, "Executors").
//
// The scheduler is the coordinator: it queues, negotiates and batches. What it decided runs on
// an executor: host memory (and CUDA tensors staged for a host backend) through the host fusion
// buffer, CUDA tensors on a backend that takes them here:
//  - every tensor's *ready event* is recorded on its producer's stream when it is submitted, so
//    the work queued there before the submission is what the collective waits for, nothing later;
//  - hvd's own stream per device waits for those events (once per producer stream and batch),
//    packs a fused batch into the device's fusion buffer with one copy-and-scale launch per 1024
//    tensors (prescale on the way), runs the backend's collective on it, unpacks (postscale);
//  - an event recorded after that completes the batch's requests (Completion).
// Every call returns once the work is queued; the device's errors surface through the events.
#ifndef HVD_CORE_SCHEDULER_DEVICE_EXECUTOR_HPP
#define HVD_CORE_SCHEDULER_DEVICE_EXECUTOR_HPP

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/device_memory.hpp"
#include "hvd/sdk/result.hpp"
#include "hvd/types.h"

namespace hvd::core {

class DeviceExecutor {
 public:
  explicit DeviceExecutor(DeviceMemory& runtime) : runtime_(runtime) {}
  // Frees its buffers (in stream order: after the work queued on them), streams and events,
  // without waiting for the device.
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  // Whether it can drive `device` (an event made there, and hvd's kernels have code for it): the
  // runtime's reason if not.
  Status probe(int32_t device);

  // What a tensor's collective waits for: the work queued on its producer's stream when it was
  // submitted.
  struct Ready {
    void* event = nullptr;  // null: none recorded
    void* stream = nullptr;
    uint64_t sequence = 0;  // order of recording: on one stream, a later event covers an earlier
  };
  // Any thread. An event from the device's pool, recorded on `stream`; hand it back with
  // release() once the work that waits for it is queued (or will never be).
  Result<Ready> record_ready(int32_t device, void* stream);
  void release(const Ready& ready, int32_t device);

  using Done = std::shared_ptr<const DeviceEvent>;
  struct Tensor {
    const void* send;
    void* recv;
    uint64_t count;
    Ready ready;
  };
  // `reduce(send, recv, count, stream)` queues the backend's allreduce on hvd's stream.
  using Reduce = std::function<Status(const void* send, void* recv, uint64_t count, void* stream)>;
  // An allreduce of tensors of one dtype, scaled alike, on `device`. Several: packed into the
  // device's fusion buffer (each tensor at a 16-byte boundary, the gaps reduced as they are and
  // never read), reduced there, unpacked. One: reduced from its send to its recv buffer, scaled
  // in place there.
  Result<Done> allreduce(const std::vector<Tensor>& batch, hvd_dtype dtype, double prescale,
                         double postscale, int32_t device, const Reduce& reduce);
  // Any other collective: `queue(stream)` queues it on hvd's stream of `device`, after `ready`.
  Result<Done> run(const Ready& ready, int32_t device, const std::function<Status(void*)>& queue);

  // Device memory of at least `bytes` for work queued on hvd's stream of `device` (inside run's
  // `queue`): the fusion buffer, which that stream's order keeps from other uses.
  Result<char*> scratch(int32_t device, size_t bytes);

 private:
  struct PerDevice {
    void* stream = nullptr;
    void* fusion = nullptr;  // allocated and freed in stream order: a growth waits for nothing
    size_t fusion_bytes = 0;
  };
  Result<PerDevice*> on(int32_t device);
  // hvd's stream waits for the batch's ready events: the latest one of each producer stream.
  Status order_after(const std::vector<const Ready*>& ready, int32_t device, void* stream);
  Result<char*> fusion_buffer(PerDevice& d, int32_t device, size_t bytes);
  Result<Done> completed(int32_t device, void* stream);

  DeviceMemory& runtime_;
  std::map<int32_t, PerDevice> devices_;  // the scheduler's thread only

  mutable std::mutex pool_mutex_;  // submitting threads and the scheduler's
  std::map<int32_t, std::vector<void*>> idle_events_;
  // Ready events are numbered and recorded under one lock, so that on one stream a higher number
  // is a later record.
  std::mutex record_mutex_;
  uint64_t sequence_ = 0;
};

}  // namespace hvd::core

#endif  // HVD_CORE_SCHEDULER_DEVICE_EXECUTOR_HPP
