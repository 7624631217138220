// The backends' own answers to faults, through the plugin table, with no hvd host around them:
// abort (ABI 1.1) from another thread ends a call blocked on a peer that never comes, later calls
// fail at once, finalize after it is prompt; Gloo turns ranks that disagree on a large collective
// into HVD_ERR_MISMATCH (Gloo's own check would end the process on its event-loop thread); the
// kvs test plugin's fault knobs do what they say. Ranks are threads of this process, each with
// host services of this file (an in-memory store and an out-of-band allgather built on it).
//
// The MPI backend cannot run two ranks in one process: hvd_mpi_abort_job (mpi_abort_job.cpp)
// tests its abort under mpirun, from fault_jobs_test.cpp.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hvd/backend.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

thread_local std::string t_error;  // what the plugin last set_error'ed on this thread

// Host services for `size` ranks of one communicator, each rank a thread of this process.
class Job {
 public:
  explicit Job(int size) : size_(size), ranks_(static_cast<size_t>(size)) {
    for (int r = 0; r < size; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.job = this;
      rank.rank = r;
      rank.services = hvd_host_services{
          sizeof(hvd_host_services), &rank,     &Job::kv_set,   &Job::kv_get, &Job::free_value,
          &Job::oob_allgather,       &Job::log, &Job::set_error};
    }
  }

  int size() const { return size_; }
  const hvd_host_services* services(int rank) {
    return &ranks_[static_cast<size_t>(rank)].services;
  }

 private:
  struct Rank {
    Job* job = nullptr;
    int rank = 0;
    int oob_round = 0;
    hvd_host_services services{};
  };

  static Rank& of(void* ctx) { return *static_cast<Rank*>(ctx); }

  static hvd_status kv_set(void* ctx, const char* key, const void* value, size_t size) {
    Job& job = *of(ctx).job;
    const std::lock_guard<std::mutex> lock(job.mutex_);
    const char* bytes = static_cast<const char*>(value);
    job.store_[key] = std::vector<char>(bytes, bytes + size);
    job.changed_.notify_all();
    return HVD_SUCCESS;
  }

  static hvd_status kv_get(void* ctx, const char* key, int64_t timeout_ms, void** value,
                           size_t* size) {
    Job& job = *of(ctx).job;
    std::unique_lock<std::mutex> lock(job.mutex_);
    if (!job.changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                               [&] { return job.store_.count(key) > 0; })) {
      return HVD_ERR_TIMEOUT;
    }
    const std::vector<char>& stored = job.store_[key];
    *size = stored.size();
    *value = std::malloc(stored.size() + 1);
    if (!stored.empty()) std::memcpy(*value, stored.data(), stored.size());
    return HVD_SUCCESS;
  }

  static void free_value(void*, void* value) { std::free(value); }

  static hvd_status oob_allgather(void* ctx, const void* send, size_t size, void* recv,
                                  int64_t timeout_ms) {
    Rank& me = of(ctx);
    const std::string round = "oob/" + std::to_string(me.oob_round++) + "/";
    kv_set(ctx, (round + std::to_string(me.rank)).c_str(), send, size);
    for (int r = 0; r < me.job->size_; ++r) {
      void* value = nullptr;
      size_t got = 0;
      const hvd_status s =
          kv_get(ctx, (round + std::to_string(r)).c_str(), timeout_ms, &value, &got);
      if (s != HVD_SUCCESS) return s;
      if (got == size && size > 0) std::memcpy(static_cast<char*>(recv) + r * size, value, size);
      std::free(value);
    }
    return HVD_SUCCESS;
  }

  static void log(void*, hvd_log_level, const char*) {}
  static void set_error(void*, const char* message) { t_error = message; }

  const int size_;
  std::vector<Rank> ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> store_;
};

const hvd_backend_v1* load(const char* path) {
  void* library = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);  // never closed, as hvd does
  if (library == nullptr) return nullptr;
  auto entry =
      reinterpret_cast<hvd_backend_entry_v1_fn>(::dlsym(library, HVD_BACKEND_ENTRY_SYMBOL));
  return entry != nullptr ? entry() : nullptr;
}

// One communicator of `job.size()` ranks on `table`, made by init on every rank at once.
std::vector<hvd_backend_comm*> init_all(const hvd_backend_v1* table, Job& job,
                                        std::chrono::milliseconds timeout) {
  std::vector<hvd_backend_comm*> comms(static_cast<size_t>(job.size()), nullptr);
  std::vector<int32_t> members(static_cast<size_t>(job.size()));
  for (int r = 0; r < job.size(); ++r) members[static_cast<size_t>(r)] = r;
  std::vector<std::thread> threads;
  for (int r = 0; r < job.size(); ++r) {
    threads.emplace_back([&, r] {
      hvd_backend_init_args args{};
      args.struct_size = sizeof args;
      args.rank = r;
      args.size = job.size();
      args.local_rank = r;
      args.local_size = job.size();
      args.timeout_ms = timeout.count();
      args.local_address = "127.0.0.1";
      args.host = job.services(r);
      args.members = members.data();
      args.member_count = job.size();
      args.comm_id = 1;
      args.member_local_rank = r;
      args.member_local_size = job.size();
      hvd_backend_comm* comm = nullptr;
      if (table->init(&args, &comm) == HVD_SUCCESS) comms[static_cast<size_t>(r)] = comm;
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// Death by SIGSEGV; under a sanitizer, its report of the SEGV and its exit (the sanitizers
// handle SIGSEGV themselves).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EXPECT_DIES_OF_SIGSEGV(statement) \
  EXPECT_EXIT(                            \
      statement, [](int status) { return status != 0; }, "SEGV")
#else
#define EXPECT_DIES_OF_SIGSEGV(statement) \
  EXPECT_EXIT(statement, ::testing::KilledBySignal(SIGSEGV), "")
#endif

hvd_collective_args float_args(std::vector<float>& data) {
  hvd_collective_args a{};
  a.struct_size = sizeof a;
  a.sendbuf = data.data();
  a.recvbuf = data.data();
  a.count = data.size();
  a.dtype = HVD_FLOAT32;
  a.op = HVD_SUM;
  a.memory_type = HVD_MEMORY_HOST;
  a.device = -1;
  return a;
}

struct Outcome {
  hvd_status status;
  std::string error;
  double seconds;
};

// Runs fn on a thread of its own (a rank's), timing it and keeping what it set_error'ed.
std::future<Outcome> start(std::function<hvd_status()> fn) {
  return std::async(std::launch::async, [fn = std::move(fn)] {
    t_error.clear();
    const auto begin = Clock::now();
    const hvd_status s = fn();
    return Outcome{s, t_error, std::chrono::duration<double>(Clock::now() - begin).count()};
  });
}

double seconds_of(const std::function<void()>& fn) {
  const auto begin = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

// ---- gloo ---------------------------------------------------------------------------------------

class GlooFaults : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    table_ = load(HVD_GLOO_PLUGIN);
    ASSERT_NE(table_, nullptr) << ::dlerror();
    ASSERT_NE(table_->abort, nullptr);
  }
  const hvd_backend_v1* table_ = nullptr;
};

// Rank 1 never calls; rank 0's call, blocked on it (the sync mesh at 8 B, the event-loop mesh at
// 64 MiB, with sends queued that abort turns into EPIPE), ends at abort, far before the timeout.
TEST_P(GlooFaults, AbortEndsACallBlockedOnAPeerThatNeverComes) {
  Job job(2);
  auto comms = init_all(table_, job, 30s);
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
  std::vector<float> data(GetParam() / sizeof(float), 1.0f);
  auto call = start([&] {
    const hvd_collective_args a = float_args(data);
    return table_->allreduce(comms[0], &a);
  });
  std::this_thread::sleep_for(300ms);
  t_error.clear();
  EXPECT_EQ(table_->abort(comms[0]), HVD_SUCCESS) << t_error;
  ASSERT_EQ(call.wait_for(5s), std::future_status::ready) << "abort did not end the call";
  const Outcome o = call.get();
  EXPECT_EQ(o.status, HVD_ERR_STATE) << o.error;
  EXPECT_NE(o.error.find("aborted"), std::string::npos) << o.error;
  EXPECT_LT(o.seconds, 0.3 + 2.0);

  // Later calls fail at once, without the network; abort again is harmless.
  const Outcome later = start([&] { return table_->barrier(comms[0]); }).get();
  EXPECT_EQ(later.status, HVD_ERR_STATE);
  EXPECT_NE(later.error.find("aborted"), std::string::npos) << later.error;
  EXPECT_LT(later.seconds, 0.1);
  EXPECT_EQ(table_->abort(comms[0]), HVD_SUCCESS);

  // finalize after abort skips the leaving barrier; the peer's finalize finds the connections
  // closed, both well within the timeout.
  EXPECT_LT(seconds_of([&] { EXPECT_EQ(table_->finalize(comms[0]), HVD_SUCCESS); }), 2.0);
  EXPECT_LT(seconds_of([&] { table_->finalize(comms[1]); }), 5.0);
}

INSTANTIATE_TEST_SUITE_P(SyncAndEventLoopMeshes, GlooFaults,
                         ::testing::Values(size_t{8}, size_t{64} << 20),
                         [](const auto& p) { return p.param == 8 ? "8B" : "64MiB"; });

// Both ranks past the agreement and in the data of a 256 MiB allreduce on the event-loop mesh
// (about 0.3 s on loopback), with writes queued on Gloo's thread: abort on rank 0 ends its call at
// once (the queued writes meet EPIPE, whose SIGPIPE Gloo's thread blocks), and rank 1 reads the
// end of its connections at once too.
TEST(GlooAbort, EndsBothRanksInTheMiddleOfALargeAllreduce) {
  const hvd_backend_v1* table = load(HVD_GLOO_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  Job job(2);
  auto comms = init_all(table, job, 30s);
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
  std::vector<float> d0(size_t{64} << 20, 1.0f), d1(size_t{64} << 20, 2.0f);
  const hvd_collective_args a0 = float_args(d0), a1 = float_args(d1);
  auto r0 = start([&] { return table->allreduce(comms[0], &a0); });
  auto r1 = start([&] { return table->allreduce(comms[1], &a1); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(table->abort(comms[0]), HVD_SUCCESS);
  ASSERT_EQ(r0.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(r1.wait_for(5s), std::future_status::ready);
  const Outcome o0 = r0.get(), o1 = r1.get();
  if (o0.status == HVD_SUCCESS && o1.status == HVD_SUCCESS) {
    GTEST_SKIP() << "the allreduce finished in " << o0.seconds << " s, before abort";
  }
  EXPECT_EQ(o0.status, HVD_ERR_STATE) << o0.error;
  EXPECT_NE(o0.error.find("aborted"), std::string::npos) << o0.error;
  EXPECT_NE(o1.status, HVD_SUCCESS);
  EXPECT_LT(o1.seconds, 5.0) << o1.error;
  auto f0 = start([&] { return table->finalize(comms[0]); });
  auto f1 = start([&] { return table->finalize(comms[1]); });
  EXPECT_LT(f0.get().seconds, 2.0);
  EXPECT_LT(f1.get().seconds, 5.0);
}

TEST(GlooAbort, WithNoCallInProgressThenFinalizeIsPrompt) {
  const hvd_backend_v1* table = load(HVD_GLOO_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  Job job(2);
  auto comms = init_all(table, job, 30s);
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
  EXPECT_EQ(table->abort(comms[0]), HVD_SUCCESS);
  std::vector<float> data(4, 1.0f);
  const hvd_collective_args a = float_args(data);
  EXPECT_EQ(start([&] { return table->allreduce(comms[0], &a); }).get().status, HVD_ERR_STATE);
  // Rank 1's next call finds rank 0's connections shut down: an error, not a wait.
  const Outcome peer = start([&] { return table->allreduce(comms[1], &a); }).get();
  EXPECT_NE(peer.status, HVD_SUCCESS);
  EXPECT_LT(peer.seconds, 5.0) << peer.error;
  auto finalize0 = start([&] { return table->finalize(comms[0]); });
  auto finalize1 = start([&] { return table->finalize(comms[1]); });
  EXPECT_LT(finalize0.get().seconds, 2.0);
  EXPECT_LT(finalize1.get().seconds, 5.0);
}

// 1 Mi against 1 Mi + 1 float32: without the agreement, the rank with fewer elements receives a
// longer message than its buffer on Gloo's event-loop thread, and the process aborts.
TEST(GlooMismatch, CountsThatDifferOnTheEventLoopMeshFailEveryRankAndLeaveItUsable) {
  const hvd_backend_v1* table = load(HVD_GLOO_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  Job job(2);
  auto comms = init_all(table, job, 10s);
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
  std::vector<float> a0(1 << 20, 1.0f), a1((1 << 20) + 1, 2.0f);
  const hvd_collective_args args0 = float_args(a0), args1 = float_args(a1);
  auto r0 = start([&] { return table->allreduce(comms[0], &args0); });
  auto r1 = start([&] { return table->allreduce(comms[1], &args1); });
  for (const Outcome& o : {r0.get(), r1.get()}) {
    EXPECT_EQ(o.status, HVD_ERR_MISMATCH) << o.error;
    EXPECT_NE(o.error.find("rank 0 allreduce of 1048576 float32 (sum); rank 1 allreduce of "
                           "1048577 float32 (sum)"),
              std::string::npos)
        << o.error;
  }
  // A broadcast against an allreduce of the same size is a mismatch too.
  std::vector<float> b0(1 << 20, 1.0f), b1(1 << 20, 2.0f);
  hvd_collective_args bargs0 = float_args(b0), bargs1 = float_args(b1);
  auto s0 = start([&] { return table->allreduce(comms[0], &bargs0); });
  auto s1 = start([&] { return table->broadcast(comms[1], &bargs1); });
  EXPECT_EQ(s0.get().status, HVD_ERR_MISMATCH);
  EXPECT_EQ(s1.get().status, HVD_ERR_MISMATCH);

  // Every rank saw the same shapes and stopped before sending data: the next call works.
  auto ok0 = start([&] { return table->allreduce(comms[0], &bargs0); });
  auto ok1 = start([&] { return table->allreduce(comms[1], &bargs1); });
  EXPECT_EQ(ok0.get().status, HVD_SUCCESS);
  EXPECT_EQ(ok1.get().status, HVD_SUCCESS);
  EXPECT_EQ(b0.front(), 3.0f);
  EXPECT_EQ(b1.back(), 3.0f);
  auto f0 = start([&] { return table->finalize(comms[0]); });
  auto f1 = start([&] { return table->finalize(comms[1]); });
  EXPECT_EQ(f0.get().status, HVD_SUCCESS);
  EXPECT_EQ(f1.get().status, HVD_SUCCESS);
}

// ---- kvs's fault knobs --------------------------------------------------------------------------

// Sets environment variables for the life of the object (the knobs are read at init).
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      ::setenv(name, value, 1);
      names_.push_back(name);
    }
  }
  ~Env() {
    for (const char* name : names_) ::unsetenv(name);
  }

 private:
  std::vector<const char*> names_;
};

hvd_backend_comm* init_one(const hvd_backend_v1* table, Job& job) {
  auto comms = init_all(table, job, 5s);
  return comms[0];
}

TEST(KvsKnobs, AHangEndsAtAbortAndLaterCallsFailAtOnce) {
  const hvd_backend_v1* table = load(HVD_KVS_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  ASSERT_NE(table->abort, nullptr);
  const Env env{{"HVD_TEST_HANG", "allreduce"}, {"HVD_TEST_FAULT_SKIP", "1"}};
  Job job(1);
  hvd_backend_comm* comm = init_one(table, job);
  ASSERT_NE(comm, nullptr);
  std::vector<float> data(4, 1.0f);
  const hvd_collective_args a = float_args(data);
  EXPECT_EQ(start([&] { return table->allreduce(comm, &a); }).get().status, HVD_SUCCESS)
      << "HVD_TEST_FAULT_SKIP=1 lets the first call through";
  auto hung = start([&] { return table->allreduce(comm, &a); });
  EXPECT_EQ(hung.wait_for(1500ms), std::future_status::timeout)
      << "the call must ignore its 5 s timeout... and it returned within 1.5 s";
  EXPECT_EQ(table->abort(comm), HVD_SUCCESS);
  ASSERT_EQ(hung.wait_for(2s), std::future_status::ready);
  const Outcome o = hung.get();
  EXPECT_EQ(o.status, HVD_ERR_STATE);
  EXPECT_NE(o.error.find("HVD_TEST_HANG"), std::string::npos) << o.error;
  const Outcome later = start([&] { return table->barrier(comm); }).get();
  EXPECT_EQ(later.status, HVD_ERR_STATE);
  EXPECT_NE(later.error.find("aborted"), std::string::npos) << later.error;
  EXPECT_EQ(table->finalize(comm), HVD_SUCCESS);
}

TEST(KvsKnobs, AFinalizeHangEndsAtAbort) {
  const hvd_backend_v1* table = load(HVD_KVS_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  const Env env{{"HVD_TEST_HANG", "finalize"}};
  Job job(1);
  hvd_backend_comm* comm = init_one(table, job);
  ASSERT_NE(comm, nullptr);
  auto finalize = start([&] { return table->finalize(comm); });
  EXPECT_EQ(finalize.wait_for(500ms), std::future_status::timeout);
  EXPECT_EQ(table->abort(comm), HVD_SUCCESS);
  ASSERT_EQ(finalize.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(finalize.get().status, HVD_SUCCESS);
}

TEST(KvsKnobs, TheHangRankAloneHangs) {
  const hvd_backend_v1* table = load(HVD_KVS_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  const Env env{{"HVD_TEST_HANG", "barrier"}, {"HVD_TEST_HANG_RANK", "1"}};
  Job job(1);  // rank 0 of 1: not the hanging rank
  hvd_backend_comm* comm = init_one(table, job);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(start([&] { return table->barrier(comm); }).get().status, HVD_SUCCESS);
  EXPECT_EQ(table->finalize(comm), HVD_SUCCESS);
}

TEST(KvsKnobs, AnUnknownCallNameFailsInit) {
  const hvd_backend_v1* table = load(HVD_KVS_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  const Env env{{"HVD_TEST_CRASH", "allredcue"}};
  Job job(1);
  t_error.clear();
  hvd_backend_init_args args{};
  args.struct_size = sizeof args;
  args.size = 1;
  args.local_size = 1;
  args.timeout_ms = 1000;
  args.local_address = "";
  args.host = job.services(0);
  hvd_backend_comm* comm = nullptr;
  EXPECT_EQ(table->init(&args, &comm), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(t_error.find("HVD_TEST_CRASH='allredcue' is none of init, allreduce"),
            std::string::npos)
      << t_error;
}

TEST(KvsKnobsDeathTest, ACrashKnobRaisesSigsegvInThatCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // earlier tests started threads
  const hvd_backend_v1* table = load(HVD_KVS_PLUGIN);
  ASSERT_NE(table, nullptr) << ::dlerror();
  EXPECT_DIES_OF_SIGSEGV({
    ::setenv("HVD_TEST_CRASH", "broadcast", 1);
    Job job(1);
    hvd_backend_comm* comm = init_one(table, job);
    std::vector<float> data(4, 1.0f);
    hvd_collective_args a = float_args(data);
    if (comm != nullptr) table->broadcast(comm, &a);
    std::exit(0);  // not reached when the knob works
  });
}

TEST(CrashEntryDeathTest, TheEntryFunctionRaisesSigsegv) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DIES_OF_SIGSEGV({
    load(HVD_CRASHENTRY_PLUGIN);
    std::exit(0);
  });
}

}  // namespace
