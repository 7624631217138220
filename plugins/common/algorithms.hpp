// algorithms.hpp — hvd's collective algorithms, written once over a point-to-point transport:
// the ofi plugin runs them over libfabric's tagged messages, the mpi plugin
// (HVD_MPI_ALGORITHMS=hvd) over MPI_Isend and MPI_Irecv, and the unit tests over threads in one
// process.
//
//   allreduce       recursive doubling below `ring_allreduce_bytes` (every rank gets the same
//                   bits: each pair combines in rank order, and the ranks past the largest power
//                   of two fold into a partner first); at and above it a ring reduce-scatter then
//                   a ring allgather, in segments, pipelined (see RingPass)
//   reduce_scatter  the ring's reduce-scatter alone
//   allgather(v)    the ring's allgather alone, received in place
//   broadcast       a binomial tree below `scatter_broadcast_bytes` or at 2 ranks; at and above
//                   it, the root scatters blocks and the ranks allgather them on the ring
//   barrier         dissemination: ceil(log2 n) rounds of empty messages
//   alltoall        every pair at once: all receives posted, then all sends
//
// Reductions are the SDK's hvd_reduce; AVERAGE sums, and the one rank that completes a block
// divides it before it travels on, so every rank has the same bits.
//
// The transport (a template parameter: no virtual call per message) is a class with
//   int rank() const; int size() const;
//   struct Op { bool done; int peer; ... };      one posted message, valid until the call ends
//   Result<Op*> try_send(int peer, uint32_t index, const void* buffer, size_t bytes);
//   Result<Op*> try_recv(int peer, uint32_t index, void* buffer, size_t bytes);
//                       post, or nullptr while the transport's queue is full
//   Result<Op*> send(...), recv(...);            post, waiting for room within the deadline
//   Status exchange(int peer, uint32_t index, const void* send, void* recv, size_t bytes);
//   Status wait_until(Done done, WaitingFor waiting_for);
//                       progress until done() holds; an error at the call's deadline, on abort
//                       or when a message fails; waiting_for() names the rank waited on
//   Status wait(const Op* op); Status wait_all(); until the op, or every op of the call, is done
// A message is `index` between two ranks in one direction: the same index is never in flight
// twice between the same pair, and messages of one pair and direction are posted in the same
// order on both sides (a transport may match by order alone). A receive must get exactly `bytes`.
#ifndef HVD_PLUGINS_COMMON_ALGORITHMS_HPP
#define HVD_PLUGINS_COMMON_ALGORITHMS_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hvd/backend.h"
#include "hvd/reduce.h"
#include "hvd/sdk/result.hpp"

namespace hvd::algorithms {

// The algorithms' knobs; each plugin sets them from its environment.
struct Tuning {
  size_t ring_allreduce_bytes = 64
                                << 10;  // allreduce: the ring from here, recursive doubling below
  size_t scatter_broadcast_bytes = 1 << 20;  // broadcast: scatter-allgather from here (> 2 ranks)
  size_t segment_bytes = 256 << 10;          // the ring's messages
  size_t segments_in_flight = 4;             // reduce-scatter receive buffers
  size_t sends_in_flight = 64;
};

namespace detail {

inline int mod(int a, int n) { return ((a % n) + n) % n; }

inline Status reduce_status(hvd_status code) {
  return code == HVD_SUCCESS ? Status::success()
                             : Status(code, "the reduction kernel refused its arguments");
}

// `count` elements in n blocks as even as they go: block b starts at offset[b], holds count[b].
struct Blocks {
  std::vector<uint64_t> offset;
  std::vector<uint64_t> count;

  static Blocks even(uint64_t total, int n) {
    Blocks b;
    uint64_t at = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t c = total / static_cast<uint64_t>(n) +
                         (static_cast<uint64_t>(i) < total % static_cast<uint64_t>(n) ? 1 : 0);
      b.offset.push_back(at);
      b.count.push_back(c);
      at += c;
    }
    return b;
  }

  static Blocks of_counts(const uint64_t* counts, int n) {
    Blocks b;
    uint64_t at = 0;
    for (int i = 0; i < n; ++i) {
      b.offset.push_back(at);
      b.count.push_back(counts[i]);
      at += counts[i];
    }
    return b;
  }

  uint64_t largest() const { return *std::max_element(count.begin(), count.end()); }
};

// One pass around the ring, in segments, pipelined (the classic ring allreduce: Patarasuk and
// Yuan; what NCCL and Gloo run for large messages).
//
// Rank r sends to r+1 and receives from r-1. The pass has `rs` reduce-scatter steps then `ag`
// allgather steps (n-1 each, or 0); at global step t it sends block send_block(t) and receives
// block recv_block(t), the block it sends at t+1. Each block is cut into m segments, one message
// each: message k = t*m + j is segment j of step t, in both directions. After the reduce-scatter,
// rank r holds the whole reduction of block r.
//
// The pipeline: a received segment is reduced as soon as it arrives and is sent on at the next
// step right away, so reduction overlaps transfer and no step waits for the whole previous one.
// Reduce-scatter segments land in `segments_in_flight` scratch slots (a slot is free again once
// reduced); allgather segments land in place. A location is overwritten only after the send that
// read it completed (the conditions in can_recv / can_process), and the call returns only after
// every send completed.
template <typename Transport>
class RingPass {
  using Op = typename Transport::Op;

 public:
  // `kind`: an allreduce runs both passes, a reduce-scatter the first, an allgather the second.
  RingPass(Transport& ep, const Tuning& tuning, hvd_collective kind,
           const hvd_collective_args& args, Blocks blocks, char* scratch)
      : ep_(ep),
        kind_(kind),
        r_(ep.rank()),
        n_(ep.size()),
        esize_(hvd_dtype_size(args.dtype)),
        dtype_(args.dtype),
        op_(args.op),
        src_(static_cast<const char*>(args.sendbuf)),
        dst_(static_cast<char*>(args.recvbuf)),
        blocks_(std::move(blocks)),
        scratch_(scratch),
        slots_(tuning.segments_in_flight),
        sends_in_flight_(tuning.sends_in_flight) {
    segment_elems_ = std::max<uint64_t>(1, tuning.segment_bytes / esize_);
    rs_ = kind == HVD_COLLECTIVE_ALLGATHER ? 0 : n_ - 1;
    ag_ = kind == HVD_COLLECTIVE_REDUCE_SCATTER ? 0 : n_ - 1;
    const uint64_t largest = blocks_.largest();
    m_ = (largest + segment_elems_ - 1) / segment_elems_;
    total_ = static_cast<uint64_t>(rs_ + ag_) * m_;
    sends_.assign(total_, nullptr);
    recvs_.assign(total_, nullptr);
  }

  // Scratch bytes the pass needs: the slots, and for reduce-scatter two block-sized regions for
  // the partial reductions in transit (allreduce keeps them in the output).
  static size_t scratch_bytes(const Tuning& tuning, hvd_collective kind, const Blocks& blocks,
                              size_t esize, int n) {
    if (kind == HVD_COLLECTIVE_ALLGATHER || n == 1) return 0;
    const uint64_t segment_elems = std::max<uint64_t>(1, tuning.segment_bytes / esize);
    const uint64_t segment = std::min<uint64_t>(segment_elems, blocks.largest()) * esize;
    size_t bytes = tuning.segments_in_flight * segment;
    if (kind == HVD_COLLECTIVE_REDUCE_SCATTER) bytes += 2 * blocks.largest() * esize;
    return bytes;
  }

  Status run() {
    if (total_ == 0) return Status::success();
    Status failure;
    HVD_RETURN_IF_ERROR(ep_.wait_until(
        [&] {
          failure = advance();
          return !failure.ok() || (processed_ == total_ && sends_done());
        },
        [&] { return processed_ < total_ ? mod(r_ - 1, n_) : mod(r_ + 1, n_); }));
    return failure;
  }

 private:
  int send_block(uint64_t t) const {
    const int s = static_cast<int>(t);
    return s < rs_ ? mod(r_ - s - 1, n_) : mod(r_ - (s - rs_), n_);
  }
  int recv_block(uint64_t t) const {
    const int s = static_cast<int>(t);
    return s < rs_ ? mod(r_ - s - 2, n_) : mod(r_ - (s - rs_) - 1, n_);
  }
  // Segment j of block b: its first element within the block and its length (0: no message).
  uint64_t seg_start(uint64_t j) const { return j * segment_elems_; }
  uint64_t seg_count(int b, uint64_t j) const {
    const uint64_t c = blocks_.count[static_cast<size_t>(b)];
    const uint64_t start = seg_start(j);
    return start >= c ? 0 : std::min(segment_elems_, c - start);
  }
  char* slot(uint64_t k) const {
    return scratch_ + (k % slots_) * std::min(segment_elems_, blocks_.largest()) * esize_;
  }
  char* region(uint64_t t) const {
    const size_t slot_bytes = slots_ * std::min(segment_elems_, blocks_.largest()) * esize_;
    return scratch_ + slot_bytes + (t % 2) * blocks_.largest() * esize_;
  }
  // In the output, block b's segment j.
  char* out(int b, uint64_t j) const {
    return dst_ + (blocks_.offset[static_cast<size_t>(b)] + seg_start(j)) * esize_;
  }

  // Where message k's data is once processed: the reduction so far of its block's segment.
  char* produced(uint64_t k) const {
    const uint64_t t = k / m_;
    const uint64_t j = k % m_;
    const int b = recv_block(t);
    if (kind_ == HVD_COLLECTIVE_REDUCE_SCATTER) {
      // The output holds block r alone; partials in transit live in the two regions.
      return static_cast<int>(t) == rs_ - 1 ? dst_ + seg_start(j) * esize_
                                            : region(t) + seg_start(j) * esize_;
    }
    return out(b, j);
  }
  // What message k sends.
  const char* send_source(uint64_t k) const {
    const uint64_t t = k / m_;
    const uint64_t j = k % m_;
    if (t > 0) return produced(k - m_);
    const int b = send_block(0);
    if (kind_ == HVD_COLLECTIVE_ALLGATHER) return out(b, j);  // this rank's block, already in place
    return src_ + (blocks_.offset[static_cast<size_t>(b)] + seg_start(j)) * esize_;
  }
  char* recv_target(uint64_t k) const {
    const uint64_t t = k / m_;
    return static_cast<int>(t) < rs_ ? slot(k) : out(recv_block(t), k % m_);
  }
  bool done(const Op* op) const { return op == nullptr || op->done; }

  bool can_recv(uint64_t k) const {
    const uint64_t t = k / m_;
    if (k >= processed_ + slots_) return false;  // a free slot; allgather: a bounded window
    // An allgather segment after a reduce-scatter lands where message k - rs*m was sent from.
    if (static_cast<int>(t) >= rs_ && rs_ > 0) {
      const uint64_t earlier = k - static_cast<uint64_t>(rs_) * m_;
      if (earlier >= sends_posted_ || !done(sends_[earlier])) return false;
    }
    return true;
  }
  bool can_process(uint64_t k) const {
    if (k >= recvs_posted_ || !done(recvs_[k])) return false;
    // Reduce-scatter partials reuse a region two steps later, once the step between sent it.
    const uint64_t t = k / m_;
    if (kind_ == HVD_COLLECTIVE_REDUCE_SCATTER && t >= 2 && static_cast<int>(t) < rs_ - 1) {
      if (k - m_ >= sends_posted_ || !done(sends_[k - m_])) return false;
    }
    // In place, the result goes to the front of the input, which the first step may be sending.
    if (kind_ == HVD_COLLECTIVE_REDUCE_SCATTER && src_ == dst_ && static_cast<int>(t) == rs_ - 1) {
      const uint64_t first = k % m_;
      if (first >= sends_posted_ || !done(sends_[first])) return false;
    }
    return true;
  }
  bool sends_done() const {
    if (sends_posted_ < total_) return false;
    for (uint64_t k = sends_retired_; k < total_; ++k) {
      if (!done(sends_[k])) return false;
    }
    return true;
  }

  // Posts and processes whatever is ready; never waits.
  Status advance() {
    while (sends_retired_ < sends_posted_ && done(sends_[sends_retired_])) ++sends_retired_;
    const int next = mod(r_ + 1, n_);
    const int prev = mod(r_ - 1, n_);
    while (sends_posted_ < total_ && sends_posted_ < processed_ + m_ &&
           sends_posted_ - sends_retired_ < sends_in_flight_) {
      const uint64_t k = sends_posted_;
      const uint64_t elems = seg_count(send_block(k / m_), k % m_);
      if (elems > 0) {
        HVD_ASSIGN_OR_RETURN(
            Op * op, ep_.try_send(next, static_cast<uint32_t>(k), send_source(k), elems * esize_));
        if (op == nullptr) break;  // the queue is full: after progress
        sends_[k] = op;
      }
      ++sends_posted_;
    }
    while (recvs_posted_ < total_ && can_recv(recvs_posted_)) {
      const uint64_t k = recvs_posted_;
      const uint64_t elems = seg_count(recv_block(k / m_), k % m_);
      if (elems > 0) {
        HVD_ASSIGN_OR_RETURN(
            Op * op, ep_.try_recv(prev, static_cast<uint32_t>(k), recv_target(k), elems * esize_));
        if (op == nullptr) break;
        recvs_[k] = op;
      }
      ++recvs_posted_;
    }
    while (processed_ < total_ && can_process(processed_)) {
      HVD_RETURN_IF_ERROR(process(processed_));
      ++processed_;
    }
    return Status::success();
  }

  Status process(uint64_t k) {
    const uint64_t t = k / m_;
    if (static_cast<int>(t) >= rs_) return Status::success();  // allgather: landed in place
    const uint64_t j = k % m_;
    const int b = recv_block(t);
    const uint64_t elems = seg_count(b, j);
    if (elems == 0) return Status::success();
    char* result = produced(k);
    const char* mine = src_ + (blocks_.offset[static_cast<size_t>(b)] + seg_start(j)) * esize_;
    HVD_RETURN_IF_ERROR(reduce_status(hvd_reduce(result, mine, slot(k), elems, dtype_, op_)));
    if (op_ == HVD_AVERAGE && static_cast<int>(t) == rs_ - 1) {
      HVD_RETURN_IF_ERROR(reduce_status(hvd_divide(result, elems, dtype_, n_)));
    }
    return Status::success();
  }

  Transport& ep_;
  hvd_collective kind_;
  int r_, n_;
  size_t esize_;
  hvd_dtype dtype_;
  hvd_reduce_op op_;
  const char* src_;
  char* dst_;
  Blocks blocks_;
  char* scratch_;
  uint64_t slots_;
  uint64_t sends_in_flight_;
  uint64_t segment_elems_ = 1;
  int rs_ = 0, ag_ = 0;
  uint64_t m_ = 0, total_ = 0;
  std::vector<Op*> sends_, recvs_;
  uint64_t sends_posted_ = 0, sends_retired_ = 0, recvs_posted_ = 0, processed_ = 0;
};

}  // namespace detail

// A transport's exchange() by its posts: a receive and a send with `peer`, waited for together.
template <typename Transport>
Status exchange_by_posts(Transport& t, int peer, uint32_t index, const void* send, void* recv,
                         size_t bytes) {
  HVD_ASSIGN_OR_RETURN(typename Transport::Op * in, t.recv(peer, index, recv, bytes));
  HVD_ASSIGN_OR_RETURN(typename Transport::Op * out, t.send(peer, index, send, bytes));
  return t.wait_until([&] { return in->done && out->done; },
                      [&] { return in->done ? out->peer : in->peer; });
}

template <typename Transport>
class Algorithms {
 public:
  Algorithms(Transport& transport, Tuning tuning) : ep_(transport), tuning_(tuning) {}

  const Tuning& tuning() const { return tuning_; }
  // The scratch buffer, handed over: a transport that abandoned a receive into it keeps it.
  std::vector<char> take_scratch() { return std::move(scratch_); }

  Status allreduce(const hvd_collective_args& args);
  Status reduce_scatter(const hvd_collective_args& args);
  Status allgather(const hvd_collective_args& args);
  Status broadcast(const hvd_collective_args& args);
  Status barrier();
  Status alltoall(const hvd_collective_args& args);

 private:
  using Blocks = detail::Blocks;
  using Op = typename Transport::Op;

  Status allreduce_recursive_doubling(const hvd_collective_args& args);
  Status broadcast_tree(const hvd_collective_args& args);
  Status broadcast_scatter_allgather(const hvd_collective_args& args);
  // A scratch buffer of at least `bytes`, kept across calls.
  char* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }
  static int mod(int a, int n) { return detail::mod(a, n); }
  static Status reduce_status(hvd_status code) { return detail::reduce_status(code); }

  Transport& ep_;
  Tuning tuning_;
  std::vector<char> scratch_;
};

// ---- allreduce ------------------------------------------------------------------------------

template <typename Transport>
Status Algorithms<Transport>::allreduce(const hvd_collective_args& args) {
  const size_t bytes = args.count * hvd_dtype_size(args.dtype);
  if (ep_.size() == 1 || bytes < tuning_.ring_allreduce_bytes) {
    return allreduce_recursive_doubling(args);
  }
  const Blocks blocks = Blocks::even(args.count, ep_.size());
  char* space = scratch(detail::RingPass<Transport>::scratch_bytes(
      tuning_, HVD_COLLECTIVE_ALLREDUCE, blocks, hvd_dtype_size(args.dtype), ep_.size()));
  return detail::RingPass<Transport>(ep_, tuning_, HVD_COLLECTIVE_ALLREDUCE, args, blocks, space)
      .run();
}

// Ranks past the largest power of two p fold into a partner first (rank 2i into 2i+1, for the
// first 2(n-p) ranks), the p remaining exchange whole buffers log2(p) times, and the partners get
// the result back: the non-power-of-two fix-up of Thakur, Rabenseifner and Gropp. Each pair
// combines the lower rank's data first, so every rank computes the same bits.
template <typename Transport>
Status Algorithms<Transport>::allreduce_recursive_doubling(const hvd_collective_args& args) {
  const int n = ep_.size();
  const int r = ep_.rank();
  const size_t esize = hvd_dtype_size(args.dtype);
  const size_t bytes = args.count * esize;
  char* out = static_cast<char*>(args.recvbuf);
  if (args.sendbuf != args.recvbuf && bytes > 0) std::memcpy(out, args.sendbuf, bytes);
  if (n == 1 || bytes == 0) {
    if (args.op == HVD_AVERAGE) return reduce_status(hvd_divide(out, args.count, args.dtype, n));
    return Status::success();
  }
  char* theirs = scratch(bytes);
  // out = lower (op) higher, whichever of the two this rank is.
  auto combine = [&](bool mine_is_lower) {
    return reduce_status(mine_is_lower
                             ? hvd_reduce(out, out, theirs, args.count, args.dtype, args.op)
                             : hvd_reduce(out, theirs, out, args.count, args.dtype, args.op));
  };

  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  int vrank;  // rank among the p, or -1 for a rank folded into its partner
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      HVD_ASSIGN_OR_RETURN(Op * sent, ep_.send(r + 1, 0, out, bytes));
      HVD_RETURN_IF_ERROR(ep_.wait(sent));
      vrank = -1;
    } else {
      HVD_ASSIGN_OR_RETURN(Op * in, ep_.recv(r - 1, 0, theirs, bytes));
      HVD_RETURN_IF_ERROR(ep_.wait(in));
      HVD_RETURN_IF_ERROR(combine(false));
      vrank = r / 2;
    }
  } else {
    vrank = r - extra;
  }
  if (vrank >= 0) {
    uint32_t index = 1;
    for (int mask = 1; mask < p; mask <<= 1, ++index) {
      const int vpeer = vrank ^ mask;
      const int peer = vpeer < extra ? vpeer * 2 + 1 : vpeer + extra;
      HVD_RETURN_IF_ERROR(ep_.exchange(peer, index, out, theirs, bytes));
      HVD_RETURN_IF_ERROR(combine(vrank < vpeer));
    }
  }
  if (r < 2 * extra) {
    constexpr uint32_t kResult = 0xffff;
    if (r % 2 == 1) {
      HVD_ASSIGN_OR_RETURN(Op * sent, ep_.send(r - 1, kResult, out, bytes));
      HVD_RETURN_IF_ERROR(ep_.wait(sent));
    } else {
      HVD_ASSIGN_OR_RETURN(Op * in, ep_.recv(r + 1, kResult, out, bytes));
      HVD_RETURN_IF_ERROR(ep_.wait(in));
    }
  }
  if (args.op == HVD_AVERAGE) return reduce_status(hvd_divide(out, args.count, args.dtype, n));
  return Status::success();
}

// ---- reduce_scatter, allgather
// -------------------------------------------------------------------

template <typename Transport>
Status Algorithms<Transport>::reduce_scatter(const hvd_collective_args& args) {
  const int n = ep_.size();
  const size_t esize = hvd_dtype_size(args.dtype);
  if (n == 1) {
    if (args.sendbuf != args.recvbuf && args.count > 0) {
      std::memcpy(args.recvbuf, args.sendbuf, args.count * esize);
    }
    if (args.op != HVD_AVERAGE) return Status::success();
    return reduce_status(hvd_divide(args.recvbuf, args.count, args.dtype, 1));
  }
  // Every block holds `count` elements: the input is count * n, block b is rank b's.
  std::vector<uint64_t> counts(static_cast<size_t>(n), args.count);
  const Blocks blocks = Blocks::of_counts(counts.data(), n);
  char* space = scratch(detail::RingPass<Transport>::scratch_bytes(
      tuning_, HVD_COLLECTIVE_REDUCE_SCATTER, blocks, esize, n));
  return detail::RingPass<Transport>(ep_, tuning_, HVD_COLLECTIVE_REDUCE_SCATTER, args, blocks,
                                     space)
      .run();
}

template <typename Transport>
Status Algorithms<Transport>::allgather(const hvd_collective_args& args) {
  const int n = ep_.size();
  const int r = ep_.rank();
  const size_t esize = hvd_dtype_size(args.dtype);
  std::vector<uint64_t> even(static_cast<size_t>(n), args.count);
  const Blocks blocks =
      Blocks::of_counts(args.recv_counts != nullptr ? args.recv_counts : even.data(), n);
  char* mine = static_cast<char*>(args.recvbuf) + blocks.offset[static_cast<size_t>(r)] * esize;
  if (args.sendbuf != mine && args.count > 0) std::memcpy(mine, args.sendbuf, args.count * esize);
  if (n == 1) return Status::success();
  return detail::RingPass<Transport>(ep_, tuning_, HVD_COLLECTIVE_ALLGATHER, args, blocks, nullptr)
      .run();
}

// ---- broadcast
// -----------------------------------------------------------------------------------

template <typename Transport>
Status Algorithms<Transport>::broadcast(const hvd_collective_args& args) {
  const size_t bytes = args.count * hvd_dtype_size(args.dtype);
  if (ep_.rank() == args.root && args.sendbuf != args.recvbuf && bytes > 0) {
    std::memcpy(args.recvbuf, args.sendbuf, bytes);
  }
  if (ep_.size() > 2 && bytes >= tuning_.scatter_broadcast_bytes &&
      args.count >= static_cast<uint64_t>(ep_.size())) {
    return broadcast_scatter_allgather(args);
  }
  if (ep_.size() > 1 && bytes > 0) return broadcast_tree(args);
  return Status::success();
}

// Rank v (relative to the root) receives from v minus its lowest set bit, then sends to v + 2^i
// for each 2^i below that bit: ceil(log2 n) rounds, the whole message each.
template <typename Transport>
Status Algorithms<Transport>::broadcast_tree(const hvd_collective_args& args) {
  const int n = ep_.size();
  const int v = mod(ep_.rank() - args.root, n);
  const size_t bytes = args.count * hvd_dtype_size(args.dtype);
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) {
      HVD_ASSIGN_OR_RETURN(Op * in, ep_.recv(mod(v - mask + args.root, n), 0, args.recvbuf, bytes));
      HVD_RETURN_IF_ERROR(ep_.wait(in));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      HVD_RETURN_IF_ERROR(ep_.send(mod(v + mask + args.root, n), 0, args.recvbuf, bytes).status());
    }
  }
  return ep_.wait_all();
}

// The root sends block b to rank b, then the ring allgathers the blocks: each rank sends about
// 2(n-1)/n of the message instead of the tree's whole message per round.
template <typename Transport>
Status Algorithms<Transport>::broadcast_scatter_allgather(const hvd_collective_args& args) {
  const int n = ep_.size();
  const int r = ep_.rank();
  const size_t esize = hvd_dtype_size(args.dtype);
  const Blocks blocks = Blocks::even(args.count, n);
  char* out = static_cast<char*>(args.recvbuf);
  auto block = [&](int b) { return out + blocks.offset[static_cast<size_t>(b)] * esize; };
  auto block_bytes = [&](int b) { return blocks.count[static_cast<size_t>(b)] * esize; };
  constexpr uint32_t kScatter = 0xfffffff0;  // above any ring message index
  if (r == args.root) {
    for (int b = 0; b < n; ++b) {
      if (b != r) HVD_RETURN_IF_ERROR(ep_.send(b, kScatter, block(b), block_bytes(b)).status());
    }
  } else {
    HVD_RETURN_IF_ERROR(ep_.recv(args.root, kScatter, block(r), block_bytes(r)).status());
  }
  HVD_RETURN_IF_ERROR(ep_.wait_all());
  hvd_collective_args gather = args;
  gather.sendbuf = block(r);
  return detail::RingPass<Transport>(ep_, tuning_, HVD_COLLECTIVE_ALLGATHER, gather, blocks,
                                     nullptr)
      .run();
}

// ---- barrier, alltoall
// ---------------------------------------------------------------------------

// Round i: send to r + 2^i, receive from r - 2^i. After ceil(log2 n) rounds every rank has heard,
// through some chain, from every other.
template <typename Transport>
Status Algorithms<Transport>::barrier() {
  const int n = ep_.size();
  const int r = ep_.rank();
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++round) {
    HVD_RETURN_IF_ERROR(ep_.recv(mod(r - distance, n), round, nullptr, 0).status());
    HVD_RETURN_IF_ERROR(ep_.send(mod(r + distance, n), round, nullptr, 0).status());
    HVD_RETURN_IF_ERROR(ep_.wait_all());
  }
  return Status::success();
}

template <typename Transport>
Status Algorithms<Transport>::alltoall(const hvd_collective_args& args) {
  const int n = ep_.size();
  const int r = ep_.rank();
  const size_t esize = hvd_dtype_size(args.dtype);
  const Blocks out = Blocks::of_counts(args.send_counts, n);
  const Blocks in = Blocks::of_counts(args.recv_counts, n);
  const char* send = static_cast<const char*>(args.sendbuf);
  char* recv = static_cast<char*>(args.recvbuf);
  // Receives first, from r-1 down; sends to r+1 up: no pair waits on a full queue for long.
  for (int i = 1; i < n; ++i) {
    const int peer = mod(r - i, n);
    const size_t p = static_cast<size_t>(peer);
    HVD_RETURN_IF_ERROR(
        ep_.recv(peer, 0, recv + in.offset[p] * esize, in.count[p] * esize).status());
  }
  for (int i = 1; i < n; ++i) {
    const int peer = mod(r + i, n);
    const size_t p = static_cast<size_t>(peer);
    HVD_RETURN_IF_ERROR(
        ep_.send(peer, 0, send + out.offset[p] * esize, out.count[p] * esize).status());
  }
  const size_t me = static_cast<size_t>(r);
  if (out.count[me] != in.count[me]) {
    return Status(HVD_ERR_INTERNAL, "alltoall: this rank's counts to itself differ");
  }
  if (out.count[me] > 0) {
    std::memcpy(recv + in.offset[me] * esize, send + out.offset[me] * esize, out.count[me] * esize);
  }
  return ep_.wait_all();
}

}  // namespace hvd::algorithms

#endif  // HVD_PLUGINS_COMMON_ALGORITHMS_HPP
