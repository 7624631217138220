// hvd::sdk::Runner: a job's outcome comes back; a caller walks away at its deadline or an
// interrupt, and the runner then stays stuck with the job; nothing a job throws escapes its thread.
#include "hvd/sdk/runner.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

namespace {

using hvd::Status;
using hvd::sdk::Runner;
using namespace std::chrono_literals;

Runner::Clock::time_point in(std::chrono::milliseconds ms) { return Runner::Clock::now() + ms; }

TEST(SdkRunner, ReturnsEachJobsOutcomeAndReusesItsThread) {
  Runner runner;
  std::thread::id first;
  for (int i = 0; i < 3; ++i) {
    std::optional<Status> outcome = runner.run(
        [&, i] {
          if (i == 0) first = std::this_thread::get_id();
          EXPECT_EQ(std::this_thread::get_id(), first);
          return i == 1 ? Status(HVD_ERR_REMOTE, "job 1 failed") : Status::success();
        },
        in(10s));
    ASSERT_TRUE(outcome.has_value());
    EXPECT_EQ(outcome->code(), i == 1 ? HVD_ERR_REMOTE : HVD_SUCCESS);
    if (i == 1) {
      EXPECT_EQ(outcome->message(), "job 1 failed");
    }
  }
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_FALSE(runner.stuck());
}

TEST(SdkRunner, AJobPastItsDeadlineIsWalkedAwayFromAndTheRunnerStaysStuck) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  {
    Runner runner;
    const auto start = Runner::Clock::now();
    std::optional<Status> outcome = runner.run(
        [release, finished] {
          while (!release->load()) std::this_thread::sleep_for(1ms);
          finished->store(true);
          return Status::success();
        },
        in(100ms));
    EXPECT_FALSE(outcome.has_value());
    EXPECT_GE(Runner::Clock::now() - start, 100ms);
    EXPECT_LT(Runner::Clock::now() - start, 5s);
    EXPECT_TRUE(runner.stuck());
    // A stuck runner takes no more jobs.
    EXPECT_FALSE(runner.run([] { return Status::success(); }, in(10s)).has_value());
  }  // destroyed while stuck: its thread is detached, not joined
  release->store(true);
  for (int i = 0; i < 5000 && !finished->load(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(finished->load());
}

TEST(SdkRunner, AnInterruptEndsTheWaitOfInterruptibleRunsOnly) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  Runner uninterruptible;
  std::thread interrupter([&] {
    std::this_thread::sleep_for(50ms);
    uninterruptible.interrupt();
    std::this_thread::sleep_for(50ms);
    release->store(true);
  });
  std::optional<Status> outcome = uninterruptible.run(
      [release] {
        while (!release->load()) std::this_thread::sleep_for(1ms);
        return Status::success();
      },
      in(10s), /*interruptible=*/false);
  interrupter.join();
  ASSERT_TRUE(outcome.has_value()) << "a run that is not interruptible waits for its job";

  auto hold = std::make_shared<std::atomic<bool>>(false);
  Runner runner;
  std::thread aborter([&] {
    std::this_thread::sleep_for(50ms);
    runner.interrupt();
  });
  const auto start = Runner::Clock::now();
  outcome = runner.run(
      [hold] {
        while (!hold->load()) std::this_thread::sleep_for(1ms);
        return Status::success();
      },
      in(10s));
  aborter.join();
  EXPECT_FALSE(outcome.has_value());
  EXPECT_LT(Runner::Clock::now() - start, 5s);
  hold->store(true);
  // Interrupted for good: the next run does not wait either.
  EXPECT_FALSE(runner.run([] { return Status::success(); }, in(10s)).has_value());
}

TEST(SdkRunner, AJobThatThrowsIsAnInternalError) {
  Runner runner;
  std::optional<Status> outcome =
      runner.run([]() -> Status { throw std::runtime_error("boom"); }, in(10s));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->code(), HVD_ERR_INTERNAL);
  EXPECT_FALSE(runner.stuck());
}

}  // namespace
