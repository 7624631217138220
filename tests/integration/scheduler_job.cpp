// A job for the fusion scheduler over a real backend (run under hvdrun or mpirun): many named
// tensors of random shapes, dtypes and collectives, submitted in a different random order on
// every rank, round after round; every result exact. Then a mismatch, which must be the same
// error on every rank while the job goes on, and a blocking call, which now runs through the
// scheduler.
//
//   hvd_scheduler_job [--tensors N] [--rounds R] [--seed S] [--device-memory]
//
// --device-memory marks every tensor as CUDA memory (device 0) for a test backend that claims
// device memory only and copies whatever it is given: negotiation then needs the controller.
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  std::printf("rank %d of %d: %d tensors x %d rounds exact, mismatch reported alike, blocking ok\n",
              rank, size, tensors, rounds);
  return 0;
}
