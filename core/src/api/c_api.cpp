// The public C API (hvd.h): a thin hourglass over Communicator. No exception crosses it.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/handles.hpp"
#include "comm/communicator.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/hvd.h"
#include "hvd/sdk/call_shape.hpp"
#include "hvd/sdk/fnv.hpp"
#include "scheduler/scheduler.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using hvd::core::Communicator;
using hvd::core::seconds_text;
using hvd::core::Submission;

// What an hvd_comm handle names. Members are destroyed in reverse: the scheduler stops before
// the backends it runs on.
struct CommState {
  std::unique_ptr<Communicator> impl;
  std::unique_ptr<Communicator> controller;  // negotiation and checks, when impl cannot carry them
  std::mutex scheduler_mutex;  // guards the scheduler's and the controller's making, and closed
  // Shared with callers that got it before a finalize on another thread took it: what they
  // submit then is refused by the stopped scheduler, never run on a released backend.
  std::shared_ptr<hvd::core::Scheduler> scheduler;
  bool closed = false;                      // hvd_finalize has begun
  std::atomic<bool> scheduled{false};       // set once the scheduler runs every collective
  std::atomic<uint64_t> blocking_calls{0};  // names blocking calls once they go through it
  bool check_args = false;                  // HVD_CHECK_ARGS: blocking calls compared first
  uint64_t checked_calls = 0;               // numbers them (the caller's thread only)

  // Communicators from communicators: a child keeps its parent alive, and counts itself in
  // while it lives (a parent with live children cannot be finalized).
  std::shared_ptr<CommState> parent;
  std::atomic<int> live_children{0};
  std::vector<std::weak_ptr<CommState>> children;  // under scheduler_mutex: aborts reach them

  // How long a blocking hvd_* call may take, from its entry.
  Clock::duration limit() const { return impl->timeout() + Communicator::kMargin; }
};

hvd::core::HandleTable<CommState>& comms() {
  static auto* const table = new hvd::core::HandleTable<CommState>;  // outlives every caller
  return *table;
}
hvd::core::HandleTable<hvd::core::Completion>& requests() {
  static auto* const table = new hvd::core::HandleTable<hvd::core::Completion>;
  return *table;
}

hvd_request* request_of(std::shared_ptr<hvd::core::Completion> completion) {
  return reinterpret_cast<hvd_request*>(requests().insert(std::move(completion)));
}
std::shared_ptr<hvd::core::Completion> completion_of(hvd_request* request) {
  return requests().find(reinterpret_cast<uintptr_t>(request));
}
std::shared_ptr<CommState> state_of(const hvd_comm* comm) {
  return comms().find(reinterpret_cast<uintptr_t>(comm));
}

// The calling thread's last error. The success path only reads a flag, not the string (whose
// thread_local needs an init guard): bench/micro times every call. Not initial-exec: libhvd
// must load with dlopen (Python's extension does), and its TLS block (4 KiB of the static CUDA
// runtime's among it) does not fit the static TLS glibc keeps for that; TLS descriptors
// (core/CMakeLists.txt) make the access as cheap where libhvd was loaded at start.
thread_local std::string t_last_error;
thread_local bool t_has_last_error = false;

hvd_status finish(const hvd::Status& status) {
  if (status.ok()) {
    if (t_has_last_error) {
      t_last_error.clear();
      t_has_last_error = false;
    }
  } else {
    t_last_error = status.message();
    t_has_last_error = true;
  }
  return status.code();
}

template <typename Fn>
hvd_status guarded(Fn&& fn) noexcept {
  try {
    return finish(fn());
  } catch (const std::exception& e) {
    return finish(hvd::error(HVD_ERR_INTERNAL, std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return finish(hvd::error(HVD_ERR_INTERNAL, "unexpected non-standard exception"));
  }
}

// The communicator a handle names, kept alive for the call.
hvd::Result<std::shared_ptr<CommState>> require(const hvd_comm* comm) {
  if (comm == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "comm is NULL");
  std::shared_ptr<CommState> state = state_of(comm);
  if (!state) {
    return hvd::error(HVD_ERR_STATE,
                      "comm is not a live communicator (finalized already, or never made)");
  }
  return state;
}

// A struct the application filled in: its struct_size must cover at least the struct's 1.0
// fields. An application built against an older hvd.h passes a smaller struct than this hvd's,
// so fields after 1.0 are read only where HVD_HAS_FIELD says the struct has them.
hvd::Status check_size(size_t struct_size, size_t size_1_0, const char* type) {
  if (struct_size >= size_1_0) return hvd::Status::success();
  return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                    std::string(type) + ".struct_size is " + std::to_string(struct_size) +
                        ", less than the " + std::to_string(size_1_0) +
                        " bytes of its first version: set it to sizeof(" + type + ")");
}

// Sets the memory type, device and stream `placement` names on `args` (null: they stay host
// memory); fails where its struct_size is below version 1.0's. It fills the caller's `args`
// rather than returning a copy: on the fast path, a copy's wide loads stall on the narrow stores
// just made.
hvd::Status place(hvd_collective_args& args, const hvd_placement* placement) {
  if (placement == nullptr) return hvd::Status::success();
  HVD_RETURN_IF_ERROR(check_size(placement->struct_size, HVD_PLACEMENT_SIZE_1_0, "hvd_placement"));
  args.memory_type = placement->memory_type;
  args.device = placement->device;
  args.stream = placement->stream;
  return hvd::Status::success();
}

// A barrier once the scheduler runs: a one-element allreduce in a dtype and op the backend
// takes (token holds any of them).
hvd_collective_args barrier_args(const hvd::core::Plugin& plugin, uint64_t* token) {
  hvd_collective_args args = hvd::core::host_args(token, token, 1, plugin.byte_dtype());
  args.op = plugin.any_reduce_op();
  return args;
}

// A broken communicator fails every call with the error that broke it (a broken controller
// breaks it too: the scheduler aborts both when either fails). One atomic load per call.
hvd::Status usable(CommState& c) { return c.impl->health(); }

hvd::Status closed_error() {
  return hvd::error(HVD_ERR_STATE, "comm is being finalized (hvd_finalize on another thread)");
}

// What carries host bytes between the ranks for hvd itself (negotiation, argument checks): the
// backend, or where it cannot (NCCL has no host memory; a plugin may lack the dtypes or the op
// negotiation needs) a controller backend (HVD_CONTROLLER, default gloo), made on first use on
// every rank alike. Under scheduler_mutex.
hvd::Result<Communicator*> controller_locked(CommState& c) {
  if (c.closed) return closed_error();
  const hvd::core::Plugin& plugin = c.impl->plugin();
  if (hvd::core::Scheduler::can_negotiate_over(plugin.capabilities, plugin.dtypes,
                                               plugin.reduce_ops)) {
    return c.impl.get();
  }
  if (!c.controller) {
    hvd::core::CommOptions controller;
    const hvd::core::Settings& settings = c.impl->settings();
    controller.backend = settings.text(hvd::core::Knob::kController);
    controller.timeout = c.impl->timeout();
    controller.purpose = "the controller of " + plugin.name;
    HVD_ASSIGN_OR_RETURN(c.controller,
                         Communicator::create(controller, settings, hvd::core::process_env()));
  }
  return c.controller.get();
}

// The scheduler of `comm`, started on first use (with the knobs hvd_init read).
hvd::Result<std::shared_ptr<hvd::core::Scheduler>> scheduler_of(CommState& c) {
  std::lock_guard<std::mutex> lock(c.scheduler_mutex);
  if (c.closed) return closed_error();
  if (!c.scheduler) {
    auto options = hvd::core::SchedulerOptions::from(c.impl->settings());
    options.timeout = c.impl->timeout();
    if (c.parent && !options.timeline.empty()) {  // each communicator's rank 0 writes its own
      char id[24];
      std::snprintf(id, sizeof id, ".comm-%016llx", static_cast<unsigned long long>(c.impl->id()));
      options.timeline += id;
    }
    HVD_ASSIGN_OR_RETURN(Communicator * control, controller_locked(c));
    HVD_ASSIGN_OR_RETURN(c.scheduler,
                         hvd::core::Scheduler::start(*c.impl, *control, std::move(options)));
    c.scheduled.store(true, std::memory_order_release);
  }
  return c.scheduler;
}

// One tensor of the C API into *s, checked for what the C side alone can get wrong.
hvd::Status unknown_request() {
  return hvd::error(HVD_ERR_STATE, "request is not a live request (freed already, or never made)");
}

// `size`: the communicator's, the number of an alltoall's splits.
hvd::Status submission_of(const hvd_tensor& t, int size, Submission* s) {
  HVD_RETURN_IF_ERROR(check_size(t.struct_size, HVD_TENSOR_SIZE_1_0, "hvd_tensor"));
  if (t.collective < HVD_COLLECTIVE_ALLREDUCE || t.collective > HVD_COLLECTIVE_ALLTOALL) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                      "collective " + std::to_string(t.collective) + " (" +
                          hvd_collective_name(t.collective) +
                          ") is not one a tensor can name: allreduce, allgather, broadcast, "
                          "reduce_scatter or alltoall");
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, "a shape is NULL or has negative ndim");
  }
  s->name = t.name != nullptr ? t.name : "";
  s->send = t.sendbuf;
  s->recv = t.recvbuf;
  hvd::core::TensorSpec& spec = s->spec;
  spec.type = t.collective;
  spec.dtype = t.dtype;
  if (t.ndim > 0) spec.shape.assign(t.shape, t.shape + t.ndim);
  spec.op = t.op;
  spec.root = t.root;
  spec.prescale = t.prescale == 0 ? 1 : t.prescale;
  spec.postscale = t.postscale == 0 ? 1 : t.postscale;
  if (HVD_HAS_FIELD(&t, hvd_tensor, splits) && t.splits != nullptr &&
      t.collective == HVD_COLLECTIVE_ALLTOALL) {
    spec.splits.assign(t.splits, t.splits + size);
  }
  if (t.placement != nullptr) {
    HVD_RETURN_IF_ERROR(
        check_size(t.placement->struct_size, HVD_PLACEMENT_SIZE_1_0, "hvd_placement"));
    spec.memory = t.placement->memory_type;
    spec.device = t.placement->device;
    s->stream = t.placement->stream;
  }
  return hvd::Status::success();
}

hvd::Status enqueue(hvd_comm* comm, const hvd_tensor* tensors, size_t count,
                    hvd_request** requests) {
  HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
  HVD_RETURN_IF_ERROR(usable(*c));
  if (requests == nullptr || (count > 0 && tensors == nullptr)) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, "tensors or requests is NULL");
  }
  if (count == 1) {  // every hvd_*_async call: no group to build
    Submission s;
    HVD_RETURN_IF_ERROR(submission_of(tensors[0], c->impl->size(), &s));
    HVD_ASSIGN_OR_RETURN(const auto scheduler, scheduler_of(*c));
    HVD_ASSIGN_OR_RETURN(auto completion, scheduler->submit(std::move(s)));
    requests[0] = request_of(std::move(completion));
    return hvd::Status::success();
  }
  // The array's stride is its elements' struct_size: an application built against an older
  // hvd.h passes smaller elements than this hvd's hvd_tensor.
  const size_t stride = tensors[0].struct_size;
  HVD_RETURN_IF_ERROR(check_size(stride, HVD_TENSOR_SIZE_1_0, "hvd_tensor"));
  std::vector<Submission> group(count);
  for (size_t i = 0; i < count; ++i) {
    const char* element = reinterpret_cast<const char*>(tensors) + i * stride;
    hvd_tensor t{};
    std::memcpy(&t, element, std::min(stride, sizeof t));
    if (t.struct_size != stride) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                        "hvd_tensor[" + std::to_string(i) + "].struct_size is " +
                            std::to_string(t.struct_size) + ", not the " + std::to_string(stride) +
                            " of the first: every element of the array has the same size");
    }
    HVD_RETURN_IF_ERROR(submission_of(t, c->impl->size(), &group[i]));
  }
  HVD_ASSIGN_OR_RETURN(const auto scheduler, scheduler_of(*c));
  HVD_ASSIGN_OR_RETURN(auto completions, scheduler->submit_group(std::move(group)));
  for (size_t i = 0; i < count; ++i) requests[i] = request_of(std::move(completions[i]));
  return hvd::Status::success();
}

// The fields every asynchronous call has; the caller adds op, scales or root.
hvd_tensor tensor_of(hvd_collective collective, const char* name, const void* sendbuf,
                     void* recvbuf, hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                     const hvd_placement* placement) {
  hvd_tensor t{};
  t.struct_size = sizeof t;
  t.collective = collective;
  t.name = name;
  t.sendbuf = sendbuf;
  t.recvbuf = recvbuf;
  t.dtype = dtype;
  t.ndim = ndim;
  t.shape = shape;
  t.placement = placement;
  return t;
}

// Breaks the communicator and its controller with `why`: calls in progress return, and every
// later one, and everything the scheduler holds, fails with it.
void abort_comm(CommState& c, const hvd::Status& why) {
  c.impl->abort(why);
  std::vector<std::shared_ptr<CommState>> children;
  {
    std::lock_guard<std::mutex> lock(c.scheduler_mutex);
    if (c.controller) c.controller->abort(why);
    for (const auto& weak : c.children) {
      if (auto child = weak.lock()) children.push_back(std::move(child));
    }
  }
  for (const auto& child : children) abort_comm(*child, why);
}

// A blocking collective once the scheduler runs: submitted under a name every rank derives
// alike (the n-th blocking call), then waited for, no longer than the call's limit from `entry`.
// An alltoall's received counts go to `received` (its a.recv_counts is the recv buffer's
// capacity then, one element).
// With a task, the call is that task (run on the scheduler's thread in the call's place).
hvd::Status through_scheduler(CommState& c, const char* api, hvd_collective type,
                              const hvd_collective_args& a, Clock::time_point entry,
                              uint64_t* received = nullptr,
                              std::function<hvd::Status()> task = {}) {
  Submission s;
  s.task = std::move(task);
  const bool is_task = static_cast<bool>(s.task);
  s.name = "hvd.blocking." + std::to_string(c.blocking_calls++);
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
    s.spec.splits.assign(a.send_counts, a.send_counts + c.impl->size());
    s.spec.output_capacity = a.recv_counts[0];
    s.capacity_given = true;
  } else if (type == HVD_COLLECTIVE_REDUCE_SCATTER) {
    int64_t rows = 0;  // too many: a negative dimension, refused at submission
    if (a.count > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(static_cast<int64_t>(a.count), c.impl->size(), &rows)) {
      rows = -1;
    }
    s.spec.shape = {rows};
  } else if (a.recv_counts != nullptr) {  // allgatherv: recv holds the counts' sum
    const int size = c.impl->world().size;
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
  HVD_ASSIGN_OR_RETURN(const auto scheduler, scheduler_of(c));
  HVD_ASSIGN_OR_RETURN(auto completion, scheduler->submit(std::move(s)));
  const Clock::time_point deadline = entry + c.limit();
  const hvd::Status done =
      completion->wait(std::max(Clock::duration::zero(), deadline - Clock::now()));
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
  const hvd::Status why = hvd::error(
      HVD_ERR_TIMEOUT,
      std::string(api) + " (blocking call '" + name + "') did not complete within HVD_TIMEOUT (" +
          seconds_text(c.impl->timeout()) + ") + " + seconds_text(Communicator::kMargin) +
          ": not every rank made it, or the backend did not return; the "
          "communicator was aborted");
  abort_comm(c, why);
  (void)completion->wait(c.limit());
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
hvd::Status check_args(CommState& c, hvd_collective type, const hvd_collective_args& a,
                       const hvd::Status& mine) {
  ArgsRecord record{};
  record.sequence = c.checked_calls++;
  const int size = c.impl->world().size;
  record.shape = hvd::sdk::CallShape::of(type, type == HVD_COLLECTIVE_BARRIER ? nullptr : &a, size);
  if (!mine.ok()) {
    record.error_code = mine.code();
    std::snprintf(record.error, sizeof record.error, "%s", mine.message().c_str());
  }
  Communicator* carrier = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.scheduler_mutex);
    HVD_ASSIGN_OR_RETURN(carrier, controller_locked(c));
  }
  std::vector<ArgsRecord> all(static_cast<size_t>(size));
  HVD_RETURN_IF_ERROR(
      carrier->allgather(carrier->control_args(&record, all.data(), sizeof record))
          .with_context("checking the arguments of a blocking call (HVD_CHECK_ARGS)"));
  for (int r = 0; r < size; ++r) {
    const ArgsRecord& theirs = all[static_cast<size_t>(r)];
    if (theirs.error_code != 0) {
      return hvd::error(hvd::core::known_error(theirs.error_code, HVD_ERR_REMOTE),
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
      return hvd::error(HVD_ERR_MISMATCH,
                        "Mismatched blocking collectives (HVD_CHECK_ARGS): rank 0 is at its "
                        "checked call " +
                            std::to_string(first.sequence) + ", but rank " + std::to_string(r) +
                            " at its call " + std::to_string(theirs.sequence));
    }
    return hvd::error(HVD_ERR_MISMATCH,
                      "Mismatched blocking collectives (HVD_CHECK_ARGS): rank 0 "
                      "called " +
                          first.shape.describe() + ", but rank " + std::to_string(r) + " called " +
                          theirs.shape.describe() + ".");
  }
  return hvd::Status::success();
}

// The blocking alltoall's counts: every rank's send counts and recv capacity, gathered, so that
// every rank derives its recv_counts and judges every rank's capacity alike. `mine` is this
// rank's own check: a rank that failed it fails the call on every rank. Returns the size x size
// matrix of send counts (row r: rank r's).
hvd::Result<std::vector<uint64_t>> alltoall_counts(CommState& c, const hvd_collective_args& a,
                                                   uint64_t capacity, const hvd::Status& mine) {
  const size_t n = static_cast<size_t>(c.impl->size());
  const size_t fields = n + 2;  // [status, capacity, send_counts...]
  std::vector<uint64_t> record(fields, 0);
  record[0] = static_cast<uint64_t>(mine.ok() ? HVD_SUCCESS : mine.code());
  record[1] = a.recvbuf != nullptr ? capacity : 0;  // NULL holds nothing, whatever was said
  if (mine.ok()) std::copy(a.send_counts, a.send_counts + n, record.begin() + 2);
  Communicator* carrier = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.scheduler_mutex);
    HVD_ASSIGN_OR_RETURN(carrier, controller_locked(c));
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
    return hvd::error(hvd::core::known_error(code, HVD_ERR_REMOTE),
                      "hvd_alltoall failed on rank " + std::to_string(r) + " (" +
                          hvd_status_name(code) + ": its own arguments)");
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
    return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                      "hvd_alltoall: rank " + std::to_string(d) + " receives " +
                          (overflow ? std::string("more than 2^64") : std::to_string(receives)) +
                          " elements, but its recv_capacity is " + std::to_string(holds));
  }
  return matrix;
}

// Until it goes, no backend call of the blocking hvd_* call `api` runs past that call's limit
// (HVD_TIMEOUT + 1 s from the watchdog's first look at it, within 50 ms of its start).
class Bounded {
 public:
  Bounded(Communicator& comm, const char* api) : comm_(comm) { comm_.begin_serving(api); }
  ~Bounded() { comm_.end_serving(); }
  Bounded(const Bounded&) = delete;
  Bounded& operator=(const Bounded&) = delete;

 private:
  Communicator& comm_;
};

// A blocking collective: on the backend directly, or through the scheduler once it runs.
// `check` is the communicator's own check of the arguments, `direct` the call.
template <typename Check, typename Direct>
hvd::Status collective(const hvd_comm* comm, const char* api, hvd_collective type,
                       const hvd_collective_args& args, Check&& check, Direct&& direct) {
  HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
  HVD_RETURN_IF_ERROR(usable(*c));
  if (c->scheduled.load(std::memory_order_acquire)) {
    return through_scheduler(*c, api, type, args, Clock::now());
  }
  const Bounded bounded(*c->impl, api);
  if (c->check_args) {
    const hvd::Status mine = check(*c->impl);
    HVD_RETURN_IF_ERROR(check_args(*c, type, args, mine));
  }
  return direct(*c->impl);
}

// What a thread that would not stop may still use: kept reachable, never freed.
void keep_forever(std::shared_ptr<void> kept) {
  static auto* const mutex = new std::mutex;
  static auto* const kept_forever = new std::vector<std::shared_ptr<void>>;
  std::lock_guard<std::mutex> lock(*mutex);
  kept_forever->push_back(std::move(kept));
}

// Every bounded wait of hvd_finalize, in order: the scheduler's last cycle (aborted if it
// overruns), then the controller's and the backend's release.
hvd::Status finalize(const std::shared_ptr<CommState>& self) {
  CommState& c = *self;
  const Clock::time_point deadline = Clock::now() + c.limit();
  std::optional<hvd::Status> failure;
  std::shared_ptr<hvd::core::Scheduler> scheduler;
  {
    std::lock_guard<std::mutex> lock(c.scheduler_mutex);
    c.closed = true;  // no scheduler starts from now on
    scheduler = std::move(c.scheduler);
  }
  if (scheduler) {
    if (!scheduler->stop_by(deadline)) {
      const hvd::Status overran =
          hvd::error(HVD_ERR_TIMEOUT,
                     "hvd_finalize: the scheduler's last cycle did not end within "
                     "HVD_TIMEOUT (" +
                         seconds_text(c.impl->timeout()) + ") + " +
                         seconds_text(Communicator::kMargin) + ": the communicator was aborted");
      abort_comm(c, overran);
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
  if (failure) abort_comm(c, *failure);
  const hvd::Status controller = c.controller ? c.controller->finalize() : hvd::Status::success();
  const hvd::Status backend = c.impl->finalize();
  return !backend.ok() ? backend : controller;
}

// This rank's child of `c` (null for no child) from every rank's record: the records gathered
// over the carrier, then the backend's and the controller's children made. Calls the backends
// directly: on the application's thread before the scheduler runs, on the scheduler's after.
hvd::Result<std::shared_ptr<CommState>> make_child(CommState& c,
                                                   const Communicator::SplitRecord& mine,
                                                   const hvd::Status& mine_valid,
                                                   const std::string& what) {
  Communicator* carrier = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.scheduler_mutex);
    HVD_ASSIGN_OR_RETURN(carrier, controller_locked(c));
  }
  std::vector<Communicator::SplitRecord> records(static_cast<size_t>(c.impl->size()));
  static_assert(sizeof(Communicator::SplitRecord) % 8 == 0, "control records are 8-byte words");
  HVD_RETURN_IF_ERROR(carrier->allgather(carrier->control_args(&mine, records.data(), sizeof mine))
                          .with_context(what + ": gathering every rank's color and key"));
  // A rank whose own arguments failed fails the call on every rank, with its code.
  if (!mine_valid.ok()) return mine_valid;
  for (size_t r = 0; r < records.size(); ++r) {
    const auto code = static_cast<hvd_status>(records[r].error);
    if (code == HVD_SUCCESS) continue;
    return hvd::error(hvd::core::known_error(code, HVD_ERR_REMOTE),
                      what + " failed on rank " + std::to_string(r) + " (" + hvd_status_name(code) +
                          ": its own arguments)");
  }
  // Both splits are made whatever the first gives: every rank then counts them alike.
  hvd::Result<std::unique_ptr<Communicator>> impl = c.impl->split(records, what);
  hvd::Result<std::unique_ptr<Communicator>> controller = std::unique_ptr<Communicator>();
  if (c.controller) controller = c.controller->split(records, what + " (its controller)");
  HVD_RETURN_IF_ERROR(impl.status());
  HVD_RETURN_IF_ERROR(controller.status());
  if (!*impl) return std::shared_ptr<CommState>();
  auto child = std::make_shared<CommState>();
  child->impl = std::move(impl).value();
  child->controller = std::move(controller).value();
  child->check_args = c.check_args;
  return child;
}

// A split of `comm`, collective over its ranks: made at once, or, once its scheduler runs (it
// alone calls the backends then), as a blocking call the scheduler runs in its turn.
hvd::Status split_comm(const hvd_comm* comm, const Communicator::SplitRecord& mine,
                       const hvd::Status& mine_valid, const char* api, hvd_comm** out) {
  if (out == nullptr)
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, std::string(api) + ": out is NULL");
  *out = nullptr;
  HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
  HVD_RETURN_IF_ERROR(usable(*c));
  std::shared_ptr<CommState> child;
  if (c->scheduled.load(std::memory_order_acquire)) {
    auto made = std::make_shared<std::shared_ptr<CommState>>();
    // Alive whenever the task runs: hvd_finalize stops the scheduler before it lets go.
    CommState* parent = c.get();
    HVD_RETURN_IF_ERROR(through_scheduler(
        *c, api, HVD_COLLECTIVE_ALLREDUCE, hvd::core::host_args(nullptr, nullptr, 0, HVD_UINT8),
        Clock::now(), nullptr, [parent, mine, mine_valid, api, made]() -> hvd::Status {
          HVD_ASSIGN_OR_RETURN(*made, make_child(*parent, mine, mine_valid, api));
          return hvd::Status::success();
        }));
    child = std::move(*made);
  } else {
    const Bounded bounded(*c->impl, api);
    HVD_ASSIGN_OR_RETURN(child, make_child(*c, mine, mine_valid, api));
  }
  if (!child) return hvd::Status::success();
  child->parent = c;
  c->live_children.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(c->scheduler_mutex);
    auto& children = c->children;
    children.erase(std::remove_if(children.begin(), children.end(),
                                  [](const std::weak_ptr<CommState>& w) { return w.expired(); }),
                   children.end());
    children.push_back(child);
  }
  *out = reinterpret_cast<hvd_comm*>(comms().insert(std::move(child)));
  return hvd::Status::success();
}

}  // namespace

extern "C" {

hvd_status hvd_init(const hvd_init_options* options, hvd_comm** comm) {
  return guarded([&]() -> hvd::Status {
    if (comm == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "comm is NULL");
    *comm = nullptr;
    hvd::core::CommOptions opts;
    if (options != nullptr) {
      HVD_RETURN_IF_ERROR(
          check_size(options->struct_size, HVD_INIT_OPTIONS_SIZE_1_0, "hvd_init_options"));
      if (options->backend != nullptr && *options->backend != '\0') opts.backend = options->backend;
      if (options->timeout_seconds > 0) {
        opts.timeout = std::chrono::milliseconds(
            static_cast<int64_t>(std::ceil(options->timeout_seconds * 1000)));
      }
    }
    const hvd::core::EnvLookup env = hvd::core::process_env();
    HVD_ASSIGN_OR_RETURN(const hvd::core::Settings settings, hvd::core::Settings::read(env));
    hvd::core::set_log_level(settings.text(hvd::core::Knob::kLogLevel));
    HVD_ASSIGN_OR_RETURN(auto impl, Communicator::create(opts, settings, env));
    auto state = std::make_shared<CommState>();
    state->impl = std::move(impl);
    state->check_args = settings.flag(hvd::core::Knob::kCheckArgs);
    *comm = reinterpret_cast<hvd_comm*>(comms().insert(std::move(state)));
    return hvd::Status::success();
  });
}

hvd_status hvd_finalize(hvd_comm* comm) {
  return guarded([&]() -> hvd::Status {
    if (comm == nullptr) return hvd::Status::success();
    if (const std::shared_ptr<CommState> live = state_of(comm)) {
      const int children = live->live_children.load();
      if (children > 0) {
        return hvd::error(HVD_ERR_STATE,
                          "hvd_finalize: this communicator has " + std::to_string(children) +
                              " live child communicator" + (children == 1 ? "" : "s") +
                              " (hvd_comm_split, process sets): finalize them first");
      }
    }
    const std::shared_ptr<CommState> c = comms().remove(reinterpret_cast<uintptr_t>(comm));
    if (!c) {
      return hvd::error(HVD_ERR_STATE,
                        "hvd_finalize: comm is not a live communicator (finalized already, or "
                        "never made)");
    }
    const hvd::Status finalized = finalize(c);
    if (c->parent) c->parent->live_children.fetch_sub(1);
    return finalized;
  });
}

hvd_status hvd_comm_abort(hvd_comm* comm) {
  return guarded([&]() -> hvd::Status {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
    abort_comm(*c, hvd::error(HVD_ERR_STATE,
                              "the communicator was aborted by the application (hvd_comm_abort)"));
    return hvd::Status::success();
  });
}

int hvd_rank(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->world().rank : -1;
}
int hvd_size(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->world().size : -1;
}
int hvd_local_rank(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->world().local_rank : -1;
}
int hvd_local_size(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->world().local_size : -1;
}
uint64_t hvd_backend_capabilities(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->plugin().capabilities : 0;
}
uint64_t hvd_backend_dtypes(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->plugin().dtypes : 0;
}
uint64_t hvd_backend_reduce_ops(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->impl->plugin().reduce_ops : 0;
}
const char* hvd_backend_name(const hvd_comm* comm) {
  const auto c = state_of(comm);  // the plugin's name lives as long as the process
  return c ? c->impl->plugin().name.c_str() : "";
}

hvd_status hvd_allreduce(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.op = op;
    return collective(
        comm, "hvd_allreduce", HVD_COLLECTIVE_ALLREDUCE, args,
        [&](Communicator& c) { return c.check_allreduce(args); },
        [&](Communicator& c) { return c.allreduce(args); });
  });
}

hvd_status hvd_allgather(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    return collective(
        comm, "hvd_allgather", HVD_COLLECTIVE_ALLGATHER, args,
        [&](Communicator& c) { return c.check_allgather(args); },
        [&](Communicator& c) { return c.allgather(args); });
  });
}

hvd_status hvd_allgatherv(hvd_comm* comm, const void* sendbuf, void* recvbuf,
                          const uint64_t* recv_counts, hvd_dtype dtype,
                          const hvd_placement* placement) {
  return guarded([&]() -> hvd::Status {
    if (recv_counts == nullptr)
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
    const int rank = hvd_rank(comm);
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, 0, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.count = rank >= 0 ? recv_counts[rank] : 0;
    args.recv_counts = recv_counts;
    return collective(
        comm, "hvd_allgatherv", HVD_COLLECTIVE_ALLGATHER, args,
        [&](Communicator& c) { return c.check_allgather(args); },
        [&](Communicator& c) { return c.allgather(args); });
  });
}

hvd_status hvd_broadcast(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, int root, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.root = root;
    return collective(
        comm, "hvd_broadcast", HVD_COLLECTIVE_BROADCAST, args,
        [&](Communicator& c) { return c.check_broadcast(args); },
        [&](Communicator& c) { return c.broadcast(args); });
  });
}

hvd_status hvd_barrier(hvd_comm* comm) {
  return guarded([&]() -> hvd::Status {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
    HVD_RETURN_IF_ERROR(usable(*c));
    if (c->scheduled.load(std::memory_order_acquire)) {
      uint64_t token = 0;  // a one-element allreduce, in the scheduler's order
      return through_scheduler(*c, "hvd_barrier", HVD_COLLECTIVE_ALLREDUCE,
                               barrier_args(c->impl->plugin(), &token), Clock::now());
    }
    const Bounded bounded(*c->impl, "hvd_barrier");
    if (c->check_args) {
      HVD_RETURN_IF_ERROR(check_args(*c, HVD_COLLECTIVE_BARRIER,
                                     hvd::core::host_args(nullptr, nullptr, 0, HVD_UINT8),
                                     hvd::Status::success()));
    }
    return c->impl->barrier();
  });
}

hvd_status hvd_reduce_scatter(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                              hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.op = op;
    return collective(
        comm, "hvd_reduce_scatter", HVD_COLLECTIVE_REDUCE_SCATTER, args,
        [&](Communicator& c) { return c.check_reduce_scatter(args); },
        [&](Communicator& c) { return c.reduce_scatter(args); });
  });
}

hvd_status hvd_alltoall(hvd_comm* comm, const void* sendbuf, const uint64_t* send_counts,
                        void* recvbuf, uint64_t recv_capacity, uint64_t* recv_counts,
                        hvd_dtype dtype, const hvd_placement* placement) {
  return guarded([&]() -> hvd::Status {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
    HVD_RETURN_IF_ERROR(usable(*c));
    if (send_counts == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_alltoall: send_counts is NULL");
    }
    const int size = c->impl->size();
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, 0, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.send_counts = send_counts;
    for (int r = 0; r < size; ++r) {
      if (__builtin_add_overflow(args.count, send_counts[r], &args.count)) {
        return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_alltoall: send_counts overflow");
      }
    }
    std::vector<uint64_t> received(static_cast<size_t>(size));
    if (c->scheduled.load(std::memory_order_acquire)) {
      args.recv_counts = &recv_capacity;
      HVD_RETURN_IF_ERROR(through_scheduler(*c, "hvd_alltoall", HVD_COLLECTIVE_ALLTOALL, args,
                                            Clock::now(), received.data()));
    } else {
      const Bounded bounded(*c->impl, "hvd_alltoall");
      const hvd::Status mine = c->impl->check_alltoall_send(args);
      if (c->check_args) {
        HVD_RETURN_IF_ERROR(check_args(*c, HVD_COLLECTIVE_ALLTOALL, args, hvd::Status::success()));
      }
      HVD_ASSIGN_OR_RETURN(const std::vector<uint64_t> matrix,
                           alltoall_counts(*c, args, recv_capacity, mine));
      for (int r = 0; r < size; ++r) {
        received[static_cast<size_t>(r)] =
            matrix[static_cast<size_t>(r) * static_cast<size_t>(size) +
                   static_cast<size_t>(c->impl->rank())];
      }
      args.recv_counts = received.data();
      HVD_RETURN_IF_ERROR(c->impl->alltoall(args, matrix.data()));
    }
    if (recv_counts != nullptr) std::copy(received.begin(), received.end(), recv_counts);
    return hvd::Status::success();
  });
}

hvd_status hvd_allreduce_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                               hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                               hvd_reduce_op op, double prescale, double postscale,
                               const hvd_placement* placement, hvd_request** request) {
  return guarded([&] {
    hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_ALLREDUCE, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    t.op = op;
    t.prescale = prescale;
    t.postscale = postscale;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_allgather_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                               hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                               const hvd_placement* placement, hvd_request** request) {
  return guarded([&] {
    const hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_ALLGATHER, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_broadcast_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                               hvd_dtype dtype, int32_t ndim, const int64_t* shape, int root,
                               const hvd_placement* placement, hvd_request** request) {
  return guarded([&] {
    hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_BROADCAST, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    t.root = root;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_reduce_scatter_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                    void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                    const int64_t* shape, hvd_reduce_op op, double prescale,
                                    double postscale, const hvd_placement* placement,
                                    hvd_request** request) {
  return guarded([&] {
    hvd_tensor t = tensor_of(HVD_COLLECTIVE_REDUCE_SCATTER, name, sendbuf, recvbuf, dtype, ndim,
                             shape, placement);
    t.op = op;
    t.prescale = prescale;
    t.postscale = postscale;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_alltoall_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                              hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                              const int64_t* splits, const hvd_placement* placement,
                              hvd_request** request) {
  return guarded([&] {
    hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_ALLTOALL, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    t.splits = splits;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_grouped_async(hvd_comm* comm, const hvd_tensor* tensors, size_t count,
                             hvd_request** requests) {
  return guarded([&] { return enqueue(comm, tensors, count, requests); });
}

hvd_status hvd_request_poll(hvd_request* request, int* done) {
  return guarded([&] {
    if (request == nullptr || done == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or done is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    *done = completion->done() ? 1 : 0;
    return hvd::Status::success();
  });
}

hvd_status hvd_request_wait(hvd_request* request, double timeout_seconds) {
  return guarded([&] {
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->wait(std::chrono::duration<double>(timeout_seconds));
  });
}

hvd_status hvd_request_wait_on_stream(hvd_request* request, void* stream, double timeout_seconds) {
  return guarded([&] {
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->order_stream(stream, std::chrono::duration<double>(timeout_seconds));
  });
}

hvd_status hvd_request_output(hvd_request* request, void** data, int64_t* first_dim) {
  return guarded([&] {
    if (request == nullptr || data == nullptr || first_dim == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request, data or first_dim is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->output(data, first_dim);
  });
}

hvd_status hvd_join_async(hvd_comm* comm, hvd_request** request) {
  return guarded([&] {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
    HVD_RETURN_IF_ERROR(usable(*c));
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    HVD_ASSIGN_OR_RETURN(const auto scheduler, scheduler_of(*c));
    HVD_ASSIGN_OR_RETURN(auto completion, scheduler->join());
    *request = request_of(std::move(completion));
    return hvd::Status::success();
  });
}

hvd_status hvd_request_last_joined(hvd_request* request, int* rank) {
  return guarded([&] {
    if (request == nullptr || rank == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or rank is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->last_joined(rank);
  });
}

hvd_status hvd_request_received_splits(hvd_request* request, int64_t* splits, int count) {
  return guarded([&] {
    if (request == nullptr || splits == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or splits is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    std::vector<int64_t> received;
    HVD_RETURN_IF_ERROR(completion->received_splits(&received));
    if (count < 0 || static_cast<size_t>(count) < received.size()) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_request_received_splits: splits holds " +
                                                      std::to_string(count) +
                                                      " entries, but the communicator has " +
                                                      std::to_string(received.size()) + " ranks");
    }
    std::copy(received.begin(), received.end(), splits);
    return hvd::Status::success();
  });
}

void hvd_request_free(hvd_request* request) {
  // An unknown handle is ignored: there is no status to report it with.
  if (request != nullptr) (void)requests().remove(reinterpret_cast<uintptr_t>(request));
}

hvd_status hvd_scheduler_stats_get(hvd_comm* comm, hvd_scheduler_stats* stats) {
  return guarded([&] {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<CommState> c, require(comm));
    if (stats == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "stats is NULL");
    HVD_RETURN_IF_ERROR(
        check_size(stats->struct_size, HVD_SCHEDULER_STATS_SIZE_1_0, "hvd_scheduler_stats"));
    hvd::core::Scheduler::Stats s;
    {
      std::lock_guard<std::mutex> lock(c->scheduler_mutex);
      if (c->scheduler) s = c->scheduler->stats();
    }
    stats->cycles = s.cycles;
    stats->full_negotiations = s.full_negotiations;
    stats->negotiation_seconds = s.negotiation_seconds;
    stats->tensors = s.tensors;
    stats->backend_calls = s.backend_calls;
    return hvd::Status::success();
  });
}

hvd_status hvd_comm_split(hvd_comm* comm, int color, int key, hvd_comm** out) {
  return guarded([&] {
    Communicator::SplitRecord mine;
    mine.color = color < 0 ? -1 : color;
    mine.key = key;
    return split_comm(comm, mine, hvd::Status::success(), "hvd_comm_split", out);
  });
}

hvd_status hvd_comm_create_process_set(hvd_comm* comm, const int* ranks, int count,
                                       hvd_comm** out) {
  return guarded([&]() -> hvd::Status {
    // Every rank takes part, even with a bad list: its record then differs, and every rank fails.
    const int size = hvd_size(comm);
    hvd::Status valid;
    std::vector<int> sorted;
    if (count < 1 || ranks == nullptr) {
      valid = hvd::error(HVD_ERR_INVALID_ARGUMENT,
                         "hvd_comm_create_process_set: no ranks (ranks NULL or count < 1)");
    } else {
      sorted.assign(ranks, ranks + count);
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size() && valid.ok(); ++i) {
        if (sorted[i] < 0 || sorted[i] >= size) {
          valid = hvd::error(HVD_ERR_INVALID_ARGUMENT,
                             "hvd_comm_create_process_set: rank " + std::to_string(sorted[i]) +
                                 " is not a rank of this communicator of " + std::to_string(size));
        } else if (i > 0 && sorted[i] == sorted[i - 1]) {
          valid = hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_comm_create_process_set: rank " +
                                                           std::to_string(sorted[i]) +
                                                           " is listed twice");
        }
      }
    }
    Communicator::SplitRecord mine;
    mine.key = hvd_rank(comm);
    hvd::sdk::Fnv1a fnv;  // of the sorted list: every rank's alike
    for (const int r : sorted) fnv.add(static_cast<uint64_t>(r));
    const uint64_t hash = fnv.digest();
    mine.check = hash | 1;  // a plain split passes 0: never a process set's
    mine.error = valid.code();
    mine.color = valid.ok() && std::binary_search(sorted.begin(), sorted.end(), mine.key) ? 0 : -1;
    return split_comm(comm, mine, valid, "hvd_comm_create_process_set", out);
  });
}

int hvd_comm_job_rank(const hvd_comm* comm, int rank) {
  const auto c = state_of(comm);
  if (!c || rank < 0 || rank >= c->impl->size()) return -1;
  return c->impl->members()[static_cast<size_t>(rank)];
}

const char* hvd_last_error(void) { return t_has_last_error ? t_last_error.c_str() : ""; }

const char* hvd_version(void) { return HVD_VERSION_STRING; }

}  // extern "C"
