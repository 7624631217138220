// scheduler.cpp — the fusion scheduler's coordinator: tensors submitted and queued, the
// background cycle that negotiates which are ready on every rank (negotiation.hpp) and hands them
// to the executors (host_executor.cpp, device_executor.cpp), stalls, shutdown and failure.
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
