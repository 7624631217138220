// gloo_algorithms.hpp — the Gloo algorithms hvd runs, shared by the gloo plugin and hvd-bench's
// direct-Gloo baseline so that their ratio measures hvd alone.
//
// These are Gloo's buffer-based ("legacy") algorithm classes, built for each call except large
// allreduces, which keep theirs (ReusedAllreduces). Gloo's unbound-buffer API (gloo::allreduce &
// co.) pays a rendezvous of notifications per segment, and on the reference machine it is far
// slower for small messages (1 KiB allreduce, 2 ranks: 1.7-4.0 ms against 55-225 us) and beyond
// two ranks (4 MiB at 3 ranks: 3.1-3.2 s against 16-44 ms); see docs/performance.md. The two APIs
// must not be mixed on one context either: a legacy send sets the socket's SO_SNDBUF (turning off
// the kernel's autotuning) to the size of that message, after which large unbound-buffer transfers
// on the same pair crawl. So every collective of a context goes through this file.
//
// Legacy classes count elements in int (and AllgatherRing bytes in int): larger calls are cut
// into pieces, or, for allgather, sent as one broadcast per rank.
#ifndef HVD_PLUGINS_GLOO_ALGORITHMS_HPP
#define HVD_PLUGINS_GLOO_ALGORITHMS_HPP

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/pair.h>

#include "hvd/sdk/result.hpp"

namespace hvd::gloo_algorithms {

// An hvd key-value store as Gloo's rendezvous store sees it: every key under a prefix (so that
// two meshes can meet through one store), and hvd's statuses turned into the exceptions Gloo
// expects.
struct KvStore {
  std::function<Status(const std::string& key, const std::vector<char>& value)> set;
  std::function<Result<std::vector<char>>(const std::string& key,
                                          std::chrono::milliseconds timeout)>
      get;
};

class PrefixedStore final : public gloo::rendezvous::Store {
 public:
  PrefixedStore(const KvStore& kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const Status s = kv_.set(prefix_ + key, data);
    if (!s.ok()) throw gloo::IoException(s.message());
  }
  std::vector<char> get(const std::string& key) override { return get(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) (void)get(key, timeout);
  }

 private:
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) {
    Result<std::vector<char>> value = kv_.get(prefix_ + key, timeout);
    if (!value.ok()) throw gloo::IoException(value.status().message());
    return std::move(value).value();
  }

  const KvStore& kv_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// Gloo's algorithm objects are made to be run again and again: each run ends in a barrier, so that
// the next cannot disturb it. Building one allocates its scratch buffers and posts its receive
// buffers, which a large allreduce on a buffer it has seen before need not pay again: reusing the
// object made 1 to 16 MiB allreduces at 2 ranks mostly 10-35% faster (docs/performance.md). Every
// rank must decide alike whether to build, since an object draws its slots when it is built. So
// the entries are found by what the ranks agree on (count, and element type and op through the
// reduction) and evicted least recently used first, which the ranks do alike. But an object is
// also bound to this rank's buffer, whose address is this rank's own, and a rank cannot build
// alone: its peers' slots would not match, and a peer's next message may already sit in the old
// object's inbox. So before reusing one the ranks allreduce, on the sync mesh, one integer per
// entry of this shape saying whether the entry holds their buffer; they run the first entry that
// holds every rank's, or all build a new one.
class ReusedAllreduces {
 public:
  // Calls from this size on reuse objects, at most this many and of these bytes in all (an entry
  // holds scratch of about its bytes divided by the ranks); others build theirs per call. Below
  // 1 MiB reuse gained nothing measurable, and the agreement costs a round trip.
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kMaxEntries = 8;
  static constexpr size_t kMaxBytes = size_t{128} << 20;

  // Votes: fits[i] is 1 where this rank's buffer is that of the i-th entry of this call's shape
  // (in the order get() considers them), 0 elsewhere.
  using Fits = std::array<int, kMaxEntries>;

  template <typename T>
  Fits fits(const T* data, int count, const gloo::ReductionFunction<T>* reduction) const {
    Fits votes{};
    size_t i = 0;
    for (const Entry& entry : entries_) {
      if (entry.reduction == reduction && entry.count == count) votes[i++] = entry.data == data;
    }
    return votes;
  }

  // The object to run, the ranks agreeing through an allreduce of their votes on the sync mesh.
  template <typename T>
  gloo::Algorithm& get(const std::shared_ptr<gloo::Context>& context,
                       const std::shared_ptr<gloo::Context>& sync, T* data, int count,
                       const gloo::ReductionFunction<T>* reduction) {
    Fits everywhere = fits(data, count, reduction);
    if (std::any_of(entries_.begin(), entries_.end(), [&](const Entry& entry) {
          return entry.reduction == reduction && entry.count == count;
        })) {
      gloo::AllreduceRing<int>(sync, {everywhere.data()}, static_cast<int>(everywhere.size()),
                               gloo::ReductionFunction<int>::min)
          .run();
    }
    return get_agreed(context, data, count, reduction, everywhere);
  }

  // The same, with the votes already combined by the caller: `everywhere` is the minimum over
  // the ranks of their fits() (hvd's gloo backend sends them with its call agreement, saving
  // the round trip).
  template <typename T>
  gloo::Algorithm& get_agreed(const std::shared_ptr<gloo::Context>& context, T* data, int count,
                              const gloo::ReductionFunction<T>* reduction, const Fits& everywhere) {
    size_t i = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->reduction != reduction || it->count != count) continue;
      if (everywhere[i++] == 1) {
        entries_.splice(entries_.begin(), entries_, it);
        return *entries_.front().algorithm;
      }
    }
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    while (!entries_.empty() && (entries_.size() >= kMaxEntries || bytes_ + bytes > kMaxBytes)) {
      bytes_ -= entries_.back().bytes;
      entries_.pop_back();
    }
    entries_.push_front(Entry{reduction, count, bytes, data,
                              std::make_unique<gloo::AllreduceRingChunked<T>>(
                                  context, std::vector<T*>{data}, count, reduction)});
    bytes_ += bytes;
    return *entries_.front().algorithm;
  }

  static bool holds(size_t bytes) { return bytes >= kMinBytes && bytes <= kMaxBytes; }

 private:
  struct Entry {
    const void* reduction;
    int count;
    size_t bytes;
    const void* data;  // this rank's buffer, which the algorithm reduces in place
    std::unique_ptr<gloo::Algorithm> algorithm;
  };
  std::list<Entry> entries_;  // the most recently used first
  size_t bytes_ = 0;
};

// Collectives of at most this many bytes in all go over the sync mesh (Meshes).
constexpr size_t kSyncMeshMaxBytes = 64 << 10;

// Ended connections of the event-loop mesh, seen without waiting. Gloo registers a receive buffer
// with its pair without looking at the pair's state, and a pair that fails wakes only the buffers
// registered by then: a wait on a buffer registered after its pair closed (a peer died, or gave up
// and closed its connections, while this rank set its algorithm up) sleeps out the whole timeout
// before Gloo names the closed connection. So every algorithm on that mesh registers its buffers,
// then asks this (Meshes::check), then waits; a pair that closes later wakes it.
//
// It looks at every peer of the mesh, not only those the algorithm waits on: a call on a
// communicator one of whose ranks has failed or left fails too, even where the data it needs
// came from others.
//
// It polls duplicates of the pairs' sockets (tcp::Pair::fd_ is protected: a pointer to member
// named through a derived class reads it), which keep each socket open after Gloo closed its own
// descriptor, so the end stays visible.
class ClosedConnections {
 public:
  ClosedConnections() = default;
  ClosedConnections(ClosedConnections&& other) noexcept
      : sockets_(std::exchange(other.sockets_, {})), peers_(std::move(other.peers_)) {}
  ClosedConnections& operator=(ClosedConnections&& other) noexcept {
    std::swap(sockets_, other.sockets_);
    std::swap(peers_, other.peers_);
    return *this;
  }
  ~ClosedConnections() {
    for (const pollfd& p : sockets_) ::close(p.fd);
  }

  // Watches `context`'s pairs; throws gloo::IoException when a socket cannot be duplicated.
  explicit ClosedConnections(gloo::Context& context) {
    sockets_.reserve(static_cast<size_t>(context.size));
    try {
      for (int peer = 0; peer < context.size; ++peer) {
        if (peer == context.rank) continue;
        sockets_.push_back({duplicate_socket(*context.getPair(peer)), POLLRDHUP, 0});
        peers_.push_back(peer);
      }
    } catch (...) {  // no destructor runs for an object whose constructor throws
      for (const pollfd& p : sockets_) ::close(p.fd);
      throw;
    }
  }

  // Throws gloo::IoException naming the first peer whose connection has ended (closed by the
  // peer, reset, or shut down here) with nothing left to read; one poll(2) that never waits.
  void throw_if_any() const {
    int ready;
    do {
      ready = ::poll(sockets_.data(), sockets_.size(), 0);
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) return;
    for (size_t i = 0; i < sockets_.size(); ++i) {
      if ((sockets_[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
      // Bytes still queued are Gloo's to read, maybe into the buffers just registered: its event
      // loop drains them, reaches the end and wakes those buffers itself. Failing the call now
      // would let it write into memory the caller frees.
      int queued = 0;
      if (::ioctl(sockets_[i].fd, FIONREAD, &queued) == 0 && queued > 0) continue;
      const std::string peer = std::to_string(peers_[i]);
      throw gloo::IoException("the connection to rank " + peer + " has ended (rank " + peer +
                              " failed or gave up)");
    }
  }

  // A duplicate (close-on-exec) of `pair`'s socket; throws gloo::IoException.
  static int duplicate_socket(gloo::transport::Pair& pair) {
    auto* tcp = dynamic_cast<gloo::transport::tcp::Pair*>(&pair);
    if (tcp == nullptr) throw gloo::IoException("a Gloo pair is not a TCP pair");
    const int fd = ::fcntl(PairSocket::of(*tcp), F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      throw gloo::IoException(std::string("duplicating a socket: ") + std::strerror(errno));
    return fd;
  }

 private:
  struct PairSocket : gloo::transport::tcp::Pair {
    static int of(gloo::transport::tcp::Pair& pair) { return pair.*(&PairSocket::fd_); }
  };
  mutable std::vector<pollfd> sockets_;  // poll(2) writes revents: the calling thread's alone
  std::vector<int> peers_;               // the rank of each of sockets_
};

// Two full meshes between the same ranks. A Gloo TCP pair normally leaves reading to the device's
// event-loop thread, which then wakes the caller; in sync mode the caller reads its own socket,
// one thread wake-up fewer per message. Measured (1 KiB allreduce, 2 ranks, one VM): p50 20 us
// against 53-69 us back to back; with 1 ms between calls, as the scheduler's votes come, p50 60
// against 131-137 us and p90 0.1 ms against 2-3 ms. But a sync send blocks until the kernel has
// taken every byte, so a ring whose ranks all send a large message before any of them reads
// deadlocks until the timeout (64 MiB did). Small collectives, whose messages fit in the
// sockets' buffers, therefore take the sync mesh and the rest the event-loop one. Every rank
// routes a call alike: by its total size, which the ranks agree on.
struct Meshes {
  std::shared_ptr<gloo::Context> sync;
  std::shared_ptr<gloo::Context> async;
  // Declared after the meshes, so destroyed before them: its algorithms hold their pairs.
  std::unique_ptr<ReusedAllreduces> reused = std::make_unique<ReusedAllreduces>();
  // After the meshes too: its duplicates close first, so that Gloo's own descriptors are the last
  // ones and its close ends each connection.
  ClosedConnections closed_async;

  // Before an algorithm on `context`, its buffers registered, waits (ClosedConnections).
  void check(const std::shared_ptr<gloo::Context>& context) const {
    if (context == async) closed_async.throw_if_any();
  }

  const std::shared_ptr<gloo::Context>& for_bytes(size_t bytes) const {
    return bytes <= kSyncMeshMaxBytes ? sync : async;
  }
  explicit operator bool() const { return sync != nullptr; }
  void close_connections() const {
    async->closeConnections();
    sync->closeConnections();
  }

  // Connects both through `kv`, each under a key prefix of its own (two meshes' keys must not
  // meet); throws what Gloo throws. Before any rank sends on them, every rank must have returned
  // from this (the caller's barrier): a message that reached a pair before it turned sync would
  // be read by the wrong thread.
  static Meshes connect(const KvStore& kv, std::shared_ptr<gloo::transport::Device> device,
                        int rank, int size, std::chrono::milliseconds timeout) {
    auto mesh = [&](const char* prefix) {
      PrefixedStore store(kv, prefix, timeout);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(timeout);
      context->connectFullMesh(store, device);
      return context;
    };
    Meshes m{mesh("sync/"), mesh("async/")};
    m.closed_async = ClosedConnections(*m.async);
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) m.sync->getPair(peer)->setSync(true, false);
    }
    return m;
  }
};

// Runs a Gloo algorithm object, built (its buffers registered) on `context`, once the pairs pass
// Meshes::check.
template <typename Algorithm>
void run(const Meshes& meshes, const std::shared_ptr<gloo::Context>& context,
         Algorithm&& algorithm) {
  meshes.check(context);
  algorithm.run();
}

// Below this, one message per hop (AllreduceRing) has the lowest latency; from it on, the
// bandwidth-optimal ring (reduce-scatter then allgather in chunks) moves fewer bytes.
constexpr size_t kChunkedRingFromBytes = 256 << 10;
// The largest piece one legacy call handles (its offsets are int).
constexpr size_t kMaxPieceBytes = size_t{1} << 30;

namespace detail {

template <typename T>
void broadcast(const Meshes& meshes, const std::shared_ptr<gloo::Context>& context, T* recv,
               size_t count, int root) {
  if (count == 0) return;
  run(meshes, context, gloo::BroadcastOneToAll<T>(context, {recv}, count, root));
}

template <typename T>
void allgatherv(const Meshes& meshes, const std::shared_ptr<gloo::Context>& context, T* recv,
                const std::vector<size_t>& counts) {
  size_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    broadcast(meshes, context, recv + offset, counts[r], static_cast<int>(r));
    offset += counts[r];
  }
}

}  // namespace detail

// Whether an allreduce of `count` elements runs one reused object (ReusedAllreduces), whose
// votes a caller may then gather itself and pass to allreduce().
template <typename T>
bool reuses_one_object(size_t count) {
  const size_t bytes = count * sizeof(T);
  return bytes <= kMaxPieceBytes && bytes >= kChunkedRingFromBytes &&
         ReusedAllreduces::holds(bytes);
}

// Whether the ranks' results depend on the order the reduction combines their values in:
// floating-point sums and products; min and max never.
inline bool order_sensitive(hvd_dtype dtype, hvd_reduce_op op) {
  const bool floating =
      dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16 || dtype == HVD_FLOAT32 || dtype == HVD_FLOAT64;
  return floating && (op == HVD_SUM || op == HVD_AVERAGE || op == HVD_PRODUCT);
}

// data[i] = reduction over the ranks of data[i], in place. `agreed`: where reuses_one_object, the
// minimum over the ranks of ReusedAllreduces::fits(), gathered by the caller; null, and the ranks
// exchange them here. `order_sensitive`: the reduction's result depends on the order it combines
// the ranks' values in (a floating-point sum or product). AllreduceRing, the fastest below
// kChunkedRingFromBytes, combines them in a different order on every rank, so from three ranks on
// their results differ in the last bits, and replicas trained on them drift apart; the chunked
// ring reduces each element on one rank and copies it to the others, so every rank gets the same
// bits, at twice the hops (2 (n - 1) against n - 1).
template <typename T>
void allreduce(Meshes& meshes, T* data, size_t count, const gloo::ReductionFunction<T>* reduction,
               bool order_sensitive, const ReusedAllreduces::Fits* agreed = nullptr) {
  const auto& context = meshes.for_bytes(count * sizeof(T));
  const size_t piece = kMaxPieceBytes / sizeof(T);
  for (size_t done = 0; done < count; done += piece) {
    const int n = static_cast<int>(std::min(piece, count - done));
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    // At two ranks the ring's orders are a + b and b + a, the same bits (IEEE 754 sums and
    // products commute); from three on they differ.
    if (bytes < kChunkedRingFromBytes && (!order_sensitive || context->size <= 2)) {
      run(meshes, context, gloo::AllreduceRing<T>(context, {data + done}, n, reduction));
    } else if (bytes < kChunkedRingFromBytes) {
      run(meshes, context, gloo::AllreduceRingChunked<T>(context, {data + done}, n, reduction));
    } else if (ReusedAllreduces::holds(bytes)) {
      if (agreed != nullptr && reuses_one_object<T>(count)) {
        run(meshes, context, meshes.reused->get_agreed(context, data, n, reduction, *agreed));
      } else {
        run(meshes, context, meshes.reused->get(context, meshes.sync, data + done, n, reduction));
      }
    } else {
      run(meshes, context, gloo::AllreduceRingChunked<T>(context, {data + done}, n, reduction));
    }
  }
}

// recv (count elements) = root's recv; every rank passes its own recv, the root's holds the data.
template <typename T>
void broadcast(const Meshes& meshes, T* recv, size_t count, int root) {
  detail::broadcast(meshes, meshes.for_bytes(count * sizeof(T)), recv, count, root);
}

// recv holds each rank's `counts[r]` elements, rank by rank; this rank's part must already be in
// place. One broadcast per rank: the shape allgathers take when counts differ or are too large
// for AllgatherRing.
template <typename T>
void allgatherv(const Meshes& meshes, T* recv, const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  detail::allgatherv(meshes, meshes.for_bytes(total * sizeof(T)), recv, counts);
}

// recv holds every rank's `count` elements, rank by rank; send is this rank's part (it may be
// recv's own slot already).
template <typename T>
void allgather(const Meshes& meshes, const T* send, T* recv, size_t count) {
  if (count == 0) return;
  const auto& context =
      meshes.for_bytes(count * sizeof(T) * static_cast<size_t>(meshes.sync->size));
  const size_t ranks = static_cast<size_t>(context->size);
  if (count * ranks * sizeof(T) > kMaxPieceBytes) {
    T* mine = recv + static_cast<size_t>(context->rank) * count;
    if (send != mine) std::copy(send, send + count, mine);
    detail::allgatherv(meshes, context, recv, std::vector<size_t>(ranks, count));
    return;
  }
  run(meshes, context, gloo::AllgatherRing<T>(context, {send}, recv, static_cast<int>(count)));
}

inline void barrier(const Meshes& meshes) { gloo::BarrierAllToAll(meshes.sync).run(); }

namespace detail {

// Runs a wait on `peer`'s messages; a Gloo I/O error (which names the peer by its socket address)
// gets the peer's rank too.
template <typename Fn>
void waiting_on(int peer, const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    throw gloo::IoException(std::string(e.what()) + " (" + what + " rank " + std::to_string(peer) +
                            ")");
  }
}

}  // namespace detail

// recv (count elements) = this rank's block of the reduction over the ranks of send, which holds
// one block of `count` elements per rank, rank by rank. recv may be send itself (the result then
// takes its first block). Every rank passes the same count.
//
// A ring, as the first half of AllreduceRingChunked, built on the same pair buffers (Gloo's own
// ReduceScatterHalvingDoubling returns wrong blocks: pytorch/gloo#303): in round k each rank
// passes its right neighbour the partial sum of block rank-k-1 and folds its own block into the
// one from its left, so after size-1 rounds each rank holds its own block reduced over every
// rank, having sent (size-1)/size of the buffer. Each block is reduced along one chain, so every
// element is combined once per rank. As in AllreduceRing, a rank tells its left neighbour when its
// inbox is free again before that neighbour sends into it. `scratch` holds the inbox and outbox
// (two blocks): kept by the caller, so that a large call does not fault in fresh pages each time.
template <typename T>
void reduce_scatter(const Meshes& meshes, const T* send, T* recv, size_t count,
                    const gloo::ReductionFunction<T>* reduction, std::vector<char>* scratch) {
  if (count == 0) return;
  const auto& context =
      meshes.for_bytes(count * sizeof(T) * static_cast<size_t>(meshes.sync->size));
  const int size = context->size;
  const int rank = context->rank;
  auto block = [&](int r) { return send + static_cast<size_t>((r % size + size) % size) * count; };
  const size_t bytes = count * sizeof(T);
  if (scratch->size() < 2 * count * sizeof(T)) scratch->resize(2 * count * sizeof(T));
  T* const inbox = reinterpret_cast<T*>(scratch->data());  // operator new's alignment suits T
  T* const outbox = inbox + count;
  std::copy(block(rank - 1), block(rank - 1) + count, outbox);
  const int left_rank = (rank + size - 1) % size;
  const int right_rank = (rank + 1) % size;
  auto& left = context->getPair(left_rank);
  auto& right = context->getPair(right_rank);
  const int slot = context->nextSlot();
  const int notification_slot = context->nextSlot();
  const auto send_data = right->createSendBuffer(slot, outbox, bytes);
  const auto recv_data = left->createRecvBuffer(slot, inbox, bytes);
  int dummy = 0;
  const auto send_notification = left->createSendBuffer(notification_slot, &dummy, sizeof(dummy));
  const auto recv_notification = right->createRecvBuffer(notification_slot, &dummy, sizeof(dummy));
  meshes.check(context);
  const int rounds = size - 1;
  for (int round = 0; round < rounds; ++round) {
    send_data->send();
    detail::waiting_on(left_rank, "receiving from", [&] { recv_data->waitRecv(); });
    detail::waiting_on(right_rank, "sending to", [&] { send_data->waitSend(); });
    if (round < rounds - 1) {
      std::copy(inbox, inbox + count, outbox);
      reduction->call(outbox, block(rank - round - 2), count);
      // The left neighbour may send its next block into the inbox now, and this rank may send
      // into its right neighbour's once that one has said so. The last round needs neither.
      send_notification->send();
      detail::waiting_on(right_rank, "waiting for", [&] { recv_notification->waitRecv(); });
      detail::waiting_on(left_rank, "sending to", [&] { send_notification->waitSend(); });
    } else {
      // Every block but this rank's own has been consumed by now, so recv may overlap send.
      const T* mine = block(rank);
      if (recv != mine) std::copy(mine, mine + count, recv);
      reduction->call(recv, inbox, count);
    }
  }
}

// Every rank sends send_counts[r] elements to each rank r, packed in rank order in send, and
// receives recv_counts[r] elements from each rank r, packed in rank order in recv (never in place).
// The counts must be consistent across the ranks (what rank p sends q is what q receives from p),
// and `total_bytes`, the bytes the whole exchange moves over all ranks, the same everywhere: it
// chooses the mesh as for the other collectives. Every message is posted at once on pair buffers of
// one slot (each pair carries at most one message each way), then waited for.
template <typename T>
void alltoall(const Meshes& meshes, const T* send, const std::vector<size_t>& send_counts, T* recv,
              const std::vector<size_t>& recv_counts, size_t total_bytes) {
  const auto& context = meshes.for_bytes(total_bytes);
  const int size = context->size;
  const int rank = context->rank;
  std::vector<size_t> send_offsets(static_cast<size_t>(size));
  std::vector<size_t> recv_offsets(static_cast<size_t>(size));
  for (size_t r = 1; r < static_cast<size_t>(size); ++r) {
    send_offsets[r] = send_offsets[r - 1] + send_counts[r - 1];
    recv_offsets[r] = recv_offsets[r - 1] + recv_counts[r - 1];
  }
  const int slot = context->nextSlot();
  std::vector<std::pair<int, std::unique_ptr<gloo::transport::Buffer>>> receives;  // from rank
  std::vector<std::pair<int, std::unique_ptr<gloo::transport::Buffer>>> sends;     // to rank
  for (int i = 1; i < size; ++i) {
    const int from = (rank + size - i) % size;
    const auto r = static_cast<size_t>(from);
    if (recv_counts[r] == 0) continue;
    receives.emplace_back(from, context->getPair(from)->createRecvBuffer(
                                    slot, recv + recv_offsets[r], recv_counts[r] * sizeof(T)));
  }
  meshes.check(context);
  // Gloo only reads a send buffer; its API takes every buffer as void*.
  T* const out = const_cast<T*>(send);
  for (int i = 1; i < size; ++i) {
    const int to = (rank + i) % size;
    const auto r = static_cast<size_t>(to);
    if (send_counts[r] == 0) continue;
    sends.emplace_back(to, context->getPair(to)->createSendBuffer(slot, out + send_offsets[r],
                                                                  send_counts[r] * sizeof(T)));
    sends.back().second->send();
  }
  const auto self = static_cast<size_t>(rank);
  std::copy(send + send_offsets[self], send + send_offsets[self] + send_counts[self],
            recv + recv_offsets[self]);
  for (const auto& [from, buffer] : receives) {
    detail::waiting_on(from, "receiving from", [&] { buffer->waitRecv(); });
  }
  for (const auto& [to, buffer] : sends) {
    detail::waiting_on(to, "sending to", [&] { buffer->waitSend(); });
  }
}

}  // namespace hvd::gloo_algorithms

#endif  // HVD_PLUGINS_GLOO_ALGORITHMS_HPP
