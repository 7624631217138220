// Host buffers: the size allocate_host reserves, the buffers themselves, and the kernel's THP mode.
#include "common/host_memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace hvd::core {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostAllocationBytes, BelowAHugePageIsTheSizeAsItIs) {
  EXPECT_EQ(host_allocation_bytes(0), 0u);
  EXPECT_EQ(host_allocation_bytes(1), 1u);
  EXPECT_EQ(host_allocation_bytes(4096), 4096u);
  EXPECT_EQ(host_allocation_bytes(2 * kMiB - 1), 2 * kMiB - 1);
}

TEST(HostAllocationBytes, FromAHugePageUpIsRoundedUpToWholeHugePages) {
  EXPECT_EQ(kHugePageBytes, 2 * kMiB);
  EXPECT_EQ(host_allocation_bytes(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(host_allocation_bytes(2 * kMiB + 1), 4 * kMiB);
  EXPECT_EQ(host_allocation_bytes(4 * kMiB - 1), 4 * kMiB);
  EXPECT_EQ(host_allocation_bytes(4 * kMiB), 4 * kMiB);
  EXPECT_EQ(host_allocation_bytes(7 * kMiB), 8 * kMiB);
}

TEST(HostAllocationBytes, NearSizeMaxItIsZeroWhereRoundingUpWouldOverflow) {
  const size_t last_whole = SIZE_MAX / kHugePageBytes * kHugePageBytes;  // the largest multiple
  EXPECT_EQ(host_allocation_bytes(last_whole), last_whole);
  EXPECT_EQ(host_allocation_bytes(last_whole - 1), last_whole);
  EXPECT_EQ(host_allocation_bytes(last_whole + 1), 0u);
  EXPECT_EQ(host_allocation_bytes(SIZE_MAX), 0u);
}

// Writes a pattern over all `bytes` of `p`, then reads it back: the whole buffer is there.
bool writable_end_to_end(void* p, size_t bytes) {
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes; i += 4093) c[i] = static_cast<unsigned char>(i / 4093 + 1);
  c[bytes - 1] = 0xa5;
  for (size_t i = 0; i < bytes - 1; i += 4093) {
    if (c[i] != static_cast<unsigned char>(i / 4093 + 1)) return false;
  }
  return c[bytes - 1] == 0xa5;
}

TEST(AllocateHost, SmallBuffersAreUsableToTheirLastByte) {
  for (size_t bytes : {size_t{1}, size_t{100}, 2 * kMiB - 1}) {
    void* p = allocate_host(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_TRUE(writable_end_to_end(p, bytes)) << bytes;
    free_host(p, bytes);
  }
}

TEST(AllocateHost, HugeBuffersStartOnAHugePageAndAreUsableToTheirLastByte) {
  for (size_t bytes : {2 * kMiB, 2 * kMiB + 1, 5 * kMiB + 3}) {
    void* p = allocate_host(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u) << bytes;
    // What was reserved is usable too, not only what was asked for.
    EXPECT_TRUE(writable_end_to_end(p, host_allocation_bytes(bytes))) << bytes;
    free_host(p, bytes);
  }
}

TEST(AllocateHost, SizesNoMappingCanHoldGiveNull) {
  EXPECT_EQ(allocate_host(SIZE_MAX), nullptr);
  EXPECT_EQ(allocate_host(SIZE_MAX / kHugePageBytes * kHugePageBytes), nullptr);
  free_host(nullptr, 0);  // freeing nothing is allowed, as free() is
  free_host(nullptr, 4 * kMiB);
}

TEST(TransparentHugePages, IsOneOfTheKernelsModes) {
  const std::string mode = transparent_huge_pages();
  EXPECT_TRUE(mode == "always" || mode == "madvise" || mode == "never" || mode == "unknown")
      << mode;
}

}  // namespace
}  // namespace hvd::core
