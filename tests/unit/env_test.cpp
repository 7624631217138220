#include "bootstrap/env.hpp"

#include <gtest/gtest.h>

#include "fake_env.hpp"

#include <map>

namespace hvd::core {
namespace {

TEST(DiscoverWorld, DefaultsToASingleProcess) {
  auto world = discover_world(fake_env({}));
  ASSERT_TRUE(world.ok());
  EXPECT_EQ(world->rank, 0);
  EXPECT_EQ(world->size, 1);
}

TEST(DiscoverWorld, HvdVariablesWinOverLaunchers) {
  auto world = discover_world(fake_env({{"HVD_RANK", "2"},
                                        {"HVD_SIZE", "3"},
                                        {"HVD_LOCAL_RANK", "0"},
                                        {"HVD_LOCAL_SIZE", "1"},
                                        {"OMPI_COMM_WORLD_RANK", "0"},
                                        {"OMPI_COMM_WORLD_SIZE", "8"}}));
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  EXPECT_EQ(world->rank, 2);
  EXPECT_EQ(world->size, 3);
  EXPECT_EQ(world->local_rank, 0);
  EXPECT_EQ(world->local_size, 1);
  EXPECT_EQ(world->source, "HVD_* variables");
  EXPECT_FALSE(world->from_launcher);
}

TEST(DiscoverWorld, ReadsOpenMpiPmiAndSlurm) {
  auto ompi = discover_world(fake_env({{"OMPI_COMM_WORLD_RANK", "5"},
                                       {"OMPI_COMM_WORLD_SIZE", "8"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  ASSERT_TRUE(ompi.ok());
  EXPECT_EQ(ompi->rank, 5);
  EXPECT_EQ(ompi->local_rank, 1);
  EXPECT_EQ(ompi->local_size, 4);
  EXPECT_EQ(ompi->source, "Open MPI");
  EXPECT_TRUE(ompi->from_launcher);

  auto pmi = discover_world(fake_env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  ASSERT_TRUE(pmi.ok());
  EXPECT_EQ(pmi->source, "PMI");
  EXPECT_EQ(pmi->local_size, 2);  // no local information: one host assumed

  auto slurm = discover_world(fake_env({{"SLURM_PROCID", "6"},
                                        {"SLURM_NTASKS", "7"},
                                        {"SLURM_LOCALID", "0"},
                                        {"SLURM_NODEID", "3"},
                                        {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  ASSERT_TRUE(slurm.ok()) << slurm.status().to_string();
  EXPECT_EQ(slurm->rank, 6);
  EXPECT_EQ(slurm->local_size, 1);
  EXPECT_EQ(slurm->source, "Slurm");
}

// Node 1 of SLURM_TASKS_PER_NODE=2(x3),1 runs 2 tasks; a list or node id Slurm would not write is
// an error naming the variable, not a task count of 0.
TEST(DiscoverWorld, ReadsSlurmsTasksPerNodeExactly) {
  auto slurm = [](const char* node, const char* spec) {
    return discover_world(fake_env({{"SLURM_PROCID", "2"},
                                    {"SLURM_NTASKS", "7"},
                                    {"SLURM_LOCALID", "0"},
                                    {"SLURM_NODEID", node},
                                    {"SLURM_TASKS_PER_NODE", spec}}));
  };
  ASSERT_TRUE(slurm("1", "2(x3),1").ok());
  EXPECT_EQ(slurm("1", "2(x3),1")->local_size, 2);
  EXPECT_EQ(slurm("1", "1,2,3")->local_size, 2);
  for (const char* spec : {"two", "2(x3,1", "2(x)", "2(3),1", "(x3)", "-2"}) {
    EXPECT_EQ(slurm("1", spec).status().message(),
              std::string("SLURM_TASKS_PER_NODE='") + spec +
                  "' is not a list of task counts like 2(x3),1")
        << spec;
  }
  EXPECT_EQ(slurm("one", "2(x3),1").status().message(),
            "SLURM_NODEID='one' is not a non-negative integer");
}

TEST(DiscoverWorld, AcceptsHorovodSpellings) {
  auto world = discover_world(fake_env({{"HOROVOD_RANK", "1"}, {"HOROVOD_SIZE", "2"}}));
  ASSERT_TRUE(world.ok());
  EXPECT_EQ(world->rank, 1);
}

TEST(DiscoverWorld, RejectsMalformedValuesWithTheVariableName) {
  auto half = discover_world(fake_env({{"HVD_RANK", "0"}}));
  EXPECT_EQ(half.status().message(), "HVD_RANK is set but HVD_SIZE is not: set both");
  auto text = discover_world(fake_env({{"HVD_RANK", "one"}, {"HVD_SIZE", "2"}}));
  EXPECT_EQ(text.status().message(), "HVD_RANK='one' is not a non-negative integer");
  for (const char* loose : {"+1", " 1", "1 ", "0x1", "99999999999999999999"}) {
    auto world = discover_world(fake_env({{"HVD_RANK", "0"}, {"HVD_SIZE", loose}}));
    EXPECT_EQ(world.status().message(),
              std::string("HVD_SIZE='") + loose + "' is not a non-negative integer");
  }
  auto outside = discover_world(fake_env({{"HVD_RANK", "3"}, {"HVD_SIZE", "3"}}));
  EXPECT_EQ(outside.status().message(), "HVD_RANK=3 is not a rank of HVD_SIZE=3");
  auto local = discover_world(fake_env(
      {{"HVD_RANK", "0"}, {"HVD_SIZE", "2"}, {"HVD_LOCAL_RANK", "2"}, {"HVD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(local.status().code(), HVD_ERR_INVALID_ARGUMENT);
}

TEST(Split, KeepsNonEmptyPiecesInOrder) {
  EXPECT_EQ(split("/a:/b::/c:", ':'), (std::vector<std::string>{"/a", "/b", "/c"}));
  EXPECT_EQ(split("  --mca x  y ", ' '), (std::vector<std::string>{"--mca", "x", "y"}));
  EXPECT_TRUE(split("", ',').empty());
}

}  // namespace
}  // namespace hvd::core
