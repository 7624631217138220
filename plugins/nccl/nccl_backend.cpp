// The NCCL backend: hvd's collectives on CUDA memory, enqueued on the caller's stream.
//
// Every NCCL communicator is made non-blocking (ncclConfig_t.blocking = 0), so that no call of
// NCCL's can hold the caller past the deadline: init, split and each enqueue return at once, and
// the plugin polls ncclCommGetAsyncError until the communicator is ready, failed, or the
// deadline passes (then ncclCommAbort). `abort` is ncclCommAbort, from any thread, as NCCL
// intends. Errors carry NCCL's own words (ncclGetLastError). The unique id travels through the
// host's out-of-band allgather; children come from ncclCommSplit.
//
// Calls are stream-ordered (docs/plugin-abi.md, section 6): a call returns once its work is
// enqueued on args.stream, and the caller synchronizes. Without a usable GPU, init fails with
// "no usable GPU: <the CUDA runtime's reason>", and hvd-info's description says the same.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hvd/sdk/backend.hpp"
#include "hvd/sdk/cuda_device.hpp"
#include "nccl_types.hpp"

namespace {

using hvd::Result;
using hvd::Status;
using hvd::nccl::data_type;
using hvd::nccl::reduce_op;
using hvd::sdk::InitContext;
using Clock = std::chrono::steady_clock;

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// Why this process cannot use a GPU, or "" when it can.
std::string no_gpu_reason() {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);  // leaves `devices` alone on failure
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
  }
  return devices == 0 ? "no CUDA device" : "";
}

// "0.1.0 (NCCL 2.28.9)": the NCCL this process loaded, which may differ from the build's.
const char* version() {
  static const std::string text =
      std::string(HVD_PLUGIN_VERSION) + " (NCCL " + nccl_version() + ")";
  return text.c_str();
}

const char* description() {
  static const std::string text = [] {
    std::string d = "NCCL " + nccl_version() + " collectives on CUDA memory, stream-ordered";
    const std::string why = no_gpu_reason();
    if (!why.empty()) d += " (no usable GPU: " + why + ")";
    return d;
  }();
  return text.c_str();
}

using OnDevice = hvd::sdk::OnCudaDevice;

class NcclBackend {
 public:
  static constexpr uint64_t dtypes = HVD_DTYPES_1_0;  // every dtype hvd has, NCCL has too
  static constexpr uint64_t reduce_ops = HVD_REDUCE_OPS_1_0;

  static Result<std::unique_ptr<NcclBackend>> create(const InitContext& ctx) {
    // Every rank's verdict travels with the unique id, so that a rank that cannot take part
    // fails them all at once, with its reason, instead of leaving them to time out.
    struct Offer {
      ncclUniqueId id;
      int32_t failed;
      char why[196];
    };
    Offer mine{};
    int device = 0;
    std::string why = no_gpu_reason();
    if (!why.empty()) {
      why = "no usable GPU: " + why;
    } else if (const cudaError_t rc = cudaGetDevice(&device); rc != cudaSuccess) {
      // NCCL binds the device current on this thread (the application chose it, usually
      // local_rank), and every call after runs there.
      why = std::string("cudaGetDevice: ") + cudaGetErrorString(rc);
    } else if (ctx.rank == 0) {
      if (const ncclResult_t got = ncclGetUniqueId(&mine.id); got != ncclSuccess) {
        why = std::string("ncclGetUniqueId: ") + ncclGetErrorString(got);
      }
    }
    mine.failed = why.empty() ? 0 : 1;
    std::snprintf(mine.why, sizeof mine.why, "%s", why.c_str());
    std::vector<Offer> all(static_cast<size_t>(ctx.size));
    HVD_RETURN_IF_ERROR(ctx.host.oob_allgather(&mine, sizeof mine, all.data(), ctx.timeout));
    for (int r = 0; r < ctx.size; ++r) {
      const Offer& o = all[static_cast<size_t>(r)];
      if (o.failed != 0) {
        const std::string reason(o.why, strnlen(o.why, sizeof o.why));
        return Status(reason.rfind("no usable GPU", 0) == 0 ? HVD_ERR_UNSUPPORTED : HVD_ERR_SYSTEM,
                      "rank " + std::to_string(r) + ": " + reason);  // alike on every rank
      }
    }
    auto self = std::unique_ptr<NcclBackend>(new NcclBackend(ctx, device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc =
        ncclCommInitRankConfig(&self->comm_, ctx.size, all[0].id, ctx.rank, &config);
    HVD_RETURN_IF_ERROR(self->settle("ncclCommInitRankConfig", rc, Clock::now() + ctx.timeout));
    return Result<std::unique_ptr<NcclBackend>>(std::move(self));
  }

  ~NcclBackend() {
    const OnDevice on(device_);
    if (comm_ != nullptr && !comm_gone_) {
      // A broken communicator is aborted (its work may never finish); a healthy one is destroyed
      // once its work has drained, within the timeout. On a non-blocking communicator
      // ncclCommFinalize returns ncclInProgress, and the communicator's state says when it is done.
      const ncclResult_t finalizing = broken_.load() ? ncclInternalError : ncclCommFinalize(comm_);
      if ((finalizing == ncclSuccess || finalizing == ncclInProgress) &&
          settle("ncclCommFinalize", finalizing, Clock::now() + timeout_).ok()) {
        (void)ncclCommDestroy(comm_);
      } else {
        std::lock_guard<std::mutex> lock(mutex_);
        abort_comm_locked();
      }
    }
    // After the communicator: cudaFree synchronizes the device, which its work may still hold.
    if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
    if (barrier_stream_ != nullptr) (void)cudaStreamDestroy(barrier_stream_);
  }

  Status allreduce(const hvd_collective_args& a) {
    return enqueue("ncclAllReduce", a, [&](cudaStream_t s) {
      return ncclAllReduce(a.sendbuf, a.recvbuf, a.count, data_type(a.dtype), reduce_op(a.op),
                           comm_, s);
    });
  }

  Status reduce_scatter(const hvd_collective_args& a) {
    // In place, hvd's result is at the buffer's start, NCCL's at this rank's block: NCCL runs
    // in place there, and the block is moved to the start after it, on the same stream.
    const size_t block = a.count * hvd_dtype_size(a.dtype);
    const bool in_place = a.sendbuf == a.recvbuf;
    char* result = static_cast<char*>(a.recvbuf) + (in_place ? rank_ * block : 0);
    return enqueue("ncclReduceScatter", a, [&](cudaStream_t s) {
      ncclResult_t rc = ncclReduceScatter(a.sendbuf, result, a.count, data_type(a.dtype),
                                          reduce_op(a.op), comm_, s);
      if (rc == ncclSuccess && result != a.recvbuf &&
          cudaMemcpyAsync(a.recvbuf, result, block, cudaMemcpyDeviceToDevice, s) != cudaSuccess) {
        (void)cudaGetLastError();
        rc = ncclUnhandledCudaError;
      }
      return rc;
    });
  }

  Status broadcast(const hvd_collective_args& a) {
    return enqueue("ncclBroadcast", a, [&](cudaStream_t s) {
      return ncclBroadcast(a.sendbuf, a.recvbuf, a.count, data_type(a.dtype), a.root, comm_, s);
    });
  }

  // With recv_counts (allgatherv), one broadcast per rank in a group, as NCCL has no
  // allgatherv of its own.
  Status allgather(const hvd_collective_args& a) {
    if (a.recv_counts == nullptr) {
      return enqueue("ncclAllGather", a, [&](cudaStream_t s) {
        return ncclAllGather(a.sendbuf, a.recvbuf, a.count, data_type(a.dtype), comm_, s);
      });
    }
    const size_t element = hvd_dtype_size(a.dtype);
    return enqueue("ncclBroadcast (allgatherv)", a, [&](cudaStream_t s) {
      ncclResult_t rc = ncclGroupStart();
      uint64_t offset = 0;
      for (int r = 0; r < size_ && rc == ncclSuccess; ++r) {
        char* to = static_cast<char*>(a.recvbuf) + offset * element;
        rc = ncclBroadcast(r == rank_ ? a.sendbuf : to, to, a.recv_counts[r], data_type(a.dtype), r,
                           comm_, s);
        offset += a.recv_counts[r];
      }
      const ncclResult_t ended = ncclGroupEnd();
      return rc != ncclSuccess ? rc : ended;
    });
  }

  Status alltoall(const hvd_collective_args& a) {
    const size_t element = hvd_dtype_size(a.dtype);
    return enqueue("ncclSend/ncclRecv (alltoall)", a, [&](cudaStream_t s) {
      ncclResult_t rc = ncclGroupStart();
      uint64_t sent = 0, received = 0;
      for (int r = 0; r < size_ && rc == ncclSuccess; ++r) {
        rc = ncclSend(static_cast<const char*>(a.sendbuf) + sent * element, a.send_counts[r],
                      data_type(a.dtype), r, comm_, s);
        if (rc == ncclSuccess) {
          rc = ncclRecv(static_cast<char*>(a.recvbuf) + received * element, a.recv_counts[r],
                        data_type(a.dtype), r, comm_, s);
        }
        sent += a.send_counts[r];
        received += a.recv_counts[r];
      }
      const ncclResult_t ended = ncclGroupEnd();
      return rc != ncclSuccess ? rc : ended;
    });
  }

  // NCCL has no barrier: an allreduce of one element on a buffer of the plugin's, waited for.
  Status barrier() {
    HVD_RETURN_IF_ERROR(usable("barrier"));
    const CallScope call(this);
    if (call.refused()) return usable("barrier");
    const OnDevice on(device_);
    if (barrier_buffer_ == nullptr) {
      if (const cudaError_t rc = cudaMalloc(&barrier_buffer_, sizeof(int32_t)); rc != cudaSuccess) {
        barrier_buffer_ = nullptr;
        return Status(HVD_ERR_SYSTEM, std::string("cudaMalloc: ") + cudaGetErrorString(rc));
      }
      (void)cudaMemset(barrier_buffer_, 0, sizeof(int32_t));
    }
    hvd_collective_args a{};
    a.struct_size = sizeof a;
    a.sendbuf = a.recvbuf = barrier_buffer_;
    a.count = 1;
    a.dtype = HVD_INT32;
    a.op = HVD_SUM;
    a.memory_type = HVD_MEMORY_CUDA;
    a.device = device_;
    a.stream = barrier_stream();
    if (a.stream == nullptr) return Status(HVD_ERR_SYSTEM, "cudaStreamCreate failed");
    HVD_RETURN_IF_ERROR(allreduce(a));
    return wait_for_stream(static_cast<cudaStream_t>(a.stream));
  }

  // color: the child's first member (the same on every member, distinct between children);
  // key: the rank in the child. A rank that joins none passes NCCL_SPLIT_NOCOLOR.
  Result<std::unique_ptr<NcclBackend>> split(const InitContext* child) {
    HVD_RETURN_IF_ERROR(usable("ncclCommSplit"));
    const CallScope call(this);
    if (call.refused()) return usable("ncclCommSplit");
    const OnDevice on(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const int color = child != nullptr ? child->members[0] : NCCL_SPLIT_NOCOLOR;
    const int key = child != nullptr ? child->rank : 0;
    split_child_ = nullptr;
    const ncclResult_t rc = ncclCommSplit(comm_, color, key, &split_child_, &config);
    // On a non-blocking parent the split runs on NCCL's own thread, which writes the child into
    // split_child_ when it is done (a member: a split cut short by abort or the timeout may still
    // write it); the parent's state says when. ncclCommSplit returns ncclSuccess while that
    // thread runs (the group's ncclInProgress shows only in the parent's state), so success
    // means "started".
    const Status split =
        settle("ncclCommSplit", rc == ncclSuccess ? ncclInProgress : rc, Clock::now() + timeout_);
    ncclComm_t child_comm = take_split_child();
    if (!split.ok()) {
      if (child_comm != nullptr) (void)ncclCommAbort(child_comm);
      return split;
    }
    if (child == nullptr) return std::unique_ptr<NcclBackend>();
    if (child_comm == nullptr) return Status(HVD_ERR_INTERNAL, "ncclCommSplit made no child");
    auto self = std::unique_ptr<NcclBackend>(new NcclBackend(*child, device_));
    self->comm_ = child_comm;
    HVD_RETURN_IF_ERROR(
        self->settle("ncclCommSplit (the child)", ncclInProgress, Clock::now() + timeout_));
    return Result<std::unique_ptr<NcclBackend>>(std::move(self));
  }

  // From any thread, during a call or not. ncclCommAbort frees the communicator, so it runs
  // here only when no call is in progress; otherwise the call, which polls aborted_, ends and
  // aborts it on its way out (CallScope).
  Status abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_.store(true);
    broken_.store(true);
    if (calls_ == 0) {
      const OnDevice on(device_);
      abort_comm_locked();
    }
    return Status::success();
  }

 private:
  NcclBackend(const InitContext& ctx, int device)
      : rank_(ctx.rank), size_(ctx.size), device_(device), timeout_(ctx.timeout) {}

  // Marks a call in progress, for abort (above).
  class CallScope {
   public:
    // Counted under the lock abort takes, so that abort never frees the communicator between a
    // call's check and its use of it: a call that begins after abort is refused (refused()).
    explicit CallScope(NcclBackend* self) : self_(self) {
      std::lock_guard<std::mutex> lock(self_->mutex_);
      ++self_->calls_;
      refused_ = self_->comm_gone_;
    }
    bool refused() const { return refused_; }
    ~CallScope() {
      std::lock_guard<std::mutex> lock(self_->mutex_);
      if (--self_->calls_ == 0 && self_->aborted_.load()) self_->abort_comm_locked();
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    NcclBackend* self_;
    bool refused_ = false;
  };

  void abort_comm_locked() {
    if (comm_ != nullptr && !comm_gone_) {
      (void)ncclCommAbort(comm_);  // ends a split in progress on NCCL's thread too
      comm_gone_ = true;
      if (ncclComm_t orphan = take_split_child(); orphan != nullptr) (void)ncclCommAbort(orphan);
    }
  }

  ncclComm_t take_split_child() {
    return __atomic_exchange_n(&split_child_, nullptr, __ATOMIC_ACQ_REL);
  }

  Status usable(const char* what) const {
    if (aborted_.load())
      return Status(HVD_ERR_STATE, std::string(what) + ": the communicator was aborted");
    if (broken_.load())
      return Status(HVD_ERR_STATE, std::string(what) + ": the communicator failed earlier");
    return Status::success();
  }

  // A non-blocking NCCL call's outcome: `rc` when it failed outright, else the communicator's
  // state polled until it leaves ncclInProgress, within `deadline` (then aborted).
  Status settle(const char* what, ncclResult_t rc, Clock::time_point deadline) {
    // A collective's enqueue completes within microseconds: yield for the first 100 us, then
    // sleep in growing steps (a sleep of 1 us takes about 50).
    const Clock::time_point yield_until = Clock::now() + std::chrono::microseconds(100);
    auto spin = std::chrono::microseconds(10);
    while (rc == ncclInProgress) {
      if (aborted_.load()) return usable(what);
      if (Clock::now() >= deadline) {
        broken_.store(true);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          abort_comm_locked();
        }
        return Status(HVD_ERR_TIMEOUT, std::string(what) + " did not complete within " +
                                           std::to_string(timeout_.count()) +
                                           " ms (HVD_TIMEOUT): a rank is missing or stuck");
      }
      if (Clock::now() < yield_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(spin);
        spin = std::min(spin * 2, std::chrono::microseconds(1000));
      }
      if (comm_ == nullptr || ncclCommGetAsyncError(comm_, &rc) != ncclSuccess) break;
    }
    if (rc == ncclSuccess) return Status::success();
    broken_.store(true);
    const char* last = comm_ != nullptr && !comm_gone_ ? ncclGetLastError(comm_) : nullptr;
    return Status(rc == ncclRemoteError ? HVD_ERR_REMOTE : HVD_ERR_SYSTEM,
                  std::string(what) + ": " + ncclGetErrorString(rc) +
                      (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : ""));
  }

  template <typename Enqueue>
  Status enqueue(const char* what, const hvd_collective_args& a, Enqueue&& run) {
    HVD_RETURN_IF_ERROR(usable(what));
    const CallScope call(this);
    if (call.refused()) return usable(what);
    const OnDevice on(a.device);
    return settle(what, run(static_cast<cudaStream_t>(a.stream)), Clock::now() + timeout_);
  }

  void* barrier_stream() {
    if (barrier_stream_ == nullptr &&
        cudaStreamCreateWithFlags(&barrier_stream_, cudaStreamNonBlocking) != cudaSuccess) {
      barrier_stream_ = nullptr;
    }
    return barrier_stream_;
  }

  // The barrier's one wait on the host: polled against the deadline, so that a stuck peer is
  // a timeout (and ncclCommAbort ends the kernel), not a hang.
  Status wait_for_stream(cudaStream_t stream) {
    const Clock::time_point deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream);
      if (rc == cudaSuccess) return Status::success();
      if (rc != cudaErrorNotReady) {
        broken_.store(true);
        return Status(HVD_ERR_SYSTEM, std::string("barrier: ") + cudaGetErrorString(rc));
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        return settle("barrier", async, deadline);
      }
      HVD_RETURN_IF_ERROR(usable("barrier"));
      if (Clock::now() >= deadline) {
        return settle("barrier", ncclInProgress, Clock::now());  // aborts, reports the timeout
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  ncclComm_t split_child_ = nullptr;  // written by NCCL's thread during a split
  std::mutex mutex_;                  // calls_, comm_gone_: between a call and abort
  int calls_ = 0;           // CallScopes open (a barrier's allreduce nests in the barrier's)
  bool comm_gone_ = false;  // ncclCommAbort freed comm_
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
  void* barrier_buffer_ = nullptr;
  cudaStream_t barrier_stream_ = nullptr;
};

}  // namespace

HVD_BACKEND_PLUGIN(NcclBackend, "nccl", version(), description(),
                   HVD_CAP_CUDA_MEMORY | HVD_CAP_ALLGATHERV)
