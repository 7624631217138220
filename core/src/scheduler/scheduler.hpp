// scheduler.hpp — named asynchronous collectives, negotiated, fused and run by one background
// thread per communicator (Horovod's design; docs/scheduler.md).
//
// Application threads submit named tensors and get a Completion back. Every HVD_CYCLE_TIME the
// background thread takes what was submitted, agrees with the other ranks on what is ready
// everywhere (negotiation.hpp), packs ready allreduces of one kind into a fusion buffer of up to
// HVD_FUSION_THRESHOLD bytes, runs one backend collective per buffer, unpacks, and completes.
#ifndef HVD_CORE_SCHEDULER_SCHEDULER_HPP
#define HVD_CORE_SCHEDULER_SCHEDULER_HPP

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bootstrap/settings.hpp"
#include "comm/collectives.hpp"
#include "comm/device_memory.hpp"
#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"
#include "scheduler/device_executor.hpp"
#include "scheduler/negotiation.hpp"
#include "scheduler/timeline.hpp"

namespace hvd::core {

struct SchedulerOptions {
  std::chrono::microseconds cycle_time{1000};       // HVD_CYCLE_TIME (ms)
  uint64_t fusion_threshold = 128ull << 20;         // HVD_FUSION_THRESHOLD (bytes; 0: no fusion)
  size_t cache_capacity = 1024;                     // HVD_CACHE_CAPACITY (0: no cache)
  std::string timeline;                             // HVD_TIMELINE (written by rank 0)
  bool timeline_mark_cycles = false;                // HVD_TIMELINE_MARK_CYCLES
  std::chrono::duration<double> stall_check{60};    // HVD_STALL_CHECK_TIME_SECONDS (0: off)
  std::chrono::duration<double> stall_shutdown{0};  // HVD_STALL_SHUTDOWN_TIME_SECONDS (0: off)
  // How CUDA tensors are staged through the fusion buffer for a backend that takes host memory
  // only (null: the CUDA runtime's); a test's fake where there is no GPU.
  DeviceMemory* device_memory = nullptr;
  // Bounds the waits for staging copies (the communicator's HVD_TIMEOUT).
  std::chrono::milliseconds timeout{30000};
  // HVD_DEVICE_EXECUTOR (default 1): CUDA tensors on a backend that takes CUDA memory run on the
  // device executor; 0 gives them to the backend as they are (the direct path), as where the
  // executor cannot run (for a test plugin that takes host pointers for CUDA memory).
  bool device_executor = true;

  // The knobs above, as hvd_init read them.
  static SchedulerOptions from(const Settings& settings);
};

class Scheduler;

// Why a scheduler's communicators were aborted, once they were: shared with the completions it
// settled on a device. Their events complete even when the backend was aborted under their work
// (ncclCommAbort ends NCCL's kernels without a CUDA error), so an operation whose device work
// was not yet seen complete when the communicators broke fails with their error.
class SharedFailure {
 public:
  void set(const Status& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!why_) why_ = why;
  }
  std::optional<Status> get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return why_;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<Status> why_;
};

// An operation's work on a device, where it has some: the event after it, and the scheduler's
// failure that would make it fail.
struct DeviceWork {
  std::shared_ptr<const DeviceEvent> event;
  std::shared_ptr<const SharedFailure> failure;
  bool direct = false;  // queued on its own stream, with no event of hvd's (the direct path)
};

// The end of one submitted operation; shared by the scheduler and the caller's handle.
//
// An operation is *settled* once the scheduler is done with it: failed, or run, or (CUDA tensors
// on a backend that takes CUDA memory) queued on a device with an event after its work. It is
// *done* once settled and that event, if any, has completed: then its results are there.
class Completion {
 public:
  explicit Completion(Scheduler& scheduler) : scheduler_(scheduler) {}
  bool done() const;
  // Waits up to `timeout` (forever if negative) until done; HVD_ERR_TIMEOUT if it is not. The
  // scheduler counts the caller as waiting meanwhile (see Scheduler::waiting). An error on the
  // device becomes the operation's status.
  Status wait(std::chrono::duration<double> timeout) const;
  // Waits up to `timeout` until settled; then work queued on `stream` (a cudaStream_t of the
  // operation's device) runs after the operation's, and the host does not wait for the device.
  // An operation without device work (host memory, staged) is waited for until done. One that
  // ran on its own stream (the direct path) cannot be ordered so: HVD_ERR_UNSUPPORTED.
  Status order_stream(void* stream, std::chrono::duration<double> timeout) const;
  void complete(Status status, DeviceWork on_device = {});
  // Completes every one, then wakes their waiters: a caller that waits on them in order wakes
  // once, not once per completion while the rest are still being completed.
  static void complete_all(const std::vector<std::shared_ptr<Completion>>& all,
                           const Status& status, const DeviceWork& on_device = {});

  // An allgather submitted without a recv buffer: the gathered tensor hvd allocated, and its
  // first dimension (the ranks', summed). Set by the scheduler before it completes; read once it
  // succeeded, and owned by the completion.
  void set_output(std::unique_ptr<char[]> data, int64_t first_dim);
  Status output(void** data, int64_t* first_dim) const;
  // An alltoall's rows received from each rank: set before it completes, read once it succeeded.
  void set_received_splits(std::vector<int64_t> splits);
  Status received_splits(std::vector<int64_t>* splits) const;
  // A join's: the rank that joined last, set before it completes, read once it succeeded.
  void set_last_joined(int rank);
  Status last_joined(int* rank) const;

 private:
  bool settle(const Status& status, DeviceWork on_device);
  // Settled, waits up to `deadline` for the device event (if any): the operation's status then.
  Status wait_for_device(std::chrono::steady_clock::time_point deadline) const;
  // Under mutex_: settled and the device event seen complete (polled once more if not yet).
  bool done_locked() const;
  // Under mutex_: waits up to `timeout` (forever if negative) until settled.
  bool wait_settled(std::unique_lock<std::mutex>& lock,
                    std::chrono::duration<double> timeout) const;

  // Alive while this is not done: a scheduler completes everything it queued before it ends.
  // So a waiter is counted in and out by wait() while not done, and by settle() when done.
  Scheduler& scheduler_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  mutable int waiters_ = 0;  // threads in wait() counted in the scheduler
  bool done_ = false;        // settled
  mutable Status status_;
  // Completes the operation on its device; the event dropped once seen complete.
  mutable DeviceWork on_device_;
  std::unique_ptr<char[]> output_;
  int64_t output_first_dim_ = -1;  // -1: no output allocated by hvd
  std::optional<std::vector<int64_t>> received_splits_;
  std::optional<int> last_joined_;
};

// One tensor to submit.
struct Submission {
  std::string name;
  TensorSpec spec;  // group fields and the output capacity are filled in at submission
  const void* send = nullptr;
  void* recv = nullptr;         // an allgather's may be NULL: hvd allocates the output
  void* stream = nullptr;       // CUDA tensors: the cudaStream_t their buffers are ordered on
  bool capacity_given = false;  // an alltoall's spec.output_capacity is the caller's
  // Work of hvd's own that must run between the backend calls, at the same point on every rank
  // (a split of the communicators the scheduler drives): run instead of the (empty) collective,
  // on the scheduler's thread, which alone calls the backends while it runs.
  std::function<Status()> task;
};

class Scheduler {
 public:
  // Starts the background thread. `control` carries negotiation (host memory), `data` the
  // tensors; they may be the same object. Both must outlive the scheduler.
  static Result<std::unique_ptr<Scheduler>> start(Collectives& data, Collectives& control,
                                                  SchedulerOptions options);
  // Whether a backend can carry negotiation (be `control`): host memory, uint8 and int64, and
  // MIN (a backend that cannot negotiates through another, HVD_CONTROLLER).
  static bool can_negotiate_over(uint64_t capabilities, uint64_t dtypes, uint64_t reduce_ops) {
    const uint64_t needed_dtypes = HVD_DTYPE_BIT(HVD_UINT8) | HVD_DTYPE_BIT(HVD_INT64);
    return (capabilities & HVD_CAP_HOST_MEMORY) != 0 && (dtypes & needed_dtypes) == needed_dtypes &&
           (reduce_ops & HVD_REDUCE_OP_BIT(HVD_MIN)) != 0;
  }
  ~Scheduler();  // shutdown(), then joins

  // Checks the arguments here and queues the tensor. A bad one fails now, on this rank, and is
  // still negotiated (carrying its error), so that it fails within a cycle on the ranks that
  // submitted the same name too, and blocking calls stay matched.
  Result<std::shared_ptr<Completion>> submit(Submission&& submission);
  // Several tensors queued at once; every rank's group completes in the same cycle. When one is
  // bad, the call fails and every tensor of the group fails on every rank, as above.
  Result<std::vector<std::shared_ptr<Completion>>> submit_group(std::vector<Submission> group);
  // Horovod's join: this rank has nothing more to submit. Until every rank has joined, it takes
  // part in the allreduces the others submit (host memory) with zeros; any other collective
  // submitted meanwhile fails on every rank. Completes once every rank joined, with the rank
  // that joined last (Completion::last_joined).
  Result<std::shared_ptr<Completion>> join();

  // Application threads waiting for their tensors (+1 as one starts, -1 as one stops): a thread
  // that waits has nothing more to submit for now, so the cycle clock stops waiting for more.
  void waiting(int change);

  // Stops on every rank in the same cycle: the first rank to call it ends the scheduler of all.
  // Operations in flight fail with a message that says so.
  void shutdown();
  // shutdown(), then waits until the background thread has stopped or `deadline` passed; true
  // if it stopped. (It stops within a backend call's limit once the communicators are aborted.)
  bool stop_by(std::chrono::steady_clock::time_point deadline);
  // Why the scheduler stopped, when it was a failure (a backend error or timeout, a stall
  // shutdown), not a shutdown: finalize reports it.
  std::optional<Status> failure() const;

  // Counters since start (read from any thread).
  struct Stats {
    uint64_t cycles = 0;
    uint64_t full_negotiations = 0;  // cycles that gathered requests: somebody missed the cache
    double negotiation_seconds = 0;  // the cache-bit vote, gathers and validation
    uint64_t tensors = 0;            // completed
    uint64_t backend_calls = 0;      // data collectives run (a fused buffer counts once)
  };
  Stats stats() const;

 private:
  struct Entry {
    Submission what;
    std::shared_ptr<Completion> completion;
    Timeline::Clock::time_point submitted;
    Timeline::Clock::time_point negotiated;
    uint64_t elements = 0;  // computed once: the cycle asks for it per tensor, more than once
    uint64_t bytes() const { return elements * hvd_dtype_size(what.spec.dtype); }
    FirstDims first_dims;  // an allgather's, as negotiated
    bool sent = false;     // its request went to the message table (not waiting on a cache bit)
    Status local_error;    // it failed this rank's checks: negotiated only to fail everywhere
    DeviceExecutor::Ready ready;      // a CUDA tensor's on a backend that takes CUDA memory
    std::list<Entry>::iterator self;  // its node in queue_, then in pending_
    // A joined rank's part in another rank's allreduce: zeros it owns, and no name in flight.
    std::unique_ptr<char[]> stand_in;
  };
  // A tensor found ready everywhere, with the group and error every rank agrees on.
  struct Verdict {
    Entry* entry;
    uint64_t group;
    uint32_t group_size;
    std::string error;  // a mismatch, or a rank's own failure: the entry fails with it
    FirstDims first_dims;
    hvd_status error_code = HVD_ERR_MISMATCH;
  };
  Scheduler(Collectives& data, Collectives& control, SchedulerOptions options);
  // Checks a submission's arguments (a bad one fails now, on this rank) and completes its spec.
  Status prepare(Submission& s) const;
  // Under mutex_: whether a tensor of this name may be queued now; then queue it.
  Status admit_locked(const std::string& name) const;
  std::shared_ptr<Completion> queue_locked(Submission&& s, Timeline::Clock::time_point now,
                                           const DeviceExecutor::Ready& ready = {});
  // Whether a tensor runs on the device executor: CUDA memory on a backend that takes it, where
  // the executor can drive the device. Where it cannot (no CUDA runtime or driver: a build without
  // the toolkit, a test plugin that takes host pointers for CUDA memory), such tensors take the
  // direct path: to the backend as they are, on their own stream, unfused and unscaled, and
  // complete once queued.
  // Decided by prepare() (TensorSpec::device_executor), and agreed on by negotiation.
  static bool on_device(const TensorSpec& spec) { return spec.device_executor; }
  // CUDA memory on a backend that takes it: asks the device executor once whether it can drive
  // the device (see on_device); the reason where not.
  const Status& probe_device(int32_t device) const;
  // A checked submission on the device executor: its ready event (none otherwise), or why none
  // could be recorded.
  Result<DeviceExecutor::Ready> ready_event(const Submission& s);
  static Status duplicate(const std::string& name);
  // This rank has joined: an entry of zeros in pending_ for a tensor the others submitted.
  Entry* stand_in_for(const std::string& name, const TensorSpec& spec);
  void loop();
  // The cycle clock. While this rank has tensors in flight, cycles follow each other a cycle time
  // apart. An idle rank waits for the first submission and votes a cycle time after it, so that
  // the vote catches the application's whole burst instead of racing it for the CPU; it still
  // votes every kIdleVoteInterval, so that peers' shutdowns and failures reach it.
  // While an application thread waits, what is queued is voted on at once, and cycles follow
  // each other without a pause for as long as each runs something; a cycle that runs nothing
  // (peers have not submitted: a stall, or a slower rank) puts the clock back in charge, so that
  // waiting never spins.
  void wait_for_next_cycle(Timeline::Clock::time_point last_start);
  static constexpr std::chrono::milliseconds kIdleVoteInterval{100};
  Status run_cycle(bool* stop);
  Result<std::vector<std::vector<Request>>> gather(const std::vector<Request>& mine);
  void stall_check(Timeline::Clock::time_point now);
  void execute(std::vector<Verdict> ready);
  void run_fused(std::vector<Entry*>& batch);
  // A batch of CUDA allreduces (one or more) on the device executor.
  void run_on_device(std::vector<Entry*>& batch);
  // Copies each entry's device buffer to or from its place in the fusion buffer, then waits.
  Status stage(const std::vector<Entry*>& batch, bool in);
  void run_alone(Entry& e);
  Status run_collective(Entry& e);  // any but a fused allreduce, on the backend
  // The device executor could not queue a batch's work: the communicator breaks.
  void fail_device(const Status& status);
  Status run_allgather(Entry& e);
  Status run_reduce_scatter(Entry& e);
  static Result<void*> output_of(const Submission& w, uint64_t bytes,
                                 std::unique_ptr<char[]>* allocated);
  Status run_alltoall(Entry& e);
  void finish(Entry* e, const Status& status, const DeviceWork& on_device = {});
  // `on_device`: the event after the entries' device work (they complete when it does).
  void finish(const std::vector<Entry*>& entries, const Status& status,
              const DeviceWork& on_device = {});
  // What finishes a batch the device executor queued: its event, and this scheduler's failure.
  DeviceWork on_device_done(const Result<DeviceExecutor::Done>& done) const {
    return done.ok() ? DeviceWork{*done, failure_token_, false} : DeviceWork{};
  }
  void fail_all(const Status& status);
  // The communicators broke (or negotiation failed): abort both, so that peers learn at once,
  // and fail everything with the error that broke them.
  void fail_for(const Status& status);
  // Where a batch's buffers lie end to end in memory, the first byte; nullptr otherwise.
  template <typename Pointer>
  static Pointer end_to_end(const std::vector<Entry*>& batch, Pointer Submission::*buffer);

  Collectives& data_;
  Collectives& control_;
  SchedulerOptions options_;
  Negotiator negotiator_;
  std::unique_ptr<Timeline> timeline_;
  StagingBuffer fusion_buffer_;                      // pinned once it has staged CUDA tensors
  std::unique_ptr<DeviceExecutor> device_executor_;  // where the backend takes CUDA memory
  std::shared_ptr<SharedFailure> failure_token_ = std::make_shared<SharedFailure>();
  // The device of this rank's CUDA tensors on such a backend: the first one submitted fixes it
  // (NCCL binds one device per communicator); -1 before.
  mutable std::atomic<int32_t> cuda_device_{-1};
  mutable std::once_flag device_probe_;
  mutable Status device_unusable_;  // why the device executor cannot run, once probed
  std::vector<char> scratch_;       // a reduce-scatter's padded or scaled input and output

  // Shared with submitting threads. Entries live in list nodes from submission to completion
  // (the queue's nodes are spliced onto pending_), so views of their names stay valid.
  mutable std::mutex mutex_;
  std::list<Entry> queue_;
  // Finished entries, kept for the next submissions (a step's worth, at most kSpareEntries): a
  // submission then allocates no node, and its name reuses its storage.
  std::list<Entry> spare_;
  static constexpr size_t kSpareEntries = 4096;
  std::unordered_set<std::string_view> in_flight_;            // names submitted and not completed
  std::vector<decltype(in_flight_)::node_type> spare_names_;  // its nodes, kept like spare_
  bool shutdown_requested_ = false;
  int waiting_ = 0;                       // application threads waiting for a completion
  std::condition_variable work_arrived_;  // the queue's first entry, a waiter, or shutdown
  std::optional<Status> stopped_;         // why the scheduler no longer runs
  std::optional<Status> failure_;         // ... when it was a failure
  bool exited_ = false;                   // the background thread is done
  std::condition_variable exited_cv_;

  // Background thread only: what was taken from the queue, in submission order; the entries
  // whose requests went out in full, by name; grouped tensors waiting for their whole group.
  std::list<Entry> pending_;
  std::unordered_map<std::string_view, Entry*> sent_;
  std::map<uint64_t, std::vector<Verdict>> held_;
  bool last_cycle_ran_ = false;  // the last cycle found something ready
  Timeline::Clock::time_point last_stall_warning_{};
  bool stall_shutdown_due_ = false;
  std::atomic<uint64_t> cycles_{0}, full_negotiations_{0}, negotiation_ns_{0}, tensors_{0},
      backend_calls_{0};
  std::thread thread_;
};

}  // namespace hvd::core

#endif  // HVD_CORE_SCHEDULER_SCHEDULER_HPP
