// communicator.hpp — one live backend over all ranks of the job: the engine behind hvd_comm.
#ifndef HVD_CORE_COMM_COMMUNICATOR_HPP
#define HVD_CORE_COMM_COMMUNICATOR_HPP

#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/env.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/settings.hpp"
#include "bootstrap/store.hpp"
#include "comm/collectives.hpp"
#include "comm/device_memory.hpp"
#include "comm/host_services.hpp"
#include "comm/watchdog.hpp"
#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"
#include "hvd/sdk/runner.hpp"
#include "loader/plugin_loader.hpp"

namespace hvd::core {

struct CommOptions {
  std::optional<std::string> backend;                // else HVD_BACKEND, else "gloo"
  std::optional<std::chrono::milliseconds> timeout;  // else HVD_TIMEOUT
  // Why this communicator exists, when it is not the job's own ("bootstrap for gloo"): part of
  // the agreement, so that ranks doing different things fail together instead of deadlocking.
  std::string purpose;
  // How CUDA memory is staged for a backend that takes host memory only, and host memory for one
  // that takes CUDA memory only (null: the CUDA runtime's); a test's fake where there is no GPU.
  // It must outlive the communicator.
  DeviceMemory* device_memory = nullptr;
};

// Every backend call is bounded: by HVD_TIMEOUT plus kMargin, and by the end of the blocking
// hvd_* call it serves (begin_serving). A call that overruns is aborted by the watchdog
// (plugins with `abort`) or walked away from (plugins without: their calls run on a Runner). A
// backend error, a timeout or an abort breaks the communicator for good: every later call fails
// with the error that broke it, and finalize releases the backend without talking to peers.
//
// Starting a call reads no clock (a reading is a third of the host's cost of a small call):
// the watchdog stamps each call, and each blocking hvd_* call served, at its first look, within
// one Watchdog::kPeriod of its start, so a deadline is never early, and late by at most the two
// periods to the look that stamps it and the look that finds it past (while the watchdog's
// thread runs on time).
class Communicator final : public Collectives, private Watchdog::Watched {
 public:
  using Clock = std::chrono::steady_clock;
  // Past HVD_TIMEOUT, how long a backend call may run before the host aborts it: a plugin that
  // honours timeout_ms returns first, with its own, more precise message.
  static constexpr std::chrono::milliseconds kMargin{1000};

  // Discover the world, reach the rendezvous store, load the backend, check that every rank
  // chose the same one, and initialize it.
  // `settings`: the knobs as hvd_init read them; `env` for the launcher's variables.
  static Result<std::unique_ptr<Communicator>> create(const CommOptions& options,
                                                      const Settings& settings,
                                                      const EnvLookup& env);
  // The same with the knobs read from `env` (tests; hvd_init reads them itself first).
  static Result<std::unique_ptr<Communicator>> create(const CommOptions& options,
                                                      const EnvLookup& env);
  ~Communicator() override;  // finalize(), if it has not run
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Validate `args` (struct_size set) against this job and backend, then run the collective.
  Status allreduce(const hvd_collective_args& args) override;
  Status allgather(const hvd_collective_args& args) override;
  Status broadcast(const hvd_collective_args& args) override;
  // The plugin's reduce_scatter, or an allreduce into a host buffer keeping this rank's block.
  Status reduce_scatter(const hvd_collective_args& args) override;
  // The plugin's alltoall, or one broadcast per rank of what it sends (host memory).
  Status alltoall(const hvd_collective_args& args, const uint64_t* matrix) override;
  bool takes_cuda_memory() const override {
    return (plugin_.capabilities & HVD_CAP_CUDA_MEMORY) != 0;
  }
  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }
  Status barrier();
  // The checks allreduce/allgather/broadcast make before calling the backend, alone.
  Status check_allreduce(const hvd_collective_args& args) const;
  Status check_allgather(const hvd_collective_args& args) const;
  Status check_broadcast(const hvd_collective_args& args) const;
  Status check_reduce_scatter(const hvd_collective_args& args) const;
  // What alltoall checks before it knows recv_counts (they come from the peers).
  Status check_alltoall_send(const hvd_collective_args& args) const;

  Status health() const override;
  void abort(const Status& why) override;
  // A backend that takes CUDA memory only binds the device current where it was made.
  int32_t cuda_device() const override { return host_staging_device_; }
  // Releases the backend (with its peers while healthy; alone once broken) and reports the
  // error that broke the communicator, if any. Bounded like any call; once. A call still in
  // progress (walked away from, or on another thread) keeps what it uses: nothing is freed.
  Status finalize();
  // Until end_serving(), no backend call runs past the end of the blocking hvd_* call `api` (a
  // string literal) that the caller serves: HVD_TIMEOUT + kMargin from the watchdog's first look
  // at it. A timeout's message names it.
  void begin_serving(const char* api);
  // The same for the calls a parent's hierarchical allreduce makes on this child: under what the
  // parent serves, if anything.
  void serve_for(const Communicator& parent);
  void end_serving();
  std::chrono::milliseconds timeout() const { return timeout_; }
  // A collective that moves `bytes` (a multiple of 8) of host memory: hvd's own control records,
  // in a dtype the plugin takes.
  hvd_collective_args control_args(const void* send, void* recv, size_t bytes) const;

  const World& world() const { return world_; }
  // The knobs hvd_init read, which the communicators made from this one share.
  const Settings& settings() const { return settings_; }
  const Plugin& plugin() const { return plugin_; }
  // The job rank of each rank of this communicator (the identity for the world).
  const std::vector<int32_t>& members() const { return members_; }
  uint64_t id() const { return comm_id_; }

  // What each rank of this communicator says in a split: its color (< 0: no child), its key,
  // and a value every rank must pass alike (a process set's ranks, hashed; 0 for a plain split).
  struct SplitRecord {
    int32_t color = -1;
    int32_t key = 0;
    uint64_t check = 0;
    int32_t error = HVD_SUCCESS;  // this rank's own arguments failed its checks
    int32_t reserved = 0;
  };
  // HVD_HIERARCHICAL_ALLREDUCE: whether allreduces of at least kHierarchicalMinBytes of host
  // memory run in three phases (reduce-scatter within the host, allreduce across hosts, allgather
  // within the host). Needs two hosts or more with the same number of ranks on each.
  bool hierarchical() const { return local_ != nullptr; }
  static constexpr uint64_t kHierarchicalMinBytes = 64 * 1024;

  // This rank's child (null for a negative color) from every rank's record, in rank order:
  // collective over every rank of this communicator (the plugin's split on it, or an init over
  // the child's members with services of their own). `what` names the call in errors.
  Result<std::unique_ptr<Communicator>> split(const std::vector<SplitRecord>& records,
                                              const std::string& what);

 private:
  Communicator() = default;
  // Every rank's init record (its host, its launcher's word on its place there, its backend
  // choice): the same verdict on every rank, and this rank's local rank and size among the ranks
  // of its host. True when the hosts place some rank otherwise than its launcher did.
  Result<bool> agree_and_place(const std::vector<std::string>& records);
  // The same for a job without rendezvous, over the (initialized) backend itself.
  Result<bool> agree_through_backend(const std::string& record);
  // Makes the communicators within this rank's host and across hosts (collective), when the job
  // qualifies; `chunk_bytes`: the pipeline's chunk (0: the phases one after another).
  Status enable_hierarchical(uint64_t chunk_bytes);
  Status hierarchical_allreduce(const hvd_collective_args& args);
  // Make the backend's communicator over the world as it now stands (the plugin's init), and
  // release it.
  Status init_backend();
  // The arguments of the plugin's init or split for this communicator (members: their storage),
  // with fresh host services; and the watchdog's eye on it.
  hvd_backend_init_args prepare_backend(std::vector<int32_t>* members);
  // The plugin's split on this communicator (args NULL on a rank that joins no child), bounded
  // like a collective where the plugin can be aborted, else reported like init.
  Status call_split(const hvd_backend_init_args* args, hvd_backend_comm** child);
  Status finalize_backend();
  // One bounded backend call (args NULL for a barrier).
  // Runs `args` (null: a barrier) on the backend, stamped with the call's deadline (ABI 1.2).
  Status call(hvd_collective entry, const char* what, const hvd_collective_args* unstamped);
  hvd_collective_args stamped(const hvd_collective_args& args) const;
  // The same for a plugin without abort: on the runner, walked away from at the deadline.
  Status call_on_runner(hvd_collective entry, const char* what, const hvd_collective_args* args,
                        Clock::time_point deadline);
  // "<what> on backend 'x' failed: <message>", with the plugin's code if it is one of hvd's.
  Status failed(const char* what, hvd_status code, const std::string& message) const;
  // A failed call breaks the communicator: the status its callers get from now on.
  Status broken_by(const char* what, hvd_status code, const std::string& message);
  Status timed_out(const std::string& what) const;
  Status timed_out_locked(const std::string& what) const;  // under call_mutex_
  Status finalized_already(const char* what) const;
  Status another_call(const char* what) const;
  Status run_on_runner(hvd_collective entry, const char* what, const hvd_collective_args* args,
                       Clock::time_point deadline);
  // Under call_mutex_: marks the communicator broken (the first reason sticks).
  void break_locked(const Status& why);
  // Interrupts the call in progress (the plugin's abort, the runner's wait, the host services).
  void abort_backend();
  void check(Clock::time_point now) override;  // the watchdog's
  // Keep what a call still in progress may use: the backend's communicator, the host services
  // and the store they read.
  void leak_for_stuck_call();
  // `args` for a call that reduces nothing, with an op the plugin declared.
  hvd_collective_args without_reduction(const hvd_collective_args& args) const;
  Status validate(hvd_collective entry, const char* what, const hvd_collective_args& args) const;
  // Whether a collective on `memory` runs staged: CUDA memory for a backend that takes host
  // memory only, host memory for one that takes CUDA memory only.
  int32_t device_for_host_memory() const;  // host_staging_device_, for a new communicator
  bool through_staging(hvd_memory_type memory) const {
    return stages(memory) || (memory == HVD_MEMORY_HOST && host_staging_device_ >= 0);
  }
  // Runs `run` on `a` moved to the memory the backend takes (host memory for CUDA, device memory
  // for host): this rank's input (`in_bytes` of a.sendbuf) is copied to `in_offset` of the
  // staging buffer, and the result (its first `out_bytes`) back to a.recvbuf.
  template <typename Run>
  Status staged(const char* what, const hvd_collective_args& a, uint64_t in_offset,
                uint64_t in_bytes, uint64_t out_bytes, Run&& run);

  World world_;  // a child's: its rank and size, and its local place among its members
  Plugin plugin_;
  uint64_t comm_id_ = 0;
  bool child_ = false;              // made by split
  std::vector<int32_t> members_;    // job ranks, by rank
  std::vector<std::string> hosts_;  // host identities, by rank
  int job_local_rank_ = 0;          // this process's place on its host among the job's ranks
  int job_local_size_ = 1;
  uint64_t splits_made_ = 0;     // the split ordinal: part of each child's id
  std::string prefix_;           // of this hvd_init's keys in the store
  std::string local_address_;    // this host's address as peers reach it
  std::string services_prefix_;  // of the plugin's keys
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<TcpStoreServer> server_;  // when this rank hosts the rendezvous
  std::shared_ptr<KvStore> store_;
  // Where the job's TCP store is, and its secret: each child opens a connection of its own (one
  // connection serves one request at a time, and children wait on the store concurrently).
  std::optional<HostPort> store_where_;
  std::string store_secret_;
  std::unique_ptr<HostServices> services_;
  hvd_backend_comm* backend_ = nullptr;  // set and taken under abort_mutex_
  DeviceMemory* device_memory_ = nullptr;

  // The call in progress, as the watchdog sees it, and what broke the communicator.
  mutable std::mutex call_mutex_;
  bool in_call_ = false;
  bool call_abortable_ = false;      // init cannot be: the watchdog only reports it
  const char* call_what_ = "";       // a string literal, as every call's name is
  Clock::time_point call_deadline_;  // kUnstamped until the watchdog's first look
  bool overran_ = false;
  static constexpr Clock::time_point kUnstamped = Clock::time_point::max();
  // The end of the blocking hvd_* call served, and its name: kNotServing; a scope not stamped
  // yet, which is -(its number among this communicator's scopes), so that the watchdog's
  // exchange never stamps a scope that began after it looked; or the stamp, a time (> 0). Set
  // by the calling thread without the lock, stamped by the watchdog.
  static constexpr Clock::rep kNotServing = std::numeric_limits<Clock::rep>::min();
  std::atomic<Clock::rep> serving_deadline_{kNotServing};
  std::atomic<const char*> serving_{""};
  int64_t serving_scopes_ = 0;  // the calling thread's
  // What a backend call that starts now and cannot wait for the watchdog's stamp (on a Runner,
  // which needs its deadline at once) is given: HVD_TIMEOUT + kMargin from now, or the served
  // call's end if that is stamped and sooner.
  Clock::time_point deadline_from_now() const;
  std::atomic<bool> broken_{false};
  Status broken_status_;
  bool watched_ = false;
  bool closing_ = false;          // finalize has begun: no call starts
  bool in_hierarchical_ = false;  // a hierarchical allreduce runs (on the children)

  std::mutex abort_mutex_;  // the plugin's abort and finalize never overlap
  bool backend_aborted_ = false;
  sdk::Runner
      runner_;  // the calls of a plugin without abort, and finalize; stuck once walked away from
  std::optional<Status> finalized_;
  StagingBuffer staging_;  // CUDA tensors through host memory; pinned once used
  // A backend that takes CUDA memory only (NCCL): host memory goes through device memory of the
  // device current where the communicator was made (the one the backend binds); -1 where none.
  int32_t host_staging_device_ = -1;
  DeviceBuffer device_staging_;
  std::vector<char> scratch_;  // the fallbacks' host buffer (inside staging, when staged)
  // HVD_HIERARCHICAL_ALLREDUCE: this rank's communicators within its host and across hosts (the
  // ranks of its local rank), the pipeline's chunk, and each chunk's reduced block.
  std::unique_ptr<Communicator> local_, cross_;
  uint64_t hierarchical_chunk_bytes_ = 0;
  Settings settings_;
  std::vector<char> blocks_;
};

// A rendezvous for a job started by a launcher (mpirun) without HVD_RENDEZVOUS_ADDR, made
// through a self-bootstrapping backend (HVD_BOOTSTRAP_BACKEND, default mpi).
Result<SharedRendezvous> rendezvous_through_launcher(const std::string& for_backend,
                                                     std::chrono::milliseconds timeout,
                                                     const Settings& settings,
                                                     const EnvLookup& env);

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_COMMUNICATOR_HPP
