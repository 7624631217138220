// The Gloo backend: hvd's collectives on Facebook's Gloo over TCP.
//
// Bootstrap goes through the host's rendezvous store (gloo_algorithms::KvStore).
// The collectives are Gloo's buffer-based algorithms with hvd's reduction kernels (reduce-scatter
// and alltoall are built here on the same pair buffers), small ones over a mesh whose callers read
// their own sockets (gloo_algorithms.hpp says why for both).
//
// A communicator made by split is made by init over its members, with host services of its own:
// nothing here assumes the world (rank, size, addresses and keys are the communicator's).
// Configuration: HVD_GLOO_IFACE (a network interface) or HVD_GLOO_HOSTNAME (an address to bind);
// by default the address this host uses to reach the rendezvous server.
//
// Failures are errors, never the end of the process:
// - Gloo's event-loop thread reads the large collectives' messages, and a message longer than the
//   buffer it is for fails Gloo's bounds check there (Pair::prepareRead in
//   gloo/transport/tcp/pair.cc), an exception on a thread nobody catches: std::terminate. So
//   before a collective goes on that mesh, the ranks exchange what they are about to run over the
//   mesh whose callers read their own sockets (CallShape); any difference is HVD_ERR_MISMATCH on
//   every rank, before any data moves (the communicator stays usable). Alltoall, whose counts
//   differ by rank and decide its mesh, always runs such an exchange, with every rank's counts.
// - Gloo writes without MSG_NOSIGNAL, so a write that meets EPIPE raises SIGPIPE, whose default
//   action ends the process without a word (2 of 26 runs of a survivor of a killed peer; a peer
//   that closed first leaves the socket in CLOSE_WAIT, where the first failed write is EPIPE). A
//   write's SIGPIPE goes to the writing thread: every call into Gloo blocks it on the calling
//   thread and, unless the call succeeded on the sync mesh, takes one raised meanwhile off before
//   unblocking (SigpipeBlocked: two system calls, or three), and Gloo's event-loop thread is
//   started with it blocked. The process's disposition of SIGPIPE is left as the application set
//   it.
// - abort() (ABI 1.1) shuts down this communicator's sockets from any thread (shutdown(2) on
//   duplicates of Gloo's descriptors): a call blocked in a read, or waiting on the event loop, sees
//   its connections end at once, a write fails (EPIPE, whose SIGPIPE is blocked), the peers read
//   the end of their connections too, and later calls fail without touching the network.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <gloo/allgather_ring.h>
#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>

#include "gloo_algorithms.hpp"
#include "hvd/reduce.h"
#include "hvd/sdk/backend.hpp"
#include "hvd/sdk/call_shape.hpp"

namespace {

using hvd::Status;

// Blocks SIGPIPE on this thread for its lifetime, and takes off one that Gloo's writes raised
// meanwhile before restoring the mask (the way libpq keeps SIGPIPE from its writes). A thread
// that blocks SIGPIPE already is left alone, with whatever it has pending. Where a write that
// meets EPIPE fails the Gloo call it belongs to (the sync mesh: guarded()), nothing can be pending
// after a call that succeeded, and succeeded() skips the look (a third system call).
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
    owned_ = sigismember(&previous_, SIGPIPE) == 0;
  }
  ~SigpipeBlocked() {
    if (!owned_) return;
    sigset_t pending;
    if (!succeeded_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &now) == -1 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  // Every Gloo call under this mask succeeded: none of their writes met EPIPE.
  void succeeded() { succeeded_ = true; }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_;
  sigset_t previous_;
  bool owned_ = false;
  bool succeeded_ = false;
};

// Run a Gloo call, turning its exceptions into statuses: I/O errors mean a peer or the network
// failed (or a wait timed out); enforce failures are misuse. Gloo names the failed peer by its
// socket address; a crashed rank is named by hvdrun, which sees it exit.
template <typename Fn>
Status run_gloo(const char* what, Fn&& fn) {
  try {
    fn();
    return Status::success();
  } catch (const gloo::IoException& e) {
    const std::string message = e.what();
    const bool timed_out = message.find("imed out") != std::string::npos ||
                           message.find("imeout") != std::string::npos;
    return Status(timed_out ? HVD_ERR_TIMEOUT : HVD_ERR_REMOTE,
                  std::string("gloo ") + what + ": " + message +
                      (timed_out ? " (a peer rank did not respond in time)"
                                 : " (a peer rank failed or became unreachable)"));
  } catch (const gloo::EnforceNotMet& e) {
    return Status(HVD_ERR_INTERNAL, std::string("gloo ") + what + ": " + e.what());
  }
}

// Gloo sizes buffers by sizeof(T): each dtype travels as the unsigned type of its width.
template <size_t Bytes>
struct Unsigned;
template <>
struct Unsigned<1> {
  using type = uint8_t;
};
template <>
struct Unsigned<2> {
  using type = uint16_t;
};
template <>
struct Unsigned<4> {
  using type = uint32_t;
};
template <>
struct Unsigned<8> {
  using type = uint64_t;
};
template <size_t Bytes>
using Element = typename Unsigned<Bytes>::type;

// Calls fn(element) with a value of the element type of `element_size` bytes; nothing for a size
// that is no dtype's (the collectives refuse a dtype they do not know first).
template <typename Fn>
void with_element_type(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1:
      fn(Element<1>{});
      break;
    case 2:
      fn(Element<2>{});
      break;
    case 4:
      fn(Element<4>{});
      break;
    case 8:
      fn(Element<8>{});
      break;
    default:
      break;
  }
}

// Gloo's legacy algorithms take a plain function per element type, so each dtype/op pair gets
// one instance of hvd's kernel.
template <hvd_dtype D, hvd_reduce_op Op, typename T>
void reduce_into(T* x, const T* y, size_t n) {
  hvd_reduce(x, x, y, n, D, Op);
}

template <hvd_dtype D, typename T>
const gloo::ReductionFunction<T>* reduction_of(hvd_reduce_op op) {
  using Function = gloo::ReductionFunction<T>;
  static const Function sum(gloo::SUM, &reduce_into<D, HVD_SUM, T>);
  static const Function product(gloo::PRODUCT, &reduce_into<D, HVD_PRODUCT, T>);
  static const Function min(gloo::MIN, &reduce_into<D, HVD_MIN, T>);
  static const Function max(gloo::MAX, &reduce_into<D, HVD_MAX, T>);
  switch (op) {
    case HVD_PRODUCT:
      return &product;
    case HVD_MIN:
      return &min;
    case HVD_MAX:
      return &max;
    default:  // HVD_AVERAGE sums; the caller divides
      return &sum;
  }
}

// Calls fn(element, reduction): a value of the dtype's element type and its reduction for op;
// nothing for a dtype this plugin does not know (the collectives refuse one first).
template <typename Fn>
void with_reduction(hvd_dtype dtype, hvd_reduce_op op, Fn&& fn) {
  switch (dtype) {
    case HVD_UINT8:
      fn(Element<1>{}, reduction_of<HVD_UINT8, Element<1>>(op));
      break;
    case HVD_INT8:
      fn(Element<1>{}, reduction_of<HVD_INT8, Element<1>>(op));
      break;
    case HVD_INT32:
      fn(Element<4>{}, reduction_of<HVD_INT32, Element<4>>(op));
      break;
    case HVD_INT64:
      fn(Element<8>{}, reduction_of<HVD_INT64, Element<8>>(op));
      break;
    case HVD_FLOAT16:
      fn(Element<2>{}, reduction_of<HVD_FLOAT16, Element<2>>(op));
      break;
    case HVD_BFLOAT16:
      fn(Element<2>{}, reduction_of<HVD_BFLOAT16, Element<2>>(op));
      break;
    case HVD_FLOAT32:
      fn(Element<4>{}, reduction_of<HVD_FLOAT32, Element<4>>(op));
      break;
    case HVD_FLOAT64:
      fn(Element<8>{}, reduction_of<HVD_FLOAT64, Element<8>>(op));
      break;
    default:
      break;
  }
}

// The host passes only the dtypes this plugin declares (all of ABI 1.0's); one from a later ABI
// would have no element type here, and must never be read at another width.
Status check_dtype(hvd_dtype dtype) {
  if (hvd_dtype_size(dtype) != 0) return Status::success();
  return Status(HVD_ERR_UNSUPPORTED,
                "gloo: dtype " + std::to_string(dtype) + " is not one it knows");
}

// Duplicates of a communicator's sockets, so that abort() can shut them down from any thread.
// shutdown(2) acts on the socket, which a duplicate keeps open: it can never reach a descriptor
// number Gloo closed and the process then reused. Destroyed before the meshes, so that Gloo's
// own descriptors stay the last ones and its close ends each connection as it always has.
class Sockets {
 public:
  Sockets() = default;
  Sockets(const Sockets&) = delete;
  Sockets& operator=(const Sockets&) = delete;
  ~Sockets() {
    for (int fd : fds_) ::close(fd);
  }

  // Duplicates the socket of each of `context`'s pairs. Call it before any collective runs.
  Status add(gloo::Context& context) {
    for (int peer = 0; peer < context.size; ++peer) {
      if (peer == context.rank) continue;
      try {
        fds_.push_back(
            hvd::gloo_algorithms::ClosedConnections::duplicate_socket(*context.getPair(peer)));
      } catch (const gloo::IoException& e) {
        return Status(HVD_ERR_SYSTEM, std::string("gloo: ") + e.what());
      }
    }
    return Status::success();
  }

  // Ends every connection now, from any thread: a blocked read returns end of file, a write
  // EPIPE, the event loop reads end of file, and each peer reads end of file too.
  void shut_down() const noexcept {
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  std::vector<int> fds_;  // written before the communicator is handed out, then only read
};

// What a rank is about to run on the event-loop mesh, as words for one AllgatherRing: its call's
// shape, which must be the same everywhere, then an allreduce's votes on reusing an algorithm
// object (ReusedAllreduces::Fits), which the ranks combine. Alltoall's counts differ by rank: its
// record carries the counts themselves after the shape (agree_on_alltoall).
constexpr size_t kShapeWords = sizeof(hvd::sdk::CallShape) / sizeof(uint64_t);
constexpr size_t kRecordWords = kShapeWords + hvd::gloo_algorithms::ReusedAllreduces::kMaxEntries;

void put_shape(const hvd::sdk::CallShape& shape, uint64_t* words) {
  std::memcpy(words, &shape, sizeof shape);
}

hvd::sdk::CallShape shape_at(const uint64_t* words) {
  return hvd::sdk::CallShape::from_bytes(words);
}

// A peer whose call is not a record (a collective of 64 KiB or less, on the sync mesh) sends
// other bytes.
std::string describe_record(const uint64_t* words) {
  const hvd::sdk::CallShape shape = shape_at(words);
  return shape.magic == hvd::sdk::CallShape::kMagic
             ? shape.describe()
             : "a collective of 64 KiB or less, or another call";
}

class GlooBackend {
 public:
  static hvd::Result<std::unique_ptr<GlooBackend>> create(const hvd::sdk::InitContext& ctx) {
    auto self = std::unique_ptr<GlooBackend>(new GlooBackend(ctx));
    if (ctx.size == 1) return self;  // nothing to connect: every collective is local

    gloo::transport::tcp::attr attr;
    attr.iface = hvd::sdk::env_or("HVD_GLOO_IFACE", "");
    if (attr.iface.empty()) {
      attr.hostname = hvd::sdk::env_or("HVD_GLOO_HOSTNAME",
                                       ctx.local_address.empty() ? "127.0.0.1" : ctx.local_address);
    }
    const hvd::sdk::Host host = ctx.host;
    const hvd::gloo_algorithms::KvStore kv{
        [&](const std::string& key, const std::vector<char>& value) {
          return host.kv_set(key, value.data(), value.size());
        },
        [&](const std::string& key, std::chrono::milliseconds timeout) {
          return host.kv_get(key, timeout);
        }};
    const std::string where =
        attr.iface.empty() ? "address " + attr.hostname : "interface " + attr.iface;
    Status s;
    {
      // The device's event-loop thread starts here, and keeps the mask it was born with.
      const SigpipeBlocked sigpipe;
      s = run_gloo("connect", [&] {
        self->meshes_ = hvd::gloo_algorithms::Meshes::connect(
            kv, gloo::transport::tcp::CreateDevice(attr), ctx.rank, ctx.size, ctx.timeout);
      });
    }
    if (!s.ok()) {
      return s.with_context("connecting rank " + std::to_string(ctx.rank) + " on " + where);
    }
    HVD_RETURN_IF_ERROR(self->sockets_.add(*self->meshes_.sync));
    HVD_RETURN_IF_ERROR(self->sockets_.add(*self->meshes_.async));
    HVD_RETURN_IF_ERROR(wait_until_all_connected(ctx));
    return self;
  }

  ~GlooBackend() {
    // Leave together: a rank that closes its sockets while a peer still drains the last
    // collective would turn that peer's success into a connection error. After a failure or an
    // abort the connections are closed already.
    if (meshes_ && !failed_ && !aborted_.load()) {
      const SigpipeBlocked sigpipe;  // peers may be gone; this is no hot path
      (void)run_gloo("barrier at finalize", [&] { hvd::gloo_algorithms::barrier(meshes_); });
    }
  }

  // From any thread, during a call or not: the call in progress fails at once, and so does every
  // later one. Nothing is freed here; the destructor (finalize) does that.
  Status abort() {
    aborted_.store(true);
    sockets_.shut_down();
    return Status::success();
  }

  Status allreduce(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("allreduce"));
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    if (a.count == 0) return Status::success();
    const size_t element = hvd_dtype_size(a.dtype);
    if (a.sendbuf != a.recvbuf) std::memcpy(a.recvbuf, a.sendbuf, a.count * element);
    if (meshes_) {
      const size_t bytes = a.count * element;
      Status s;
      with_reduction(a.dtype, a.op, [&](auto t, const auto* reduction) {
        using T = decltype(t);
        T* data = static_cast<T*>(a.recvbuf);
        // A reused algorithm object's votes travel with the agreement: one round trip, not two.
        std::optional<hvd::gloo_algorithms::ReusedAllreduces::Fits> votes;
        if (hvd::gloo_algorithms::reuses_one_object<T>(a.count)) {
          votes = meshes_.reused->fits(data, static_cast<int>(a.count), reduction);
        }
        s = agree_before_event_loop("allreduce", bytes, HVD_COLLECTIVE_ALLREDUCE, a,
                                    votes ? &*votes : nullptr);
        if (!s.ok()) return;
        s = guarded("allreduce", bytes, [&] {
          hvd::gloo_algorithms::allreduce(meshes_, data, a.count, reduction,
                                          hvd::gloo_algorithms::order_sensitive(a.dtype, a.op),
                                          votes ? &*votes : nullptr);
        });
      });
      if (!s.ok()) return s;
    }
    if (a.op == HVD_AVERAGE) hvd_divide(a.recvbuf, a.count, a.dtype, size_);
    return Status::success();
  }

  Status allgather(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("allgather"));
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    const size_t element = hvd_dtype_size(a.dtype);
    if (a.recv_counts != nullptr) return allgatherv(a, element);
    if (a.count == 0) return Status::success();
    char* mine = static_cast<char*>(a.recvbuf) + static_cast<size_t>(rank_) * a.count * element;
    if (!meshes_) {
      if (a.sendbuf != mine) std::memcpy(mine, a.sendbuf, a.count * element);
      return Status::success();
    }
    const size_t bytes = a.count * element * static_cast<size_t>(size_);
    HVD_RETURN_IF_ERROR(agree_before_event_loop("allgather", bytes, HVD_COLLECTIVE_ALLGATHER, a));
    return guarded("allgather", bytes, [&] {
      with_element_type(element, [&](auto t) {
        using T = decltype(t);
        hvd::gloo_algorithms::allgather(meshes_, static_cast<const T*>(a.sendbuf),
                                        static_cast<T*>(a.recvbuf), a.count);
      });
    });
  }

  Status broadcast(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("broadcast"));
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    if (a.count == 0) return Status::success();
    const size_t element = hvd_dtype_size(a.dtype);
    if (rank_ == a.root && a.sendbuf != a.recvbuf) {
      std::memcpy(a.recvbuf, a.sendbuf, a.count * element);
    }
    if (!meshes_) return Status::success();
    HVD_RETURN_IF_ERROR(
        agree_before_event_loop("broadcast", a.count * element, HVD_COLLECTIVE_BROADCAST, a));
    return guarded("broadcast", a.count * element, [&] {
      with_element_type(element, [&](auto t) {
        hvd::gloo_algorithms::broadcast(meshes_, static_cast<decltype(t)*>(a.recvbuf), a.count,
                                        a.root);
      });
    });
  }

  Status barrier() {
    HVD_RETURN_IF_ERROR(usable("barrier"));
    if (!meshes_) return Status::success();
    // On the sync mesh, whatever its size: bytes 0.
    return guarded("barrier", 0, [&] { hvd::gloo_algorithms::barrier(meshes_); });
  }

  Status reduce_scatter(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("reduce_scatter"));
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    if (a.count == 0) return Status::success();
    const size_t element = hvd_dtype_size(a.dtype);
    if (!meshes_) {
      if (a.sendbuf != a.recvbuf) std::memcpy(a.recvbuf, a.sendbuf, a.count * element);
      return Status::success();  // an average over one rank is the value itself
    }
    const size_t bytes = a.count * element * static_cast<size_t>(size_);
    Status s;
    with_reduction(a.dtype, a.op, [&](auto t, const auto* reduction) {
      using T = decltype(t);
      s = agree_before_event_loop("reduce_scatter", bytes, HVD_COLLECTIVE_REDUCE_SCATTER, a);
      if (!s.ok()) return;
      s = guarded("reduce_scatter", kEitherMesh, [&] {
        hvd::gloo_algorithms::reduce_scatter(meshes_, static_cast<const T*>(a.sendbuf),
                                             static_cast<T*>(a.recvbuf), a.count, reduction,
                                             &ring_scratch_);
      });
    });
    if (!s.ok()) return s;
    if (a.op == HVD_AVERAGE) hvd_divide(a.recvbuf, a.count, a.dtype, size_);
    return Status::success();
  }

  Status alltoall(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(usable("alltoall"));
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    if (!HVD_HAS_FIELD(&a, hvd_collective_args, send_counts) || a.send_counts == nullptr ||
        a.recv_counts == nullptr) {
      return Status(HVD_ERR_INVALID_ARGUMENT,
                    "gloo alltoall: the call has no send_counts or no recv_counts");
    }
    const size_t element = hvd_dtype_size(a.dtype);
    const auto ranks = static_cast<size_t>(size_);
    const std::vector<size_t> send_counts(a.send_counts, a.send_counts + ranks);
    const std::vector<size_t> recv_counts(a.recv_counts, a.recv_counts + ranks);
    if (!meshes_) {
      if (send_counts[0] != recv_counts[0]) {
        return Status(HVD_ERR_MISMATCH,
                      "gloo alltoall: rank 0 sends itself " + std::to_string(send_counts[0]) +
                          " elements but expects " + std::to_string(recv_counts[0]));
      }
      if (send_counts[0] > 0) std::memcpy(a.recvbuf, a.sendbuf, send_counts[0] * element);
      return Status::success();
    }
    size_t total = 0;  // elements moved by the whole exchange, the same on every rank
    HVD_RETURN_IF_ERROR(agree_on_alltoall(a, send_counts, recv_counts, &total));
    if (total == 0) return Status::success();
    return guarded("alltoall", kEitherMesh, [&] {
      with_element_type(element, [&](auto t) {
        using T = decltype(t);
        hvd::gloo_algorithms::alltoall(meshes_, static_cast<const T*>(a.sendbuf), send_counts,
                                       static_cast<T*>(a.recvbuf), recv_counts, total * element);
      });
    });
  }

 private:
  explicit GlooBackend(const hvd::sdk::InitContext& ctx) : rank_(ctx.rank), size_(ctx.size) {}

  Status usable(const char* what) const {
    if (!aborted_.load()) return Status::success();
    return Status(HVD_ERR_STATE, std::string("gloo ") + what +
                                     ": the communicator was aborted; it takes no more calls");
  }

  // run_gloo with SIGPIPE blocked; a failure also closes every connection. A collective that failed
  // half way leaves peers waiting for messages this rank will never send (a peer of a dead rank
  // gives up, and the dead rank's other peers would wait on it for the whole timeout); closed
  // sockets tell them at once, naming this rank's address.
  //
  // `bytes`: the call's size, which routes it as gloo_algorithms does (Meshes::for_bytes), or
  // kEitherMesh. On the sync mesh every write is the caller's, and one that fails throws from it
  // (Gloo's sendSyncMode), so a call there that succeeded raised no SIGPIPE; on the event-loop
  // mesh a write's failure may surface only in a later call (a notification nobody waits for).
  static constexpr size_t kEitherMesh = SIZE_MAX;
  template <typename Fn>
  Status guarded(const char* what, size_t bytes, Fn&& fn) {
    SigpipeBlocked sigpipe;
    Status s = run_gloo(what, std::forward<Fn>(fn));
    if (s.ok() && bytes <= hvd::gloo_algorithms::kSyncMeshMaxBytes) sigpipe.succeeded();
    if (!s.ok() && !failed_) {
      failed_ = true;
      sockets_.shut_down();  // the duplicates keep the sockets open past Gloo's close
      (void)run_gloo("closing connections", [&] { meshes_.close_connections(); });
    }
    if (!s.ok() && aborted_.load()) {
      // What Gloo says of sockets this rank shut down itself names no culprit worth reading.
      return Status(HVD_ERR_STATE, std::string("gloo ") + what +
                                       ": the communicator was aborted during the call (" +
                                       s.message() + ")");
    }
    return s;
  }

  // Before a collective of `bytes` in all goes on the event-loop mesh (gloo_algorithms routes by
  // the same size), the ranks gather each other's CallShape over the sync mesh, whose reads
  // happen on the callers' threads. The same shapes everywhere: every rank goes on. Otherwise
  // every rank has seen the same shapes, and fails alike with HVD_ERR_MISMATCH, leaving both
  // meshes as they were. A rank whose call stays on the sync mesh meanwhile (a disagreement
  // across the 64 KiB line) fails the exchange on its caller's thread, also an error. A call the
  // host marks HVD_CALL_RANKS_AGREE (negotiated by the scheduler, or checked by HVD_CHECK_ARGS)
  // skips the exchange unless it carries votes.
  //
  // `votes`, for an allreduce that reuses an algorithm object (at least 1 MiB, so always past
  // this exchange): this rank's ReusedAllreduces::fits() in, the minimum over the ranks out, which
  // saves ReusedAllreduces its own round trip.
  Status agree_before_event_loop(const char* what, size_t bytes, hvd_collective kind,
                                 const hvd_collective_args& a,
                                 hvd::gloo_algorithms::ReusedAllreduces::Fits* votes = nullptr) {
    if (bytes <= hvd::gloo_algorithms::kSyncMeshMaxBytes) return Status::success();
    // The host compared the ranks' calls already (ABI 1.2): only votes need the round trip.
    const bool agreed =
        HVD_HAS_FIELD(&a, hvd_collective_args, flags) && (a.flags & HVD_CALL_RANKS_AGREE) != 0;
    if (agreed && votes == nullptr) return Status::success();
    const auto shape = hvd::sdk::CallShape::of(kind, &a, size_);
    constexpr size_t kRecord = kRecordWords;
    std::array<uint64_t, kRecord> mine{};
    put_shape(shape, mine.data());
    if (votes != nullptr) {
      for (size_t i = 0; i < votes->size(); ++i) {
        mine[kShapeWords + i] = static_cast<uint64_t>((*votes)[i]);
      }
    }
    std::vector<uint64_t> all(kRecord * static_cast<size_t>(size_));
    HVD_RETURN_IF_ERROR(guarded(what, 0, [&] {  // on the sync mesh, whatever its size
      gloo::AllgatherRing<uint64_t>(meshes_.sync, {mine.data()}, all.data(),
                                    static_cast<int>(kRecord))
          .run();
    }));
    auto record = [&](int r) { return all.begin() + static_cast<ptrdiff_t>(r * kRecord); };
    bool same = true;
    for (int r = 0; r < size_ && same; ++r) same = shape_at(&*record(r)) == shape;
    if (!same) {
      std::string text = std::string("gloo ") + what + ": the ranks called different collectives:";
      for (int r = 0; r < size_; ++r) {
        text += (r == 0 ? " rank " : "; rank ") + std::to_string(r) + " " +
                describe_record(&*record(r));
      }
      return Status(HVD_ERR_MISMATCH, text);
    }
    if (votes != nullptr) {
      for (int r = 0; r < size_; ++r) {
        for (size_t i = 0; i < votes->size(); ++i) {
          (*votes)[i] = std::min((*votes)[i], static_cast<int>(record(r)[kShapeWords + i]));
        }
      }
    }
    return Status::success();
  }

  // Alltoall's agreement, before every alltoall of more than one rank: each rank's counts differ,
  // and which mesh the exchange takes depends on all of them, so the ranks always gather each
  // other's shape (kind and dtype) and send and receive counts over the sync mesh (2 * size + 6
  // words per rank). The same shapes everywhere, and counts where what each rank sends each other
  // is what that one expects: every rank goes on, knowing the elements the whole exchange moves
  // (`total`), which routes it. Otherwise every rank fails alike with HVD_ERR_MISMATCH.
  Status agree_on_alltoall(const hvd_collective_args& a, const std::vector<size_t>& send_counts,
                           const std::vector<size_t>& recv_counts, size_t* total) {
    const auto ranks = static_cast<size_t>(size_);
    const size_t words = kShapeWords + 2 * ranks;
    const hvd::sdk::CallShape shape = hvd::sdk::CallShape::of(HVD_COLLECTIVE_ALLTOALL, &a, size_);
    std::vector<uint64_t> mine(words);
    put_shape(shape, mine.data());
    std::copy(send_counts.begin(), send_counts.end(), mine.begin() + kShapeWords);
    std::copy(recv_counts.begin(), recv_counts.end(),
              mine.begin() + static_cast<ptrdiff_t>(kShapeWords + ranks));
    std::vector<uint64_t> all(words * ranks);
    HVD_RETURN_IF_ERROR(guarded("alltoall", kEitherMesh, [&] {
      gloo::AllgatherRing<uint64_t>(meshes_.sync, {mine.data()}, all.data(),
                                    static_cast<int>(words))
          .run();
    }));
    auto record = [&](size_t r) { return all.data() + r * words; };
    for (size_t r = 0; r < ranks; ++r) {
      if (shape_at(record(r)) == shape) continue;
      std::string text = "gloo alltoall: the ranks called different collectives:";
      for (size_t q = 0; q < ranks; ++q) {
        text +=
            (q == 0 ? " rank " : "; rank ") + std::to_string(q) + " " + describe_record(record(q));
      }
      return Status(HVD_ERR_MISMATCH, text);
    }
    *total = 0;
    for (size_t p = 0; p < ranks; ++p) {
      for (size_t q = 0; q < ranks; ++q) {
        const uint64_t sent = record(p)[kShapeWords + q];
        const uint64_t expected = record(q)[kShapeWords + ranks + p];
        if (sent != expected) {
          return Status(HVD_ERR_MISMATCH,
                        "gloo alltoall: rank " + std::to_string(p) + " sends rank " +
                            std::to_string(q) + " " + std::to_string(sent) + " elements but rank " +
                            std::to_string(q) + " expects " + std::to_string(expected) +
                            " from rank " + std::to_string(p) +
                            ": the ranks' send and receive counts disagree");
        }
        *total += static_cast<size_t>(sent);
      }
    }
    return Status::success();
  }

  // Every rank has finished connectFullMesh once this returns. Without it a rank could leave
  // init (and exit) while a peer still reads its handshake, failing that peer's init.
  static Status wait_until_all_connected(const hvd::sdk::InitContext& ctx) {
    const char mine = 1;
    std::vector<char> all(static_cast<size_t>(ctx.size));
    return ctx.host.oob_allgather(&mine, 1, all.data(), ctx.timeout);
  }

  Status allgatherv(const hvd_collective_args& a, size_t element) {
    const size_t total = std::accumulate(a.recv_counts, a.recv_counts + size_, size_t{0});
    if (total == 0) return Status::success();
    std::vector<size_t> counts(a.recv_counts, a.recv_counts + size_);
    size_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[static_cast<size_t>(r)];
    char* mine = static_cast<char*>(a.recvbuf) + offset * element;
    if (a.count > 0 && a.sendbuf != mine) std::memcpy(mine, a.sendbuf, a.count * element);
    if (!meshes_) return Status::success();
    HVD_RETURN_IF_ERROR(
        agree_before_event_loop("allgatherv", total * element, HVD_COLLECTIVE_ALLGATHER, a));
    return guarded("allgatherv", kEitherMesh, [&] {
      with_element_type(element, [&](auto t) {
        hvd::gloo_algorithms::allgatherv(meshes_, static_cast<decltype(t)*>(a.recvbuf), counts);
      });
    });
  }

  int rank_;
  int size_;
  hvd::gloo_algorithms::Meshes meshes_;  // empty when size == 1
  Sockets sockets_;                      // duplicates of the meshes' sockets, for abort()
  bool failed_ = false;                  // a collective failed: the connections are closed
  std::atomic<bool> aborted_{false};     // abort() was called, from any thread
  std::vector<char> ring_scratch_;       // reduce_scatter's inbox and outbox, kept between calls
};

}  // namespace

HVD_BACKEND_PLUGIN(
    GlooBackend, "gloo", HVD_PLUGIN_VERSION " (gloo " HVD_GLOO_VERSION ")",
    "Gloo collectives over TCP (HVD_GLOO_IFACE / HVD_GLOO_HOSTNAME choose the network)",
    HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV | HVD_CAP_REDUCE_SCATTER)
