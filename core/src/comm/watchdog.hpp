// watchdog.hpp — the one thread per process that notices backend calls running past their limit.
//
// A communicator registers while it lives; every kPeriod the watchdog asks each one to check
// its call in progress against the call's deadline (HVD_TIMEOUT plus a margin, or the end of the
// blocking hvd_* call it serves), which the communicator stamps at the watchdog's first look at
// the call, so that starting one reads no clock. An overrunning communicator then aborts itself,
// from this thread: the backend's abort makes the stuck call return to its caller with
// HVD_ERR_TIMEOUT.
#ifndef HVD_CORE_COMM_WATCHDOG_HPP
#define HVD_CORE_COMM_WATCHDOG_HPP

#include <chrono>

namespace hvd::core {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // How often calls are checked: a deadline is never early, and at most two periods late (one to
  // the first look, one to the look that finds it past).
  static constexpr std::chrono::milliseconds kPeriod{50};

  class Watched {
   public:
    // Called on the watchdog's thread, never concurrently with unwatch() of this object.
    virtual void check(Clock::time_point now) = 0;

   protected:
    ~Watched() = default;
  };

  // After unwatch() returns, check() is not running and will not be called again.
  static void watch(Watched* watched);
  static void unwatch(Watched* watched);
};

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_WATCHDOG_HPP
