// A job for the fusion scheduler over a real backend (run under hvdrun or mpirun): many named
// tensors of random shapes, dtypes and collectives, submitted in a different random order on
// every rank, round after round; every result exact. Then allgathers whose ranks differ in the
// first dimension and a blocking allgatherv (host memory), a mismatch, which must be the same
// error on every rank while the job goes on, and a blocking call, which now runs through the
// scheduler.
//
//   hvd_scheduler_job [--tensors N] [--rounds R] [--seed S] [--device-memory]
//
// --device-memory marks every tensor as CUDA memory (device 0) for a test backend that claims
// device memory only and copies whatever it is given: negotiation then needs the controller.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "hvd/hvd.hpp"
#include "tensor_workload.hpp"

namespace {

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int tensors = 200;
  int rounds = 3;
  uint32_t seed = 2026;
  hvd_placement placement{sizeof(hvd_placement), HVD_MEMORY_HOST, -1, nullptr};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device-memory") == 0) {
      placement.memory_type = HVD_MEMORY_CUDA;
      placement.device = 0;
    }
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tensors") == 0) tensors = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--seed") == 0) seed = static_cast<uint32_t>(std::atoi(argv[i + 1]));
  }
  auto comm = hvd::Comm::init();
  if (!comm.ok()) {
    std::fprintf(stderr, "init: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  const int rank = comm->rank();
  const int size = comm->size();
  const auto workload = hvd::testing::random_tensors(tensors, size, seed);

  for (int round = 0; round < rounds; ++round) {
    std::vector<size_t> order(workload.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(
        order.begin(), order.end(),
        std::mt19937(seed + 1000u * static_cast<uint32_t>(round) + static_cast<uint32_t>(rank)));
    std::vector<std::vector<char>> in(workload.size()), out(workload.size()), want(workload.size());
    std::vector<hvd::Request> requests;
    std::vector<size_t> which;
    for (size_t k : order) {
      const auto& t = workload[k];
      std::tie(in[k], want[k]) = hvd::testing::data_for(t, rank, size);
      out[k].assign(want[k].size(), 0x5a);
      auto submit = [&]() -> hvd::Result<hvd::Request> {
        switch (t.collective) {
          case HVD_COLLECTIVE_ALLREDUCE:
            return comm->allreduce_async(t.name, in[k].data(), out[k].data(), t.dtype, t.shape,
                                         t.op, 1, 1, &placement);
          case HVD_COLLECTIVE_ALLGATHER:
            return comm->allgather_async(t.name, in[k].data(), out[k].data(), t.dtype, t.shape,
                                         &placement);
          default:
            if (rank == t.root) std::copy(in[k].begin(), in[k].end(), out[k].begin());
            return comm->broadcast_async(t.name, out[k].data(), out[k].data(), t.dtype, t.shape,
                                         t.root, &placement);
        }
      };
      hvd::Result<hvd::Request> r = submit();
      if (!r.ok()) return fail(rank, t.name + ": " + r.status().to_string());
      requests.push_back(std::move(r).value());
      which.push_back(k);
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& t = workload[which[i]];
      const hvd::Status s = requests[i].wait(120);
      if (!s.ok()) return fail(rank, t.name + ": " + s.to_string());
      if (out[which[i]] != want[which[i]]) {
        return fail(rank, "round " + std::to_string(round) + ", " + t.name + ": wrong result");
      }
    }
  }

  // Allgathers whose ranks differ in the first dimension, into outputs hvd allocates (host memory
  // only), in a random order per rank: rank r sends (k + r) % 4 rows of k % 3 + 1 elements, each
  // element 100 * r + its row.
  if (placement.memory_type == HVD_MEMORY_HOST) {
    const int count = 20;
    std::vector<int> order(count);
    for (int k = 0; k < count; ++k) order[static_cast<size_t>(k)] = k;
    std::shuffle(order.begin(), order.end(), std::mt19937(seed + static_cast<uint32_t>(rank)));
    std::vector<std::vector<int64_t>> in(count);
    std::vector<std::optional<hvd::Request>> requests(count);
    for (int k : order) {
      const int64_t rows = (k + rank) % 4, width = k % 3 + 1;
      for (int64_t i = 0; i < rows * width; ++i) in[k].push_back(100 * rank + i / width);
      auto r = comm->allgather_async("v" + std::to_string(k), in[k].data(), nullptr, HVD_INT64,
                                     {rows, width}, &placement);
      if (!r.ok())
        return fail(rank, "allgather v" + std::to_string(k) + ": " + r.status().to_string());
      requests[static_cast<size_t>(k)].emplace(std::move(r).value());
    }
    for (int k = 0; k < count; ++k) {
      const std::string name = "allgather v" + std::to_string(k);
      const hvd::Request& request = *requests[static_cast<size_t>(k)];
      const hvd::Status s = request.wait(120);
      if (!s.ok()) return fail(rank, name + ": " + s.to_string());
      const auto out = request.output();
      if (!out.ok()) return fail(rank, name + ": " + out.status().to_string());
      std::vector<int64_t> want;
      int64_t want_rows = 0;
      const int64_t width = k % 3 + 1;
      for (int r = 0; r < size; ++r) {
        const int64_t rows = (k + r) % 4;
        want_rows += rows;
        for (int64_t i = 0; i < rows * width; ++i) want.push_back(100 * r + i / width);
      }
      const auto* got = static_cast<const int64_t*>(out->data);
      if (out->first_dim != want_rows || !std::equal(want.begin(), want.end(), got)) {
        return fail(rank, name + ": wrong result (first dimension " +
                              std::to_string(out->first_dim) + ", want " +
                              std::to_string(want_rows) + ")");
      }
    }
    // The blocking allgatherv, which now goes through the scheduler: rank r sends r + 1.
    std::vector<uint64_t> counts;
    std::vector<int32_t> want;
    for (int r = 0; r < size; ++r) {
      counts.push_back(static_cast<uint64_t>(r) + 1);
      want.insert(want.end(), static_cast<size_t>(r) + 1, r);
    }
    const std::vector<int32_t> mine(static_cast<size_t>(rank) + 1, rank);
    std::vector<int32_t> all(want.size(), -1);
    const hvd::Status v = comm->allgatherv(mine.data(), all.data(), counts.data(), HVD_INT32);
    if (!v.ok() || all != want)
      return fail(rank, "allgatherv through the scheduler: " + v.to_string());
  }

  // Ranks that disagree: the same message everywhere, and the job goes on.
  std::vector<float> a(4, 1.0f), b(4, 0.0f);
  const int64_t n = rank == 0 ? 3 : 4;
  auto mismatch = comm->allreduce_async("mismatch", a.data(), b.data(), HVD_FLOAT32, {n}, HVD_SUM,
                                        1, 1, &placement);
  if (!mismatch.ok()) return fail(rank, mismatch.status().to_string());
  const hvd::Status m = mismatch->wait(120);
  const std::string expected =
      "Mismatched ALLREDUCE tensor shapes for tensor 'mismatch': One rank sent a tensor of shape "
      "[3], but another rank sent a tensor of shape [4].";
  if (size > 1 && (m.code() != HVD_ERR_MISMATCH || m.message() != expected)) {
    return fail(rank, "mismatch gave: " + m.to_string());
  }

  // A blocking call now goes through the scheduler, in order on every rank.
  int64_t value = rank + 1;
  const hvd::Status blocking = comm->allreduce(&value, &value, 1, HVD_INT64, HVD_SUM, &placement);
  if (!blocking.ok() || value != static_cast<int64_t>(size) * (size + 1) / 2) {
    return fail(rank, "blocking allreduce through the scheduler: " + blocking.to_string() +
                          ", value " + std::to_string(value));
  }
  const hvd::Status finalized = comm->finalize();
  if (!finalized.ok()) return fail(rank, "finalize: " + finalized.to_string());
  std::printf(
      "rank %d of %d: %d tensors x %d rounds exact, allgathers of different first dimensions "
      "exact, mismatch reported alike, blocking ok\n",
      rank, size, tensors, rounds);
  return 0;
}
