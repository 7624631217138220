// runner.hpp — a thread that runs backend calls its caller may have to walk away from.
//
// A call the host cannot interrupt (any call of a plugin without `abort`; finalize, which must
// not be aborted under it) runs here while the caller waits against a deadline. If the call
// overruns, the caller returns and the runner stays with it: the runner is then stuck for good,
// and its owner must leak what the call may still use (the plugin's communicator, the host
// services) instead of freeing it. A stuck runner's thread is detached at destruction; a healthy
// one is joined.
#ifndef HVD_CORE_COMM_RUNNER_HPP
#define HVD_CORE_COMM_RUNNER_HPP

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "hvd/types.h"

namespace hvd::core {

class Runner {
 public:
  using Clock = std::chrono::steady_clock;
  // A call's outcome: its status and, on error, the message it reported on the runner's thread.
  struct Outcome {
    hvd_status code = HVD_SUCCESS;
    std::string message;
    // A plugin call's outcome, taken on the thread that made it (its message is thread-local).
    static Outcome of(hvd_status code);
  };
  // What runs: everything it uses must be owned by the job itself or outlive a stuck runner.
  using Job = std::function<Outcome()>;

  Runner() = default;
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Runs `job` on the runner's thread (started on first use) and waits until it returns, the
  // deadline passes or, if `interruptible`, interrupt() has been called (before or during the
  // run). nullopt: the caller stopped waiting and the runner is stuck with the job from now on.
  std::optional<Outcome> run(Job job, Clock::time_point deadline, bool interruptible = true);
  // From now on interruptible runs stop waiting at once (any thread; for good, as an abort is).
  void interrupt();
  bool stuck() const;

 private:
  // Shared with the thread, which outlives the Runner when stuck.
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    Job job;  // set: a job waits for or is in the thread
    std::optional<Outcome> outcome;
    bool busy = false;         // the thread has a job
    bool stuck = false;        // a caller walked away from the job in the thread
    bool interrupted = false;  // wake the waiting caller
    bool stop = false;
  };
  static void loop(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_RUNNER_HPP
