// The host side of CUDA staging: the staging buffer (page-locked once it stages) and host
// allocations with huge pages advised.
#include "comm/device_memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "common/host_memory.hpp"
#include "fake_gpu.hpp"

namespace {

using hvd::testing::FakeDeviceMemory;

// The staging buffer: ordinary memory until it stages, then page-locked, kept while it fits, and
// freed by what allocated it; where the runtime gives no page-locked memory, ordinary memory,
// asked for once.
TEST(StagingBuffer, PinsOnceItStagesKeepsWhatFitsAndFreesThroughItsAllocator) {
  FakeDeviceMemory device;
  {
    hvd::core::StagingBuffer buffer;
    char* host = buffer.reserve(100);
    ASSERT_NE(host, nullptr);
    EXPECT_FALSE(buffer.pinned());
    EXPECT_EQ(buffer.reserve(50), host);  // fits: kept
    EXPECT_EQ(device.pinned_allocations, 0);
    char* pinned = buffer.reserve(80, &device);
    ASSERT_NE(pinned, nullptr);
    EXPECT_TRUE(buffer.pinned());
    EXPECT_GE(buffer.size(), 100u);  // never shrinks
    EXPECT_EQ(buffer.reserve(100, &device), pinned);
    EXPECT_EQ(buffer.reserve(10), pinned);  // pinned memory serves host batches too
    EXPECT_NE(buffer.reserve(1000, &device), nullptr);
    EXPECT_EQ(device.pinned_allocations, 2);
    EXPECT_EQ(device.pinned_live, 1);
  }
  EXPECT_EQ(device.pinned_live, 0);

  FakeDeviceMemory no_gpu;
  no_gpu.fail = true;
  hvd::core::StagingBuffer buffer;
  ASSERT_NE(buffer.reserve(64, &no_gpu), nullptr);
  EXPECT_FALSE(buffer.pinned());
  ASSERT_NE(buffer.reserve(128, &no_gpu), nullptr);
  EXPECT_FALSE(buffer.pinned());
  EXPECT_EQ(no_gpu.pinned_allocations, 0);
}

namespace {

// The flags /proc/self/smaps gives the mapping that holds `p` ("rd wr mr ... hg": hg is
// MADV_HUGEPAGE); empty where there is no such mapping.
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long from = 0, to = 0;
    if (line.rfind("VmFlags:", 0) == 0) {
      if (inside) return line.substr(8) + " ";
    } else if (std::sscanf(line.c_str(), "%llx-%llx ", &from, &to) == 2) {
      inside = from <= at && at < to;  // a mapping's first line: its address range
    }
  }
  return "";
}

}  // namespace

// The fusion buffer is read by the peers' single-copy transfers: from 2 MiB up it is a mapping
// of its own on 2 MiB boundaries with huge pages advised (the advice is what hvd gives, whatever
// the kernel then makes of it), in whole huge pages; below, ordinary malloc.
TEST(StagingBuffer, AdvisesHugePagesFromTwoMebibytes) {
  using hvd::core::kHugePageBytes;
  if (hvd::core::transparent_huge_pages() == "unknown") {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  void* below = hvd::core::allocate_host(kHugePageBytes - 1);
  void* at = hvd::core::allocate_host(kHugePageBytes);
  ASSERT_NE(below, nullptr);
  ASSERT_NE(at, nullptr);
  if (mapping_flags(at).empty()) GTEST_SKIP() << "/proc/self/smaps gives no VmFlags here";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % kHugePageBytes, 0u);
  EXPECT_NE(mapping_flags(at).find(" hg "), std::string::npos) << mapping_flags(at);
  EXPECT_EQ(mapping_flags(below).find(" hg "), std::string::npos) << mapping_flags(below);
  hvd::core::free_host(below, kHugePageBytes - 1);
  hvd::core::free_host(at, kHugePageBytes);
  EXPECT_EQ(hvd::core::host_allocation_bytes(SIZE_MAX), 0u);  // no wrap-around to a tiny block

  hvd::core::StagingBuffer large;
  const size_t bytes = (size_t{64} << 20) + 3;
  char* p = large.reserve(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  EXPECT_NE(mapping_flags(p).find(" hg "), std::string::npos) << mapping_flags(p);
  EXPECT_EQ(large.size(), size_t{66} << 20);  // whole huge pages
  std::memset(p, 1, large.size());            // writable to the end (ASan would see a short one)
  EXPECT_EQ(large.reserve(size_t{65} << 20), p);  // a growth within them keeps the buffer
}

}  // namespace
