// session.hpp — what an hvd_comm handle names: one communicator's backend, its controller, its
// scheduler and its children, and the one place that decides how a blocking call runs: on the
// backend directly (its arguments compared across the ranks first under HVD_CHECK_ARGS), or,
// once the scheduler runs (it alone calls the backends then), through it, in its order.
#ifndef HVD_CORE_API_SESSION_HPP
#define HVD_CORE_API_SESSION_HPP

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"
#include "scheduler/scheduler.hpp"

namespace hvd::core {

// Until it goes, no backend call of the blocking hvd_* call `api` runs past that call's limit
// (HVD_TIMEOUT + 1 s from the watchdog's first look at it, within 50 ms of its start).
class CallScope {
 public:
  CallScope(Communicator& comm, const char* api) : comm_(comm) { comm_.begin_serving(api); }
  ~CallScope() { comm_.end_serving(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Communicator& comm_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Clock = std::chrono::steady_clock;

  // hvd_init: the world communicator, with the knobs read once.
  static Result<std::shared_ptr<Session>> open(const CommOptions& options, const Settings& settings,
                                               const EnvLookup& env);

  Communicator& comm() const { return *impl_; }
  // A broken communicator fails every call with the error that broke it (a broken controller
  // breaks it too: the scheduler aborts both when either fails). One atomic load per call.
  Status usable() const { return impl_->health(); }
  // How long a blocking hvd_* call may take, from its entry.
  Clock::duration limit() const { return impl_->timeout() + Communicator::kMargin; }

  // A blocking collective: `check` is the communicator's own check of the arguments, `direct`
  // the call on the backend. Under HVD_CHECK_ARGS the ranks compare their calls first, and
  // `args` is then marked so for the backend.
  template <typename Check, typename Direct>
  Status collective(const char* api, hvd_collective type, hvd_collective_args& args, Check&& check,
                    Direct&& direct) {
    HVD_RETURN_IF_ERROR(usable());
    if (scheduled_.load(std::memory_order_acquire)) {
      return through_scheduler(api, type, args, Clock::now());
    }
    const CallScope scope(*impl_, api);
    if (check_args_) {
      const Status mine = check(*impl_);
      HVD_RETURN_IF_ERROR(check_args(type, args, mine));
      args.flags |= HVD_CALL_RANKS_AGREE;  // `direct` runs these very args
    }
    return direct(*impl_);
  }
  Status barrier();
  // `args` has sendbuf, send_counts and count; the received counts go to `received` (size).
  Status alltoall(hvd_collective_args& args, uint64_t recv_capacity, uint64_t* received);
  // This rank's child (null where it joins none), collective over this communicator's ranks.
  Result<std::shared_ptr<Session>> split(const Communicator::SplitRecord& mine,
                                         const Status& mine_valid, const char* api);

  // The scheduler, started on first use (with the knobs hvd_init read).
  Result<std::shared_ptr<Scheduler>> scheduler();
  // Its statistics; zero before it starts.
  Scheduler::Stats scheduler_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return scheduler_ ? scheduler_->stats() : Scheduler::Stats{};
  }
  // Breaks the communicator, its controller and its children with `why`: calls in progress
  // return, and every later one, and everything the scheduler holds, fails with it.
  void abort(const Status& why);
  // hvd_finalize: every bounded wait in order (the scheduler's last cycle, aborted if it
  // overruns; the controller's and the backend's release). `self` is this session.
  static Status finalize(const std::shared_ptr<Session>& self);

  int live_children() const { return live_children_.load(); }
  // The parent's count of live children, for a child finalized.
  void released() {
    if (parent_) parent_->live_children_.fetch_sub(1);
  }

 private:
  Result<Communicator*> controller_locked();
  Status through_scheduler(const char* api, hvd_collective type, const hvd_collective_args& a,
                           Clock::time_point entry, uint64_t* received = nullptr,
                           std::function<Status()> task = {});
  Status check_args(hvd_collective type, const hvd_collective_args& a, const Status& mine);
  Result<std::vector<uint64_t>> alltoall_counts(const hvd_collective_args& a, uint64_t capacity,
                                                const Status& mine);
  Result<std::shared_ptr<Session>> make_child(const Communicator::SplitRecord& mine,
                                              const Status& mine_valid, const std::string& what);

  // Members are destroyed in reverse: the scheduler stops before the backends it runs on.
  std::unique_ptr<Communicator> impl_;
  std::unique_ptr<Communicator> controller_;  // negotiation and checks, when impl_ cannot
  std::mutex mutex_;  // guards the scheduler's and the controller's making, closed_, children_
  // Shared with callers that got it before a finalize on another thread took it: what they
  // submit then is refused by the stopped scheduler, never run on a released backend.
  std::shared_ptr<Scheduler> scheduler_;
  bool closed_ = false;                      // hvd_finalize has begun
  std::atomic<bool> scheduled_{false};       // set once the scheduler runs every collective
  std::atomic<uint64_t> blocking_calls_{0};  // names blocking calls once they go through it
  bool check_args_ = false;                  // HVD_CHECK_ARGS: blocking calls compared first
  uint64_t checked_calls_ = 0;               // numbers them (the caller's thread only)

  // Communicators from communicators: a child keeps its parent alive, and counts itself in
  // while it lives (a parent with live children cannot be finalized).
  std::shared_ptr<Session> parent_;
  std::atomic<int> live_children_{0};
  std::vector<std::weak_ptr<Session>> children_;  // under mutex_: aborts reach them
};

}  // namespace hvd::core

#endif  // HVD_CORE_API_SESSION_HPP
