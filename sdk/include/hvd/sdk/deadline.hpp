// hvd/sdk/deadline.hpp — when a collective call must have returned, and a wait bounded by it and
// by the communicator's abort flag.
//
// The host stamps each call's deadline (ABI 1.2: hvd_collective_args.deadline_ns, on the steady
// clock); a host of ABI 1.0 or 1.1 does not, and a plugin then bounds the call by init's
// timeout_ms from its start. Deadline::of() reads whichever applies, so a plugin has one deadline
// per call and never rebuilds it per wait.
#ifndef HVD_SDK_DEADLINE_HPP
#define HVD_SDK_DEADLINE_HPP

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include <time.h>

#include "hvd/backend.h"

namespace hvd::sdk {

class Deadline {
 public:
  // libstdc++'s steady_clock is CLOCK_MONOTONIC, the clock deadline_ns counts.
  using Clock = std::chrono::steady_clock;

  // None: waits end only when done or aborted.
  static Deadline none() { return Deadline(Clock::time_point::max()); }

  // `timeout` from now; a timeout of 0 (a host that passes none) is none.
  static Deadline after(std::chrono::milliseconds timeout) {
    return timeout.count() > 0 ? Deadline(Clock::now() + timeout) : none();
  }

  // The host's stamp on `args` (ABI 1.2), or none where it made none.
  static Deadline stamped(const hvd_collective_args& args) {
    if (HVD_HAS_FIELD(&args, hvd_collective_args, deadline_ns) && args.deadline_ns > 0) {
      return Deadline(Clock::time_point(std::chrono::nanoseconds(args.deadline_ns)));
    }
    return none();
  }

  // The host's stamp on `args` where there is one, else `timeout` (init's) from now.
  static Deadline of(const hvd_collective_args& args, std::chrono::milliseconds timeout) {
    const Deadline host = stamped(args);
    return host.is_none() ? after(timeout) : host;
  }

  Clock::time_point at() const { return at_; }
  bool is_none() const { return at_ == Clock::time_point::max(); }
  bool passed(Clock::time_point now = Clock::now()) const { return now >= at_; }
  // What is left, never negative (for APIs that take a relative timeout).
  std::chrono::milliseconds remaining(Clock::time_point now = Clock::now()) const {
    if (is_none()) return std::chrono::hours(24 * 365);
    if (now >= at_) return std::chrono::milliseconds(0);
    return std::chrono::ceil<std::chrono::milliseconds>(at_ - now);
  }
  // The earlier of the two.
  Deadline or_earlier(Deadline other) const { return other.at_ < at_ ? other : *this; }

  // The time now from the kernel's coarse clock (CLOCK_MONOTONIC as of its last tick) plus one
  // tick (its resolution, 1-10 ms): at most a tick late, and early only if the kernel's
  // timekeeping lags by more than a tick (milliseconds, against timeouts of seconds). Several times
  // cheaper to read than the precise clock in a KVM guest, for a stamp taken on every call.
  static Clock::time_point coarse_now() {
    static const std::chrono::nanoseconds tick = [] {
      timespec resolution{};
      if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) != 0) {
        return std::chrono::nanoseconds(-1);
      }
      return std::chrono::seconds(resolution.tv_sec) + std::chrono::nanoseconds(resolution.tv_nsec);
    }();
    timespec now{};
    if (tick.count() < 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0) return Clock::now();
    return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
        std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec) + tick));
  }

  // For the host: `deadline` as hvd_collective_args.deadline_ns.
  static int64_t to_ns(Clock::time_point deadline) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch())
        .count();
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

// How a wait polls. Libraries that move data only inside their own calls (Open MPI, libfabric's
// shm) stall if the waiter sleeps, so a wait first polls back to back for `spin_for`; a wait that
// lasts longer is far more often a stopped or lost peer than data, so from then on it polls for
// `burst`, then sleeps `nap`: a few percent of a core until the deadline, and still progress
// every `nap` for a call that is merely long.
struct Backoff {
  std::chrono::nanoseconds spin_for = std::chrono::seconds(1);
  std::chrono::nanoseconds burst = std::chrono::microseconds(50);
  std::chrono::nanoseconds nap = std::chrono::milliseconds(1);
};

enum class WaitEnd { kReady, kDeadline, kAborted };

// Polls `ready()` until it returns true, the deadline passes or `aborted` is set (from any
// thread), whichever comes first; `ready` is polled once more after each nap.
template <typename Ready>
WaitEnd wait_until(Ready&& ready, const Deadline& deadline, const std::atomic<bool>& aborted,
                   const Backoff& backoff = Backoff{}) {
  Deadline::Clock::time_point burst_end = Deadline::Clock::now() + backoff.spin_for;
  for (;;) {
    if (ready()) return WaitEnd::kReady;
    if (aborted.load(std::memory_order_relaxed)) return WaitEnd::kAborted;
    const Deadline::Clock::time_point now = Deadline::Clock::now();
    if (deadline.passed(now)) return WaitEnd::kDeadline;
    if (now >= burst_end) {
      std::this_thread::sleep_for(backoff.nap);
      burst_end = Deadline::Clock::now() + backoff.burst;
    }
  }
}

}  // namespace hvd::sdk

#endif  // HVD_SDK_DEADLINE_HPP
