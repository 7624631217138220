// gloo_algorithms.hpp — the Gloo algorithms hvd runs, shared by the gloo plugin and hvd-bench's
// direct-Gloo baseline so that their ratio measures hvd alone.
//
// These are Gloo's buffer-based ("legacy") algorithm classes, built for each call. Gloo's
// unbound-buffer API (gloo::allreduce & co.) pays a rendezvous of notifications per segment,
// and on the VMs we measured it was 20-40x slower for small messages (1 KiB allreduce, 2 ranks:
// 3-4 ms against 60-140 us) and 100-200x slower for 4 MiB at 3-4 ranks (over 3 s against
// 16-33 ms); see docs/performance.md. The two APIs must not be mixed on one context either: a
// legacy send sets the socket's SO_SNDBUF (turning off the kernel's autotuning) to the size
// of that message, after which large unbound-buffer transfers on the same pair crawl. So every
// collective of a context goes through this file.
//
// Legacy classes count elements in int (and AllgatherRing bytes in int): larger calls are cut
// into pieces, or, for allgather, sent as one broadcast per rank.
#ifndef HVD_PLUGINS_GLOO_ALGORITHMS_HPP
#define HVD_PLUGINS_GLOO_ALGORITHMS_HPP

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/context.h>

namespace hvd::gloo_algorithms {

// Below this, one message per hop (AllreduceRing) has the lowest latency; from it on, the
// bandwidth-optimal ring (reduce-scatter then allgather in chunks) moves fewer bytes.
constexpr size_t kChunkedRingFromBytes = 256 << 10;
// The largest piece one legacy call handles (its offsets are int).
constexpr size_t kMaxPieceBytes = size_t{1} << 30;

// data[i] = reduction over the ranks of data[i], in place.
template <typename T>
void allreduce(const std::shared_ptr<gloo::Context>& context, T* data, size_t count,
               const gloo::ReductionFunction<T>* reduction) {
  const size_t piece = kMaxPieceBytes / sizeof(T);
  for (size_t done = 0; done < count; done += piece) {
    const int n = static_cast<int>(std::min(piece, count - done));
    const std::vector<T*> ptrs{data + done};
    if (n * sizeof(T) < kChunkedRingFromBytes) {
      gloo::AllreduceRing<T>(context, ptrs, n, reduction).run();
    } else {
      gloo::AllreduceRingChunked<T>(context, ptrs, n, reduction).run();
    }
  }
}

// recv (count elements) = root's recv; every rank passes its own recv, the root's holds the data.
template <typename T>
void broadcast(const std::shared_ptr<gloo::Context>& context, T* recv, size_t count, int root) {
  if (count == 0) return;
  gloo::BroadcastOneToAll<T>(context, {recv}, count, root).run();
}

// recv holds each rank's `counts[r]` elements, rank by rank; this rank's part must already be in
// place. One broadcast per rank: the shape allgathers take when counts differ or are too large
// for AllgatherRing.
template <typename T>
void allgatherv(const std::shared_ptr<gloo::Context>& context, T* recv,
                const std::vector<size_t>& counts) {
  size_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    broadcast(context, recv + offset, counts[r], static_cast<int>(r));
    offset += counts[r];
  }
}

// recv holds every rank's `count` elements, rank by rank; send is this rank's part (it may be
// recv's own slot already).
template <typename T>
void allgather(const std::shared_ptr<gloo::Context>& context, const T* send, T* recv,
               size_t count) {
  if (count == 0) return;
  const size_t ranks = static_cast<size_t>(context->size);
  if (count * ranks * sizeof(T) > kMaxPieceBytes) {
    T* mine = recv + static_cast<size_t>(context->rank) * count;
    if (send != mine) std::copy(send, send + count, mine);
    allgatherv(context, recv, std::vector<size_t>(ranks, count));
    return;
  }
  gloo::AllgatherRing<T>(context, {send}, recv, static_cast<int>(count)).run();
}

inline void barrier(const std::shared_ptr<gloo::Context>& context) {
  gloo::BarrierAllToAll(context).run();
}

}  // namespace hvd::gloo_algorithms

#endif  // HVD_PLUGINS_GLOO_ALGORITHMS_HPP
