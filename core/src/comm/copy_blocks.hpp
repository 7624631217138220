// copy_blocks.hpp — how one launch of the batched copy-and-scale kernel (copy_scaled.cu) shares
// its grid among its spans: each span gets a run of blocks of its own, enough to copy it in one
// pass, at least one and at most kMaxBlocksPerSpan (more passes above that). A batch of one large
// tensor and many small ones then launches about as many blocks as it has work for, where a grid
// of (the longest span's blocks) x (spans) would be mostly blocks with nothing to do.
//
// A block finds its span in two steps 32 entries wide, where a binary search would take ten
// dependent reads of the launch's parameters: first among the first blocks of every 32nd span
// (the groups), then among the group's own 32. In the kernel each step is one read per lane of a
// warp and a ballot; here it is written one entry at a time, for the unit tests.
#ifndef HVD_CORE_COMM_COPY_BLOCKS_HPP
#define HVD_CORE_COMM_COPY_BLOCKS_HPP

#include <algorithm>
#include <cstdint>

#ifdef __CUDACC__
#define HVD_HOST_DEVICE __host__ __device__
#else
#define HVD_HOST_DEVICE
#endif

namespace hvd::core::copy_blocks {

constexpr uint32_t kThreads = 256;         // a block's threads
constexpr uint32_t kVectorsPerThread = 4;  // 16-byte vectors a thread copies in one pass
constexpr uint64_t kBytesPerBlock = uint64_t{16} * kVectorsPerThread * kThreads;  // 16 KiB
constexpr uint32_t kMaxBlocksPerSpan = 1024;

// The blocks of a span of `bytes`.
HVD_HOST_DEVICE inline uint32_t blocks_for(uint64_t bytes) {
  const uint64_t blocks = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
  return blocks == 0 ? 1u : blocks > kMaxBlocksPerSpan ? kMaxBlocksPerSpan : uint32_t(blocks);
}

constexpr uint32_t kLanes = 32;                  // entries a step reads (a warp)
constexpr uint32_t kMaxSpans = kLanes * kLanes;  // what two steps can tell apart
HVD_HOST_DEVICE constexpr uint32_t groups_of(uint32_t spans) {
  return (spans + kLanes - 1) / kLanes;
}

// How many of the `n` (<= kLanes) rising entries are at or before `block`: a step of the search.
inline uint32_t at_or_before(const uint32_t* entries, uint32_t n, uint32_t block) {
  uint32_t at = 0;
  while (at < n && entries[at] <= block) ++at;
  return at;
}

// A block's span and the blocks of that span's run, [first, end).
struct Run {
  uint32_t span, first, end;
};

// The run that holds `block`, among `count` (1 .. kMaxSpans) runs of `blocks` in all: first_block
// rises strictly from first_block[0] = 0, and group_first_block[g] = first_block[g * kLanes]. The
// end is the group's next entry, or the next group's first, or `blocks`: what the kernel's lanes
// hold after the two steps.
inline Run run_of(const uint32_t* first_block, const uint32_t* group_first_block, uint32_t count,
                  uint32_t blocks, uint32_t block) {
  const uint32_t groups = groups_of(count);
  const uint32_t group = at_or_before(group_first_block, groups, block) - 1;
  const uint32_t base = group * kLanes;
  const uint32_t in_group =
      at_or_before(first_block + base, std::min(count - base, kLanes), block) - 1;
  const uint32_t end =
      in_group + 1 < kLanes
          ? (base + in_group + 1 < count ? first_block[base + in_group + 1] : blocks)
      : group + 1 < groups ? group_first_block[group + 1]
                           : blocks;
  return {base + in_group, first_block[base + in_group], end};
}

}  // namespace hvd::core::copy_blocks

#endif  // HVD_CORE_COMM_COPY_BLOCKS_HPP
