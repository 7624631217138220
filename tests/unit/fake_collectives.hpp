// Ranks as threads: an in-process Collectives for the scheduler's unit tests. Every rank's call
// meets the others' at a rendezvous; the last to arrive computes every rank's result with the
// SDK's reference kernels. Ranks that call different collectives, or wait longer than the
// timeout, get an error (a scheduler bug, which the tests then see).
#ifndef HVD_TESTS_FAKE_COLLECTIVES_HPP
#define HVD_TESTS_FAKE_COLLECTIVES_HPP

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/collectives.hpp"
#include "fake_gpu.hpp"
#include "hvd/reduce.h"

namespace hvd::testing {

class FakeWorld {
 public:
  explicit FakeWorld(int size) : size_(size), calls_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  enum Kind { kAllreduce, kAllgather, kBroadcast, kReduceScatter };

  Status run(int rank, Kind kind, const hvd_collective_args& a) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    calls_[static_cast<size_t>(rank)] = Call{kind, a};
    if (++arrived_ == size_) {
      status_ = compute();
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::seconds(20),
                             [&] { return generation_ != generation; })) {
      return Status(HVD_ERR_TIMEOUT, "fake: rank " + std::to_string(rank) + " waited 20 s");
    }
    return status_;
  }

 private:
  struct Call {
    Kind kind;
    hvd_collective_args args;
  };

  Status compute() {
    const Call& first = calls_[0];
    // An allgatherv's counts differ by rank; every rank passes the same recv_counts.
    const uint64_t* counts = first.args.recv_counts;
    for (const Call& c : calls_) {
      const bool counts_agree =
          counts == nullptr ? c.args.recv_counts == nullptr && c.args.count == first.args.count
                            : c.args.recv_counts != nullptr &&
                                  std::equal(counts, counts + size_, c.args.recv_counts) &&
                                  c.args.count == counts[&c - calls_.data()];
      if (c.kind != first.kind || c.args.dtype != first.args.dtype || !counts_agree ||
          c.args.op != first.args.op || c.args.root != first.args.root) {
        return Status(HVD_ERR_MISMATCH, "fake: ranks called different collectives");
      }
    }
    const size_t element = hvd_dtype_size(first.args.dtype);
    const size_t bytes = first.args.count * element;
    if (counts != nullptr) {
      std::vector<char> result;
      for (const Call& c : calls_) {
        const char* in = static_cast<const char*>(c.args.sendbuf);
        result.insert(result.end(), in, in + c.args.count * element);
      }
      for (const Call& c : calls_) {
        if (!result.empty()) std::memcpy(c.args.recvbuf, result.data(), result.size());
      }
      return Status::success();
    }
    if (first.kind == kReduceScatter) {  // count elements per rank: reduce them all, scatter
      const uint64_t all = first.args.count * static_cast<uint64_t>(size_);
      std::vector<char> sum(bytes * static_cast<size_t>(size_));
      if (!sum.empty()) std::memcpy(sum.data(), calls_[0].args.sendbuf, sum.size());
      for (int r = 1; r < size_; ++r) {
        hvd_reduce(sum.data(), sum.data(), calls_[static_cast<size_t>(r)].args.sendbuf, all,
                   first.args.dtype, first.args.op);
      }
      if (first.args.op == HVD_AVERAGE) hvd_divide(sum.data(), all, first.args.dtype, size_);
      for (size_t r = 0; r < calls_.size(); ++r) {
        if (bytes > 0) std::memcpy(calls_[r].args.recvbuf, sum.data() + r * bytes, bytes);
      }
      return Status::success();
    }
    std::vector<char> result(first.kind == kAllgather ? bytes * size_ : bytes);
    switch (first.kind) {
      case kAllreduce:
        if (bytes > 0) std::memcpy(result.data(), calls_[0].args.sendbuf, bytes);
        for (int r = 1; r < size_; ++r) {
          hvd_reduce(result.data(), result.data(), calls_[static_cast<size_t>(r)].args.sendbuf,
                     first.args.count, first.args.dtype, first.args.op);
        }
        if (first.args.op == HVD_AVERAGE) {
          hvd_divide(result.data(), first.args.count, first.args.dtype, size_);
        }
        break;
      case kAllgather:
        for (int r = 0; r < size_; ++r) {
          if (bytes > 0) {
            std::memcpy(result.data() + bytes * static_cast<size_t>(r),
                        calls_[static_cast<size_t>(r)].args.sendbuf, bytes);
          }
        }
        break;
      case kReduceScatter:
        break;
      case kBroadcast: {
        const hvd_collective_args& root = calls_[static_cast<size_t>(first.args.root)].args;
        if (bytes > 0) std::memcpy(result.data(), root.sendbuf, bytes);
        break;
      }
    }
    for (const Call& c : calls_) {
      if (!result.empty()) std::memcpy(c.args.recvbuf, result.data(), result.size());
    }
    return Status::success();
  }

  const int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  Status status_;
};

// One rank of a FakeWorld. Counts the calls it gets, by kind, and keeps the last allreduce's
// buffers and memory type. With `takes_cuda`, it takes CUDA memory as it is, as NCCL does (the
// "device" buffers of these tests are host memory).
class FakeRank final : public core::Collectives {
 public:
  // With `gpu`, a collective on CUDA memory is queued on its stream there and runs when the fake
  // device runs it (as NCCL's kernels do); without, at once.
  FakeRank(FakeWorld& world, int rank, bool takes_cuda = false, FakeDeviceMemory* gpu = nullptr)
      : world_(world), rank_(rank), takes_cuda_(takes_cuda), gpu_(gpu) {}
  bool takes_cuda_memory() const override { return takes_cuda_; }
  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  Status allreduce(const hvd_collective_args& a) override {
    ++allreduces;
    last_allreduce_send = a.sendbuf;
    last_allreduce_recv = a.recvbuf;
    last_allreduce_memory = a.memory_type;
    last_allreduce_stream = a.stream;
    return run(FakeWorld::kAllreduce, a);
  }
  Status allgather(const hvd_collective_args& a) override {
    ++allgathers;
    return run(FakeWorld::kAllgather, a);
  }
  Status broadcast(const hvd_collective_args& a) override {
    ++broadcasts;
    return run(FakeWorld::kBroadcast, a);
  }
  Status reduce_scatter(const hvd_collective_args& a) override {
    return run(FakeWorld::kReduceScatter, a);
  }
  void abort(const Status& why) override {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted.ok()) aborted = why;
  }
  Status aborted_with() {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    return aborted;
  }

  std::atomic<int> allreduces{0}, allgathers{0}, broadcasts{0};
  std::atomic<const void*> last_allreduce_send{nullptr};
  std::atomic<void*> last_allreduce_recv{nullptr};
  std::atomic<hvd_memory_type> last_allreduce_memory{HVD_MEMORY_HOST};
  std::atomic<void*> last_allreduce_stream{nullptr};
  std::atomic<bool> fail_calls{false};  // every call fails from now on, as a broken backend's

 private:
  Status run(FakeWorld::Kind kind, const hvd_collective_args& a) {
    if (fail_calls) return Status(HVD_ERR_SYSTEM, "fake: the backend failed");
    if (gpu_ == nullptr || a.memory_type != HVD_MEMORY_CUDA) return world_.run(rank_, kind, a);
    // The device reports what goes wrong there through its events; a mismatch here is a
    // scheduler bug, which the test sees in the results.
    // The counts' arrays are the caller's, gone by the time a paused device runs this.
    const size_t n = static_cast<size_t>(world_.size());
    auto counts = std::make_shared<std::vector<uint64_t>>();
    if (a.recv_counts != nullptr) counts->assign(a.recv_counts, a.recv_counts + n);
    return gpu_->enqueue(a.device, a.stream, [this, kind, args = a, counts]() mutable {
      if (args.recv_counts != nullptr) args.recv_counts = counts->data();
      (void)world_.run(rank_, kind, args);
    });
  }

  FakeWorld& world_;
  int rank_;
  bool takes_cuda_;
  FakeDeviceMemory* gpu_;
  std::mutex abort_mutex_;
  Status aborted;
};

}  // namespace hvd::testing

#endif  // HVD_TESTS_FAKE_COLLECTIVES_HPP
