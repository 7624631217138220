// hvd/sdk/runner.hpp — a thread for calls that cannot be bounded or interrupted, which its caller
// may have to walk away from.
//
// The caller hands a job to the runner's thread and waits until it returns, a deadline passes,
// or interrupt() is called. If it stops waiting first, the runner is stuck with that job for good:
// the job's thread goes on (it may never return), and whatever the job uses must be owned by the
// job or outlive it. A stuck runner's thread is detached at destruction; a healthy one is joined.
//
// libhvd runs here the calls of plugins that have no `abort`, and every plugin's finalize; the mpi
// plugin runs here MPI's blocking collectives, which MPI can neither bound nor interrupt.
#ifndef HVD_SDK_RUNNER_HPP
#define HVD_SDK_RUNNER_HPP

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "hvd/sdk/result.hpp"

namespace hvd::sdk {

class Runner {
 public:
  using Clock = std::chrono::steady_clock;
  // What runs: everything it uses must be owned by the job itself or outlive a stuck runner.
  using Job = std::function<Status()>;

  Runner() = default;
  ~Runner() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
      if (state_->stuck) {
        // The job may never return: the thread keeps the state alive and ends on its own, if ever.
        thread_.detach();
        return;
      }
    }
    state_->cv.notify_all();
    thread_.join();
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Runs `job` on the runner's thread (started on first use) and waits until it returns, the
  // deadline passes or, if `interruptible`, interrupt() has been called (before or during the
  // run). nullopt: the caller stopped waiting and the runner is stuck with the job from now on.
  // Throws std::system_error when the thread cannot be started (nothing has run then).
  std::optional<Status> run(Job job, Clock::time_point deadline, bool interruptible = true) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (state_->stuck || state_->busy) return std::nullopt;
    if (!thread_.joinable()) thread_ = std::thread([state = state_] { loop(state); });
    state_->job = std::move(job);
    state_->busy = true;
    state_->outcome.reset();
    state_->cv.notify_all();
    state_->cv.wait_until(lock, deadline,
                          [&] { return !state_->busy || (interruptible && state_->interrupted); });
    if (state_->busy) {
      state_->stuck = true;
      return std::nullopt;
    }
    return std::move(state_->outcome);
  }

  // From now on interruptible runs stop waiting at once (any thread; for good, as an abort is).
  void interrupt() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->interrupted = true;
    }
    state_->cv.notify_all();
  }

  bool stuck() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->stuck;
  }

 private:
  // Shared with the thread, which outlives the Runner when stuck.
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    Job job;  // set: a job waits for or is in the thread
    std::optional<Status> outcome;
    bool busy = false;         // the thread has a job
    bool stuck = false;        // a caller walked away from the job in the thread
    bool interrupted = false;  // wake the waiting caller
    bool stop = false;
  };

  static void loop(const std::shared_ptr<State>& state) {
    std::unique_lock<std::mutex> lock(state->mutex);
    for (;;) {
      state->cv.wait(lock, [&] { return state->stop || state->job; });
      if (!state->job) return;  // stopping, idle
      Job job = std::move(state->job);
      state->job = nullptr;
      lock.unlock();
      Status outcome;
      try {
        outcome = job();
      } catch (...) {  // nothing escapes a thread of the library's
        outcome = Status(HVD_ERR_INTERNAL, "a call on the runner's thread threw");
      }
      job = nullptr;  // what it captured goes before anyone learns it is done
      lock.lock();
      state->outcome = std::move(outcome);
      state->busy = false;
      if (state->stuck || state->stop) return;  // nobody waits for it any more
      state->cv.notify_all();
    }
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace hvd::sdk

#endif  // HVD_SDK_RUNNER_HPP
