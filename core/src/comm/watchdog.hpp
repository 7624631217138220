// watchdog.hpp — the one thread per process that notices backend calls running past their limit.
//
// A communicator registers while it lives; every kPeriod the watchdog asks each one to check
// its call in progress against the call's deadline (HVD_TIMEOUT plus a margin, or the end of the
// blocking hvd_* call it serves). An overrunning communicator then aborts itself, from this
// thread: the backend's abort makes the stuck call return to its caller with HVD_ERR_TIMEOUT.
#ifndef HVD_CORE_COMM_WATCHDOG_HPP
#define HVD_CORE_COMM_WATCHDOG_HPP

#include <chrono>

namespace hvd::core {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // How often calls are checked: the precision of every deadline.
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
