// Session: how a blocking call runs (directly, or through the scheduler once it runs), the
// argument check, abort, children and finalize, on one process over the kvs test backend.
#include "api/session.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fake_env.hpp"

namespace hvd::core {
namespace {

const fs::path kTestPlugins = HVD_TEST_PLUGIN_DIR;

std::shared_ptr<Session> open_session(const std::map<std::string, std::string>& vars = {}) {
  CommOptions options;
  options.backend = (kTestPlugins / "libhvd-backend-kvs.so").string();
  const EnvLookup env = fake_env(vars);
  auto settings = Settings::read(env);
  EXPECT_TRUE(settings.ok()) << settings.status().to_string();
  auto session = Session::open(options, *settings, env);
  EXPECT_TRUE(session.ok()) << session.status().to_string();
  return session.ok() ? *session : nullptr;
}

// A blocking allreduce of `value` as c_api.cpp runs it; counts the direct backend calls.
Status allreduce(Session& session, int32_t& value, int& direct_calls,
                 const Status& check = Status::success()) {
  hvd_collective_args args = host_args(&value, &value, 1, HVD_INT32);
  args.op = HVD_SUM;
  return session.collective(
      "hvd_allreduce", HVD_COLLECTIVE_ALLREDUCE, args,
      [&](Communicator& c) { return check.ok() ? c.check_allreduce(args) : check; },
      [&](Communicator& c) {
        ++direct_calls;
        return c.allreduce(args);
      });
}

TEST(Session, ABlockingCallRunsOnTheBackendUntilTheSchedulerRunsThenThroughIt) {
  auto session = open_session();
  ASSERT_NE(session, nullptr);
  int32_t value = 5;
  int direct = 0;
  ASSERT_TRUE(allreduce(*session, value, direct).ok());
  EXPECT_EQ(value, 5);
  EXPECT_EQ(direct, 1);
  EXPECT_EQ(session->scheduler_stats().tensors, 0u);

  ASSERT_TRUE(session->scheduler().ok());
  ASSERT_TRUE(allreduce(*session, value, direct).ok());
  EXPECT_EQ(value, 5);
  EXPECT_EQ(direct, 1);  // the scheduler ran it, not the direct path
  EXPECT_EQ(session->scheduler_stats().tensors, 1u);
  EXPECT_TRUE(Session::finalize(session).ok());
}

TEST(Session, UnderCheckArgsARanksOwnBadArgumentsAreItsErrorAndNothingRuns) {
  auto session = open_session({{"HVD_CHECK_ARGS", "1"}});
  ASSERT_NE(session, nullptr);
  int32_t value = 5;
  int direct = 0;
  const Status bad = error(HVD_ERR_INVALID_ARGUMENT, "hvd_allreduce: made up for the test");
  const Status status = allreduce(*session, value, direct, bad);
  EXPECT_EQ(status.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(status.message().find("made up for the test"), std::string::npos) << status.message();
  EXPECT_EQ(direct, 0);
  ASSERT_TRUE(allreduce(*session, value, direct).ok());  // the job goes on
  EXPECT_EQ(direct, 1);
  EXPECT_TRUE(Session::finalize(session).ok());
}

TEST(Session, AfterAnAbortEveryCallFailsWithItsReasonAndFinalizeReturnsIt) {
  auto session = open_session();
  ASSERT_NE(session, nullptr);
  session->abort(error(HVD_ERR_STATE, "aborted for the test"));
  int32_t value = 1;
  int direct = 0;
  const Status status = allreduce(*session, value, direct);
  EXPECT_EQ(status.code(), HVD_ERR_STATE);
  EXPECT_EQ(status.message(), "aborted for the test");
  EXPECT_EQ(direct, 0);
  EXPECT_EQ(session->barrier().code(), HVD_ERR_STATE);
  EXPECT_EQ(Session::finalize(session).code(), HVD_ERR_STATE);
}

TEST(Session, AChildCountsItselfInWhileItLivesAndAnAbortReachesIt) {
  auto parent = open_session();
  ASSERT_NE(parent, nullptr);
  Communicator::SplitRecord mine;
  mine.color = 0;
  auto child = parent->split(mine, Status::success(), "hvd_comm_split");
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  ASSERT_NE(*child, nullptr);
  EXPECT_EQ(parent->live_children(), 1);
  EXPECT_TRUE((*child)->barrier().ok());

  parent->abort(error(HVD_ERR_STATE, "the parent was aborted"));
  EXPECT_EQ((*child)->barrier().message(), "the parent was aborted");
  (void)Session::finalize(*child);
  (*child)->released();
  EXPECT_EQ(parent->live_children(), 0);
  (void)Session::finalize(parent);
}

TEST(Session, ARankOutsideEveryColorGetsNoChild) {
  auto parent = open_session();
  ASSERT_NE(parent, nullptr);
  Communicator::SplitRecord mine;  // color -1
  auto child = parent->split(mine, Status::success(), "hvd_comm_split");
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  EXPECT_EQ(*child, nullptr);
  EXPECT_EQ(parent->live_children(), 0);
  EXPECT_TRUE(Session::finalize(parent).ok());
}

TEST(Session, AlltoallReturnsTheCountsItReceivedAndRefusesTooSmallABuffer) {
  auto session = open_session();
  ASSERT_NE(session, nullptr);
  const std::vector<int32_t> in{1, 2, 3};
  std::vector<int32_t> out(3, 0);
  const uint64_t send_counts[1] = {3};
  uint64_t received[1] = {0};
  hvd_collective_args args = host_args(in.data(), out.data(), 3, HVD_INT32);
  args.send_counts = send_counts;
  ASSERT_TRUE(session->alltoall(args, 3, received).ok());
  EXPECT_EQ(out, in);
  EXPECT_EQ(received[0], 3u);

  const Status small = session->alltoall(args, 2, received);
  EXPECT_EQ(small.code(), HVD_ERR_INVALID_ARGUMENT) << small.to_string();
  EXPECT_TRUE(Session::finalize(session).ok());
}

}  // namespace
}  // namespace hvd::core
