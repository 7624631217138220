#include "api/session.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status_text.hpp"
#include "hvd/sdk/call_shape.hpp"

namespace hvd::core {
namespace {

Status closed_error() {
  return error(HVD_ERR_STATE, "comm is being finalized (hvd_finalize on another thread)");
}

// A barrier once the scheduler runs: a one-element allreduce in a dtype and op the backend
// takes (token holds any of them).
hvd_collective_args barrier_args(const Plugin& plugin, uint64_t* token) {
  hvd_collective_args args = host_args(token, token, 1, plugin.byte_dtype());
  args.op = plugin.any_reduce_op();
  return args;
}

// What a thread that would not stop may still use: kept reachable, never freed.
void keep_forever(std::shared_ptr<void> kept) {
  static auto* const mutex = new std::mutex;
  static auto* const kept_forever = new std::vector<std::shared_ptr<void>>;
  std::lock_guard<std::mutex> lock(*mutex);
  kept_forever->push_back(std::move(kept));
}

}  // namespace

Result<std::shared_ptr<Session>> Session::open(const CommOptions& options, const Settings& settings,
                                               const EnvLookup& env) {
  HVD_ASSIGN_OR_RETURN(auto impl, Communicator::create(options, settings, env));
  auto session = std::make_shared<Session>();
  session->impl_ = std::move(impl);
  session->check_args_ = settings.flag(Knob::kCheckArgs);
  return session;
}

// What carries host bytes between the ranks for hvd itself (negotiation, argument checks): the
// backend, or where it cannot (NCCL has no host memory; a plugin may lack the dtypes or the op
// negotiation needs) a controller backend (HVD_CONTROLLER, default gloo), made on first use on
// every rank alike. Under scheduler_mutex.
Result<Communicator*> Session::controller_locked() {
  if (closed_) return closed_error();
  const Plugin& plugin = impl_->plugin();
  if (Scheduler::can_negotiate_over(plugin.capabilities, plugin.dtypes, plugin.reduce_ops)) {
    return impl_.get();
  }
  if (!controller_) {
    CommOptions controller;
    const Settings& settings = impl_->settings();
    controller.backend = settings.text(Knob::kController);
    controller.timeout = impl_->timeout();
    controller.purpose = "the controller of " + plugin.name;
    HVD_ASSIGN_OR_RETURN(controller_, Communicator::create(controller, settings, process_env()));
  }
  return controller_.get();
}

// The scheduler of `comm`, started on first use (with the knobs hvd_init read).
Result<std::shared_ptr<Scheduler>> Session::scheduler() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return closed_error();
  if (!scheduler_) {
    auto options = SchedulerOptions::from(impl_->settings());
    options.timeout = impl_->timeout();
    if (parent_ && !options.timeline.empty()) {  // each communicator's rank 0 writes its own
      char id[24];
      std::snprintf(id, sizeof id, ".comm-%016llx", static_cast<unsigned long long>(impl_->id()));
      options.timeline += id;
    }
    HVD_ASSIGN_OR_RETURN(Communicator * control, controller_locked());
    HVD_ASSIGN_OR_RETURN(scheduler_, Scheduler::start(*impl_, *control, std::move(options)));
    scheduled_.store(true, std::memory_order_release);
  }
  return scheduler_;
}

// Breaks the communicator and its controller with `why`: calls in progress return, and every
// later one, and everything the scheduler holds, fails with it.
void Session::abort(const Status& why) {
  impl_->abort(why);
  std::vector<std::shared_ptr<Session>> children;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (controller_) controller_->abort(why);
    for (const auto& weak : children_) {
      if (auto child = weak.lock()) children.push_back(std::move(child));
    }
  }
  for (const auto& child : children) child->abort(why);
}

// A blocking collective once the scheduler runs: submitted under a name every rank derives
// alike (the n-th blocking call), then waited for, no longer than the call's limit from `entry`.
// An alltoall's received counts go to `received` (its a.recv_counts is the recv buffer's
// capacity then, one element).
// With a task, the call is that task (run on the scheduler's thread in the call's place).
Status Session::through_scheduler(const char* api, hvd_collective type,
                                  const hvd_collective_args& a, Clock::time_point entry,
                                  uint64_t* received, std::function<Status()> task) {
  Submission s;
  s.task = std::move(task);
  const bool is_task = static_cast<bool>(s.task);
  s.name = "hvd.blocking." + std::to_string(blocking_calls_++);
  s.send = a.sendbuf;
  s.recv = a.recvbuf;
  s.spec.type = type;
  s.spec.dtype = a.dtype;
  s.spec.shape = {static_cast<int64_t>(a.count)};
  s.spec.op = a.op;
  s.spec.root = a.root;
  s.spec.memory = a.memory_type;
  s.spec.device = a.device;
  s.stream = a.stream;
  if (type == HVD_COLLECTIVE_ALLTOALL) {  // rows of one element; the caller's capacity
    s.spec.splits.assign(a.send_counts, a.send_counts + impl_->size());
    s.spec.output_capacity = a.recv_counts[0];
    s.capacity_given = true;
  } else if (type == HVD_COLLECTIVE_REDUCE_SCATTER) {
    int64_t rows = 0;  // too many: a negative dimension, refused at submission
    if (a.count > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(static_cast<int64_t>(a.count), impl_->size(), &rows)) {
      rows = -1;
    }
    s.spec.shape = {rows};
  } else if (a.recv_counts != nullptr) {  // allgatherv: recv holds the counts' sum
    const int size = impl_->world().size;
    uint64_t total = 0;
    for (int r = 0; r < size; ++r) {
      if (__builtin_add_overflow(total, a.recv_counts[r], &total)) {
        total = UINT64_MAX;  // fails the tensor's checks, on every rank
        break;
      }
    }
    s.spec.output_capacity = total;
  }
  // A task's shape has two dimensions, which no blocking collective's has: a rank that makes a
  // collective where another splits fails with a mismatch instead of waiting.
  if (is_task) s.spec.shape = {0, 0};
  const std::string name = s.name;
  HVD_ASSIGN_OR_RETURN(const auto scheduler, scheduler());
  HVD_ASSIGN_OR_RETURN(auto completion, scheduler->submit(std::move(s)));
  const Clock::time_point deadline = entry + limit();
  const Status done = completion->wait(std::max(Clock::duration::zero(), deadline - Clock::now()));
  if (completion->done()) {
    if (done.ok() && received != nullptr) {
      std::vector<int64_t> splits;
      HVD_RETURN_IF_ERROR(completion->received_splits(&splits));
      for (size_t r = 0; r < splits.size(); ++r) received[r] = static_cast<uint64_t>(splits[r]);
    }
    return done;
  }
  // Some rank never made this call, or the backend is stuck: abort, so that the scheduler lets
  // go of the buffers before this call returns, and every rank learns.
  const Status why = error(
      HVD_ERR_TIMEOUT,
      std::string(api) + " (blocking call '" + name + "') did not complete within HVD_TIMEOUT (" +
          seconds_text(impl_->timeout()) + ") + " + seconds_text(Communicator::kMargin) +
          ": not every rank made it, or the backend did not return; the "
          "communicator was aborted");
  abort(why);
  (void)completion->wait(limit());
  return why;
}

// HVD_CHECK_ARGS: what each rank is about to call, compared before anyone calls it.
struct ArgsRecord {
  uint64_t sequence;  // the n-th checked call: ranks out of step show here too
  hvd::sdk::CallShape shape;
  int32_t error_code;  // this rank's own checks failed: with `error`
  int32_t reserved;
  char error[200];
};
static_assert(sizeof(ArgsRecord) == 264 && sizeof(ArgsRecord) % 8 == 0, "a fixed, padded record");

// Every rank's record of this call; the same verdict on every rank.
Status Session::check_args(hvd_collective type, const hvd_collective_args& a, const Status& mine) {
  ArgsRecord record{};
  record.sequence = checked_calls_++;
  const int size = impl_->world().size;
  record.shape = hvd::sdk::CallShape::of(type, type == HVD_COLLECTIVE_BARRIER ? nullptr : &a, size);
  if (!mine.ok()) {
    record.error_code = mine.code();
    std::snprintf(record.error, sizeof record.error, "%s", mine.message().c_str());
  }
  Communicator* carrier = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HVD_ASSIGN_OR_RETURN(carrier, controller_locked());
  }
  std::vector<ArgsRecord> all(static_cast<size_t>(size));
  HVD_RETURN_IF_ERROR(
      carrier->allgather(carrier->control_args(&record, all.data(), sizeof record))
          .with_context("checking the arguments of a blocking call (HVD_CHECK_ARGS)"));
  for (int r = 0; r < size; ++r) {
    const ArgsRecord& theirs = all[static_cast<size_t>(r)];
    if (theirs.error_code != 0) {
      return error(known_error(theirs.error_code, HVD_ERR_REMOTE),
                   "the call failed on rank " + std::to_string(r) + ": " +
                       std::string(theirs.error, strnlen(theirs.error, sizeof theirs.error)));
    }
  }
  for (int r = 1; r < size; ++r) {
    ArgsRecord first = all[0];
    ArgsRecord theirs = all[static_cast<size_t>(r)];
    std::memset(first.error, 0, sizeof first.error);
    std::memset(theirs.error, 0, sizeof theirs.error);
    if (std::memcmp(&first, &theirs, sizeof first) == 0) continue;
    if (first.sequence != theirs.sequence) {
      return error(HVD_ERR_MISMATCH,
                   "Mismatched blocking collectives (HVD_CHECK_ARGS): rank 0 is at its "
                   "checked call " +
                       std::to_string(first.sequence) + ", but rank " + std::to_string(r) +
                       " at its call " + std::to_string(theirs.sequence));
    }
    return error(HVD_ERR_MISMATCH,
                 "Mismatched blocking collectives (HVD_CHECK_ARGS): rank 0 "
                 "called " +
                     first.shape.describe() + ", but rank " + std::to_string(r) + " called " +
                     theirs.shape.describe() + ".");
  }
  return Status::success();
}

// The blocking alltoall's counts: every rank's send counts and recv capacity, gathered, so that
// every rank derives its recv_counts and judges every rank's capacity alike. `mine` is this
// rank's own check: a rank that failed it fails the call on every rank. Returns the size x size
// matrix of send counts (row r: rank r's).
Result<std::vector<uint64_t>> Session::alltoall_counts(const hvd_collective_args& a,
                                                       uint64_t capacity, const Status& mine) {
  const size_t n = static_cast<size_t>(impl_->size());
  const size_t fields = n + 2;  // [status, capacity, send_counts...]
  std::vector<uint64_t> record(fields, 0);
  record[0] = static_cast<uint64_t>(mine.ok() ? HVD_SUCCESS : mine.code());
  record[1] = a.recvbuf != nullptr ? capacity : 0;  // NULL holds nothing, whatever was said
  if (mine.ok()) std::copy(a.send_counts, a.send_counts + n, record.begin() + 2);
  Communicator* carrier = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HVD_ASSIGN_OR_RETURN(carrier, controller_locked());
  }
  std::vector<uint64_t> all(fields * n);
  HVD_RETURN_IF_ERROR(
      carrier
          ->allgather(carrier->control_args(record.data(), all.data(), fields * sizeof(uint64_t)))
          .with_context("hvd_alltoall: exchanging the counts"));
  if (!mine.ok()) return mine;  // this rank's own words first
  for (size_t r = 0; r < n; ++r) {
    const auto code = static_cast<hvd_status>(all[r * fields]);
    if (code == HVD_SUCCESS) continue;
    return error(known_error(code, HVD_ERR_REMOTE),
                 "hvd_alltoall failed on rank " + std::to_string(r) + " (" + hvd_status_name(code) +
                     ": its own arguments)");
  }
  std::vector<uint64_t> matrix(n * n);
  for (size_t r = 0; r < n; ++r) {
    std::copy_n(all.begin() + static_cast<ptrdiff_t>(r * fields + 2), n,
                matrix.begin() + static_cast<ptrdiff_t>(r * n));
  }
  for (size_t d = 0; d < n; ++d) {
    uint64_t receives = 0;
    bool overflow = false;
    for (size_t r = 0; r < n; ++r) {
      overflow |= __builtin_add_overflow(receives, matrix[r * n + d], &receives);
    }
    const uint64_t holds = all[d * fields + 1];
    if (!overflow && receives <= holds) continue;
    return error(HVD_ERR_INVALID_ARGUMENT,
                 "hvd_alltoall: rank " + std::to_string(d) + " receives " +
                     (overflow ? std::string("more than 2^64") : std::to_string(receives)) +
                     " elements, but its recv_capacity is " + std::to_string(holds));
  }
  return matrix;
}

Status Session::barrier() {
  HVD_RETURN_IF_ERROR(usable());
  if (scheduled_.load(std::memory_order_acquire)) {
    uint64_t token = 0;  // a one-element allreduce, in the scheduler's order
    return through_scheduler("hvd_barrier", HVD_COLLECTIVE_ALLREDUCE,
                             barrier_args(impl_->plugin(), &token), Clock::now());
  }
  const CallScope scope(*impl_, "hvd_barrier");
  if (check_args_) {
    HVD_RETURN_IF_ERROR(check_args(HVD_COLLECTIVE_BARRIER,
                                   host_args(nullptr, nullptr, 0, HVD_UINT8), Status::success()));
  }
  return impl_->barrier();
}

Status Session::alltoall(hvd_collective_args& args, uint64_t recv_capacity, uint64_t* received) {
  HVD_RETURN_IF_ERROR(usable());
  const int size = impl_->size();
  if (scheduled_.load(std::memory_order_acquire)) {
    args.recv_counts = &recv_capacity;
    return through_scheduler("hvd_alltoall", HVD_COLLECTIVE_ALLTOALL, args, Clock::now(), received);
  }
  const CallScope scope(*impl_, "hvd_alltoall");
  const Status mine = impl_->check_alltoall_send(args);
  if (check_args_) {
    HVD_RETURN_IF_ERROR(check_args(HVD_COLLECTIVE_ALLTOALL, args, Status::success()));
  }
  HVD_ASSIGN_OR_RETURN(const std::vector<uint64_t> matrix,
                       alltoall_counts(args, recv_capacity, mine));
  for (int r = 0; r < size; ++r) {
    received[r] = matrix[static_cast<size_t>(r) * static_cast<size_t>(size) +
                         static_cast<size_t>(impl_->rank())];
  }
  args.recv_counts = received;
  if (check_args_) args.flags |= HVD_CALL_RANKS_AGREE;
  return impl_->alltoall(args, matrix.data());
}

// Every bounded wait of hvd_finalize, in order: the scheduler's last cycle (aborted if it
// overruns), then the controller's and the backend's release.
Status Session::finalize(const std::shared_ptr<Session>& self) {
  Session& c = *self;
  const Clock::time_point deadline = Clock::now() + c.limit();
  std::optional<Status> failure;
  std::shared_ptr<Scheduler> scheduler;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    c.closed_ = true;  // no scheduler starts from now on
    scheduler = std::move(c.scheduler_);
  }
  if (scheduler) {
    if (!scheduler->stop_by(deadline)) {
      const Status overran =
          error(HVD_ERR_TIMEOUT,
                "hvd_finalize: the scheduler's last cycle did not end within "
                "HVD_TIMEOUT (" +
                    seconds_text(c.impl_->timeout()) + ") + " +
                    seconds_text(Communicator::kMargin) + ": the communicator was aborted");
      c.abort(overran);
      // The abort ends the backend call in progress; a plugin whose abort does not is left its
      // thread, and everything that thread uses is kept, never freed.
      if (!scheduler->stop_by(Clock::now() + c.limit())) {
        keep_forever(std::move(scheduler));
        keep_forever(self);
        return overran;
      }
    }
    failure = scheduler->failure();
    scheduler.reset();  // joins (if last): every backend call it makes now returns in its limit
  }
  // A stall shutdown or a failed collective ended the scheduler on every rank: release alone,
  // and report it.
  if (failure) c.abort(*failure);
  const Status controller = c.controller_ ? c.controller_->finalize() : Status::success();
  const Status backend = c.impl_->finalize();
  return !backend.ok() ? backend : controller;
}

// This rank's child of `c` (null for no child) from every rank's record: the records gathered
// over the carrier, then the backend's and the controller's children made. Calls the backends
// directly: on the application's thread before the scheduler runs, on the scheduler's after.
Result<std::shared_ptr<Session>> Session::make_child(const Communicator::SplitRecord& mine,
                                                     const Status& mine_valid,
                                                     const std::string& what) {
  Communicator* carrier = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HVD_ASSIGN_OR_RETURN(carrier, controller_locked());
  }
  std::vector<Communicator::SplitRecord> records(static_cast<size_t>(impl_->size()));
  static_assert(sizeof(Communicator::SplitRecord) % 8 == 0, "control records are 8-byte words");
  HVD_RETURN_IF_ERROR(carrier->allgather(carrier->control_args(&mine, records.data(), sizeof mine))
                          .with_context(what + ": gathering every rank's color and key"));
  // A rank whose own arguments failed fails the call on every rank, with its code.
  if (!mine_valid.ok()) return mine_valid;
  for (size_t r = 0; r < records.size(); ++r) {
    const auto code = static_cast<hvd_status>(records[r].error);
    if (code == HVD_SUCCESS) continue;
    return error(known_error(code, HVD_ERR_REMOTE), what + " failed on rank " + std::to_string(r) +
                                                        " (" + hvd_status_name(code) +
                                                        ": its own arguments)");
  }
  // Both splits are made whatever the first gives: every rank then counts them alike.
  Result<std::unique_ptr<Communicator>> impl = impl_->split(records, what);
  Result<std::unique_ptr<Communicator>> controller = std::unique_ptr<Communicator>();
  if (controller_) controller = controller_->split(records, what + " (its controller)");
  HVD_RETURN_IF_ERROR(impl.status());
  HVD_RETURN_IF_ERROR(controller.status());
  if (!*impl) return std::shared_ptr<Session>();
  auto child = std::make_shared<Session>();
  child->impl_ = std::move(impl).value();
  child->controller_ = std::move(controller).value();
  child->check_args_ = check_args_;
  return child;
}

Result<std::shared_ptr<Session>> Session::split(const Communicator::SplitRecord& mine,
                                                const Status& mine_valid, const char* api) {
  HVD_RETURN_IF_ERROR(usable());
  std::shared_ptr<Session> child;
  if (scheduled_.load(std::memory_order_acquire)) {
    // Once the scheduler runs it alone calls the backends: the split is a blocking call it runs
    // in its turn. This session is alive whenever the task runs: finalize stops the scheduler
    // before it lets go.
    auto made = std::make_shared<std::shared_ptr<Session>>();
    HVD_RETURN_IF_ERROR(
        through_scheduler(api, HVD_COLLECTIVE_ALLREDUCE, host_args(nullptr, nullptr, 0, HVD_UINT8),
                          Clock::now(), nullptr, [this, mine, mine_valid, api, made]() -> Status {
                            HVD_ASSIGN_OR_RETURN(*made, make_child(mine, mine_valid, api));
                            return Status::success();
                          }));
    child = std::move(*made);
  } else {
    const CallScope scope(*impl_, api);
    HVD_ASSIGN_OR_RETURN(child, make_child(mine, mine_valid, api));
  }
  if (!child) return child;
  child->parent_ = shared_from_this();
  live_children_.fetch_add(1);
  std::lock_guard<std::mutex> lock(mutex_);
  children_.erase(std::remove_if(children_.begin(), children_.end(),
                                 [](const std::weak_ptr<Session>& w) { return w.expired(); }),
                  children_.end());
  children_.push_back(child);
  return child;
}

}  // namespace hvd::core
