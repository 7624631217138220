#include "comm/communicator.hpp"

#include <gtest/gtest.h>

#include <string>

#include "fake_env.hpp"
#include "kvs_job.hpp"

namespace hvd::core {
namespace {

using hvd::testing::contains;
using hvd::testing::kTestPlugins;

TEST(Communicator, InitFailureCarriesThePluginsMessage) {
  auto comm = Communicator::create(
      {}, fake_env({{"HVD_BACKEND", "failinit"}, {"HVD_PLUGIN_PATH", kTestPlugins.string()}}));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), HVD_ERR_SYSTEM);
  EXPECT_EQ(
      comm.status().message(),
      "init on backend 'failinit' failed: failinit: this test plugin always refuses to start");
}

TEST(Communicator, ASingleProcessNeedsNoRendezvous) {
  CommOptions options;
  options.backend = (kTestPlugins / "libhvd-backend-kvs.so").string();
  auto comm = Communicator::create(options, fake_env({}));
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  int32_t value = 41;
  hvd_collective_args args{};
  args.sendbuf = &value;
  args.recvbuf = &value;
  args.count = 1;
  args.dtype = HVD_INT32;
  args.op = HVD_MAX;
  EXPECT_TRUE((*comm)->allreduce(args).ok());
  EXPECT_EQ(value, 41);
  EXPECT_TRUE((*comm)->barrier().ok());
}

TEST(Communicator, SeveralRanksWithoutRendezvousIsAClearError) {
  auto comm = Communicator::create({}, fake_env({{"HVD_RANK", "0"}, {"HVD_SIZE", "2"}}));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(contains(comm.status().message(), "HVD_RENDEZVOUS_ADDR is not set"))
      << comm.status().message();
}

TEST(Communicator, RendezvousWithoutSecretIsAClearError) {
  auto comm = Communicator::create(
      {}, fake_env({{"HVD_RANK", "1"}, {"HVD_SIZE", "2"}, {"HVD_RENDEZVOUS_ADDR", "127.0.0.1:1"}}));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(contains(comm.status().message(), "HVD_SECRET is not")) << comm.status().message();
}

}  // namespace
}  // namespace hvd::core
