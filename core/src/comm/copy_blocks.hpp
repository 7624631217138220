// copy_blocks.hpp — how one launch of the batched copy-and-scale kernel (copy_scaled.cu) shares
// its grid among its spans: each span gets a run of blocks of its own, enough to copy it in one
// pass, at least one and at most kMaxBlocksPerSpan (more passes above that); a block finds its
// span by a binary search of the runs' first blocks. A batch of one large tensor and many small
// ones then launches about as many blocks as it has work for, where a grid of (the longest span's
// blocks) x (spans) would be mostly blocks with nothing to do. Host and device code alike, so the
// unit tests check the mapping the kernel uses.
#ifndef HVD_CORE_COMM_COPY_BLOCKS_HPP
#define HVD_CORE_COMM_COPY_BLOCKS_HPP

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

// The span whose run holds `block`: the last of the `count` (>= 1) runs starting at or before it.
// `first_block` rises strictly from first_block[0] = 0.
HVD_HOST_DEVICE inline uint32_t span_of(const uint32_t* first_block, uint32_t count,
                                        uint32_t block) {
  uint32_t low = 0, high = count - 1;
  while (low < high) {
    const uint32_t middle = low + (high - low + 1) / 2;
    if (first_block[middle] <= block) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

}  // namespace hvd::core::copy_blocks

#endif  // HVD_CORE_COMM_COPY_BLOCKS_HPP
