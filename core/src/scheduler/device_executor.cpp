#include "scheduler/device_executor.hpp"

#include <algorithm>
#include <string>

namespace hvd::core {
namespace {

constexpr size_t kAlignment = 16;  // each packed tensor's start: the copy kernel's vector width

uint64_t aligned(uint64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

Status DeviceExecutor::probe(int32_t device) {
  HVD_ASSIGN_OR_RETURN(void* event, runtime_.create_event(device));
  release({event, nullptr, 0}, device);  // the first ready event's
  return runtime_.kernels(device);
}

Result<DeviceExecutor::Ready> DeviceExecutor::record_ready(int32_t device, void* stream) {
  void* event = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    std::vector<void*>& idle = idle_events_[device];
    if (!idle.empty()) {
      event = idle.back();
      idle.pop_back();
    }
  }
  if (event == nullptr) {
    HVD_ASSIGN_OR_RETURN(event, runtime_.create_event(device));
  }
  Ready ready{event, stream, 0};
  Status recorded;
  {
    std::lock_guard<std::mutex> lock(record_mutex_);
    ready.sequence = ++sequence_;
    recorded = runtime_.record(event, device, stream);
  }
  if (!recorded.ok()) {
    release(ready, device);
    return recorded;
  }
  return ready;
}

void DeviceExecutor::release(const Ready& ready, int32_t device) {
  if (ready.event == nullptr) return;
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_events_[device].push_back(ready.event);
}

Result<DeviceExecutor::PerDevice*> DeviceExecutor::on(int32_t device) {
  PerDevice& d = devices_[device];
  if (d.stream == nullptr) {
    HVD_ASSIGN_OR_RETURN(d.stream, runtime_.create_stream(device));
  }
  return &d;
}

Status DeviceExecutor::order_after(const std::vector<const Ready*>& ready, int32_t device,
                                   void* stream) {
  // One wait per producer stream: its latest event covers the earlier ones.
  std::vector<const Ready*> latest;
  for (const Ready* r : ready) {
    if (r->event == nullptr) continue;
    auto same = std::find_if(latest.begin(), latest.end(),
                             [&](const Ready* l) { return l->stream == r->stream; });
    if (same == latest.end()) {
      latest.push_back(r);
    } else if ((*same)->sequence < r->sequence) {
      *same = r;
    }
  }
  for (const Ready* r : latest) HVD_RETURN_IF_ERROR(runtime_.wait_event(device, stream, r->event));
  return Status::success();
}

Result<char*> DeviceExecutor::fusion_buffer(PerDevice& d, int32_t device, size_t bytes) {
  if (bytes <= d.fusion_bytes) return static_cast<char*>(d.fusion);
  if (d.fusion != nullptr) {
    runtime_.free_device(d.fusion, device, d.stream);  // after the work queued there
    d.fusion = nullptr;
    d.fusion_bytes = 0;
  }
  void* data = runtime_.allocate_device(bytes, device, d.stream);
  if (data == nullptr) {
    return error(HVD_ERR_SYSTEM, "could not allocate a fusion buffer of " + std::to_string(bytes) +
                                     " bytes on CUDA device " + std::to_string(device) +
                                     " (HVD_FUSION_THRESHOLD bounds it)");
  }
  d.fusion = data;
  d.fusion_bytes = bytes;
  return static_cast<char*>(data);
}

Result<DeviceExecutor::Done> DeviceExecutor::completed(int32_t device, void* stream) {
  HVD_ASSIGN_OR_RETURN(void* event, runtime_.create_event(device));
  auto done = std::make_shared<const DeviceEvent>(runtime_, event, device);
  HVD_RETURN_IF_ERROR(runtime_.record(event, device, stream));
  return Done(std::move(done));
}

Result<DeviceExecutor::Done> DeviceExecutor::allreduce(const std::vector<Tensor>& batch,
                                                       hvd_dtype dtype, double prescale,
                                                       double postscale, int32_t device,
                                                       const Reduce& reduce) {
  HVD_ASSIGN_OR_RETURN(PerDevice * d, on(device));
  std::vector<const Ready*> ready;
  ready.reserve(batch.size());
  for (const Tensor& t : batch) ready.push_back(&t.ready);
  HVD_RETURN_IF_ERROR(order_after(ready, device, d->stream));

  if (batch.size() == 1) {
    const Tensor& t = batch.front();
    const void* send = t.send;
    if (prescale != 1) {
      const CopySpan in{t.recv, t.send, t.count};
      HVD_RETURN_IF_ERROR(runtime_.copy_scaled(&in, 1, dtype, prescale, device, d->stream));
      send = t.recv;
    }
    HVD_RETURN_IF_ERROR(reduce(send, t.recv, t.count, d->stream));
    if (postscale != 1) {
      const CopySpan out{t.recv, t.recv, t.count};
      HVD_RETURN_IF_ERROR(runtime_.copy_scaled(&out, 1, dtype, postscale, device, d->stream));
    }
    return completed(device, d->stream);
  }

  const size_t element = hvd_dtype_size(dtype);
  uint64_t total = 0;
  for (const Tensor& t : batch) total += aligned(t.count * element);
  HVD_ASSIGN_OR_RETURN(char* buffer, fusion_buffer(*d, device, std::max<uint64_t>(total, 1)));
  std::vector<CopySpan> in, out;
  in.reserve(batch.size());
  out.reserve(batch.size());
  uint64_t offset = 0;
  for (const Tensor& t : batch) {
    if (t.count > 0) {
      in.push_back({buffer + offset, t.send, t.count});
      out.push_back({t.recv, buffer + offset, t.count});
    }
    offset += aligned(t.count * element);
  }
  HVD_RETURN_IF_ERROR(
      runtime_.copy_scaled(in.data(), in.size(), dtype, prescale, device, d->stream));
  HVD_RETURN_IF_ERROR(reduce(buffer, buffer, total / element, d->stream));
  HVD_RETURN_IF_ERROR(
      runtime_.copy_scaled(out.data(), out.size(), dtype, postscale, device, d->stream));
  return completed(device, d->stream);
}

Result<DeviceExecutor::Done> DeviceExecutor::run(const Ready& ready, int32_t device,
                                                 const std::function<Status(void*)>& queue) {
  HVD_ASSIGN_OR_RETURN(PerDevice * d, on(device));
  HVD_RETURN_IF_ERROR(order_after({&ready}, device, d->stream));
  HVD_RETURN_IF_ERROR(queue(d->stream));
  return completed(device, d->stream);
}

Result<char*> DeviceExecutor::scratch(int32_t device, size_t bytes) {
  HVD_ASSIGN_OR_RETURN(PerDevice * d, on(device));
  return fusion_buffer(*d, device, std::max<size_t>(bytes, 1));
}

DeviceExecutor::~DeviceExecutor() {
  // Nothing here waits for the device: the buffers are freed in stream order, and a destroyed
  // stream's work still completes (a collective stuck in NCCL's kernel ends when its
  // communicator is aborted, which the communicator's own finalize sees to).
  for (auto& [device, d] : devices_) {
    if (d.stream == nullptr) continue;
    if (d.fusion != nullptr) runtime_.free_device(d.fusion, device, d.stream);
    runtime_.destroy_stream(d.stream, device);
  }
  for (auto& [device, idle] : idle_events_) {
    for (void* event : idle) runtime_.destroy_event(event, device);
  }
}

}  // namespace hvd::core
