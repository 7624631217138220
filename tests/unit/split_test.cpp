// Communicator::split: a child per color with its members ordered by key then rank, placed on
// their hosts, with an id every member derives alike; ranks that pass different arguments fail
// alike.
#include "comm/communicator.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fake_env.hpp"
#include "hvd/sdk/fnv.hpp"
#include "kvs_job.hpp"

namespace hvd::core {
namespace {

using hvd::testing::run_ranks;
using hvd::testing::test_plugin;
using hvd::testing::with_var;
using Record = Communicator::SplitRecord;

Record record(int32_t color, int32_t key = 0, uint64_t check = 0) {
  Record r;
  r.color = color;
  r.key = key;
  r.check = check;
  return r;
}

Result<std::unique_ptr<Communicator>> on_kvs(const EnvLookup& env) {
  CommOptions options;
  options.backend = test_plugin("kvs");
  return Communicator::create(options, env);
}

// A child's id: the parent's, the split's ordinal among the parent's splits, and the color.
uint64_t child_id(uint64_t parent, uint64_t ordinal, int32_t color) {
  return hvd::sdk::Fnv1a().add(parent).add(ordinal).add(static_cast<uint64_t>(color)).digest();
}

TEST(CommunicatorSplit, AChildIsACommunicatorOfItsOwnAndEverySplitCountsInItsId) {
  auto parent = on_kvs(fake_env({}));
  ASSERT_TRUE(parent.ok()) << parent.status().to_string();
  Communicator& p = **parent;
  auto none = p.split({record(-1)}, "hvd_comm_split");
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(*none, nullptr);
  auto made = p.split({record(0)}, "hvd_comm_split");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  ASSERT_NE(*made, nullptr);
  Communicator& child = **made;
  EXPECT_EQ(child.rank(), 0);
  EXPECT_EQ(child.size(), 1);
  EXPECT_EQ(child.members(), std::vector<int32_t>{0});
  EXPECT_EQ(child.timeout(), p.timeout());
  // The split that gave no child counted too: every rank counts every split alike.
  EXPECT_EQ(child.id(), child_id(p.id(), 1, 0));
  auto other = p.split({record(5)}, "hvd_comm_split");
  ASSERT_TRUE(other.ok() && *other != nullptr) << other.status().to_string();
  EXPECT_EQ((*other)->id(), child_id(p.id(), 2, 5));
  int32_t value = 7, sum = 0;
  ASSERT_TRUE(child.allreduce(host_args(&value, &sum, 1, HVD_INT32)).ok());
  EXPECT_EQ(sum, 7);
  EXPECT_TRUE(child.finalize().ok());
  EXPECT_TRUE((*other)->finalize().ok());
}

std::string ints(const std::vector<int32_t>& v) {
  std::string out;
  for (int32_t x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

// Four ranks on hosts a, a, b, b split by colors 0, 1, 0, 0 with keys 2, 7, 1, 2. Each reports
// its child's view: its place, its members, the sum of its members' job ranks + 1 and their
// ranks gathered (both over the child's backend), then its id.
std::string split_on_rank(int rank, const EnvLookup& env) {
  auto parent = on_kvs(with_var(env, "HVD_HOSTNAME", rank < 2 ? "a" : "b"));
  if (!parent.ok()) return parent.status().to_string();
  auto made =
      (*parent)->split({record(0, 2), record(1, 7), record(0, 1), record(0, 2)}, "hvd_comm_split");
  if (!made.ok()) return made.status().to_string();
  Communicator& child = **made;
  const World& w = child.world();
  int32_t mine = rank + 1, sum = 0;
  Status s = child.allreduce(host_args(&mine, &sum, 1, HVD_INT32));
  if (!s.ok()) return "allreduce: " + s.to_string();
  int32_t me = rank;
  std::vector<int32_t> gathered(static_cast<size_t>(child.size()), -1);
  s = child.allgather(host_args(&me, gathered.data(), 1, HVD_INT32));
  if (!s.ok()) return "allgather: " + s.to_string();
  char id[20];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(child.id()));
  std::string report = "rank " + std::to_string(w.rank) + "/" + std::to_string(w.size) + " local " +
                       std::to_string(w.local_rank) + "/" + std::to_string(w.local_size) +
                       " members " + ints(child.members()) + " sum " + std::to_string(sum) +
                       " gathered " + ints(gathered) + " id " + id;
  s = child.finalize();
  if (s.ok()) s = (*parent)->finalize();
  return s.ok() ? report : report + " | finalize: " + s.to_string();
}

TEST(CommunicatorSplit, MembersAreOrderedByKeyThenRankAndEachColorIsACommunicator) {
  const auto reports = run_ranks(4, {{"HVD_TIMEOUT", "60"}}, split_on_rank);
  std::vector<std::string> views, ids;
  for (const std::string& r : reports) {
    const size_t at = r.rfind(" id ");
    views.push_back(r.substr(0, at));
    ids.push_back(at == std::string::npos ? "" : r.substr(at + 4));
  }
  EXPECT_EQ(views[0], "rank 1/3 local 0/1 members 2,0,3 sum 8 gathered 2,0,3");
  EXPECT_EQ(views[1], "rank 0/1 local 0/1 members 1 sum 2 gathered 1");
  EXPECT_EQ(views[2], "rank 0/3 local 0/2 members 2,0,3 sum 8 gathered 2,0,3");
  EXPECT_EQ(views[3], "rank 2/3 local 1/2 members 2,0,3 sum 8 gathered 2,0,3");
  EXPECT_EQ(ids[0].size(), 16u);
  EXPECT_EQ(ids[2], ids[0]);
  EXPECT_EQ(ids[3], ids[0]);
  EXPECT_NE(ids[1], ids[0]);
}

// Rank 1 passes another check value (a process set's ranks listed otherwise): every rank fails
// the split with one message, and the parent goes on.
std::string mismatched_split_on_rank(int /*rank*/, const EnvLookup& env) {
  auto parent = on_kvs(env);
  if (!parent.ok()) return parent.status().to_string();
  auto made = (*parent)->split({record(0, 0, 7), record(0, 0, 8)}, "hvd_comm_split");
  std::string report = made.ok() ? "split succeeded" : made.status().to_string();
  report += " | barrier " + (*parent)->barrier().to_string();
  return report + " | finalize " + (*parent)->finalize().to_string();
}

TEST(CommunicatorSplit, RanksThatPassDifferentArgumentsFailAlike) {
  const auto reports = run_ranks(2, {{"HVD_TIMEOUT", "60"}}, mismatched_split_on_rank);
  for (const std::string& r : reports) {
    EXPECT_EQ(r,
              "mismatch between ranks: hvd_comm_split: the ranks passed different arguments (rank "
              "0's and rank 1's differ) | barrier success | finalize success");
  }
}

}  // namespace
}  // namespace hvd::core
