// A submitted operation's completion: its status once settled, waits bounded by their timeout,
// the results it carries (an allocated output, received splits, the last rank to join), and
// the device work it may still wait for.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_collectives.hpp"
#include "scheduler_job.hpp"

namespace hvd::core {
namespace {

using namespace std::chrono_literals;
using hvd::testing::allgather;
using hvd::testing::FakeDeviceMemory;
using hvd::testing::FakeRank;
using hvd::testing::FakeWorld;
using hvd::testing::fast_options;
using hvd::testing::Job;
using hvd::testing::kWait;

// A completion needs the scheduler that counts its waiters: one over a job of one rank.
class CompletionTest : public ::testing::Test {
 protected:
  CompletionTest() : world_(1), rank_(world_, 0) {
    auto started = Scheduler::start(rank_, rank_, fast_options());
    EXPECT_TRUE(started.ok()) << started.status().to_string();
    if (started.ok()) scheduler_ = std::move(started).value();
  }
  std::shared_ptr<Completion> make() { return std::make_shared<Completion>(*scheduler_); }

 private:
  FakeWorld world_;
  FakeRank rank_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(CompletionTest, AWaitEndsAtItsTimeoutUntilTheOperationCompletes) {
  auto c = make();
  EXPECT_FALSE(c->done());
  const Status early = c->wait(std::chrono::duration<double>(0.05));
  EXPECT_EQ(early.code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(early.message(), "the operation did not complete within 0.050000 s (it goes on)");
  c->complete(Status::success());
  EXPECT_TRUE(c->done());
  EXPECT_TRUE(c->wait(kWait).ok());
  EXPECT_TRUE(c->wait(std::chrono::duration<double>(0)).ok());  // done: no waiting at all
}

TEST_F(CompletionTest, TheFirstStatusSticks) {
  auto c = make();
  c->complete(error(HVD_ERR_MISMATCH, "first"));
  c->complete(Status::success());
  c->complete(error(HVD_ERR_STATE, "third"));
  const Status s = c->wait(kWait);
  EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
  EXPECT_EQ(s.message(), "first");
}

TEST_F(CompletionTest, WaitersOnOtherThreadsWakeWithTheStatus) {
  std::vector<std::shared_ptr<Completion>> all{make(), make(), make()};
  std::vector<Status> seen(all.size());
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < all.size(); ++i) {
    waiters.emplace_back([&, i] { seen[i] = all[i]->wait(kWait); });
  }
  Completion::complete_all(all, error(HVD_ERR_REMOTE, "a peer died"));
  for (auto& t : waiters) t.join();
  for (const Status& s : seen) EXPECT_EQ(s.to_string(), "remote failure: a peer died");
}

TEST_F(CompletionTest, AnOutputIsReadOnceTheOperationSucceeded) {
  auto c = make();
  void* data = nullptr;
  int64_t first_dim = 0;
  EXPECT_EQ(c->output(&data, &first_dim).message(), "the operation has not completed yet");
  auto bytes = std::make_unique<char[]>(8);
  char* const where = bytes.get();
  c->set_output(std::move(bytes), 4);
  c->complete(Status::success());
  ASSERT_TRUE(c->output(&data, &first_dim).ok());
  EXPECT_EQ(data, where);
  EXPECT_EQ(first_dim, 4);

  auto failed = make();
  failed->set_output(std::make_unique<char[]>(8), 4);
  failed->complete(error(HVD_ERR_TIMEOUT, "too late"));
  EXPECT_EQ(failed->output(&data, &first_dim).message(), "too late");

  auto none = make();
  none->complete(Status::success());
  const Status no_output = none->output(&data, &first_dim);
  EXPECT_EQ(no_output.code(), HVD_ERR_STATE);
  EXPECT_EQ(no_output.message(),
            "this operation has no output allocated by hvd (only an allgather or an alltoall "
            "submitted with recvbuf NULL has one)");
}

TEST_F(CompletionTest, SplitsAndTheLastJoinedRankAreThereOnlyForTheirOperation) {
  auto alltoall = make(), join = make();
  std::vector<int64_t> splits;
  int last = -1;
  EXPECT_EQ(alltoall->received_splits(&splits).message(), "the operation has not completed yet");
  EXPECT_EQ(join->last_joined(&last).message(), "the operation has not completed yet");
  alltoall->set_received_splits({3, 0, 2});
  join->set_last_joined(2);
  alltoall->complete(Status::success());
  join->complete(Status::success());
  ASSERT_TRUE(alltoall->received_splits(&splits).ok());
  EXPECT_EQ(splits, (std::vector<int64_t>{3, 0, 2}));
  ASSERT_TRUE(join->last_joined(&last).ok());
  EXPECT_EQ(last, 2);
  EXPECT_EQ(join->received_splits(&splits).message(), "this operation is not an alltoall");
  EXPECT_EQ(alltoall->last_joined(&last).message(), "this operation is not a join");
}

// An event after work queued on a paused fake device: complete once the device runs it.
struct PendingDeviceWork {
  PendingDeviceWork() {
    device.pause();
    EXPECT_TRUE(device.enqueue(0, stream, [] {}).ok());
    void* handle = *device.create_event(0);
    EXPECT_TRUE(device.record(handle, 0, stream).ok());
    event = std::make_shared<DeviceEvent>(device, handle, 0);
  }
  FakeDeviceMemory device;
  int stream_tag = 0;
  void* stream = &stream_tag;
  std::shared_ptr<const DeviceEvent> event;
};

TEST_F(CompletionTest, SettledWithDeviceWorkItIsDoneOnceTheDeviceRanIt) {
  PendingDeviceWork work;
  auto c = make();
  c->complete(Status::success(), DeviceWork{work.event, nullptr, false});
  EXPECT_FALSE(c->done());
  EXPECT_EQ(c->wait(std::chrono::duration<double>(0.05)).code(), HVD_ERR_TIMEOUT);
  // Ordering a stream after it needs no wait on the host: the device waits for the event.
  int consumer = 0;
  EXPECT_TRUE(c->order_stream(&consumer, kWait).ok());
  EXPECT_EQ(work.device.waits, 1);
  work.device.resume();
  EXPECT_TRUE(c->done());
  EXPECT_TRUE(c->wait(kWait).ok());
}

TEST_F(CompletionTest, AnErrorOnTheDeviceOrABrokenCommunicatorIsTheStatus) {
  PendingDeviceWork work;
  auto on_device = make();
  on_device->complete(Status::success(), DeviceWork{work.event, nullptr, false});
  work.device.break_device(error(HVD_ERR_SYSTEM, "fake: an illegal address"));
  EXPECT_EQ(on_device->wait(kWait).message(), "on the device: fake: an illegal address");

  PendingDeviceWork other;
  auto failure = std::make_shared<SharedFailure>();
  auto broken = make();
  broken->complete(Status::success(), DeviceWork{other.event, failure, false});
  failure->set(error(HVD_ERR_TIMEOUT, "allreduce timed out"));
  failure->set(error(HVD_ERR_STATE, "a later reason"));  // the first sticks
  other.device.resume();  // the abort ended the work: its event completes without an error
  EXPECT_EQ(broken->wait(kWait).to_string(),
            "timeout: the communicator broke before the device had run it: allreduce timed out");
}

TEST_F(CompletionTest, WorkQueuedOnTheCallersOwnStreamCannotBeOrderedAfter) {
  auto direct = make();
  direct->complete(Status::success(), DeviceWork{nullptr, nullptr, true});
  int consumer = 0;
  EXPECT_EQ(direct->order_stream(&consumer, kWait).code(), HVD_ERR_UNSUPPORTED);
  // A failed operation has nothing on a device: ordering after it is its status.
  PendingDeviceWork work;
  auto failed = make();
  failed->complete(error(HVD_ERR_MISMATCH, "shapes differ"),
                   DeviceWork{work.event, nullptr, false});
  EXPECT_TRUE(failed->done());
  EXPECT_EQ(failed->order_stream(&consumer, kWait).message(), "shapes differ");
  EXPECT_EQ(work.device.waits, 0);
}

// ---- inside the scheduler ------------------------------------------------------------------

TEST(Scheduler, AnOutputIsThereOnlyForAnAllgatherHvdAllocated) {
  Job job(1, fast_options());
  std::vector<int64_t> in(4, 7), out(4);
  auto given = job.at(0).submit(allgather("given", in.data(), out.data(), HVD_INT64, {4}));
  ASSERT_TRUE(given.ok());
  ASSERT_TRUE((*given)->wait(kWait).ok());
  EXPECT_EQ(out, in);
  void* data = nullptr;
  int64_t first_dim = 0;
  EXPECT_EQ((*given)->output(&data, &first_dim).code(), HVD_ERR_STATE);
}

}  // namespace
}  // namespace hvd::core
