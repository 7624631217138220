// The hierarchical allreduce (HVD_HIERARCHICAL_ALLREDUCE=1): four ranks as two hosts of two
// (HVD_HOSTNAME), in pipelined chunks, in one chunk, and flat where the job does not qualify.
#include "comm/communicator.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_env.hpp"
#include "kvs_job.hpp"

namespace hvd::core {
namespace {

using hvd::testing::run_ranks;
using hvd::testing::test_plugin;
using hvd::testing::with_var;

// Where `got` first differs from `want`, or "exact".
template <typename T>
std::string compared(const std::vector<T>& got, const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return "wrong at " + std::to_string(i) + ": " + std::to_string(got[i]) + " for " +
             std::to_string(want[i]);
    }
  }
  return "exact";
}

// Allreduces on a communicator of `size` ranks: 49153 int32 sums (three chunks of 64 KiB and
// one element that no chunk divides among the host's ranks), 20000 float averages (a chunk and a
// part of one) and 100 int32 sums (below the size hierarchy starts at).
std::string allreduces(Communicator& comm, int rank, int size) {
  std::string out = comm.hierarchical() ? "hierarchical" : "flat";
  std::vector<int32_t> in(49153), sums(in.size(), -1), want(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(i % 1000) * (rank + 1);
    want[i] = static_cast<int32_t>(i % 1000) * size * (size + 1) / 2;
  }
  Status s = comm.allreduce(host_args(in.data(), sums.data(), in.size(), HVD_INT32));
  out += ", sum " + (s.ok() ? compared(sums, want) : s.to_string());
  std::vector<float> values(20000, static_cast<float>(rank + 1)), averages(values.size(), -1);
  hvd_collective_args average =
      host_args(values.data(), averages.data(), values.size(), HVD_FLOAT32);
  average.op = HVD_AVERAGE;
  s = comm.allreduce(average);
  const std::vector<float> mean(values.size(), static_cast<float>(size + 1) / 2);
  out += ", average " + (s.ok() ? compared(averages, mean) : s.to_string());
  std::vector<int32_t> small(100, rank + 1), small_sums(100, -1);
  s = comm.allreduce(host_args(small.data(), small_sums.data(), small.size(), HVD_INT32));
  out +=
      ", small " + (s.ok() ? compared(small_sums, std::vector<int32_t>(100, size * (size + 1) / 2))
                           : s.to_string());
  return out;
}

// The ranks on `hosts` (rank r on hosts[r]) run allreduces() with each chunk size in turn.
std::vector<std::string> run_on_hosts(const std::string& hosts,
                                      const std::vector<std::string>& chunks) {
  const int size = static_cast<int>(hosts.size());
  return run_ranks(size, {{"HVD_TIMEOUT", "60"}, {"HVD_HIERARCHICAL_ALLREDUCE", "1"}},
                   [&](int rank, const EnvLookup& env) {
                     std::string report;
                     for (const std::string& chunk : chunks) {
                       CommOptions options;
                       options.backend = test_plugin("kvs");
                       const EnvLookup on_host =
                           with_var(with_var(env, "HVD_HOSTNAME", std::string(1, hosts[rank])),
                                    "HVD_HIERARCHICAL_CHUNK_BYTES", chunk);
                       auto comm = Communicator::create(options, on_host);
                       if (!comm.ok()) return report + comm.status().to_string();
                       report += "chunk " + chunk + ": " + allreduces(**comm, rank, size);
                       const Status finalized = (*comm)->finalize();
                       if (!finalized.ok()) return report + ", finalize: " + finalized.to_string();
                       report += "; ";
                     }
                     return report;
                   });
}

TEST(HierarchicalAllreduce, TwoHostsOfTwoReduceExactlyInPipelinedChunksAndInOne) {
  const auto reports = run_on_hosts("aabb", {"65536", "0"});
  for (const std::string& r : reports) {
    EXPECT_EQ(r,
              "chunk 65536: hierarchical, sum exact, average exact, small exact; "
              "chunk 0: hierarchical, sum exact, average exact, small exact; ");
  }
}

TEST(HierarchicalAllreduce, HostsWithDifferentRankCountsRunFlat) {
  const auto reports = run_on_hosts("aab", {"65536"});
  for (const std::string& r : reports) {
    EXPECT_EQ(r, "chunk 65536: flat, sum exact, average exact, small exact; ");
  }
}

}  // namespace
}  // namespace hvd::core
