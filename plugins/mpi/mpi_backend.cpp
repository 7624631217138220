// The MPI backend: hvd's collectives on the MPI library the job runs under (Open MPI here).
//
// It finds its peers through MPI itself (HVD_CAP_SELF_BOOTSTRAP): under mpirun no rendezvous
// variable is needed. It initializes MPI only if the application has not (and then finalizes it
// at process exit, so hvd may be initialized again), and works on its own duplicate of
// MPI_COMM_WORLD so that it never mixes with the application's MPI traffic. Child communicators
// come from split (MPI_Comm_split of the parent's communicator).
//
// Threads: hvd calls a communicator from a background thread (its scheduler), so one communicator
// needs MPI_THREAD_SERIALIZED; two communicators' schedulers call MPI from two threads at once, so
// more than one needs MPI_THREAD_MULTIPLE. The plugin asks for MULTIPLE when it initializes MPI
// itself (Debian's Open MPI 4.1 provides it); an application that initialized MPI with SERIALIZED
// gets a world communicator, and split fails saying what to change.
//
// Two ways to move the data, chosen by HVD_MPI_ALGORITHMS:
// - `hvd` (the default): hvd's algorithms (plugins/common/algorithms.hpp: recursive doubling and
//   a segmented, pipelined ring for allreduce, a binomial tree or scatter-allgather for broadcast,
//   the ring's halves for allgather and reduce-scatter, pairwise exchange for alltoall,
//   dissemination for the barrier) over nonblocking point-to-point messages (mpi_transport.hpp),
//   tested against the deadline. Each kind has its own tag, so ranks in different collectives
//   time out instead of taking each other's messages, a message of another length is
//   HVD_ERR_MISMATCH, and a timeout names the rank waited on. A call that ends early cancels its
//   receives that have not begun, so a rank that arrives late cannot write into buffers the
//   caller has since freed.
// - `library`: MPI's own collectives, so that whatever the job's MPI does best (Open MPI's tuned
//   algorithms, coll/ucc, coll/hcoll with in-network reduction, CUDA-aware transports) does the
//   work. MPI's blocking collectives can be neither bounded nor interrupted, so each call takes
//   one of two bounded forms, chosen per collective and size by measurement (docs/performance.md,
//   "MPI's collectives"): the nonblocking call (MPI_Iallreduce, ...) tested against the deadline
//   and the abort flag, or the blocking call on a thread of the plugin's (sdk::Runner) that the
//   caller walks away from at the deadline or on abort. MPI cannot cancel a collective: one
//   walked away from completes if the late ranks ever join it, and then writes its output into
//   the caller's buffers, which may be freed by then. That is why it is not the default.
// Either way abort() sets a flag the wait sees, and the call returns at once. The waits neither
// bounds are init's MPI_Init_thread and split's MPI_Comm_split, which MPI offers only blocking
// (split() says how it keeps that wait short). Counts above MPI's int go in pieces of at most
// kMaxCount: hvd's messages, and in library mode MPI's collectives (alltoall: hvd's exchange).
//
// What MPI cannot do: cancel a send, a collective, or a receive that has begun to arrive. A call
// that ends early (timeout, abort, mismatch) leaves them to finish in the background: the
// communicator then takes no more calls and is never freed, MPI may still read that call's
// buffers (and write its output) if the lost peer comes back, and the plugin skips the
// MPI_Finalize it would run at exit, which would wait for the lost peer (docs/cluster.md, "MPI
// backend").
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "algorithms.hpp"
#include "hvd/reduce.h"
#include "hvd/sdk/backend.hpp"
#include "hvd/sdk/deadline.hpp"
#include "hvd/sdk/env.hpp"
#include "hvd/sdk/runner.hpp"
#include "mpi_transport.hpp"
#include "mpi_types.hpp"

namespace {

using hvd::Status;
using hvd::sdk::Deadline;
using Clock = Deadline::Clock;

Status check(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::success();
  return Status(HVD_ERR_REMOTE, std::string(what) + ": " + hvd::mpi::error_text(code));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

// float16 and bfloat16 have no MPI type: they travel as 16-bit integers and reduce through
// user-defined operations built on the SDK's kernels, one per (dtype, op).
template <hvd_dtype D, hvd_reduce_op O>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  hvd_reduce(inout, inout, in, static_cast<uint64_t>(*len), D, O);
}

struct HalfOps {
  MPI_Op ops[2][HVD_REDUCE_OP_COUNT] = {};  // [bfloat16?][op]

  Status create() {
    MPI_User_function* const fns[2][HVD_REDUCE_OP_COUNT] = {
        {half_reduce<HVD_FLOAT16, HVD_SUM>, half_reduce<HVD_FLOAT16, HVD_SUM>,
         half_reduce<HVD_FLOAT16, HVD_MIN>, half_reduce<HVD_FLOAT16, HVD_MAX>,
         half_reduce<HVD_FLOAT16, HVD_PRODUCT>},
        {half_reduce<HVD_BFLOAT16, HVD_SUM>, half_reduce<HVD_BFLOAT16, HVD_SUM>,
         half_reduce<HVD_BFLOAT16, HVD_MIN>, half_reduce<HVD_BFLOAT16, HVD_MAX>,
         half_reduce<HVD_BFLOAT16, HVD_PRODUCT>}};
    for (int t = 0; t < 2; ++t) {
      for (int o = 0; o < HVD_REDUCE_OP_COUNT; ++o) {
        HVD_RETURN_IF_ERROR(
            check(MPI_Op_create(fns[t][o], /*commute=*/1, &ops[t][o]), "MPI_Op_create"));
      }
    }
    return Status::success();
  }
  // MPI keeps an op a pending request still uses until that request is done with it.
  void free() {
    for (auto& row : ops) {
      for (MPI_Op& op : row) {
        if (op != MPI_OP_NULL && op != MPI_Op{}) MPI_Op_free(&op);
      }
    }
  }
};

// 16-bit floats travel as 16-bit words; the reduction is the backend's own user op.
MPI_Datatype mpi_type(hvd_dtype dtype) {
  const bool half = dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16;
  return half ? MPI_UINT16_T : hvd::mpi::builtin_type(dtype);
}

// AVERAGE sums, then divides.
MPI_Op builtin_op(hvd_reduce_op op) {
  return op == HVD_AVERAGE ? MPI_SUM : hvd::mpi::builtin_op(op);
}

// The elements one MPI call takes (its counts are int): larger calls go in pieces. A test build
// lowers it (-DHVD_MPI_MAX_COUNT=7, tests/CMakeLists.txt) so that the pieces run at small sizes.
#ifndef HVD_MPI_MAX_COUNT
#define HVD_MPI_MAX_COUNT INT_MAX
#endif
constexpr uint64_t kMaxCount = HVD_MPI_MAX_COUNT;
static_assert(kMaxCount >= 1 && kMaxCount <= static_cast<uint64_t>(INT_MAX));

// Calls `piece(first, n)` for consecutive pieces of at most kMaxCount of `total` elements.
template <typename Piece>
Status in_pieces(uint64_t total, Piece piece) {
  for (uint64_t first = 0; first < total; first += kMaxCount) {
    HVD_RETURN_IF_ERROR(piece(first, static_cast<int>(std::min(kMaxCount, total - first))));
  }
  return Status::success();
}

// The element `index` of a buffer of `element`-byte elements.
char* at(void* buffer, uint64_t index, size_t element) {
  return static_cast<char*>(buffer) + index * element;
}
const char* at(const void* buffer, uint64_t index, size_t element) {
  return static_cast<const char*>(buffer) + index * element;
}

// How HVD_MPI_ALGORITHMS moves the data: hvd's algorithms over point-to-point, or MPI's
// collectives.
enum class Algorithms { kLibrary, kHvd };

hvd::Result<Algorithms> algorithms_from_env() {
  std::string text = hvd::sdk::env_or("HVD_MPI_ALGORITHMS", "hvd");
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "library") return Algorithms::kLibrary;
  if (text == "hvd") return Algorithms::kHvd;
  return Status(HVD_ERR_INVALID_ARGUMENT,
                "HVD_MPI_ALGORITHMS='" + hvd::sdk::env_or("HVD_MPI_ALGORITHMS", "") +
                    "': it takes 'hvd' (hvd's algorithms over MPI point-to-point messages, the "
                    "default) or 'library' (MPI's own collectives)");
}

// Library mode: from this size MPI's blocking call on the plugin's thread beats its nonblocking
// call for allreduce and allgather (Open MPI 4.1's libnbc: 1.3x slower allreduces from 256 KiB,
// 2-2.5x slower allgathers); below it the thread's hand-off (8-16 us) costs more than libnbc does.
// Broadcast, reduce-scatter, alltoall and the barrier are as fast nonblocking at every size, and
// take that. Measured by hvd-mpi-waits: docs/performance.md, "MPI's collectives".
constexpr uint64_t kBlockingFromBytes = uint64_t{256} << 10;

// Set once a call left a request behind (timed out, aborted or mismatched). MPI_Finalize would
// then wait for it and, in Open MPI, for every rank, one of which may never answer again: the exit
// handler below skips it.
std::atomic<bool> g_request_abandoned{false};

// MPI_Finalize runs at process exit when this plugin initialized MPI: MPI cannot be initialized
// twice in one process, and hvd may be.
bool g_we_initialized_mpi = false;
void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_request_abandoned.load()) {
    std::fputs(
        "hvd mpi backend: not calling MPI_Finalize at exit: a collective that failed (timeout, "
        "abort or mismatch) left messages MPI cannot cancel, and finalizing would wait for them\n",
        stderr);
    return;
  }
  MPI_Finalize();
}

// Keeps a buffer an abandoned receive may still write for the life of the process; moved, a
// vector keeps its elements where they were. Reachable, so no leak checker reports it.
void keep_forever(std::vector<char> buffer) {
  static std::mutex mutex;
  static auto* const kept = new std::vector<std::vector<char>>();  // never destroyed
  const std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(buffer));
}

// A call waits as hvd::sdk::wait_until does: Open MPI moves messages only inside MPI calls (it has
// no progress thread for shared memory or TCP), so a wait tests back to back for its first second,
// then for 50 us every millisecond (about 5% of a core while it waits out a stopped peer).

// Each collective's messages carry a tag of their own, so that ranks in different collectives
// never take each other's messages for theirs: they time out instead.
enum Tag : int {
  kTagAllreduce = 1,
  kTagBroadcast,
  kTagAllgather,
  kTagAllgatherv,
  kTagBarrier,
  kTagReduceScatter,
  kTagAlltoall,
  kTagSplit
};
static_assert(kTagSplit < hvd::mpi::Transport::kLastPieceTag, "a last piece's tag is its own");

// One collective under way: what it is called in messages, its tag, its element type and size,
// when it started, and when it must have returned (the host's stamp, or the timeout from start).
struct Call {
  const char* name;
  int tag;
  MPI_Datatype type;
  size_t element;
  Clock::time_point start;
  Deadline deadline;
};

class MpiBackend {
 public:
  static hvd::Result<std::unique_ptr<MpiBackend>> create(const hvd::sdk::InitContext& ctx) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return Status(HVD_ERR_STATE, "MPI was already finalized in this process");
      HVD_RETURN_IF_ERROR(check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                                "MPI_Init_thread"));
      if (!g_we_initialized_mpi) {
        g_we_initialized_mpi = true;
        std::atexit(finalize_mpi_at_exit);
      }
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      return Status(HVD_ERR_UNSUPPORTED,
                    std::string("MPI provides ") + thread_level_name(provided) +
                        " but hvd's mpi backend needs MPI_THREAD_SERIALIZED (hvd calls MPI from "
                        "its own threads), and MPI_THREAD_MULTIPLE for more than one "
                        "communicator: initialize MPI with MPI_Init_thread(..., "
                        "MPI_THREAD_MULTIPLE, ...)");
    }
    HVD_ASSIGN_OR_RETURN(const Algorithms algorithms, algorithms_from_env());
    auto self = std::unique_ptr<MpiBackend>(new MpiBackend(ctx.timeout, ctx.members, algorithms));
    {
      // MPI_Comm_dup is collective: a rank that never comes would hold this one forever.
      const Call call{"MPI_Comm_idup", 0, MPI_BYTE, 1, Clock::now(), Deadline::after(ctx.timeout)};
      HVD_RETURN_IF_ERROR(self->nonblocking_call(call, [&](MPI_Request* request) {
        return MPI_Comm_idup(MPI_COMM_WORLD, &self->comm_, request);
      }));
    }
    MPI_Comm_set_errhandler(self->comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(self->comm_, &self->rank_);
    MPI_Comm_size(self->comm_, &self->size_);
    if (self->rank_ != ctx.rank || self->size_ != ctx.size) {
      return Status(HVD_ERR_MISMATCH,
                    "MPI says this is rank " + std::to_string(self->rank_) + " of " +
                        std::to_string(self->size_) + " but hvd was told rank " +
                        std::to_string(ctx.rank) + " of " + std::to_string(ctx.size) +
                        ": launch with mpirun (or unset the HVD_RANK/HVD_SIZE variables)");
    }
    self->start_transport();
    HVD_RETURN_IF_ERROR(self->agree_on_algorithms());
    HVD_RETURN_IF_ERROR(self->half_ops_.create());
    return self;
  }

  ~MpiBackend() {
    // A call left running (abandoned) may still use the ops.
    if (!abandoned_) half_ops_.free();
    // MPI_Comm_free is collective, and requests left on the communicator still use it.
    if (comm_ != MPI_COMM_NULL && !abandoned_) MPI_Comm_free(&comm_);
    if (abandoned_) {
      keep_forever(std::move(scratch_));
      if (hvd_) keep_forever(hvd_->take_scratch());
    }
  }

  // The one call made from another thread while a call may run: it only sets the flag, which the
  // call's test loop sees (MPI may have been initialized MPI_THREAD_SERIALIZED, where it must not
  // be entered concurrently).
  Status abort() {
    aborted_.store(true);
    runner_.interrupt();
    return Status::success();
  }

  // In place on recvbuf (the input copied there first), whichever way: MPI_IN_PLACE must be
  // every rank's choice or none's, and hvd's algorithms work in place.
  Status allreduce(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("allreduce"));
    if (a.count == 0) return Status::success();
    const Call call = call_of("allreduce", kTagAllreduce, a);
    if (algorithms_ == Algorithms::kHvd) return run_hvd(call, [&] { return hvd_->allreduce(a); });
    const MPI_Op op = reduce_op(a);
    if (a.sendbuf != a.recvbuf) std::memcpy(a.recvbuf, a.sendbuf, a.count * call.element);
    if (size_ > 1) {
      const bool blocking = a.count * call.element >= kBlockingFromBytes;
      HVD_RETURN_IF_ERROR(in_pieces(a.count, [&](uint64_t first, int n) {
        void* data = at(a.recvbuf, first, call.element);
        if (blocking) {
          return blocking_call(call, [data, n, type = call.type, op, comm = comm_] {
            return MPI_Allreduce(MPI_IN_PLACE, data, n, type, op, comm);
          });
        }
        return nonblocking_call(call, [&](MPI_Request* request) {
          return MPI_Iallreduce(MPI_IN_PLACE, data, n, call.type, op, comm_, request);
        });
      }));
    }
    if (a.op == HVD_AVERAGE) hvd_divide(a.recvbuf, a.count, a.dtype, size_);
    return Status::success();
  }

  // Equal counts (allgather) or recv_counts (allgatherv, HVD_CAP_ALLGATHERV), packed in rank order.
  Status allgather(const hvd_collective_args& a) {
    const bool varying = a.recv_counts != nullptr;
    const char* const name = varying ? "allgatherv" : "allgather";
    HVD_RETURN_IF_ERROR(usable(name));
    const auto ranks = static_cast<size_t>(size_);
    std::vector<uint64_t> counts(ranks), displs(ranks);
    uint64_t total = 0;
    for (size_t r = 0; r < ranks; ++r) {
      counts[r] = varying ? a.recv_counts[r] : a.count;
      displs[r] = total;
      total += counts[r];
    }
    if (total == 0) return Status::success();
    const Call call = call_of(name, varying ? kTagAllgatherv : kTagAllgather, a);
    if (algorithms_ == Algorithms::kHvd) return run_hvd(call, [&] { return hvd_->allgather(a); });
    const auto self = static_cast<size_t>(rank_);
    char* const mine = at(a.recvbuf, displs[self], call.element);
    // Every count and displacement fits in MPI's int when the total does.
    if (total > kMaxCount)
      return allgather_by_broadcasts(call, a.sendbuf, a.recvbuf, counts, displs);
    std::vector<int> int_counts(counts.begin(), counts.end());
    std::vector<int> int_displs(displs.begin(), displs.end());
    // MPI_IN_PLACE must be every rank's choice or none's: always in place, this rank's block
    // copied to its place first.
    const int count = int_counts[self];
    if (a.sendbuf != mine && count > 0)
      std::memcpy(mine, a.sendbuf, static_cast<size_t>(count) * call.element);
    const void* send = MPI_IN_PLACE;
    if (total * call.element >= kBlockingFromBytes) {
      return blocking_call(
          call, [send, count, counts = std::move(int_counts), displs = std::move(int_displs),
                 varying, recv = a.recvbuf, type = call.type, comm = comm_] {
            return varying ? MPI_Allgatherv(send, count, type, recv, counts.data(), displs.data(),
                                            type, comm)
                           : MPI_Allgather(send, count, type, recv, count, type, comm);
          });
    }
    return nonblocking_call(call, [&](MPI_Request* request) {
      return varying ? MPI_Iallgatherv(send, count, call.type, a.recvbuf, int_counts.data(),
                                       int_displs.data(), call.type, comm_, request)
                     : MPI_Iallgather(send, count, call.type, a.recvbuf, count, call.type, comm_,
                                      request);
    });
  }

  Status broadcast(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("broadcast"));
    if (a.count == 0) return Status::success();
    const Call call = call_of("broadcast", kTagBroadcast, a);
    if (algorithms_ == Algorithms::kHvd) return run_hvd(call, [&] { return hvd_->broadcast(a); });
    if (rank_ == a.root && a.sendbuf != a.recvbuf) {
      std::memcpy(a.recvbuf, a.sendbuf, a.count * call.element);
    }
    if (size_ == 1) return Status::success();
    return library_broadcast(call, a.recvbuf, a.count, a.root);
  }

  // Dissemination (hvd): in round k every rank tells rank + 2^k it has arrived and hears from
  // rank - 2^k; after ceil(log2(n)) rounds every rank has heard, indirectly, from all.
  Status barrier() {
    HVD_RETURN_IF_ERROR(usable("barrier"));
    const Call call{"barrier", kTagBarrier, MPI_BYTE, 1, Clock::now(), Deadline::after(timeout_)};
    if (algorithms_ == Algorithms::kLibrary) {
      return nonblocking_call(call,
                              [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
    }
    return run_hvd(call, [&] { return hvd_->barrier(); });
  }

  Status reduce_scatter(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("reduce_scatter"));
    if (a.count == 0) return Status::success();
    const Call call = call_of("reduce_scatter", kTagReduceScatter, a);
    if (algorithms_ == Algorithms::kHvd) {
      return run_hvd(call, [&] { return hvd_->reduce_scatter(a); });
    }
    if (size_ == 1) {
      if (a.sendbuf != a.recvbuf) std::memcpy(a.recvbuf, a.sendbuf, a.count * call.element);
      return Status::success();  // an average over one rank is the value itself
    }
    // Open MPI's reduce-scatter counts the whole input (count x size) in an int.
    if (a.count * static_cast<uint64_t>(size_) > kMaxCount) {
      HVD_RETURN_IF_ERROR(reduce_scatter_by_reduces(call, a));
    } else {
      // MPI_IN_PLACE must be every rank's choice or none's: in place, the input is copied.
      const void* send = a.sendbuf;
      if (a.sendbuf == a.recvbuf) {
        const size_t bytes = a.count * static_cast<uint64_t>(size_) * call.element;
        send = std::memcpy(scratch(bytes), a.sendbuf, bytes);
      }
      HVD_RETURN_IF_ERROR(nonblocking_call(call, [&](MPI_Request* request) {
        return MPI_Ireduce_scatter_block(send, a.recvbuf, static_cast<int>(a.count), call.type,
                                         reduce_op(a), comm_, request);
      }));
    }
    if (a.op == HVD_AVERAGE) hvd_divide(a.recvbuf, a.count, a.dtype, size_);
    return Status::success();
  }

  // MPI_Ialltoallv (library), or hvd's exchange (hvd, and library counts beyond MPI's int), in
  // which every pair exchanges a message, an empty one too: a rank that sends where its peer
  // expects nothing is then a mismatch now, not a stray message that a later alltoall would take
  // for its own.
  Status alltoall(const hvd_collective_args& a) {
    if (!HVD_HAS_FIELD(&a, hvd_collective_args, send_counts) || a.send_counts == nullptr ||
        a.recv_counts == nullptr) {
      return Status(HVD_ERR_INVALID_ARGUMENT,
                    "alltoall: the call has no send_counts or no recv_counts");
    }
    HVD_RETURN_IF_ERROR(usable("alltoall"));
    const auto ranks = static_cast<size_t>(size_);
    std::vector<uint64_t> send_offsets(ranks), recv_offsets(ranks);
    uint64_t send_total = 0;
    uint64_t recv_total = 0;
    for (size_t r = 0; r < ranks; ++r) {
      send_offsets[r] = send_total;
      recv_offsets[r] = recv_total;
      send_total += a.send_counts[r];
      recv_total += a.recv_counts[r];
    }
    const auto self = static_cast<size_t>(rank_);
    if (a.send_counts[self] != a.recv_counts[self]) {
      return Status(HVD_ERR_MISMATCH, "alltoall: rank " + std::to_string(rank_) + " sends itself " +
                                          std::to_string(a.send_counts[self]) +
                                          " elements but expects " +
                                          std::to_string(a.recv_counts[self]));
    }
    const Call call = call_of("alltoall", kTagAlltoall, a);
    if (algorithms_ == Algorithms::kLibrary && size_ > 1) {
      // Whether MPI_Alltoallv can take the call depends on every rank's totals: one small
      // allreduce tells each rank whether any rank's exceed MPI's int.
      int too_large = std::max(send_total, recv_total) > kMaxCount ? 1 : 0;
      HVD_RETURN_IF_ERROR(nonblocking_call(call, [&](MPI_Request* request) {
        return MPI_Iallreduce(MPI_IN_PLACE, &too_large, 1, MPI_INT, MPI_MAX, comm_, request);
      }));
      if (too_large == 0) return library_alltoall(call, a, send_offsets, recv_offsets);
    }
    return run_hvd(call, [&] { return hvd_->alltoall(a); });
  }

  // The child communicator `child` describes, by MPI_Comm_split of this one (color: the job rank
  // of the child's rank 0; key: the rank in the child); a rank that joins none (child null) takes
  // part with MPI_UNDEFINED and gets null.
  //
  // MPI_Comm_split is blocking and cannot be bounded or interrupted (MPI has no nonblocking
  // split): with init, it is the one wait of this plugin that HVD_TIMEOUT and abort do not end.
  // So that it is reached only when it will return, the ranks first gather each other's color,
  // key and member list over this communicator with the bounded machinery of the collectives: a
  // rank that does not come is HVD_ERR_TIMEOUT naming it, and ranks that describe the children
  // differently fail alike with HVD_ERR_MISMATCH, before any rank enters MPI_Comm_split. What is
  // left unbounded is a rank that dies between the two.
  hvd::Result<std::unique_ptr<MpiBackend>> split(const hvd::sdk::InitContext* child) {
    HVD_RETURN_IF_ERROR(usable("split"));
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      return Status(HVD_ERR_UNSUPPORTED,
                    std::string("split: MPI provides ") + thread_level_name(provided) +
                        ", under which hvd's mpi backend can run one communicator only (two "
                        "communicators' schedulers call MPI from two threads at once): the "
                        "application must initialize MPI with MPI_Init_thread(..., "
                        "MPI_THREAD_MULTIPLE, ...) to use more than one communicator");
    }
    // A child whose member list cannot be read still takes part in the agreement, which then
    // fails on every rank.
    const bool readable =
        child == nullptr || (!child->members.empty() && child->members[0] >= 0 &&
                             static_cast<int>(child->members.size()) == child->size);
    const int color = child == nullptr ? MPI_UNDEFINED
                      : readable       ? child->members[0]
                                       : members_[static_cast<size_t>(rank_)];
    const int key = child != nullptr ? child->rank : 0;
    HVD_RETURN_IF_ERROR(agree_on_split(readable ? child : nullptr, color, key));

    MPI_Comm made = MPI_COMM_NULL;
    HVD_RETURN_IF_ERROR(check(MPI_Comm_split(comm_, color, key, &made), "split: MPI_Comm_split"));
    if (child == nullptr) {
      if (made != MPI_COMM_NULL) MPI_Comm_free(&made);
      return std::unique_ptr<MpiBackend>();
    }
    auto self =
        std::unique_ptr<MpiBackend>(new MpiBackend(child->timeout, child->members, algorithms_));
    self->comm_ = made;
    MPI_Comm_set_errhandler(self->comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(self->comm_, &self->rank_);
    MPI_Comm_size(self->comm_, &self->size_);
    if (self->rank_ != child->rank || self->size_ != child->size) {
      return Status(HVD_ERR_INTERNAL,
                    "split: MPI_Comm_split made rank " + std::to_string(self->rank_) + " of " +
                        std::to_string(self->size_) + " where hvd asked for rank " +
                        std::to_string(child->rank) + " of " + std::to_string(child->size));
    }
    self->start_transport();
    HVD_RETURN_IF_ERROR(self->half_ops_.create());
    return self;
  }

 private:
  MpiBackend(std::chrono::milliseconds timeout, std::vector<int> members, Algorithms algorithms)
      : members_(std::move(members)), timeout_(timeout), algorithms_(algorithms) {}

  // Whether a collective may start: not after abort, nor after a call abandoned messages (the
  // peers' side of that collective would meet this one's).
  Status usable(const char* what) const {
    if (aborted_.load(std::memory_order_relaxed)) {
      return Status(HVD_ERR_STATE,
                    std::string(what) + ": the communicator was aborted; it takes no more calls");
    }
    if (abandoned_) {
      return Status(HVD_ERR_STATE,
                    std::string(what) +
                        ": an earlier call on this communicator failed part way (timeout, abort "
                        "or mismatch) and left messages MPI cannot cancel; it takes no more calls");
    }
    return Status::success();
  }

  // The op MPI reduces `a` with: a built-in one, or for 16-bit floats the plugin's own.
  MPI_Op reduce_op(const hvd_collective_args& a) const {
    const bool half = a.dtype == HVD_FLOAT16 || a.dtype == HVD_BFLOAT16;
    return half ? half_ops_.ops[a.dtype == HVD_BFLOAT16][a.op] : builtin_op(a.op);
  }

  // Ranks that move data differently would only time out, each waiting on messages the others
  // never send: they compare HVD_MPI_ALGORITHMS first.
  Status agree_on_algorithms() {
    const int mine = static_cast<int>(algorithms_);
    int range[2] = {mine, -mine};  // with MPI_MAX: the largest, and minus the smallest
    const Call call{"init", 0, MPI_INT, sizeof(int), Clock::now(), Deadline::after(timeout_)};
    HVD_RETURN_IF_ERROR(nonblocking_call(call, [&](MPI_Request* request) {
      return MPI_Iallreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, comm_, request);
    }));
    if (range[0] == -range[1]) return Status::success();
    return Status(HVD_ERR_MISMATCH,
                  "the ranks set HVD_MPI_ALGORITHMS differently (some 'hvd', some 'library'): "
                  "set it alike on every rank");
  }

  // A collective on `a`, starting now.
  Call call_of(const char* name, int tag, const hvd_collective_args& a) const {
    return Call{name,
                tag,
                mpi_type(a.dtype),
                hvd_dtype_size(a.dtype),
                Clock::now(),
                Deadline::of(a, timeout_)};
  }

  Status aborted(const Call& call) const { return hvd::mpi::aborted(call.name, call.start); }
  Status timed_out(const Call& call, const std::string& waiting_on) const {
    return hvd::mpi::timed_out(call.name, timeout_, waiting_on);
  }

  // One of MPI's nonblocking collectives, started by `start` and tested to completion within the
  // call's deadline and the abort flag.
  // A request left behind is MPI's to finish: MPI forbids cancelling or freeing an active
  // collective's request, and nothing may be sent on this communicator again.
  template <typename Start>
  Status nonblocking_call(const Call& call, Start start) {
    MPI_Request request = MPI_REQUEST_NULL;
    HVD_RETURN_IF_ERROR(check(start(&request), call.name));
    Status failure;
    const hvd::sdk::WaitEnd end = hvd::sdk::wait_until(
        [&] {
          int done = 0;
          MPI_Status status;
          const int code = MPI_Test(&request, &done, &status);
          if (code != MPI_SUCCESS) {
            failure = collective_failed(call.name, code);
            return true;
          }
          return done != 0;
        },
        call.deadline, aborted_);
    if (end == hvd::sdk::WaitEnd::kReady && failure.ok()) return Status::success();
    abandoned_ = true;
    g_request_abandoned.store(true);
    if (end == hvd::sdk::WaitEnd::kReady) return failure;
    if (end == hvd::sdk::WaitEnd::kAborted) return aborted(call);
    return timed_out(call, "the other ranks");
  }

  // One of MPI's blocking collectives, on the plugin's thread, waited for within the call's
  // deadline and the abort flag. `run` owns what it uses but the buffers: a call walked away from
  // stays in MPI, and the communicator with it.
  Status blocking_call(const Call& call, std::function<int()> run) {
    // A collective started now would be walked away from at once.
    if (aborted_.load()) return aborted(call);
    if (call.deadline.passed()) return timed_out(call, "the other ranks");
    std::optional<Status> outcome;
    try {
      outcome = runner_.run(
          [run = std::move(run), name = call.name]() -> Status {
            const int code = run();
            if (code == MPI_SUCCESS) return Status::success();
            return collective_failed(name, code);
          },
          call.deadline.is_none() ? Clock::now() + std::chrono::hours(24 * 365)
                                  : call.deadline.at());
    } catch (const std::system_error& e) {
      return Status(HVD_ERR_SYSTEM, std::string(call.name) +
                                        ": no thread for MPI's blocking collective: " + e.what());
    }
    if (outcome) return std::move(*outcome);
    abandoned_ = true;
    g_request_abandoned.store(true);
    return aborted_.load() ? aborted(call) : timed_out(call, "the other ranks");
  }

  // A collective of MPI's that failed: a truncated message is ranks that disagree on the counts.
  static Status collective_failed(const char* name, int code) {
    int error_class = code;
    MPI_Error_class(code, &error_class);
    if (error_class == MPI_ERR_TRUNCATE) {
      return Status(HVD_ERR_MISMATCH, std::string(name) + ": " + hvd::mpi::error_text(code) +
                                          ": the ranks called " + name + " with different counts");
    }
    return Status(HVD_ERR_REMOTE, std::string(name) + ": " + hvd::mpi::error_text(code));
  }

  // MPI_Ialltoallv, with counts and displacements that fit in MPI's int.
  Status library_alltoall(const Call& call, const hvd_collective_args& a,
                          const std::vector<uint64_t>& send_offsets,
                          const std::vector<uint64_t>& recv_offsets) {
    const auto ranks = static_cast<size_t>(size_);
    std::vector<int> counts[2], displs[2];  // [0]: sent, [1]: received
    for (size_t r = 0; r < ranks; ++r) {
      counts[0].push_back(static_cast<int>(a.send_counts[r]));
      counts[1].push_back(static_cast<int>(a.recv_counts[r]));
      displs[0].push_back(static_cast<int>(send_offsets[r]));
      displs[1].push_back(static_cast<int>(recv_offsets[r]));
    }
    return nonblocking_call(call, [&](MPI_Request* request) {
      return MPI_Ialltoallv(a.sendbuf, counts[0].data(), displs[0].data(), call.type, a.recvbuf,
                            counts[1].data(), displs[1].data(), call.type, comm_, request);
    });
  }

  // MPI's broadcasts, in pieces.
  Status library_broadcast(const Call& call, void* data, uint64_t count, int root) {
    return in_pieces(count, [&](uint64_t first, int n) {
      return nonblocking_call(call, [&](MPI_Request* request) {
        return MPI_Ibcast(at(data, first, call.element), n, call.type, root, comm_, request);
      });
    });
  }

  // An allgather whose total exceeds MPI's int: each rank's block broadcast from it, in pieces.
  Status allgather_by_broadcasts(const Call& call, const void* mine, void* recv,
                                 const std::vector<uint64_t>& counts,
                                 const std::vector<uint64_t>& displs) {
    const auto self = static_cast<size_t>(rank_);
    char* const place = at(recv, displs[self], call.element);
    if (mine != place && counts[self] > 0) std::memcpy(place, mine, counts[self] * call.element);
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      HVD_RETURN_IF_ERROR(library_broadcast(call, at(recv, displs[i], call.element), counts[i], r));
    }
    return Status::success();
  }

  // A reduce-scatter of blocks beyond MPI's int: block r reduced to rank r with MPI's reduces, in
  // pieces. In place, rank r's result takes the place of its block 0, which the reduce to rank 0
  // consumed first; the others' block 0 goes only to rank 0.
  Status reduce_scatter_by_reduces(const Call& call, const hvd_collective_args& a) {
    const bool in_place = a.sendbuf == a.recvbuf;
    const MPI_Op op = reduce_op(a);
    for (int r = 0; r < size_; ++r) {
      const uint64_t block = static_cast<uint64_t>(r) * a.count;
      HVD_RETURN_IF_ERROR(in_pieces(a.count, [&](uint64_t first, int n) {
        const void* send = at(a.sendbuf, block + first, call.element);
        void* recv = rank_ == r ? at(a.recvbuf, first, call.element) : nullptr;
        if (in_place && rank_ == r && r == 0) send = MPI_IN_PLACE;
        return nonblocking_call(call, [&](MPI_Request* request) {
          return MPI_Ireduce(send, recv, n, call.type, op, r, comm_, request);
        });
      }));
    }
    return Status::success();
  }

  char* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  // Over MPI the ring moves whole blocks, one message each: Open MPI's shared memory copies a large
  // message once, straight into its receive, so segments only add messages (hvd-bench's allgather
  // and allreduce against MPI's own measured it: docs/performance.md, "One host, 2 ranks"). One
  // slot: one block of scratch, not four.
  static hvd::algorithms::Tuning tuning() {
    hvd::algorithms::Tuning t;
    t.segment_bytes = size_t{1} << 30;
    t.segments_in_flight = 1;
    return t;
  }

  // Makes the transport and hvd's algorithms over it, once comm_, rank_ and size_ are known.
  void start_transport() {
    transport_ =
        std::make_unique<hvd::mpi::Transport>(comm_, rank_, size_, kMaxCount, timeout_, aborted_);
    hvd_ =
        std::make_unique<hvd::algorithms::Algorithms<hvd::mpi::Transport>>(*transport_, tuning());
  }

  // One call of hvd's algorithms (`body`) on the transport: begun and ended there, so that a
  // failure abandons what it posted and the communicator takes no more calls.
  template <typename Body>
  Status run_hvd(const Call& call, Body&& body) {
    transport_->begin(call.name, call.tag, call.deadline);
    Status status;
    try {
      status = body();
    } catch (const std::exception& e) {
      status = Status(HVD_ERR_SYSTEM, std::string(call.name) + ": " + e.what());
    }
    status = transport_->end(std::move(status));
    if (transport_->abandoned()) {
      abandoned_ = true;
      g_request_abandoned.store(true);
    }
    return status;
  }

  // Before MPI_Comm_split: every rank's color, key and a hash of its child's member list,
  // gathered over this communicator within the deadline. The ranks of one color must have keys
  // 0..n-1 and, as members, the job ranks of the ranks that chose it in key order (the color being
  // the first): every rank checks every color from the same data, so all fail alike or none does.
  Status agree_on_split(const hvd::sdk::InitContext* child, int color, int key) {
    constexpr int kWords = 4;  // color, key, member count, member hash (its low 31 bits)
    std::array<int, kWords> mine{color, key, -1, 0};  // -1 members: none readable
    if (child != nullptr) {
      mine[2] = child->size;
      mine[3] = hash_members(child->members);
    }
    const auto ranks = static_cast<size_t>(size_);
    // Every rank's words; kept for good if the gather fails, as a receive may still write it.
    std::vector<char> all(ranks * kWords * sizeof(int));
    const Call call{"split",     kTagSplit,    MPI_INT,
                    sizeof(int), Clock::now(), Deadline::after(timeout_)};
    hvd_collective_args a{};
    a.struct_size = sizeof a;
    a.sendbuf = mine.data();
    a.recvbuf = all.data();
    a.count = kWords;
    a.dtype = HVD_INT32;
    if (Status gathered = run_hvd(call, [&] { return hvd_->allgather(a); }); !gathered.ok()) {
      keep_forever(std::move(all));
      return gathered;
    }
    auto word = [&](size_t r, int w) {
      int value = 0;
      std::memcpy(&value, all.data() + (r * kWords + static_cast<size_t>(w)) * sizeof(int),
                  sizeof(int));
      return value;
    };
    for (size_t r = 0; r < ranks; ++r) {
      const int c = word(r, 0);
      if (c == MPI_UNDEFINED) continue;
      std::vector<int> expected;  // the job ranks of the ranks of color c, in key order
      for (size_t q = 0; q < ranks; ++q) {
        if (word(q, 0) != c) continue;
        const int k = word(q, 1);
        if (k < 0 || k >= static_cast<int>(ranks)) {
          return split_mismatch(c, q, "a key out of range");
        }
        if (expected.size() <= static_cast<size_t>(k)) {
          expected.resize(static_cast<size_t>(k) + 1, -1);
        }
        if (expected[static_cast<size_t>(k)] != -1) {
          return split_mismatch(c, q, "a key taken twice");
        }
        expected[static_cast<size_t>(k)] = members_[q];
      }
      if (std::find(expected.begin(), expected.end(), -1) != expected.end()) {
        return split_mismatch(c, r, "keys that leave a gap");
      }
      if (expected[0] != c || word(r, 2) != static_cast<int>(expected.size()) ||
          word(r, 3) != hash_members(expected)) {
        return split_mismatch(c, r, "a member list other than the ranks that chose its color");
      }
    }
    return Status::success();
  }

  static Status split_mismatch(int color, size_t rank, const std::string& what) {
    return Status(HVD_ERR_MISMATCH,
                  "split: the ranks describe the child communicators differently: the child whose "
                  "first member is job rank " +
                      std::to_string(color) + " has " + what + " (as rank " + std::to_string(rank) +
                      " of the parent describes it)");
  }

  // FNV-1a over a member list, kept to 31 bits so that it travels as a non-negative int.
  static int hash_members(const std::vector<int>& members) {
    uint32_t h = 2166136261u;
    for (int m : members) {
      for (int byte = 0; byte < 4; ++byte) {
        h ^= (static_cast<uint32_t>(m) >> (8 * byte)) & 0xffu;
        h *= 16777619u;
      }
    }
    return static_cast<int>(h & 0x7fffffffu);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<int> members_;  // members_[r]: the job rank of communicator rank r
  int rank_ = 0;
  int size_ = 1;
  HalfOps half_ops_;
  const std::chrono::milliseconds timeout_;
  const Algorithms algorithms_;
  hvd::sdk::Runner runner_;           // MPI's blocking collectives (library mode)
  std::atomic<bool> aborted_{false};  // set by abort(), from any thread
  bool abandoned_ = false;            // a call left messages behind: comm_ is done with
  std::vector<char> scratch_;         // library mode's copy of an input; grows, never shrinks
  std::unique_ptr<hvd::mpi::Transport> transport_;  // hvd's algorithms' messages
  std::unique_ptr<hvd::algorithms::Algorithms<hvd::mpi::Transport>> hvd_;
};

std::string version() {
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(library, &length);
  std::string text(library, static_cast<size_t>(length));
  const size_t comma = text.find(',');  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  // hvd-info shows which collectives this process's calls take.
  const hvd::Result<Algorithms> algorithms = algorithms_from_env();
  const char* collectives = !algorithms.ok()                      ? "HVD_MPI_ALGORITHMS invalid"
                            : *algorithms == Algorithms::kLibrary ? "MPI's collectives"
                                                                  : "hvd's algorithms";
  return std::string(HVD_PLUGIN_VERSION) + " (" + text.substr(0, comma) + "; " + collectives + ")";
}

}  // namespace

extern "C" HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) {
  static const std::string v = version();
  return hvd::sdk::backend_table<MpiBackend>(
      "mpi", v.c_str(),
      "hvd's algorithms over MPI point-to-point (HVD_MPI_ALGORITHMS=hvd, the default) or MPI's "
      "own collectives (=library), on a duplicate of MPI_COMM_WORLD; needs no rendezvous under "
      "mpirun",
      HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV | HVD_CAP_SELF_BOOTSTRAP);
}
