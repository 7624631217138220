// hvd::sdk::Deadline and wait_until: the host's stamp wins where the args carry one (ABI 1.2), a
// 1.1 host's args and an unstamped call fall back to init's timeout, and a wait ends when ready,
// at the deadline or on abort, whichever comes first.
#include "hvd/sdk/deadline.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace {

using hvd::sdk::Deadline;
using hvd::sdk::WaitEnd;
using namespace std::chrono_literals;

hvd_collective_args args_of_size(size_t struct_size) {
  hvd_collective_args a{};
  a.struct_size = struct_size;
  return a;
}

TEST(SdkDeadline, TheHostsStampWins) {
  hvd_collective_args a = args_of_size(sizeof(hvd_collective_args));
  const auto stamp = Deadline::Clock::now() + 123s;
  a.deadline_ns = Deadline::to_ns(stamp);
  EXPECT_EQ(Deadline::of(a, 5s).at(), stamp);
  EXPECT_EQ(Deadline::stamped(a).at(), stamp);
}

TEST(SdkDeadline, WithoutAStampInitsTimeoutRunsFromNow) {
  for (const size_t size : {size_t{HVD_COLLECTIVE_ARGS_SIZE_1_1}, sizeof(hvd_collective_args)}) {
    hvd_collective_args a = args_of_size(size);
    // A 1.1 host's struct ends before deadline_ns: whatever lies there is not read.
    a.deadline_ns = size == sizeof(hvd_collective_args) ? 0 : 1;
    const auto before = Deadline::Clock::now();
    const Deadline d = Deadline::of(a, 5s);
    EXPECT_GE(d.at(), before + 5s);
    EXPECT_LE(d.at(), Deadline::Clock::now() + 5s);
    EXPECT_TRUE(Deadline::stamped(a).is_none());
  }
  EXPECT_TRUE(Deadline::of(args_of_size(sizeof(hvd_collective_args)), 0ms).is_none())
      << "a host that passes no timeout asks for none";
}

TEST(SdkDeadline, RemainingAndTheEarlierOfTwo) {
  const Deadline soon = Deadline::after(50ms);
  const Deadline later = Deadline::after(10s);
  EXPECT_EQ(soon.or_earlier(later).at(), soon.at());
  EXPECT_EQ(later.or_earlier(soon).at(), soon.at());
  EXPECT_LE(soon.remaining(), 50ms);
  EXPECT_EQ(soon.remaining(soon.at() + 1s), 0ms);
  EXPECT_FALSE(Deadline::none().passed());
}

TEST(SdkDeadline, TheCoarseClockIsAtMostATickLate) {
  const auto precise = Deadline::Clock::now();
  const auto coarse = Deadline::coarse_now();
  EXPECT_GE(coarse, precise - 1ms) << "early by more than the kernel's lag";
  EXPECT_LE(coarse, Deadline::Clock::now() + 20ms);
}

TEST(SdkDeadline, AWaitEndsWhenReadyAtTheDeadlineOrOnAbort) {
  std::atomic<bool> aborted{false};
  int polls = 0;
  EXPECT_EQ(hvd::sdk::wait_until([&] { return ++polls == 3; }, Deadline::after(10s), aborted),
            WaitEnd::kReady);
  EXPECT_EQ(polls, 3);

  const hvd::sdk::Backoff quick{1ms, 50us, 1ms};
  auto start = Deadline::Clock::now();
  EXPECT_EQ(hvd::sdk::wait_until([] { return false; }, Deadline::after(100ms), aborted, quick),
            WaitEnd::kDeadline);
  EXPECT_GE(Deadline::Clock::now() - start, 100ms);
  EXPECT_LT(Deadline::Clock::now() - start, 5s);

  std::thread aborter([&] {
    std::this_thread::sleep_for(50ms);
    aborted.store(true);
  });
  start = Deadline::Clock::now();
  EXPECT_EQ(hvd::sdk::wait_until([] { return false; }, Deadline::none(), aborted, quick),
            WaitEnd::kAborted);
  aborter.join();
  EXPECT_LT(Deadline::Clock::now() - start, 5s);
}

}  // namespace
