// scheduler_job.hpp — ranks as threads, each with its own Scheduler over fake backends: the
// harness of the scheduler's and the device executor's unit tests.
#ifndef HVD_TESTS_SCHEDULER_JOB_HPP
#define HVD_TESTS_SCHEDULER_JOB_HPP

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_collectives.hpp"
#include "scheduler/scheduler.hpp"

namespace hvd::testing {

using hvd::core::Scheduler;
using hvd::core::SchedulerOptions;
using hvd::core::Submission;
using namespace std::chrono_literals;

inline constexpr std::chrono::duration<double> kWait = 30s;

inline SchedulerOptions fast_options() {
  SchedulerOptions o;
  o.cycle_time = std::chrono::microseconds(200);
  return o;
}

// N ranks, each with its own scheduler over separate data and control fakes (so the tests can
// count the data path's calls) and its own fake CUDA memory. With `data_takes_cuda`, the data
// backend takes CUDA memory as it is; otherwise CUDA tensors are staged through host memory.
class Job {
 public:
  Job(int size, SchedulerOptions options, bool data_takes_cuda = false)
      : data_(size), control_(size) {
    for (int r = 0; r < size; ++r) {
      device_memory.push_back(std::make_unique<FakeDeviceMemory>());
      data_ranks.push_back(
          std::make_unique<FakeRank>(data_, r, data_takes_cuda, device_memory.back().get()));
      control_ranks.push_back(std::make_unique<FakeRank>(control_, r));
    }
    for (int r = 0; r < size; ++r) {
      options.device_memory = device_memory[static_cast<size_t>(r)].get();
      auto started = Scheduler::start(*data_ranks[static_cast<size_t>(r)],
                                      *control_ranks[static_cast<size_t>(r)], options);
      EXPECT_TRUE(started.ok()) << started.status().to_string();
      schedulers.push_back(std::move(started).value());
    }
  }
  // Every rank finalizes at once (as a job's ranks do), and every scheduler stops before the
  // fakes go.
  ~Job() {
    for (auto& s : schedulers) s->shutdown();
    schedulers.clear();
  }

  int size() const { return data_.size(); }
  // Returns once every rank's first cycle (the one at start) has taken its queue: what is
  // submitted from then on waits for a later cycle.
  void past_first_cycles() {
    for (const auto& s : schedulers) {
      while (s->stats().cycles == 0) std::this_thread::sleep_for(1ms);
    }
  }
  Scheduler& at(int rank) { return *schedulers[static_cast<size_t>(rank)]; }

  // fn(rank) on one thread per rank.
  void each(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }
  int data_allreduces() const {
    int n = 0;
    for (const auto& r : data_ranks) n += r->allreduces;
    return n / size();
  }
  int control_allgathers() const { return control_ranks[0]->allgathers; }

  std::vector<std::unique_ptr<FakeRank>> data_ranks, control_ranks;
  std::vector<std::unique_ptr<FakeDeviceMemory>> device_memory;
  std::vector<std::unique_ptr<Scheduler>> schedulers;

 private:
  FakeWorld data_, control_;
};

inline Submission allreduce(const std::string& name, const void* send, void* recv, hvd_dtype dtype,
                            std::vector<int64_t> shape, hvd_reduce_op op = HVD_SUM) {
  Submission s;
  s.name = name;
  s.send = send;
  s.recv = recv;
  s.spec.type = HVD_COLLECTIVE_ALLREDUCE;
  s.spec.dtype = dtype;
  s.spec.shape.assign(shape.begin(), shape.end());
  s.spec.op = op;
  return s;
}

inline Submission allgather(const std::string& name, const void* send, void* recv, hvd_dtype dtype,
                            std::vector<int64_t> shape) {
  Submission s = allreduce(name, send, recv, dtype, std::move(shape));
  s.spec.type = HVD_COLLECTIVE_ALLGATHER;
  return s;
}

// Rank r's `rows` rows of `width` int64 elements: row i holds 1000 * r + i, every element of it.
inline std::vector<int64_t> rows_of(int rank, int64_t rows, int64_t width) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < rows; ++i) v.insert(v.end(), static_cast<size_t>(width), 1000 * rank + i);
  return v;
}

// Returns once `scheduler` has finished `n` tensors (settled them), failing the test after kWait.
inline void until_settled(Scheduler& scheduler, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (scheduler.stats().tensors < n) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "nothing settled within kWait";
    std::this_thread::sleep_for(1ms);
  }
}

inline Status submit_and_wait(Scheduler& scheduler, Submission s) {
  auto completion = scheduler.submit(std::move(s));
  if (!completion.ok()) return completion.status();
  return (*completion)->wait(kWait);
}

// Submits the group and waits for every tensor of it: the first failure, or success.
inline Status submit_group_and_wait(Scheduler& scheduler, std::vector<Submission> group) {
  auto done = scheduler.submit_group(std::move(group));
  if (!done.ok()) return done.status();
  for (auto& c : *done) HVD_RETURN_IF_ERROR(c->wait(kWait));
  return Status::success();
}
}  // namespace hvd::testing

#endif  // HVD_TESTS_SCHEDULER_JOB_HPP
