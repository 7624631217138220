// The watchdog: every watched object is checked every period, and never again once unwatched.
#include "comm/watchdog.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace hvd::core {
namespace {

using namespace std::chrono_literals;

class Counter final : public Watchdog::Watched {
 public:
  void check(Watchdog::Clock::time_point now) override {
    EXPECT_GE(now, last_.load());
    last_.store(now);
    std::this_thread::sleep_for(slow_.load());
    checks_.fetch_add(1);  // last: a check still running when unwatch() returned would count after
  }
  int checks() const { return checks_.load(); }
  std::atomic<std::chrono::milliseconds> slow_{0ms};

 private:
  std::atomic<int> checks_{0};
  std::atomic<Watchdog::Clock::time_point> last_{Watchdog::Clock::time_point{}};
};

// Waits up to 10 s for `counter` to be checked `n` more times.
bool checked_again(const Counter& counter, int n) {
  const int from = counter.checks();
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (counter.checks() < from + n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(Watchdog, ChecksEveryWatchedObjectAgainAndAgain) {
  Counter a, b;
  Watchdog::watch(&a);
  Watchdog::watch(&b);
  EXPECT_TRUE(checked_again(a, 3));
  EXPECT_TRUE(checked_again(b, 3));
  Watchdog::unwatch(&a);
  Watchdog::unwatch(&b);
}

TEST(Watchdog, OnceUnwatchReturnsTheObjectIsNeverCheckedAgain) {
  for (int round = 0; round < 10; ++round) {
    Counter counter;
    counter.slow_ = 2ms;  // unwatch then often meets a check in progress
    Watchdog::watch(&counter);
    ASSERT_TRUE(checked_again(counter, 1));
    Watchdog::unwatch(&counter);
    const int after = counter.checks();
    std::this_thread::sleep_for(2 * Watchdog::kPeriod);
    EXPECT_EQ(counter.checks(), after) << "round " << round;
  }
}

TEST(Watchdog, AnObjectWatchedAgainIsCheckedAgain) {
  Counter counter;
  Watchdog::watch(&counter);
  ASSERT_TRUE(checked_again(counter, 1));
  Watchdog::unwatch(&counter);
  Watchdog::watch(&counter);
  EXPECT_TRUE(checked_again(counter, 2));
  Watchdog::unwatch(&counter);
}

}  // namespace
}  // namespace hvd::core
