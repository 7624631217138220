#include "scheduler/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string_view>

#include "common/call_checks.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/reduce.h"

namespace hvd::core {
namespace {

using Clock = Timeline::Clock;

bool is_float(hvd_dtype dtype) {
  return dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16 || dtype == HVD_FLOAT32 ||
         dtype == HVD_FLOAT64;
}

// out[i] = in[i] * factor (a plain copy for factor 1). out may be in.
void scale(void* out, const void* in, uint64_t count, hvd_dtype dtype, double factor) {
  const size_t bytes = count * hvd_dtype_size(dtype);
  if (factor == 1) {
    if (out != in && bytes > 0) std::memmove(out, in, bytes);
    return;
  }
  switch (dtype) {
    case HVD_FLOAT32: {
      const float f = static_cast<float>(factor);
      for (uint64_t i = 0; i < count; ++i)
        static_cast<float*>(out)[i] = static_cast<const float*>(in)[i] * f;
      break;
    }
    case HVD_FLOAT64:
      for (uint64_t i = 0; i < count; ++i)
        static_cast<double*>(out)[i] = static_cast<const double*>(in)[i] * factor;
      break;
    case HVD_FLOAT16:
    case HVD_BFLOAT16: {
      const bool half = dtype == HVD_FLOAT16;
      const float f = static_cast<float>(factor);
      for (uint64_t i = 0; i < count; ++i) {
        const uint16_t x = static_cast<const uint16_t*>(in)[i];
        const float v = (half ? hvd_float16_to_float(x) : hvd_bfloat16_to_float(x)) * f;
        static_cast<uint16_t*>(out)[i] = half ? hvd_float_to_float16(v) : hvd_float_to_bfloat16(v);
      }
      break;
    }
    default:  // prepare() admits factors other than 1 for floating types only
      break;
  }
}

hvd_collective_args args_for(const Submission& s, const void* send, void* recv, uint64_t count) {
  hvd_collective_args a = host_args(send, recv, count, s.spec.dtype);
  a.op = s.spec.op;
  a.root = s.spec.root;
  a.memory_type = s.spec.memory;
  a.device = s.spec.device;
  a.stream = s.stream;
  return a;
}

// Allreduces that may share a fusion buffer: one reduction of one dtype, scaled alike, in one
// kind of memory. Only what every rank agreed on: the device is each rank's own (ranks would
// otherwise batch differently and run different backend calls), and a staged batch copies each
// tensor on its own device.
bool fuses_with(const TensorSpec& a, const TensorSpec& b) {
  return a.dtype == b.dtype && a.op == b.op && a.memory == b.memory && a.prescale == b.prescale &&
         a.postscale == b.postscale;
}

}  // namespace

SchedulerOptions SchedulerOptions::from(const Settings& settings) {
  SchedulerOptions o;
  o.cycle_time =
      std::chrono::microseconds(static_cast<int64_t>(settings.number(Knob::kCycleTime) * 1000));
  o.fusion_threshold = static_cast<uint64_t>(settings.number(Knob::kFusionThreshold));
  o.cache_capacity = static_cast<size_t>(settings.number(Knob::kCacheCapacity));
  o.timeline = settings.text(Knob::kTimeline);
  // Horovod's DYNAMIC: no file until the application starts one (hvd has no such call): none.
  if (o.timeline == "DYNAMIC") o.timeline.clear();
  o.timeline_mark_cycles = settings.flag(Knob::kTimelineMarkCycles);
  o.stall_check = std::chrono::duration<double>(settings.number(Knob::kStallCheckTimeSeconds));
  o.stall_shutdown =
      std::chrono::duration<double>(settings.number(Knob::kStallShutdownTimeSeconds));
  if (settings.flag(Knob::kStallCheckDisable)) o.stall_check = {};
  o.device_executor = settings.flag(Knob::kDeviceExecutor);
  o.timeout = settings.timeout();
  return o;
}

// ---- Completion ---------------------------------------------------------------------------

bool Completion::done() const {
  std::unique_lock<std::mutex> lock(mutex_);
  return done_locked();
}

bool Completion::done_locked() const {
  if (!done_) return false;
  if (!on_device_.event) return true;
  const Result<bool> ran = on_device_.event->query();
  if (ran.ok() && !*ran) return false;
  if (!ran.ok() && status_.ok()) status_ = ran.status().with_context("on the device");
  if (status_.ok() && on_device_.failure) {
    if (std::optional<Status> broke = on_device_.failure->get()) {
      status_ = broke->with_context("the communicator broke before the device had run it");
    }
  }
  on_device_ = {};
  return true;
}

bool Completion::wait_settled(std::unique_lock<std::mutex>& lock,
                              std::chrono::duration<double> timeout) const {
  if (done_) return true;
  // Lock order: a completion's mutex, then the scheduler's.
  const auto count = [&](int change) {
    waiters_ += change;
    scheduler_.waiting(change);
  };
  count(+1);
  if (timeout.count() < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    count(-1);
    return false;
  }
  return true;
}

namespace {
Status not_within(std::chrono::duration<double> timeout) {
  return error(HVD_ERR_TIMEOUT, "the operation did not complete within " +
                                    std::to_string(timeout.count()) + " s (it goes on)");
}
}  // namespace

Status Completion::wait(std::chrono::duration<double> timeout) const {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!wait_settled(lock, timeout)) return not_within(timeout);
  // Then the device: polled, as a CUDA event cannot be waited for with a limit. The first polls
  // come quickly (a step's last allreduce is often about to finish), then every millisecond.
  auto pause = std::chrono::microseconds(20);
  while (!done_locked()) {
    if (timeout.count() >= 0 && std::chrono::steady_clock::now() - start >= timeout) {
      return not_within(timeout);
    }
    lock.unlock();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
    lock.lock();
  }
  return status_;
}

Status Completion::order_stream(void* stream, std::chrono::duration<double> timeout) const {
  std::shared_ptr<const DeviceEvent> event;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!wait_settled(lock, timeout)) return not_within(timeout);
    if (status_.ok() && on_device_.direct) {
      return error(HVD_ERR_UNSUPPORTED,
                   "this operation was queued on the stream it was submitted with (hvd's device "
                   "executor cannot run here): order work after it on that stream");
    }
    if (!status_.ok() || !on_device_.event) return status_;  // done: nothing left on a device
    event = on_device_.event;
  }
  return event->order(stream);
}

bool Completion::settle(const Status& status, DeviceWork on_device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return false;
  status_ = status;
  if (status.ok()) on_device_ = std::move(on_device);
  done_ = true;
  if (waiters_ > 0) {  // they stop waiting now, and the scheduler may be gone once they look
    scheduler_.waiting(-waiters_);
    waiters_ = 0;
  }
  return true;
}

void Completion::complete(Status status, DeviceWork on_device) {
  if (settle(status, std::move(on_device))) cv_.notify_all();
}

void Completion::set_output(std::unique_ptr<char[]> data, int64_t first_dim) {
  output_ = std::move(data);
  output_first_dim_ = first_dim;
}

void Completion::set_received_splits(std::vector<int64_t> splits) {
  received_splits_ = std::move(splits);
}

void Completion::set_last_joined(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_joined_ = rank;
}

Status Completion::last_joined(int* rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) return error(HVD_ERR_STATE, "the operation has not completed yet");
  if (!status_.ok()) return status_;
  if (!last_joined_) return error(HVD_ERR_STATE, "this operation is not a join");
  *rank = *last_joined_;
  return Status::success();
}

Status Completion::received_splits(std::vector<int64_t>* splits) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) return error(HVD_ERR_STATE, "the operation has not completed yet");
  if (!status_.ok()) return status_;
  if (!received_splits_) return error(HVD_ERR_STATE, "this operation is not an alltoall");
  *splits = *received_splits_;
  return Status::success();
}

Status Completion::output(void** data, int64_t* first_dim) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) return error(HVD_ERR_STATE, "the operation has not completed yet");
  if (!status_.ok()) return status_;
  if (output_first_dim_ < 0) {
    return error(HVD_ERR_STATE,
                 "this operation has no output allocated by hvd (only an allgather or an "
                 "alltoall submitted with recvbuf NULL has one)");
  }
  *data = output_.get();
  *first_dim = output_first_dim_;
  return Status::success();
}

void Completion::complete_all(const std::vector<std::shared_ptr<Completion>>& all,
                              const Status& status, const DeviceWork& on_device) {
  for (const auto& c : all) c->settle(status, on_device);
  for (const auto& c : all) c->cv_.notify_all();
}

// ---- Scheduler ----------------------------------------------------------------------------

Result<std::unique_ptr<Scheduler>> Scheduler::start(Collectives& data, Collectives& control,
                                                    SchedulerOptions options) {
  std::unique_ptr<Scheduler> s(new Scheduler(data, control, std::move(options)));
  if (!s->options_.timeline.empty() && control.rank() == 0) {
    HVD_ASSIGN_OR_RETURN(s->timeline_, Timeline::open(s->options_.timeline, control.rank()));
  }
  s->thread_ = std::thread([self = s.get()] { self->loop(); });
  return s;
}

Scheduler::Scheduler(Collectives& data, Collectives& control, SchedulerOptions options)
    : data_(data),
      control_(control),
      options_(std::move(options)),
      negotiator_(control.rank(), control.size(), options_.cache_capacity) {
  if (options_.device_memory == nullptr) options_.device_memory = &cuda_memory();
  if (data_.takes_cuda_memory()) {
    device_executor_ = std::make_unique<DeviceExecutor>(*options_.device_memory);
  }
}

Scheduler::~Scheduler() {
  shutdown();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::waiting(int change) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_ += change;
  if (change > 0) work_arrived_.notify_one();
}

void Scheduler::shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  shutdown_requested_ = true;
  work_arrived_.notify_one();
}

bool Scheduler::stop_by(Clock::time_point deadline) {
  shutdown();
  std::unique_lock<std::mutex> lock(mutex_);
  return exited_cv_.wait_until(lock, deadline, [&] { return exited_; });
}

std::optional<Status> Scheduler::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

Status Scheduler::prepare(Submission& s) const {
  // The message is built only on failure: this runs for every tensor of every step.
  auto invalid = [&](const std::string& why) {
    return error(HVD_ERR_INVALID_ARGUMENT,
                 std::string(op_type_name(s.spec.type)) + " '" + s.name + "': " + why);
  };
  if (s.name.empty()) return error(HVD_ERR_INVALID_ARGUMENT, "a tensor needs a name");
  TensorSpec& spec = s.spec;
  const std::string problem =
      call_problem(spec.type, spec.dtype, spec.op, spec.root, spec.memory, control_.size());
  if (!problem.empty()) return invalid(problem);
  if (spec.shape.size() > 64) return invalid("more than 64 dimensions");
  uint64_t elements = 1;
  for (int64_t d : spec.shape) {
    if (d < 0) return invalid("a negative dimension");
    if (d > 0 && elements > (UINT64_MAX >> 8) / static_cast<uint64_t>(d))
      return invalid("too many elements");
    elements *= static_cast<uint64_t>(d);
  }
  const bool cuda_to_backend = spec.memory == HVD_MEMORY_CUDA && data_.takes_cuda_memory();
  if (cuda_to_backend && spec.device < 0) {
    return invalid("a CUDA tensor needs a device ordinal, not " + std::to_string(spec.device));
  }
  // Probed on the backend's device where it says which (else this tensor's).
  spec.device_executor =
      cuda_to_backend &&
      probe_device(data_.cuda_device() >= 0 ? data_.cuda_device() : spec.device).ok();
  const bool sends = spec.type != HVD_COLLECTIVE_BROADCAST || spec.root == control_.rank();
  // An allgather or alltoall without a recv buffer gets one from hvd, of the size that arrives
  // (host memory).
  const bool gathers =
      spec.type == HVD_COLLECTIVE_ALLGATHER || spec.type == HVD_COLLECTIVE_ALLTOALL;
  const bool allocated = gathers && s.recv == nullptr && spec.memory == HVD_MEMORY_HOST;
  const int size = control_.size();
  const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
  uint64_t receives = elements;  // what recv holds (a reduce-scatter's: this rank's rows)
  if (spec.type == HVD_COLLECTIVE_REDUCE_SCATTER) {
    if (spec.shape.empty()) return invalid("a reduce-scatter needs at least one dimension");
    const uint64_t row = rows == 0 ? 0 : elements / static_cast<uint64_t>(rows);
    const int64_t mine = rows / size + (control_.rank() < rows % size ? 1 : 0);
    receives = static_cast<uint64_t>(mine) * row;
    if (spec.memory == HVD_MEMORY_CUDA && !on_device(spec) &&
        (rows % size != 0 || spec.prescale != 1 || spec.postscale != 1)) {
      return invalid(
          "a reduce-scatter of CUDA memory needs a first dimension that divides by the ranks and "
          "no scale factors, unless hvd's device executor runs it (" +
          std::string(data_.stages(spec.memory) ? "staged for a backend that takes host memory only"
                                                : "it cannot here: " + device_unusable_.message()) +
          ")");
    }
  }
  if (spec.type == HVD_COLLECTIVE_ALLTOALL) {
    if (spec.splits.empty()) {
      if (rows % size != 0) {
        return invalid("first dimension " + std::to_string(rows) + " does not divide by the " +
                       std::to_string(size) + " ranks: pass splits");
      }
      spec.splits.assign(static_cast<size_t>(size), rows / size);
    } else {
      if (spec.splits.size() != static_cast<size_t>(size)) {
        return invalid(std::to_string(spec.splits.size()) + " splits for " + std::to_string(size) +
                       " ranks");
      }
      int64_t total = 0;
      for (int64_t split : spec.splits) {
        if (split < 0) return invalid("a negative split");
        if (split > rows - total) {
          total = -1;  // more than the first dimension: no sum to report
          break;
        }
        total += split;
      }
      if (total != rows) {
        return invalid((total < 0 ? std::string("splits sum to more than")
                                  : "splits sum to " + std::to_string(total) + ", not") +
                       " the first dimension " + std::to_string(rows));
      }
    }
    receives = 0;  // unknown before negotiation: recv may be NULL when nothing arrives
    if (elements > 0 && s.send == s.recv) return invalid("an alltoall cannot run in place");
  }
  if ((receives > 0 && s.recv == nullptr && !allocated) ||
      (elements > 0 && sends && s.send == nullptr)) {
    return invalid("buffer is NULL for " + std::to_string(elements) + " elements");
  }
  if (spec.type == HVD_COLLECTIVE_ALLGATHER) {
    // By default a recv buffer is sized for equal shapes: the ranks times this rank's elements.
    if (allocated) {
      spec.output_capacity = TensorSpec::kAllocated;
    } else if (spec.output_capacity == 0) {
      spec.output_capacity = elements * static_cast<uint64_t>(control_.size());
    }
  }
  // An alltoall's recv buffer holds what the caller said (hvd_alltoall), else as much as this
  // rank sends.
  if (spec.type == HVD_COLLECTIVE_ALLTOALL) {
    if (s.recv == nullptr) {
      spec.output_capacity = allocated && !s.capacity_given ? TensorSpec::kAllocated : 0;
    } else if (!s.capacity_given) {
      spec.output_capacity = elements;
    }
  }
  for (double factor : {spec.prescale, spec.postscale}) {
    if (!std::isfinite(factor)) return invalid("a scale factor is not finite");
    if (factor != 1 && !hvd_collective_reduces(spec.type))
      return invalid("scale factors apply to allreduce and reduce-scatter only");
    if (factor != 1 && !is_float(spec.dtype)) {
      return invalid(std::string("scale factors need a floating-point dtype, not ") +
                     hvd_dtype_name(spec.dtype));
    }
    if (factor != 1 && cuda_to_backend && !on_device(spec)) {
      return invalid(
          "scale factors on CUDA tensors need hvd's device executor, which cannot run "
          "here: " +
          device_unusable_.message());
    }
  }
  // Last, once the submission is otherwise valid: the first one fixes this rank's device.
  if (on_device(spec)) {
    int32_t fixed = data_.cuda_device();
    if (fixed < 0 && !cuda_device_.compare_exchange_strong(fixed, spec.device)) {
      // fixed: the device an earlier tensor fixed
    } else if (fixed < 0) {
      fixed = spec.device;
    }
    if (fixed != spec.device) {
      return invalid("it is on CUDA device " + std::to_string(spec.device) +
                     ", this communicator's CUDA tensors on device " + std::to_string(fixed) +
                     ": its backend drives one device (NCCL binds one per communicator)");
    }
  }
  return Status::success();
}

namespace {

// A group is named by its members, in any order: every rank derives the same id for the same
// set, a different set gets a different id (so the mismatch shows), and the next step's group of
// the same tensors gets the same id again, which lets it hit the response cache.
uint64_t group_id_of(const std::vector<Submission>& group) {
  uint64_t id = group.size();
  for (const Submission& s : group) {
    uint64_t h = std::hash<std::string_view>{}(s.name);
    h ^= h >> 33;  // spread the bits before they are XORed together (murmur3's finalizer)
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    id ^= h;
  }
  return id == 0 ? 1 : id;
}

}  // namespace

Result<std::shared_ptr<Completion>> Scheduler::submit(Submission&& submission) {
  if (submission.name.empty()) return error(HVD_ERR_INVALID_ARGUMENT, "a tensor needs a name");
  Status checked = prepare(submission);
  DeviceExecutor::Ready ready;
  if (checked.ok() && on_device(submission.spec)) {
    Result<DeviceExecutor::Ready> recorded = ready_event(submission);
    if (recorded.ok()) ready = *recorded;
    checked = recorded.status();
  }
  std::shared_ptr<Completion> completion;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const Status admitted = admit_locked(submission.name);
    if (!admitted.ok()) {
      lock.unlock();
      if (device_executor_) device_executor_->release(ready, submission.spec.device);
      return admitted;
    }
    completion = queue_locked(std::move(submission), Clock::now(), ready);
    if (checked.ok()) return completion;
    queue_.back().local_error = checked;
  }
  completion->complete(checked);  // lock order: a completion's mutex, then the scheduler's
  return checked;
}

Result<std::vector<std::shared_ptr<Completion>>> Scheduler::submit_group(
    std::vector<Submission> group) {
  Status checked;
  for (Submission& s : group) {
    if (s.name.empty()) return error(HVD_ERR_INVALID_ARGUMENT, "a tensor needs a name");
    const Status mine = prepare(s);
    if (checked.ok() && !mine.ok()) checked = mine.with_context("in a group");
  }
  std::vector<DeviceExecutor::Ready> ready(group.size());
  const auto release_ready = [&] {
    for (size_t i = 0; i < group.size(); ++i) {
      if (device_executor_) device_executor_->release(ready[i], group[i].spec.device);
    }
  };
  for (size_t i = 0; i < group.size() && checked.ok(); ++i) {
    if (!on_device(group[i].spec)) continue;
    Result<DeviceExecutor::Ready> recorded = ready_event(group[i]);
    if (recorded.ok()) ready[i] = *recorded;
    checked = recorded.status().with_context("in a group");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  std::unordered_set<std::string_view> in_group;
  for (const Submission& s : group) {
    Status admitted = admit_locked(s.name);
    if (admitted.ok() && group.size() > 1 && !in_group.insert(s.name).second) {
      admitted = duplicate(s.name);
    }
    if (!admitted.ok()) {
      lock.unlock();
      release_ready();
      return admitted;
    }
  }
  const uint64_t group_id = group.size() > 1 ? group_id_of(group) : 0;
  std::vector<std::shared_ptr<Completion>> out;
  out.reserve(group.size());
  const auto now = Clock::now();
  for (size_t i = 0; i < group.size(); ++i) {
    Submission& s = group[i];
    s.spec.group = group_id;
    s.spec.group_size = group_id ? static_cast<uint32_t>(group.size()) : 0;
    out.push_back(queue_locked(std::move(s), now, ready[i]));
    if (!checked.ok()) queue_.back().local_error = checked;
  }
  if (checked.ok()) return out;
  lock.unlock();
  for (const auto& completion : out) completion->complete(checked);  // lock order, as in submit
  return checked;
}

Result<std::shared_ptr<Completion>> Scheduler::join() {
  Submission s;
  s.name = kJoinName;
  s.spec.type = HVD_COLLECTIVE_JOIN;
  s.spec.dtype = HVD_UINT8;
  s.spec.shape = {0};
  return submit(std::move(s));
}

Scheduler::Entry* Scheduler::stand_in_for(const std::string& name, const TensorSpec& spec) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (spare_.empty()) spare_.emplace_back();
  pending_.splice(pending_.end(), spare_, spare_.begin());
  Entry& e = pending_.back();
  e.what = Submission{};
  e.what.name = name;
  e.what.spec = spec;
  e.elements = spec.elements();
  e.stand_in.reset(new char[std::max<uint64_t>(e.bytes(), 1)]());  // zeros
  e.what.send = e.stand_in.get();
  e.what.recv = e.stand_in.get();
  e.completion = std::make_shared<Completion>(*this);
  e.submitted = Clock::now();
  e.negotiated = {};
  e.sent = false;
  e.local_error = Status::success();
  e.ready = {};
  e.self = std::prev(pending_.end());
  return &e;
}

Status Scheduler::duplicate(const std::string& name) {
  return error(HVD_ERR_INVALID_ARGUMENT,
               "Duplicate tensor name '" + name +
                   "': a tensor of that name is already in flight on this rank (submitted and "
                   "not yet complete)");
}

Status Scheduler::admit_locked(const std::string& name) const {
  if (stopped_) return stopped_->with_context("the scheduler has stopped");
  if (in_flight_.count(name) > 0) return duplicate(name);
  return Status::success();
}

const Status& Scheduler::probe_device(int32_t device) const {
  std::call_once(device_probe_, [&] {
    device_unusable_ = options_.device_executor
                           ? device_executor_->probe(device)
                           : error(HVD_ERR_UNSUPPORTED, "HVD_DEVICE_EXECUTOR=0");
    if (!device_unusable_.ok()) {
      log(HVD_LOG_WARNING,
          "CUDA tensors go to the backend as they are, unfused, completing when queued: hvd's "
          "device executor cannot run here (" +
              device_unusable_.message() + ")");
    }
  });
  return device_unusable_;
}

Result<DeviceExecutor::Ready> Scheduler::ready_event(const Submission& s) {
  Result<DeviceExecutor::Ready> ready = device_executor_->record_ready(s.spec.device, s.stream);
  if (!ready.ok()) {
    return ready.status().with_context(std::string(op_type_name(s.spec.type)) + " '" + s.name +
                                       "': ordering it after its stream's work");
  }
  return ready;
}

std::shared_ptr<Completion> Scheduler::queue_locked(Submission&& s, Clock::time_point now,
                                                    const DeviceExecutor::Ready& ready) {
  if (queue_.empty() || waiting_ > 0) work_arrived_.notify_one();  // the cycle may wait for it
  if (spare_.empty()) spare_.emplace_back();
  queue_.splice(queue_.end(), spare_, spare_.begin());
  Entry& e = queue_.back();
  e.what = std::move(s);
  e.completion = std::make_shared<Completion>(*this);
  e.submitted = now;
  e.negotiated = {};
  e.sent = false;
  e.local_error = Status::success();
  e.ready = ready;
  e.elements = e.what.spec.elements();
  e.self = std::prev(queue_.end());  // stays valid when spliced onto pending_
  if (spare_names_.empty()) {
    in_flight_.insert(e.what.name);
  } else {
    spare_names_.back().value() = e.what.name;
    in_flight_.insert(std::move(spare_names_.back()));
    spare_names_.pop_back();
  }
  return e.completion;
}

void Scheduler::loop() {
  for (;;) {
    const auto start = Clock::now();
    bool stop = false;
    Status s;
    try {
      s = run_cycle(&stop);
    } catch (const std::exception& e) {  // no exception leaves this thread: it fails the job
      s = error(HVD_ERR_SYSTEM, std::string("the scheduler's cycle failed: ") + e.what());
    }
    if (!s.ok()) fail_for(s);
    if (!s.ok() || stop) break;
    wait_for_next_cycle(start);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  exited_ = true;
  exited_cv_.notify_all();
}

void Scheduler::fail_for(const Status& status) {
  // The communicators' own error (what broke them first) rather than the step that noticed.
  Status why = status;
  for (const Collectives* c : {&data_, &control_}) {
    const Status health = c->health();
    if (!health.ok()) {
      why = health;
      break;
    }
  }
  log(HVD_LOG_ERROR, "scheduler stopped: " + why.message());
  failure_token_->set(why);  // before the abort that may end the device work it settled
  data_.abort(why);
  control_.abort(why);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = why;
  }
  fail_all(why);
}

void Scheduler::wait_for_next_cycle(Clock::time_point last_start) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto due = [&] {
    return shutdown_requested_ ||
           (waiting_ > 0 && (!queue_.empty() || (last_cycle_ran_ && !pending_.empty())));
  };
  if (!pending_.empty()) {  // tensors in flight: the next vote is a cycle time after the last
    work_arrived_.wait_until(lock, last_start + options_.cycle_time, due);
    return;
  }
  work_arrived_.wait_until(
      lock, Clock::now() + std::max<Clock::duration>(kIdleVoteInterval, options_.cycle_time),
      [&] { return !queue_.empty() || shutdown_requested_; });
  if (queue_.empty()) return;
  work_arrived_.wait_until(
      lock, std::max(queue_.front().submitted, last_start) + options_.cycle_time, due);
}

Status Scheduler::run_cycle(bool* stop) {
  bool shutdown = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.splice(pending_.end(), queue_);
    shutdown = shutdown_requested_;
  }
  const auto now = Clock::now();

  // What this rank has: bits for tensors the cache knows, requests for the others. A tensor that
  // waited half the stall time on its bit is sent in full, so that the stall inspector can name
  // the ranks that have not submitted it.
  const size_t nbits = negotiator_.bit_count();
  std::vector<uint8_t> vote(nbits + 3, 0);
  std::vector<Entry*> voted(nbits, nullptr);  // by bit
  std::vector<Request> mine;
  for (Entry& e : pending_) {
    if (e.sent || e.negotiated != Clock::time_point{}) continue;
    const bool waited =
        options_.stall_check.count() > 0 && now - e.submitted > options_.stall_check / 2;
    const bool failed = !e.local_error.ok();
    const auto bit =
        waited || failed ? std::nullopt : negotiator_.cached_bit(e.what.name, e.what.spec);
    if (bit) {
      vote[*bit] = 1;
      voted[*bit] = &e;
    } else {
      // Copied only when it is sent.
      mine.push_back(Request{e.what.name, e.what.spec, failed ? e.local_error.message() : "",
                             e.local_error.code()});
      e.sent = true;
      sent_.emplace(e.what.name, &e);
    }
  }
  // A joined rank has every tensor: the others' votes alone decide.
  if (negotiator_.joined(control_.rank())) std::fill(vote.begin(), vote.begin() + nbits, 1);
  // Flags, inverted so that one MIN answers "does any rank ...": send requests, stop, give up.
  vote[nbits] = mine.empty() ? 1 : 0;
  vote[nbits + 1] = shutdown ? 0 : 1;
  vote[nbits + 2] = stall_shutdown_due_ ? 0 : 1;
  hvd_collective_args a = host_args(vote.data(), vote.data(), vote.size(), HVD_UINT8);
  a.op = HVD_MIN;
  HVD_RETURN_IF_ERROR(control_.allreduce(a).with_context("negotiating (cache bits)"));

  if (vote[nbits + 1] == 0 || vote[nbits + 2] == 0) {
    std::string why = "hvd's scheduler was shut down (hvd_finalize on some rank)";
    if (vote[nbits + 2] == 0) {
      why =
          "stall shutdown (HVD_STALL_SHUTDOWN_TIME_SECONDS): tensors waited too long for ranks "
          "that never submitted them:";
      for (const auto& stall : negotiator_.stalled(now, std::chrono::duration<double>(0))) {
        why += " '" + stall.name + "' (missing ranks";
        for (int r : stall.missing) why += " " + std::to_string(r);
        why += ")";
      }
    }
    const Status stopped = error(vote[nbits + 2] == 0 ? HVD_ERR_TIMEOUT : HVD_ERR_STATE,
                                 why + "; this operation was in flight");
    if (vote[nbits + 2] == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = stopped;
    }
    fail_all(stopped);
    *stop = true;
    return Status::success();
  }

  std::vector<std::vector<Request>> gathered;
  if (vote[nbits] == 0) {
    HVD_ASSIGN_OR_RETURN(gathered, gather(mine));
  }
  vote.resize(nbits);
  Negotiator::Ready ready = negotiator_.cycle(vote, gathered, now);
  // The same verdicts on every rank; a cached tensor's spec is the cache's, equal everywhere.
  std::vector<Verdict> verdicts;
  verdicts.reserve(ready.cached.size() + ready.negotiated.size());
  for (uint32_t bit : ready.cached) {
    Entry* e = voted[bit];
    const TensorSpec& spec = negotiator_.cached_spec(bit);
    std::string refused = negotiator_.stand_in_refusal(negotiator_.cached_name(bit), spec);
    if (e == nullptr) {  // this rank has joined: it takes part with zeros, or not at all
      if (!refused.empty()) continue;
      e = stand_in_for(negotiator_.cached_name(bit), spec);
    }
    verdicts.push_back(
        Verdict{e, spec.group, spec.group_size, std::move(refused), {}, HVD_ERR_UNSUPPORTED});
    if (spec.type == HVD_COLLECTIVE_ALLGATHER || spec.type == HVD_COLLECTIVE_ALLTOALL) {
      verdicts.back().first_dims = negotiator_.cached_first_dims(bit);
    }
  }
  for (Response& r : ready.negotiated) {
    if (r.stand_in) {  // the others' tensor, which this joined rank has none of
      if (r.error.empty()) {
        verdicts.push_back(
            Verdict{stand_in_for(r.name, r.spec), r.spec.group, r.spec.group_size, {}, {}});
      }
      continue;
    }
    const auto it = sent_.find(r.name);
    if (it == sent_.end()) continue;  // answered already: one verdict per entry, however many
    // A code from a peer is one of hvd's, or reported as the peer's failure.
    verdicts.push_back(Verdict{it->second, r.spec.group, r.spec.group_size, std::move(r.error),
                               std::move(r.first_dims), known_error(r.error_code, HVD_ERR_REMOTE)});
    sent_.erase(it);
  }
  ++cycles_;
  if (!gathered.empty()) ++full_negotiations_;
  negotiation_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - now).count());
  last_cycle_ran_ = !verdicts.empty();
  stall_check(now);
  if (timeline_ && options_.timeline_mark_cycles) timeline_->mark("CYCLE", now);
  execute(std::move(verdicts));
  // A data collective that failed broke its communicator: nothing more runs on it.
  return data_.health();
}

Result<std::vector<std::vector<Request>>> Scheduler::gather(const std::vector<Request>& mine) {
  const std::vector<char> blob = serialize(mine);
  const size_t ranks = static_cast<size_t>(control_.size());
  std::vector<int64_t> lengths(ranks);
  const int64_t length = static_cast<int64_t>(blob.size());
  HVD_RETURN_IF_ERROR(control_.allgather(host_args(&length, lengths.data(), 1, HVD_INT64))
                          .with_context("negotiating (request sizes)"));
  const size_t longest = static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<char> padded(blob);
  padded.resize(longest);
  std::vector<char> all(longest * ranks);
  HVD_RETURN_IF_ERROR(control_.allgather(host_args(padded.data(), all.data(), longest, HVD_UINT8))
                          .with_context("negotiating (requests)"));
  std::vector<std::vector<Request>> out(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    HVD_ASSIGN_OR_RETURN(out[r],
                         deserialize(all.data() + r * longest, static_cast<size_t>(lengths[r])));
  }
  return out;
}

void Scheduler::stall_check(Clock::time_point now) {
  if (options_.stall_check.count() <= 0 || control_.rank() != 0) return;
  const auto stalls = negotiator_.stalled(now, options_.stall_check);
  if (stalls.empty()) return;
  if (options_.stall_shutdown.count() > 0) {
    for (const auto& stall : stalls) {
      if (stall.waited >= options_.stall_shutdown) stall_shutdown_due_ = true;
    }
  }
  if (now - last_stall_warning_ < options_.stall_check) return;
  last_stall_warning_ = now;
  // Horovod's wording, with the tensors grouped by the ranks they wait for.
  std::map<std::vector<int>, std::vector<std::string>> by_missing;
  for (const auto& stall : stalls) by_missing[stall.missing].push_back(stall.name);
  std::string text =
      "One or more tensors were submitted to be reduced, gathered or broadcast by a subset of "
      "ranks and have waited for the remaining ranks for more than " +
      seconds_number(options_.stall_check) +
      " seconds. This may mean that different ranks submit different tensors, or that only a "
      "subset of ranks submits tensors, which will deadlock. Missing ranks:";
  for (const auto& [missing, names] : by_missing) {
    text += "\n  ";
    for (size_t i = 0; i < missing.size(); ++i)
      text += (i ? ", " : "") + std::to_string(missing[i]);
    text += ": [";
    for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i];
    text += "]";
  }
  log(HVD_LOG_WARNING, text);
}

void Scheduler::execute(std::vector<Verdict> ready) {
  // Grouped tensors wait until their whole group is ready (the same on every rank).
  std::vector<Verdict> runnable;
  runnable.reserve(ready.size());
  const auto now = Clock::now();
  for (Verdict& v : ready) {
    Entry& e = *v.entry;
    e.negotiated = now;
    e.first_dims = std::move(v.first_dims);
    if (timeline_) timeline_->span(e.what.name, "NEGOTIATE", e.submitted, e.negotiated);
    if (v.group == 0) {
      runnable.push_back(std::move(v));
      continue;
    }
    std::vector<Verdict>& members = held_[v.group];
    members.push_back(std::move(v));
    if (members.size() == members.front().group_size) {
      const uint64_t group = members.front().group;
      for (Verdict& m : members) runnable.push_back(std::move(m));
      held_.erase(group);
    }
  }

  // Allreduces of one dtype/op/memory kind/scale go into one buffer, up to the threshold; the rest
  // run alone. A step's tensors are mostly of one kind: the open batches are few.
  struct Open {
    const TensorSpec* kind;
    std::vector<Entry*> batch;
    uint64_t bytes = 0;
  };
  std::vector<Open> open;
  for (Verdict& v : runnable) {
    Entry& e = *v.entry;
    if (!v.error.empty()) {
      finish(&e, error(v.error_code, v.error));
      continue;
    }
    if (e.what.spec.type == HVD_COLLECTIVE_JOIN) {
      e.completion->set_last_joined(static_cast<int>(e.first_dims.at(0)));
      finish(&e, Status::success());
      continue;
    }
    if (e.what.task) {
      const std::function<Status()> task = std::move(e.what.task);  // not kept with spare entries
      e.what.task = nullptr;
      finish(&e, task());
      continue;
    }
    const TensorSpec& s = e.what.spec;
    const bool direct = s.memory == HVD_MEMORY_CUDA && !data_.stages(s.memory) && !on_device(s);
    const bool fusable = s.type == HVD_COLLECTIVE_ALLREDUCE && !direct &&
                         options_.fusion_threshold > 0 && e.bytes() <= options_.fusion_threshold;
    if (!fusable) {
      if (s.type == HVD_COLLECTIVE_ALLREDUCE && s.memory == HVD_MEMORY_CUDA && !direct) {
        // Staged: through the fusion buffer even alone, as that is its host memory. On the
        // device: the device executor scales it.
        std::vector<Entry*> alone{&e};
        run_fused(alone);
      } else {
        run_alone(e);
      }
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(),
                           [&](const Open& o) { return fuses_with(*o.kind, s); });
    if (it == open.end()) {
      it = open.insert(open.end(), Open{&s, {}, 0});
    } else if (it->bytes + e.bytes() > options_.fusion_threshold) {
      run_fused(it->batch);  // full: it runs now and starts over
      it->bytes = 0;
    }
    it->batch.push_back(&e);
    it->bytes += e.bytes();
  }
  for (Open& o : open) run_fused(o.batch);
}

template <typename Pointer>
Pointer Scheduler::end_to_end(const std::vector<Entry*>& batch, Pointer Submission::*buffer) {
  const char* start = nullptr;
  const char* next = nullptr;
  for (const Entry* e : batch) {
    const uint64_t bytes = e->bytes();
    if (bytes == 0) continue;  // zero-size tensors may point anywhere
    const char* at = static_cast<const char*>(e->what.*buffer);
    if (next == nullptr) {
      start = at;
    } else if (at != next) {
      return nullptr;
    }
    next = at + bytes;
  }
  return static_cast<Pointer>(const_cast<char*>(start));
}

Status Scheduler::stage(const std::vector<Entry*>& batch, bool in) {
  DeviceMemory& device = *options_.device_memory;
  const auto deadline = Clock::now() + options_.timeout;
  // The batch's streams, each waited for once on its device (a rank may use several devices).
  std::vector<std::pair<int32_t, void*>> streams;
  const auto failed = [](const Status& s) {
    return error(s.code(), "staging CUDA tensors in host memory: " + s.message());
  };
  uint64_t offset = 0;
  for (const Entry* e : batch) {
    const Submission& w = e->what;
    char* host = fusion_buffer_.data() + offset;  // reserved by run_fused
    offset += e->bytes();
    const int32_t ordinal = w.spec.device;
    const Status s = in ? device.copy(host, w.send, e->bytes(), ordinal, w.stream)
                        : device.copy(w.recv, host, e->bytes(), ordinal, w.stream);
    if (!s.ok()) return failed(s);
    const std::pair<int32_t, void*> on(ordinal, w.stream);
    if (std::find(streams.begin(), streams.end(), on) == streams.end()) streams.push_back(on);
  }
  for (const auto& [ordinal, stream] : streams) {
    const Status s = device.synchronize(ordinal, stream, deadline);
    if (!s.ok()) return failed(s);
  }
  return Status::success();
}

void Scheduler::run_fused(std::vector<Entry*>& batch) {
  if (batch.empty()) return;
  const TensorSpec& s = batch.front()->what.spec;
  if (on_device(s)) {
    run_on_device(batch);
    return;
  }
  const bool staged_batch = data_.stages(s.memory);
  if (batch.size() == 1 && !staged_batch) {
    run_alone(*batch.front());
    batch.clear();
    return;
  }
  const size_t element = hvd_dtype_size(s.dtype);
  uint64_t total = 0;
  for (Entry* e : batch) total += e->bytes();

  // Tensors already end to end (a framework's flat gradient buffer, say) are reduced where they
  // lie, and each side that is not needs the fusion buffer. Every rank decides for itself: the
  // elements are in the same order either way. Inputs and outputs that overlap only in part
  // would be read after being written, so they take the buffer.
  // CUDA tensors on a backend that takes host memory only always go through the (host) buffer.
  const void* send =
      s.prescale == 1 && !staged_batch ? end_to_end(batch, &Submission::send) : nullptr;
  void* recv = s.postscale == 1 && !staged_batch ? end_to_end(batch, &Submission::recv) : nullptr;
  if (send != nullptr && recv != nullptr && send != recv) {
    const auto* a = static_cast<const char*>(send);
    const auto* b = static_cast<const char*>(recv);
    if (a < b + total && b < a + total) send = nullptr;
  }
  char* buffer = nullptr;
  if (send == nullptr || recv == nullptr) {
    buffer =
        fusion_buffer_.reserve(total, staged_batch ? options_.device_memory : nullptr, s.device);
    // Fatal, as a failed allocation always was (the loop fails the scheduler): this rank alone
    // skipping the batch would pair its next allreduce with its peers' this one.
    if (buffer == nullptr) throw std::bad_alloc();
  }

  Status status;
  const auto copy_in = Clock::now();
  const bool copied_in = send == nullptr;
  const uint64_t count = total / element;
  if (copied_in && status.ok()) {
    if (staged_batch) {
      status = stage(batch, /*in=*/true);
      if (status.ok()) scale(buffer, buffer, count, s.dtype, s.prescale);
    } else {
      uint64_t offset = 0;
      for (Entry* e : batch) {
        scale(buffer + offset, e->what.send, e->elements, s.dtype, s.prescale);
        offset += e->bytes();
      }
    }
    send = buffer;
  }
  const bool copy_back = recv == nullptr;
  if (copy_back) recv = buffer;
  const auto reduce = Clock::now();
  if (status.ok()) {
    hvd_collective_args a = args_for(batch.front()->what, send, recv, count);
    if (staged_batch) {  // the backend sees host memory
      a.memory_type = HVD_MEMORY_HOST;
      a.device = -1;
      a.stream = nullptr;
    }
    status = data_.allreduce(a);
    ++backend_calls_;
  }
  const auto copy_out = Clock::now();
  if (status.ok() && copy_back) {
    if (staged_batch) {
      scale(buffer, buffer, count, s.dtype, s.postscale);
      status = stage(batch, /*in=*/false);
    } else {
      uint64_t offset = 0;
      for (Entry* e : batch) {
        scale(e->what.recv, buffer + offset, e->elements, s.dtype, s.postscale);
        offset += e->bytes();
      }
    }
  }
  const auto end = Clock::now();
  if (timeline_) {
    for (Entry* e : batch) {
      timeline_->span(e->what.name, "QUEUE", e->negotiated, copy_in);
      if (copied_in) timeline_->span(e->what.name, "MEMCPY_IN_FUSION_BUFFER", copy_in, reduce);
      timeline_->span(e->what.name, "ALLREDUCE", reduce, copy_out);
      if (copy_back) timeline_->span(e->what.name, "MEMCPY_OUT_FUSION_BUFFER", copy_out, end);
    }
  }
  finish(batch, status);
  batch.clear();
}

void Scheduler::run_on_device(std::vector<Entry*>& batch) {
  const TensorSpec& s = batch.front()->what.spec;
  std::vector<DeviceExecutor::Tensor> tensors;
  tensors.reserve(batch.size());
  for (const Entry* e : batch) {
    tensors.push_back({e->what.send, e->what.recv, e->elements, e->ready});
  }
  const auto start = Clock::now();
  const Submission& first = batch.front()->what;
  auto reduce = [&](const void* send, void* recv, uint64_t count, void* stream) {
    hvd_collective_args a = args_for(first, send, recv, count);
    a.stream = stream;
    ++backend_calls_;
    return data_.allreduce(a);
  };
  const Result<DeviceExecutor::Done> done =
      device_executor_->allreduce(tensors, s.dtype, s.prescale, s.postscale, s.device, reduce);
  if (!done.ok()) fail_device(done.status());
  if (timeline_) {
    const auto end = Clock::now();
    for (const Entry* e : batch) {
      timeline_->span(e->what.name, "QUEUE", e->negotiated, start);
      timeline_->span(e->what.name, "ALLREDUCE", start, end);  // queued on the device
    }
  }
  finish(batch, done.status(), on_device_done(done));
  batch.clear();
}

void Scheduler::fail_device(const Status& status) {
  // This rank may have queued only part of the batch's work: its next backend call would pair
  // with its peers' earlier one. Broken, as a backend error breaks the communicator.
  failure_token_->set(status);
  data_.abort(status);
}

void Scheduler::run_alone(Entry& e) {
  if (on_device(e.what.spec)) {
    // Queued on hvd's stream after the tensor's ready event: the backend gets that stream.
    const auto start = Clock::now();
    const Result<DeviceExecutor::Done> done =
        device_executor_->run(e.ready, e.what.spec.device, [&](void* stream) {
          e.what.stream = stream;
          return run_collective(e);
        });
    ++backend_calls_;
    if (!done.ok()) fail_device(done.status());
    if (timeline_) {
      timeline_->span(e.what.name, "QUEUE", e.negotiated, start);
      timeline_->span(e.what.name, op_type_name(e.what.spec.type), start, Clock::now());
    }
    finish(&e, done.status(), on_device_done(done));
    return;
  }
  const auto start = Clock::now();
  const Status status = run_collective(e);
  ++backend_calls_;
  if (timeline_) {
    timeline_->span(e.what.name, "QUEUE", e.negotiated, start);
    timeline_->span(e.what.name, op_type_name(e.what.spec.type), start, Clock::now());
  }
  // CUDA memory given to the backend as it is (the direct path): queued on its own stream.
  DeviceWork direct;
  direct.direct = e.what.spec.memory == HVD_MEMORY_CUDA && !data_.stages(e.what.spec.memory);
  finish(&e, status, direct);
}

Status Scheduler::run_collective(Entry& e) {
  const Submission& w = e.what;
  const uint64_t count = e.elements;
  Status status;
  switch (w.spec.type) {
    case HVD_COLLECTIVE_ALLREDUCE: {
      const void* send = w.send;
      if (w.spec.prescale != 1) {
        scale(w.recv, w.send, count, w.spec.dtype, w.spec.prescale);
        send = w.recv;
      }
      status = data_.allreduce(args_for(w, send, w.recv, count));
      if (status.ok()) scale(w.recv, w.recv, count, w.spec.dtype, w.spec.postscale);
      break;
    }
    case HVD_COLLECTIVE_ALLGATHER:
      status = run_allgather(e);
      break;
    case HVD_COLLECTIVE_BROADCAST:
      status = data_.broadcast(args_for(w, w.send, w.recv, count));
      break;
    case HVD_COLLECTIVE_REDUCE_SCATTER:
      status = run_reduce_scatter(e);
      break;
    case HVD_COLLECTIVE_ALLTOALL:
      status = run_alltoall(e);
      break;
    case HVD_COLLECTIVE_JOIN:  // completed by execute(), never run
      break;
    default:  // a barrier is never a submission's
      status = error(HVD_ERR_INTERNAL, std::string(op_type_name(w.spec.type)) + " '" + w.name +
                                           "' is not a collective the scheduler runs");
      break;
  }
  return status;
}

// The submission's recv buffer, or (recvbuf NULL) one of `bytes` hvd allocates into *allocated.
// A rank that cannot allocate fails alone: the other ranks go on into the collective and time
// out (naming this one, if their backend can), as with any rank that fails outside it.
Result<void*> Scheduler::output_of(const Submission& w, uint64_t bytes,
                                   std::unique_ptr<char[]>* allocated) {
  if (w.recv != nullptr || bytes == 0) return w.recv;
  allocated->reset(new (std::nothrow) char[bytes]);
  if (!*allocated) {
    return error(HVD_ERR_INTERNAL, std::string(op_type_name(w.spec.type)) + " '" + w.name +
                                       "': could not allocate " + std::to_string(bytes) +
                                       " bytes for the output");
  }
  return static_cast<void*>(allocated->get());
}

Status Scheduler::run_allgather(Entry& e) {
  const Submission& w = e.what;
  const size_t element = hvd_dtype_size(w.spec.dtype);
  uint64_t row = 1;  // elements per unit of the first dimension (the same on every rank)
  for (size_t i = 1; i < w.spec.shape.size(); ++i) row *= static_cast<uint64_t>(w.spec.shape[i]);
  std::vector<uint64_t> counts;  // by rank
  counts.reserve(e.first_dims.size());
  uint64_t total = 0;
  int64_t first_dim = 0;
  for (int64_t rows : e.first_dims) {
    counts.push_back(static_cast<uint64_t>(rows) * row);  // the negotiator checked the sums
    total += counts.back();
    first_dim += rows;
  }
  std::unique_ptr<char[]> allocated;
  HVD_ASSIGN_OR_RETURN(void* const recv, output_of(w, total * element, &allocated));
  hvd_collective_args a = args_for(w, w.send, recv, e.elements);
  if (std::any_of(counts.begin(), counts.end(), [&](uint64_t n) { return n != counts[0]; })) {
    a.recv_counts = counts.data();  // allgatherv (the communicator's, on any backend)
  }
  const Status status = data_.allgather(a);
  if (status.ok() && w.recv == nullptr) e.completion->set_output(std::move(allocated), first_dim);
  return status;
}

Status Scheduler::run_reduce_scatter(Entry& e) {
  const Submission& w = e.what;
  const TensorSpec& spec = w.spec;
  const size_t element = hvd_dtype_size(spec.dtype);
  const uint64_t n = static_cast<uint64_t>(data_.size());
  const uint64_t rank = static_cast<uint64_t>(data_.rank());
  const uint64_t rows = static_cast<uint64_t>(spec.shape[0]);
  const uint64_t row = rows == 0 ? 0 : e.elements / rows;  // elements per row
  // Horovod's split: rows = q * n + m, and the first m ranks get one row more.
  const uint64_t q = rows / n, m = rows % n;
  const uint64_t mine = (q + (rank < m ? 1 : 0)) * row;
  // Host memory is scaled here; CUDA memory on the device executor's stream, by its kernel.
  const bool device = on_device(spec);
  const auto copy_scaled = [&](const std::vector<CopySpan>& spans, double factor) {
    if (device) {
      if (factor == 1 && spans.size() == 1 && spans[0].dst == spans[0].src)
        return Status::success();
      return options_.device_memory->copy_scaled(spans.data(), spans.size(), spec.dtype, factor,
                                                 spec.device, w.stream);
    }
    for (const CopySpan& c : spans) scale(c.dst, c.src, c.count, spec.dtype, factor);
    return Status::success();
  };
  if (m == 0 && spec.prescale == 1) {
    HVD_RETURN_IF_ERROR(data_.reduce_scatter(args_for(w, w.send, w.recv, q * row)));
    return copy_scaled({{w.recv, w.recv, mine}}, spec.postscale);
  }
  // Uneven or prescaled (staged CUDA memory: prepare() refuses these): every rank's block padded
  // to q + 1 rows in a buffer of hvd's, scaled on the way in, and this rank's rows copied out.
  const uint64_t block = (m == 0 ? q : q + 1) * row;
  const size_t in_bytes = n * block * element;
  char* in = nullptr;
  if (device) {
    HVD_ASSIGN_OR_RETURN(in, device_executor_->scratch(spec.device, in_bytes + block * element));
  } else {
    scratch_.assign(in_bytes + block * element, 0);
    in = scratch_.data();
  }
  char* out = in + in_bytes;
  std::vector<CopySpan> blocks;
  const char* from = static_cast<const char*>(w.send);
  for (uint64_t r = 0; r < n; ++r) {
    const uint64_t count = (q + (r < m ? 1 : 0)) * row;
    blocks.push_back({in + r * block * element, from, count});
    from += count * element;
  }
  HVD_RETURN_IF_ERROR(copy_scaled(blocks, spec.prescale));
  HVD_RETURN_IF_ERROR(data_.reduce_scatter(args_for(w, in, out, block)));
  return copy_scaled({{w.recv, out, mine}}, spec.postscale);
}

Status Scheduler::run_alltoall(Entry& e) {
  const Submission& w = e.what;
  const size_t element = hvd_dtype_size(w.spec.dtype);
  const size_t n = static_cast<size_t>(data_.size());
  const size_t rank = static_cast<size_t>(data_.rank());
  uint64_t row = 1;  // elements per row (the same on every rank)
  for (size_t i = 1; i < w.spec.shape.size(); ++i) row *= static_cast<uint64_t>(w.spec.shape[i]);
  // The negotiated splits of every rank, in elements; the negotiator checked every sum.
  std::vector<uint64_t> matrix(n * n);
  for (size_t i = 0; i < n * n; ++i) matrix[i] = static_cast<uint64_t>(e.first_dims[i]) * row;
  std::vector<uint64_t> recv_counts(n);
  std::vector<int64_t> received(n);
  uint64_t total = 0;
  int64_t first_dim = 0;
  for (size_t r = 0; r < n; ++r) {
    recv_counts[r] = matrix[r * n + rank];
    received[r] = e.first_dims[r * n + rank];
    total += recv_counts[r];
    first_dim += received[r];
  }
  std::unique_ptr<char[]> allocated;
  HVD_ASSIGN_OR_RETURN(void* const recv, output_of(w, total * element, &allocated));
  hvd_collective_args a = args_for(w, w.send, recv, e.elements);
  a.send_counts = matrix.data() + rank * n;
  a.recv_counts = recv_counts.data();
  const Status status = data_.alltoall(a, matrix.data());
  if (status.ok()) {
    if (w.recv == nullptr) e.completion->set_output(std::move(allocated), first_dim);
    e.completion->set_received_splits(std::move(received));
  }
  return status;
}

void Scheduler::finish(Entry* e, const Status& status, const DeviceWork& on_device) {
  finish(std::vector<Entry*>{e}, status, on_device);
}

void Scheduler::finish(const std::vector<Entry*>& entries, const Status& status,
                       const DeviceWork& on_device) {
  std::vector<std::shared_ptr<Completion>> completions;
  completions.reserve(entries.size());
  for (Entry* e : entries) {
    completions.push_back(std::move(e->completion));
    if (e->sent) sent_.erase(e->what.name);  // still there if it fails unanswered (fail_all)
    // Its device work (if any) is queued after its ready event: the event may serve again.
    if (device_executor_)
      device_executor_->release(std::exchange(e->ready, {}), e->what.spec.device);
  }
  {
    // The names are free before anyone learns of the completions: a caller that waits and then
    // submits the same name again must not find it in flight. One lock for the whole batch.
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry* e : entries) {
      if (e->stand_in) {
        e->stand_in.reset();  // a stand-in's name was never in flight
      } else {
        auto name = in_flight_.extract(e->what.name);
        if (spare_names_.size() < kSpareEntries) spare_names_.push_back(std::move(name));
      }
      if (spare_.size() < kSpareEntries) {
        spare_.splice(spare_.begin(), pending_, e->self);
      } else {
        pending_.erase(e->self);
      }
    }
  }
  tensors_ += completions.size();
  Completion::complete_all(completions, status, on_device);
}

Scheduler::Stats Scheduler::stats() const {
  Stats s;
  s.cycles = cycles_;
  s.full_negotiations = full_negotiations_;
  s.negotiation_seconds = static_cast<double>(negotiation_ns_) * 1e-9;
  s.tensors = tensors_;
  s.backend_calls = backend_calls_;
  return s;
}

void Scheduler::fail_all(const Status& status) {
  std::list<Entry> never_taken;
  {
    // Stopped before any completion is seen: a caller that sees one and submits again must be
    // refused, not queued for a scheduler that no longer runs.
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = status;
    never_taken.swap(queue_);
    for (const Entry& e : never_taken) in_flight_.erase(e.what.name);
  }
  std::vector<Entry*> entries;
  for (Entry& e : pending_) entries.push_back(&e);
  finish(entries, status);
  held_.clear();
  for (Entry& e : never_taken) {
    if (device_executor_) device_executor_->release(e.ready, e.what.spec.device);
    e.completion->complete(status);
  }
}

}  // namespace hvd::core
