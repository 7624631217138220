// completion.cpp — a submitted tensor's completion: what waits on it (with a timeout, or ordered
// on a CUDA stream) and what the executors settle it with.
#include "scheduler/scheduler.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/reduce.h"

namespace hvd::core {

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

}  // namespace hvd::core
