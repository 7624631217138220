#include "bootstrap/host.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include "bootstrap/socket.hpp"
#include "fake_env.hpp"

namespace hvd::core {
namespace {

TEST(HostIdentity, IsTheHostNameWithTheKernelAndTheNetworkNamespace) {
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  const std::string identity = host_identity(Settings());
  EXPECT_EQ(identity.rfind(std::string(name) + " (boot ", 0), 0u) << identity;
  EXPECT_NE(identity.find(", netns "), std::string::npos) << identity;
  EXPECT_EQ(identity.find('?'), std::string::npos) << "something could not be read: " << identity;
  EXPECT_EQ(identity, host_identity(Settings()));  // stable
}

TEST(HostIdentity, HvdHostnameOverridesItAndHorovodsSpellingToo) {
  EXPECT_EQ(host_identity(*Settings::read(fake_env({{"HVD_HOSTNAME", "node3"}}))), "node3");
  EXPECT_EQ(host_identity(*Settings::read(fake_env({{"HOROVOD_HOSTNAME", "node4"}}))), "node4");
}

TEST(HostIdentity, LocalPlaceCountsTheRanksOfTheSameHostInRankOrder) {
  const std::vector<std::string> hosts = {"a", "b", "a", "c", "a", "b"};
  const LocalPlace expected[] = {{0, 3}, {0, 2}, {1, 3}, {0, 1}, {2, 3}, {1, 2}};
  for (int r = 0; r < 6; ++r) {
    const LocalPlace place = local_place(hosts, r);
    EXPECT_EQ(place.rank, expected[r].rank) << "rank " << r;
    EXPECT_EQ(place.size, expected[r].size) << "rank " << r;
  }
  EXPECT_EQ(local_place({"only"}, 0).size, 1);
}

TEST(HostIdentity, ThisHostIsLoopbackOrAnAddressOfThisNetworkNamespace) {
  EXPECT_TRUE(is_this_host("localhost"));
  EXPECT_TRUE(is_this_host("127.0.0.1"));
  EXPECT_TRUE(is_this_host("127.0.1.1"));
  EXPECT_TRUE(is_this_host("::1"));
  const std::string external = first_external_address();
  if (!external.empty()) {
    EXPECT_TRUE(is_this_host(external)) << external;
  }
  EXPECT_FALSE(is_this_host("203.0.113.7"));  // TEST-NET-3: never an address of this machine
  EXPECT_FALSE(is_this_host("no-such-host.invalid"));
}

}  // namespace
}  // namespace hvd::core
