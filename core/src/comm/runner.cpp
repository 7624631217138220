#include "comm/runner.hpp"

#include <utility>

#include "comm/host_services.hpp"

namespace hvd::core {

Runner::Outcome Runner::Outcome::of(hvd_status code) {
  return Outcome{code, code == HVD_SUCCESS ? "" : backend_call_message(code)};
}

Runner::~Runner() {
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

void Runner::loop(const std::shared_ptr<State>& state) {
  std::unique_lock<std::mutex> lock(state->mutex);
  for (;;) {
    state->cv.wait(lock, [&] { return state->stop || state->job; });
    if (!state->job) return;  // stopping, idle
    Job job = std::move(state->job);
    state->job = nullptr;
    lock.unlock();
    Outcome outcome = job();
    job = nullptr;  // what it captured goes before anyone learns it is done
    lock.lock();
    state->outcome = std::move(outcome);
    state->busy = false;
    if (state->stuck || state->stop) return;  // nobody waits for it any more
    state->cv.notify_all();
  }
}

std::optional<Runner::Outcome> Runner::run(Job job, Clock::time_point deadline,
                                           bool interruptible) {
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

void Runner::interrupt() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->interrupted = true;
  }
  state_->cv.notify_all();
}

bool Runner::stuck() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stuck;
}

}  // namespace hvd::core
