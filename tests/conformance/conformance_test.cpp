// The conformance suite: one set of tests that every backend must pass, run as a real multi-rank
// job (hvdrun -np N --backend B hvd_conformance_test). Data are small integers, so every
// reduction is exact in every dtype (float16 and bfloat16 included) and results are compared
// for equality, element by element.
//
// HVD_CONFORMANCE_MAX_COUNT caps the element counts (for slow test-only backends).
// HVD_CONFORMANCE_TIMEOUT_CASE=1 runs Timeouts.*, which waits out a short HVD_TIMEOUT (seconds).
// HVD_CONFORMANCE_REPORT=<dir>: each rank writes <dir>/rank<R>.txt, one line per case
// ("start", then "pass", "fail" or "skip" with the reason), which hvd-plugin-check reads.
//
// Installed as <libexec>/hvd/hvd-conformance; hvd-plugin-check runs it at each rank count.
//
// Order matters: GoogleTest runs the plain TESTs first (CommSplit.* among them: they use children
// of the job's communicator, never its scheduler), then the parameterized suites in the order of
// their first TEST_P here, the blocking collectives' first and the scheduler's last (once the
// job's scheduler runs, every blocking call goes through it).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#ifdef HVD_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "comm_environment.hpp"
#include "hvd/hvd.hpp"
#include "hvd/reduce.h"

namespace {

using hvd_test::CommEnvironment;
using hvd_test::g_comm;

const hvd_dtype kDtypes[] = {HVD_UINT8,   HVD_INT8,     HVD_INT32,   HVD_INT64,
                             HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64};
const hvd_reduce_op kOps[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT};
const hvd_reduce_op kSum = HVD_SUM;

std::vector<uint64_t> counts() {
  std::vector<uint64_t> all = {0, 1, 7, 1023, (1u << 20) + 3};
  if (const char* cap = std::getenv("HVD_CONFORMANCE_MAX_COUNT")) {
    const uint64_t max = std::strtoull(cap, nullptr, 10);
    std::vector<uint64_t> kept;
    for (uint64_t c : all) {
      if (c <= max) kept.push_back(c);
    }
    return kept;
  }
  return all;
}

// A typed view of an untyped buffer: integer values in, exact doubles out.
class Buffer {
 public:
  Buffer(hvd_dtype dtype, uint64_t count)
      : dtype_(dtype), bytes_(std::max<size_t>(1, count * hvd_dtype_size(dtype))) {}
  void* data() { return bytes_.data(); }
  char* at(uint64_t i) { return bytes_.data() + i * hvd_dtype_size(dtype_); }
  const std::vector<char>& bytes() const { return bytes_; }

  void set(uint64_t i, int64_t v) {
    char* p = at(i);
    switch (dtype_) {
      case HVD_UINT8:
        store(p, static_cast<uint8_t>(v));
        break;
      case HVD_INT8:
        store(p, static_cast<int8_t>(v));
        break;
      case HVD_INT32:
        store(p, static_cast<int32_t>(v));
        break;
      case HVD_INT64:
        store(p, static_cast<int64_t>(v));
        break;
      case HVD_FLOAT16:
        store(p, hvd_float_to_float16(static_cast<float>(v)));
        break;
      case HVD_BFLOAT16:
        store(p, hvd_float_to_bfloat16(static_cast<float>(v)));
        break;
      case HVD_FLOAT32:
        store(p, static_cast<float>(v));
        break;
      default:  // HVD_FLOAT64
        store(p, static_cast<double>(v));
        break;
    }
  }
  double get(uint64_t i) const {
    const char* p = bytes_.data() + i * hvd_dtype_size(dtype_);
    switch (dtype_) {
      case HVD_UINT8:
        return load<uint8_t>(p);
      case HVD_INT8:
        return load<int8_t>(p);
      case HVD_INT32:
        return load<int32_t>(p);
      case HVD_INT64:
        return static_cast<double>(load<int64_t>(p));
      case HVD_FLOAT16:
        return hvd_float16_to_float(load<uint16_t>(p));
      case HVD_BFLOAT16:
        return hvd_bfloat16_to_float(load<uint16_t>(p));
      case HVD_FLOAT32:
        return load<float>(p);
      default:  // HVD_FLOAT64
        return load<double>(p);
    }
  }

 private:
  template <typename T>
  static void store(char* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  template <typename T>
  static T load(const char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  hvd_dtype dtype_;
  std::vector<char> bytes_;
};

bool is_unsigned(hvd_dtype dtype) { return dtype == HVD_UINT8; }

// Rank r's i-th input for `op`, chosen so that the exact result fits every dtype: sums stay
// within +-80 (int8, and bfloat16's 8-bit mantissa), products within 81, and AVERAGE inputs are
// multiples of the rank count so that the mean is an integer.
int64_t input(hvd_reduce_op op, hvd_dtype dtype, int rank, int size, uint64_t i) {
  const int64_t base = static_cast<int64_t>((i * 7 + static_cast<uint64_t>(rank) * 3) % 11) -
                       (is_unsigned(dtype) ? 0 : 5);
  switch (op) {
    case HVD_AVERAGE:
      return base * size;
    case HVD_PRODUCT: {
      int64_t v = static_cast<int64_t>((i + static_cast<uint64_t>(rank)) % 3) + 1;
      if (!is_unsigned(dtype) && (i + 2 * static_cast<uint64_t>(rank)) % 5 == 0) v = -v;
      return v;
    }
    default:
      return base;
  }
}

int64_t expected_reduction(hvd_reduce_op op, hvd_dtype dtype, int size, uint64_t i) {
  int64_t acc = input(op, dtype, 0, size, i);
  for (int r = 1; r < size; ++r) {
    const int64_t v = input(op, dtype, r, size, i);
    switch (op) {
      case HVD_SUM:
      case HVD_AVERAGE:
        acc += v;
        break;
      case HVD_PRODUCT:
        acc *= v;
        break;
      case HVD_MIN:
        acc = std::min(acc, v);
        break;
      default:  // HVD_MAX
        acc = std::max(acc, v);
        break;
    }
  }
  return op == HVD_AVERAGE ? acc / size : acc;
}

// Compare a buffer with expected values; report the number wrong and the first one.
template <typename Expected>
void expect_values(const Buffer& got, uint64_t count, Expected&& expected,
                   const std::string& what) {
  uint64_t wrong = 0;
  uint64_t first = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (got.get(i) != static_cast<double>(expected(i))) {
      if (wrong++ == 0) first = i;
    }
  }
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " of " << count << " elements wrong; first at "
                       << first << ": got " << got.get(first) << ", expected "
                       << static_cast<double>(expected(first));
}

// A dtype (and op) the backend did not declare never reaches it: the host refuses the call with
// the same message on every rank. This checks that, and the caller then skips the case.
::testing::AssertionResult refused_as_undeclared(const hvd::Status& s, const std::string& what,
                                                 hvd_dtype dtype, const hvd_reduce_op* op) {
  std::string expected =
      what + ": backend '" + g_comm->backend() + "' does not take " + hvd_dtype_name(dtype);
  if (op != nullptr) expected += std::string(" ") + hvd_reduce_op_name(*op);
  if (s.code() != HVD_ERR_UNSUPPORTED || s.message().rfind(expected, 0) != 0) {
    return ::testing::AssertionFailure()
           << "expected unsupported '" << expected << " (...)', got " << s.to_string();
  }
  return ::testing::AssertionSuccess();
}

bool declared(hvd_dtype dtype, const hvd_reduce_op* op = nullptr) {
  return g_comm->takes(dtype) && (op == nullptr || g_comm->takes(*op));
}

std::string undeclared(hvd_dtype dtype, const hvd_reduce_op* op = nullptr) {
  return "backend '" + g_comm->backend() + "' does not declare " + hvd_dtype_name(dtype) +
         (op != nullptr ? std::string(" ") + hvd_reduce_op_name(*op) : "");
}

std::string dtype_op_name(hvd_dtype dtype, const char* op, bool in_place) {
  return std::string(hvd_dtype_name(dtype)) + "_" + op + (in_place ? "_inplace" : "_outofplace");
}

// The 1Mi+3 count runs in these dtypes only for the collectives added later (reduce-scatter,
// alltoall): enough to cross every backend's chunking without multiplying the suite's time.
bool large_counts_for(hvd_dtype dtype) { return dtype == HVD_FLOAT32; }

std::vector<uint64_t> counts_for(hvd_dtype dtype) {
  std::vector<uint64_t> kept;
  for (uint64_t c : counts()) {
    if (c <= 1023 || large_counts_for(dtype)) kept.push_back(c);
  }
  return kept;
}

// Whether a call that failed with `s` failed alike on every rank of `comm`: the same code and the
// same message (each rank's code and a hash of its message, gathered over `comm`, which must
// therefore still work).
::testing::AssertionResult failed_alike(hvd::Comm& comm, const hvd::Status& s) {
  if (s.ok()) return ::testing::AssertionFailure() << "the call succeeded on this rank";
  if (!comm.takes(HVD_INT32)) return ::testing::AssertionSuccess();  // nothing to gather with
  uint32_t hash = 2166136261u;                                       // FNV-1a
  for (char ch : s.message()) hash = (hash ^ static_cast<uint8_t>(ch)) * 16777619u;
  const int32_t mine[2] = {static_cast<int32_t>(s.code()), static_cast<int32_t>(hash >> 1)};
  std::vector<int32_t> all(2 * static_cast<size_t>(comm.size()));
  const hvd::Status gathered = comm.allgather(mine, all.data(), 2, HVD_INT32);
  if (!gathered.ok()) {
    return ::testing::AssertionFailure() << "the communicator failed the next call after "
                                         << s.to_string() << ": " << gathered.to_string();
  }
  for (int r = 0; r < comm.size(); ++r) {
    if (all[2 * static_cast<size_t>(r)] != mine[0]) {
      return ::testing::AssertionFailure()
             << "rank " << r << " failed with " << hvd_status_name(all[2 * static_cast<size_t>(r)])
             << ", this one (" << comm.rank() << ") with " << s.to_string();
    }
    if (all[2 * static_cast<size_t>(r) + 1] != mine[1]) {
      return ::testing::AssertionFailure() << "rank " << r << "'s message differs from rank "
                                           << comm.rank() << "'s: " << s.to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- allreduce --------------------------------------------------------------------------------

class Allreduce : public ::testing::TestWithParam<std::tuple<hvd_dtype, hvd_reduce_op, bool>> {};

TEST_P(Allreduce, ExactAtEverySize) {
  const auto [dtype, op, in_place] = GetParam();
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  if (!declared(dtype, &op)) {
    Buffer one(dtype, 1);
    EXPECT_TRUE(refused_as_undeclared(g_comm->allreduce(one.data(), one.data(), 1, dtype, op),
                                      "allreduce", dtype, &op));
    GTEST_SKIP() << undeclared(dtype, &op);
  }
  for (uint64_t count : counts()) {
    Buffer send(dtype, count), recv(dtype, count);
    for (uint64_t i = 0; i < count; ++i) send.set(i, input(op, dtype, rank, size, i));
    const std::vector<char> original = send.bytes();
    const std::string what = "count " + std::to_string(count);
    hvd::Status s = in_place ? g_comm->allreduce(send.data(), send.data(), count, dtype, op)
                             : g_comm->allreduce(send.data(), recv.data(), count, dtype, op);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    expect_values(
        in_place ? send : recv, count,
        [&, op = op, dtype = dtype](uint64_t i) { return expected_reduction(op, dtype, size, i); },
        what);
    if (!in_place) {
      EXPECT_TRUE(send.bytes() == original) << what << ": the send buffer changed";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndOps, Allreduce,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kOps),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return dtype_op_name(std::get<0>(p.param),
                                                hvd_reduce_op_name(std::get<1>(p.param)),
                                                std::get<2>(p.param));
                         });

// A backend may keep state per call shape across calls (the Gloo plugin keeps an algorithm object
// per count, dtype and op, bound to each rank's buffer). Here the calls come back to earlier
// shapes, two ops share each count, there are more shapes than such a cache holds, and each rank
// moves to its other buffer on a rhythm of its own (every 2, 3, 4... calls), so that in one call
// some ranks' buffers moved and others' did not. Values change every call: a result left in an
// old buffer, or a stale input, shows.
TEST(Allreduce, ExactAcrossRepeatedShapesWhileSomeRanksMoveTheirBuffers) {
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const hvd_dtype dtype = HVD_FLOAT32;
  if (!declared(dtype)) GTEST_SKIP() << undeclared(dtype);
  // Two ops share each count where the backend takes two of these.
  std::vector<hvd_reduce_op> ops;
  for (hvd_reduce_op op : {HVD_MAX, HVD_SUM, HVD_MIN}) {
    if (g_comm->takes(op)) ops.push_back(op);
  }
  if (ops.empty())
    GTEST_SKIP() << "backend '" << g_comm->backend() << "' declares none of max, sum, min";
  const uint64_t largest = counts().back();
  std::vector<uint64_t> shapes;
  for (uint64_t j = 0; j < 11 && j * 5 < largest; ++j) shapes.push_back(largest - j * 5);
  Buffer buffers[2] = {Buffer(dtype, largest), Buffer(dtype, largest)};
  const int calls = static_cast<int>(shapes.size()) * 3 + 7;
  for (int k = 0; k < calls; ++k) {
    const uint64_t count = shapes[static_cast<size_t>(k / 3) % shapes.size()];
    const hvd_reduce_op op = ops[static_cast<size_t>(k % 2) % ops.size()];
    Buffer& b = buffers[(k / (2 + rank)) % 2];
    const auto shift = static_cast<uint64_t>(k);
    for (uint64_t i = 0; i < count; ++i) b.set(i, input(op, dtype, rank, size, i + shift));
    const std::string what = "call " + std::to_string(k) + ", count " + std::to_string(count);
    hvd::Status s = g_comm->allreduce(b.data(), b.data(), count, dtype, op);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    expect_values(
        b, count, [&](uint64_t i) { return expected_reduction(op, dtype, size, i + shift); }, what);
  }
}

// Data-parallel replicas stay identical only if every rank gets the same bits from a floating-point
// allreduce, whose value depends on the order it adds the ranks' values in. Non-integer inputs
// (where the order shows in the last bits), every size, then each rank's result is compared with
// every other's, byte for byte.
TEST(Allreduce, FloatingSumsAreTheSameBitsOnEveryRank) {
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  for (hvd_dtype dtype : {HVD_FLOAT32, HVD_FLOAT64}) {
    for (hvd_reduce_op op : {HVD_SUM, HVD_AVERAGE}) {
      if (!declared(dtype, &op) || !declared(HVD_UINT8)) continue;
      for (uint64_t count : counts()) {
        Buffer data(dtype, count);
        const size_t element = hvd_dtype_size(dtype);
        for (uint64_t i = 0; i < count; ++i) {
          const double v = std::sin(double(rank) * 7919.0 + double(i)) * 1000.0 / 3.0;
          if (dtype == HVD_FLOAT32) {
            const auto f = static_cast<float>(v);
            std::memcpy(static_cast<char*>(data.data()) + i * element, &f, sizeof f);
          } else {
            std::memcpy(static_cast<char*>(data.data()) + i * element, &v, sizeof v);
          }
        }
        const std::string what = std::string(hvd_dtype_name(dtype)) + " " + hvd_reduce_op_name(op) +
                                 " count " + std::to_string(count);
        hvd::Status s = g_comm->allreduce(data.data(), data.data(), count, dtype, op);
        ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
        const std::vector<char> mine = data.bytes();
        std::vector<char> all(mine.size() * static_cast<size_t>(size));
        s = g_comm->allgather(mine.data(), all.data(), mine.size(), HVD_UINT8);
        ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
        for (int r = 0; r < size; ++r) {
          EXPECT_TRUE(std::equal(mine.begin(), mine.end(), all.begin() + r * long(mine.size())))
              << what << ": rank " << r << "'s result differs from rank " << rank << "'s";
        }
      }
    }
  }
}

// ---- allgather --------------------------------------------------------------------------------

int64_t gather_value(hvd_dtype dtype, int rank, uint64_t i) {
  return static_cast<int64_t>((static_cast<uint64_t>(rank) * 17 + i) % 97) -
         (is_unsigned(dtype) ? 0 : 40);
}

class Allgather : public ::testing::TestWithParam<std::tuple<hvd_dtype, bool>> {};

TEST_P(Allgather, RankOrderAtEverySize) {
  const auto [dtype, in_place] = GetParam();
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  if (!declared(dtype)) {
    Buffer one(dtype, 1), all(dtype, static_cast<uint64_t>(size));
    EXPECT_TRUE(refused_as_undeclared(g_comm->allgather(one.data(), all.data(), 1, dtype),
                                      "allgather", dtype, nullptr));
    GTEST_SKIP() << undeclared(dtype);
  }
  for (uint64_t count : counts()) {
    const uint64_t total = count * static_cast<uint64_t>(size);
    Buffer send(dtype, count), recv(dtype, total);
    for (uint64_t i = 0; i < total; ++i) recv.set(i, 99);  // must all be overwritten
    for (uint64_t i = 0; i < count; ++i) send.set(i, gather_value(dtype, rank, i));
    const void* source = send.data();
    if (in_place) {
      for (uint64_t i = 0; i < count; ++i) recv.set(rank * count + i, gather_value(dtype, rank, i));
      source = recv.at(static_cast<uint64_t>(rank) * count);
    }
    const std::string what = "count " + std::to_string(count);
    hvd::Status s = g_comm->allgather(source, recv.data(), count, dtype);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    expect_values(
        recv, total,
        [&, dtype = dtype](uint64_t i) {
          return gather_value(dtype, static_cast<int>(i / count), i % count);
        },
        what);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Allgather,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::Bool()),
                         [](const auto& p) {
                           return dtype_op_name(std::get<0>(p.param), "gather",
                                                std::get<1>(p.param));
                         });

// ---- allgatherv: a different count on every rank ----------------------------------------------

TEST_P(Allgather, VariableCountsInRankOrder) {
  // Backends without HVD_CAP_ALLGATHERV get it from the host: one broadcast per rank.
  const auto [dtype, in_place] = GetParam();
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  if (!declared(dtype)) GTEST_SKIP() << undeclared(dtype);
  for (uint64_t base : counts()) {
    // Rank r sends base + r elements (rank 0 sends none when base is 0).
    std::vector<uint64_t> per_rank(static_cast<size_t>(size));
    std::vector<uint64_t> offset(static_cast<size_t>(size) + 1, 0);
    for (int r = 0; r < size; ++r) {
      per_rank[static_cast<size_t>(r)] = base + static_cast<uint64_t>(r);
      offset[static_cast<size_t>(r) + 1] =
          offset[static_cast<size_t>(r)] + per_rank[static_cast<size_t>(r)];
    }
    const uint64_t mine = per_rank[static_cast<size_t>(rank)];
    const uint64_t total = offset.back();
    Buffer send(dtype, mine), recv(dtype, total);
    for (uint64_t i = 0; i < total; ++i) recv.set(i, 99);
    for (uint64_t i = 0; i < mine; ++i) send.set(i, gather_value(dtype, rank, i));
    const void* source = send.data();
    if (in_place) {
      for (uint64_t i = 0; i < mine; ++i)
        recv.set(offset[static_cast<size_t>(rank)] + i, gather_value(dtype, rank, i));
      source = recv.at(offset[static_cast<size_t>(rank)]);
    }
    const std::string what = "base count " + std::to_string(base);
    hvd::Status s = g_comm->allgatherv(source, recv.data(), per_rank.data(), dtype);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    expect_values(
        recv, total,
        [&, dtype = dtype](uint64_t i) {
          int r = 0;
          while (offset[static_cast<size_t>(r) + 1] <= i) ++r;
          return gather_value(dtype, r, i - offset[static_cast<size_t>(r)]);
        },
        what);
  }
}

// ---- broadcast --------------------------------------------------------------------------------

class Broadcast : public ::testing::TestWithParam<std::tuple<hvd_dtype, bool>> {};

TEST_P(Broadcast, FromEveryRootAtEverySize) {
  const auto [dtype, in_place] = GetParam();
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  if (!declared(dtype)) {
    Buffer one(dtype, 1);
    EXPECT_TRUE(refused_as_undeclared(g_comm->broadcast(one.data(), one.data(), 1, dtype, 0),
                                      "broadcast", dtype, nullptr));
    GTEST_SKIP() << undeclared(dtype);
  }
  auto value = [dtype = dtype](int root, uint64_t i) {
    return static_cast<int64_t>((static_cast<uint64_t>(root) * 13 + i) % 89) -
           (is_unsigned(dtype) ? 0 : 30);
  };
  for (int root = 0; root < size; ++root) {
    for (uint64_t count : counts()) {
      Buffer send(dtype, count), recv(dtype, count);
      // Non-roots' send buffers hold junk that must not leak into the result.
      for (uint64_t i = 0; i < count; ++i) {
        send.set(i, rank == root ? value(root, i) : 100 + rank);
        recv.set(i, 99);
      }
      Buffer& target = in_place ? send : recv;
      const std::string what = "root " + std::to_string(root) + ", count " + std::to_string(count);
      hvd::Status s = g_comm->broadcast(send.data(), target.data(), count, dtype, root);
      ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
      expect_values(
          target, count, [&](uint64_t i) { return value(root, i); }, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Broadcast,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::Bool()),
                         [](const auto& p) {
                           return dtype_op_name(std::get<0>(p.param), "bcast",
                                                std::get<1>(p.param));
                         });

// ---- reduce-scatter ---------------------------------------------------------------------------

class ReduceScatter : public ::testing::TestWithParam<std::tuple<hvd_dtype, hvd_reduce_op, bool>> {
};

// Rank r's block of count elements is the reduction of every rank's [r * count, (r + 1) * count):
// the inputs are indexed over the whole count * size elements, so every block differs.
TEST_P(ReduceScatter, ExactAtEverySize) {
  const auto [dtype, op, in_place] = GetParam();
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  if (!declared(dtype, &op)) {
    Buffer all(dtype, static_cast<uint64_t>(size));
    EXPECT_TRUE(refused_as_undeclared(g_comm->reduce_scatter(all.data(), all.data(), 1, dtype, op),
                                      "reduce_scatter", dtype, &op));
    GTEST_SKIP() << undeclared(dtype, &op);
  }
  for (uint64_t count : counts_for(dtype)) {
    const uint64_t total = count * static_cast<uint64_t>(size);
    Buffer send(dtype, total), recv(dtype, count + 1);  // recv's last element: a guard
    for (uint64_t i = 0; i < total; ++i) send.set(i, input(op, dtype, rank, size, i));
    for (uint64_t i = 0; i <= count; ++i) recv.set(i, 99);
    const std::vector<char> original = send.bytes();
    const std::string what = "count " + std::to_string(count);
    hvd::Status s = in_place ? g_comm->reduce_scatter(send.data(), send.data(), count, dtype, op)
                             : g_comm->reduce_scatter(send.data(), recv.data(), count, dtype, op);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    const uint64_t first = static_cast<uint64_t>(rank) * count;
    expect_values(
        in_place ? send : recv, count,
        [&, op = op, dtype = dtype](uint64_t i) {
          return expected_reduction(op, dtype, size, first + i);
        },
        what);
    if (!in_place) {
      EXPECT_TRUE(send.bytes() == original) << what << ": the send buffer changed";
      EXPECT_EQ(recv.get(count), 99) << what << ": written past the recv buffer's count";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndOps, ReduceScatter,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kOps),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return dtype_op_name(std::get<0>(p.param),
                                                hvd_reduce_op_name(std::get<1>(p.param)),
                                                std::get<2>(p.param));
                         });

// ---- alltoall ---------------------------------------------------------------------------------

// Byte b of the k-th element rank `from` sends rank `to`: a pattern of its own for every pair and
// position, any bit pattern of the dtype (NaNs too), so that an alltoall is checked bit for bit.
uint8_t alltoall_byte(int from, int to, uint64_t k, size_t b) {
  return static_cast<uint8_t>(static_cast<uint64_t>(from) * 97 + static_cast<uint64_t>(to) * 61 +
                              k * 13 + (k >> 8) * 7 + b * 29);
}

// How many elements each rank sends each rank in one case of the blocking alltoall.
struct AlltoallCase {
  std::string what;
  std::function<uint64_t(int from, int to)> count;
  bool recv_counts = true;  // false: recv_counts NULL
};

std::vector<AlltoallCase> alltoall_cases(hvd_dtype dtype, int size) {
  std::vector<AlltoallCase> cases = {
      {"(from + to) % 3 elements", [](int from, int to) { return uint64_t((from + to) % 3); }},
      {"nothing at all", [](int, int) { return uint64_t{0}; }},
      {"5 elements to the next rank only, recv_counts NULL",
       [size](int from, int to) { return uint64_t(to == (from + 1) % size ? 5 : 0); }, false},
  };
  for (uint64_t c : counts_for(dtype)) {
    if (c == 0) continue;
    cases.push_back({std::to_string(c) + " + (from + to) % 2 elements",
                     [c](int from, int to) { return c + uint64_t((from + to) % 2); }});
  }
  return cases;
}

class Alltoall : public ::testing::TestWithParam<hvd_dtype> {};

TEST_P(Alltoall, UnevenCountsBitForBitWithTheirRecvCounts) {
  const hvd_dtype dtype = GetParam();
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const size_t element = hvd_dtype_size(dtype);
  const auto n = static_cast<size_t>(size);
  if (!declared(dtype)) {
    Buffer send(dtype, n), recv(dtype, n);
    const std::vector<uint64_t> ones(n, 1);
    EXPECT_TRUE(refused_as_undeclared(
        g_comm->alltoall(send.data(), ones.data(), recv.data(), n, nullptr, dtype), "alltoall",
        dtype, nullptr));
    GTEST_SKIP() << undeclared(dtype);
  }
  for (const AlltoallCase& c : alltoall_cases(dtype, size)) {
    std::vector<uint64_t> send_counts(n), expected_counts(n), send_offset(n + 1, 0),
        recv_offset(n + 1, 0);
    for (int r = 0; r < size; ++r) {
      const auto i = static_cast<size_t>(r);
      send_counts[i] = c.count(rank, r);
      expected_counts[i] = c.count(r, rank);
      send_offset[i + 1] = send_offset[i] + send_counts[i];
      recv_offset[i + 1] = recv_offset[i] + expected_counts[i];
    }
    const uint64_t receives = recv_offset[n];
    std::vector<uint8_t> send(std::max<size_t>(1, send_offset[n] * element));
    std::vector<uint8_t> recv((receives + 1) * element, 0xEE);  // one element more: a guard
    for (size_t d = 0; d < n; ++d) {
      for (uint64_t k = 0; k < send_counts[d]; ++k) {
        for (size_t b = 0; b < element; ++b) {
          send[(send_offset[d] + k) * element + b] = alltoall_byte(rank, static_cast<int>(d), k, b);
        }
      }
    }
    const std::vector<uint8_t> original = send;
    std::vector<uint64_t> recv_counts(n, 12345);
    const hvd::Status s = g_comm->alltoall(send.data(), send_counts.data(), recv.data(), receives,
                                           c.recv_counts ? recv_counts.data() : nullptr, dtype);
    ASSERT_TRUE(s.ok()) << c.what << ": " << s.to_string();
    if (c.recv_counts) {
      EXPECT_EQ(recv_counts, expected_counts) << c.what << ": recv_counts";
    }
    uint64_t wrong = 0;
    std::string first;
    for (size_t from = 0; from < n; ++from) {
      for (uint64_t k = 0; k < expected_counts[from]; ++k) {
        for (size_t b = 0; b < element; ++b) {
          const uint8_t expected = alltoall_byte(static_cast<int>(from), rank, k, b);
          const uint8_t got = recv[(recv_offset[from] + k) * element + b];
          if (got == expected) continue;
          if (wrong++ == 0) {
            first = "element " + std::to_string(k) + " from rank " + std::to_string(from) +
                    ", byte " + std::to_string(b) + ": got " + std::to_string(got) + ", expected " +
                    std::to_string(expected);
          }
          break;
        }
      }
    }
    EXPECT_EQ(wrong, 0u) << c.what << ": " << wrong << " of " << receives
                         << " elements wrong; first: " << first;
    EXPECT_TRUE(std::all_of(recv.begin() + static_cast<ptrdiff_t>(receives * element), recv.end(),
                            [](uint8_t b) { return b == 0xEE; }))
        << c.what << ": written past recv_capacity";
    EXPECT_TRUE(send == original) << c.what << ": the send buffer changed";
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Alltoall, ::testing::ValuesIn(kDtypes),
                         [](const auto& p) { return std::string(hvd_dtype_name(p.param)); });

// Rank r sends 1 + (r + d) % 3 int32 to rank d; the last rank's recv_capacity is one short: the
// call fails on every rank alike and breaks nothing (hvd found the error before the backend).
void alltoall_short_on_one_rank_then_exact(hvd::Comm& comm) {
  const int rank = comm.rank();
  const int size = comm.size();
  const auto n = static_cast<size_t>(size);
  const auto count = [](int from, int to) { return uint64_t(1 + (from + to) % 3); };
  const auto value = [](int from, int to, uint64_t k) {
    return static_cast<int32_t>(from * 1000 + to * 10 + static_cast<int>(k));
  };
  std::vector<uint64_t> send_counts(n);
  std::vector<int32_t> send, expected;
  for (int d = 0; d < size; ++d) {
    send_counts[static_cast<size_t>(d)] = count(rank, d);
    for (uint64_t k = 0; k < count(rank, d); ++k) send.push_back(value(rank, d, k));
    for (uint64_t k = 0; k < count(d, rank); ++k) expected.push_back(value(d, rank, k));
  }
  std::vector<int32_t> recv(expected.size(), -1);
  std::vector<uint64_t> recv_counts(n);
  const uint64_t capacity = expected.size() - (rank == size - 1 ? 1 : 0);
  const hvd::Status s = comm.alltoall(send.data(), send_counts.data(), recv.data(), capacity,
                                      recv_counts.data(), HVD_INT32);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT) << s.to_string();
  EXPECT_TRUE(failed_alike(comm, s));
  const hvd::Status again = comm.alltoall(send.data(), send_counts.data(), recv.data(),
                                          expected.size(), recv_counts.data(), HVD_INT32);
  ASSERT_TRUE(again.ok()) << "the next alltoall: " << again.to_string();
  EXPECT_EQ(recv, expected);
}

// ---- barrier and argument errors --------------------------------------------------------------

TEST(Barrier, CompletesRepeatedly) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(g_comm->barrier().ok());
}

TEST(Errors, RootOutOfRangeIsTheSameErrorOnEveryRank) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  int32_t value = 1;
  const int root = g_comm->size();
  hvd::Status s = g_comm->broadcast(&value, &value, 1, HVD_INT32, root);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "broadcast: root " + std::to_string(root) +
                             " is not a rank of this job of " + std::to_string(g_comm->size()));
}

TEST(Errors, InvalidDtypeAndOpAreRejectedBeforeTheBackend) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  int32_t value = 1;
  hvd::Status s = g_comm->allreduce(&value, &value, 1, static_cast<hvd_dtype>(42), HVD_SUM);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "allreduce: dtype 42 is not an hvd_dtype");
  s = g_comm->allreduce(&value, &value, 1, HVD_INT32, static_cast<hvd_reduce_op>(-1));
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  s = g_comm->allreduce(nullptr, nullptr, 3, HVD_INT32, HVD_SUM);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  // The communicator still works after rejected calls.
  ASSERT_TRUE(g_comm->allreduce(&value, &value, 1, HVD_INT32, HVD_SUM).ok());
  EXPECT_EQ(value, g_comm->size());
}

TEST(Errors, ATensorOfABarrierJoinOrUnknownKindIsRejectedBeforeTheScheduler) {
  int32_t value = 1;
  const int64_t shape[1] = {1};
  for (const int kind :
       {static_cast<int>(HVD_COLLECTIVE_BARRIER), static_cast<int>(HVD_COLLECTIVE_JOIN), 42}) {
    hvd_tensor t{};
    t.collective = static_cast<hvd_collective>(kind);
    t.name = "conformance.kind";
    t.sendbuf = &value;
    t.recvbuf = &value;
    t.dtype = HVD_INT32;
    t.ndim = 1;
    t.shape = shape;
    t.op = HVD_SUM;
    const auto requests = g_comm->grouped_async({t});
    ASSERT_FALSE(requests.ok()) << kind;
    EXPECT_EQ(requests.status().code(), HVD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(requests.status().message(),
              "collective " + std::to_string(kind) + " (" + hvd_collective_name(kind) +
                  ") is not one a tensor can name: allreduce, allgather, broadcast, "
                  "reduce_scatter or alltoall");
  }
}

TEST(Errors, InconsistentAllgathervCountsAreRejected) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  int32_t value = 1;
  hvd::Status s = g_comm->allgatherv(&value, &value, nullptr, HVD_INT32);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "allgatherv: recv_counts is NULL");
}

TEST(Errors, AlltoallRecvCapacityShortOnOneRankFailsOnEveryRankAlikeAndTheNextCallWorks) {
  if (!declared(HVD_INT32)) GTEST_SKIP() << undeclared(HVD_INT32);
  alltoall_short_on_one_rank_then_exact(*g_comm);
}

// ---- communicators from communicators: split and process sets ----------------------------------
// Children of the job's communicator (or of children of it), each with its own scheduler. The
// values follow from the members' job ranks, so a child that ranks its members otherwise than
// it says (rank, job_rank), or data from another communicator, shows.

std::vector<int> job_ranks_of(const hvd::Comm& comm) {
  std::vector<int> ranks;
  for (int r = 0; r < comm.size(); ++r) ranks.push_back(comm.job_rank(r));
  return ranks;
}

// What `comm` must be: `members` (job ranks, in the child's rank order), this rank among them,
// and a local rank and size that fit (on one host: the child's own rank and size).
void expect_members(const hvd::Comm& comm, const std::vector<int>& members,
                    const std::string& where) {
  const int job_rank = g_comm->rank();
  ASSERT_TRUE(static_cast<bool>(comm)) << where << ": job rank " << job_rank << " got no child";
  const auto me = std::find(members.begin(), members.end(), job_rank);
  ASSERT_NE(me, members.end()) << where << ": job rank " << job_rank << " is not a member";
  EXPECT_EQ(comm.size(), static_cast<int>(members.size())) << where;
  EXPECT_EQ(comm.rank(), static_cast<int>(me - members.begin())) << where;
  EXPECT_EQ(job_ranks_of(comm), members) << where << ": job_rank of each child rank";
  EXPECT_EQ(comm.job_rank(-1), -1) << where;
  EXPECT_EQ(comm.job_rank(comm.size()), -1) << where;
  EXPECT_EQ(comm.backend(), g_comm->backend()) << where;
  if (g_comm->local_size() == g_comm->size()) {  // one host: every member is local
    EXPECT_EQ(comm.local_rank(), comm.rank()) << where;
    EXPECT_EQ(comm.local_size(), comm.size()) << where;
  } else {
    EXPECT_GE(comm.local_rank(), 0) << where;
    EXPECT_LT(comm.local_rank(), comm.local_size()) << where;
    EXPECT_LE(comm.local_size(), comm.size()) << where;
  }
}

// allreduce, allgather, broadcast, reduce-scatter and alltoall on `comm` (int32 sums), blocking
// (`names` empty) or by name (tensors `names`.*, all in flight at once), exact. `salt` sets the
// values apart (two communicators used at once with the same names must not mix them).
void expect_every_collective_exact(hvd::Comm& comm, const std::string& names, int32_t salt,
                                   const std::string& where) {
  const int rank = comm.rank();
  const int size = comm.size();
  const auto n = static_cast<size_t>(size);
  const std::vector<int> job = job_ranks_of(comm);
  const size_t count = 7;  // per rank
  const auto value = [&](int r, size_t i) {
    return salt + job[static_cast<size_t>(r)] * 1000 + static_cast<int32_t>(i);
  };
  const bool by_name = !names.empty();
  const std::string how = where + (by_name ? " by name" : " blocking") + ": ";

  std::vector<int32_t> reduced(count), gathered(count * n, -1), broadcast(count, -1),
      scattered(count, -1);
  std::vector<int32_t> mine(count), everyone(count * n);
  for (size_t i = 0; i < count; ++i) mine[i] = value(rank, i);
  for (size_t i = 0; i < count * n; ++i) everyone[i] = value(rank, i);
  const int root = size - 1;
  if (rank == root) broadcast = mine;
  // alltoall: 1 + (job rank + d) % 3 elements to child rank d.
  const auto sends = [&](int from, int to) {
    return size_t(1 + (job[static_cast<size_t>(from)] + to) % 3);
  };
  std::vector<int32_t> a2a_send, a2a_expected;
  std::vector<uint64_t> send_counts(n), expected_counts(n);
  std::vector<int64_t> splits(n), expected_splits(n);
  for (int d = 0; d < size; ++d) {
    const auto i = static_cast<size_t>(d);
    send_counts[i] = sends(rank, d);
    splits[i] = static_cast<int64_t>(send_counts[i]);
    expected_counts[i] = sends(d, rank);
    expected_splits[i] = static_cast<int64_t>(expected_counts[i]);
    for (size_t k = 0; k < sends(rank, d); ++k) a2a_send.push_back(value(rank, 100 * i + k));
    for (size_t k = 0; k < sends(d, rank); ++k)
      a2a_expected.push_back(value(d, 100 * static_cast<size_t>(rank) + k));
  }
  std::vector<int32_t> a2a_recv(a2a_expected.size(), -1);
  std::vector<uint64_t> recv_counts(n);

  if (!by_name) {
    hvd::Status s = comm.allreduce(mine.data(), reduced.data(), count, HVD_INT32, HVD_SUM);
    ASSERT_TRUE(s.ok()) << how << "allreduce: " << s.to_string();
    s = comm.allgather(mine.data(), gathered.data(), count, HVD_INT32);
    ASSERT_TRUE(s.ok()) << how << "allgather: " << s.to_string();
    s = comm.broadcast(broadcast.data(), broadcast.data(), count, HVD_INT32, root);
    ASSERT_TRUE(s.ok()) << how << "broadcast: " << s.to_string();
    s = comm.reduce_scatter(everyone.data(), scattered.data(), count, HVD_INT32, HVD_SUM);
    ASSERT_TRUE(s.ok()) << how << "reduce_scatter: " << s.to_string();
    s = comm.alltoall(a2a_send.data(), send_counts.data(), a2a_recv.data(), a2a_recv.size(),
                      recv_counts.data(), HVD_INT32);
    ASSERT_TRUE(s.ok()) << how << "alltoall: " << s.to_string();
    EXPECT_EQ(recv_counts, expected_counts) << how << "alltoall's recv_counts";
  } else {
    const std::vector<int64_t> shape = {static_cast<int64_t>(count)};
    const std::vector<int64_t> all_shape = {static_cast<int64_t>(count * n)};
    const std::vector<int64_t> a2a_shape = {static_cast<int64_t>(a2a_send.size())};
    auto ar = comm.allreduce_async(names + ".allreduce", mine.data(), reduced.data(), HVD_INT32,
                                   shape, HVD_SUM);
    auto ag =
        comm.allgather_async(names + ".allgather", mine.data(), gathered.data(), HVD_INT32, shape);
    auto bc = comm.broadcast_async(names + ".broadcast", broadcast.data(), broadcast.data(),
                                   HVD_INT32, shape, root);
    auto rs = comm.reduce_scatter_async(names + ".reduce_scatter", everyone.data(),
                                        scattered.data(), HVD_INT32, all_shape, HVD_SUM);
    auto a2a = comm.alltoall_async(names + ".alltoall", a2a_send.data(), nullptr, HVD_INT32,
                                   a2a_shape, splits);
    for (auto* r : {&ar, &ag, &bc, &rs, &a2a}) {
      ASSERT_TRUE(r->ok()) << how << r->status().to_string();
    }
    for (auto* r : {&ar, &ag, &bc, &rs, &a2a}) {
      const hvd::Status s = (*r)->wait(120);
      ASSERT_TRUE(s.ok()) << how << s.to_string();
    }
    auto out = a2a->output();
    ASSERT_TRUE(out.ok()) << how << "alltoall's output: " << out.status().to_string();
    ASSERT_EQ(out->first_dim, static_cast<int64_t>(a2a_expected.size())) << how;
    std::memcpy(a2a_recv.data(), out->data, a2a_recv.size() * sizeof(int32_t));
    auto received = a2a->received_splits(size);
    ASSERT_TRUE(received.ok()) << how << received.status().to_string();
    EXPECT_EQ(*received, expected_splits) << how << "alltoall's received splits";
  }
  for (size_t i = 0; i < count; ++i) {
    int32_t sum = 0;
    for (int r = 0; r < size; ++r) sum += value(r, i);
    EXPECT_EQ(reduced[i], sum) << how << "allreduce[" << i << "]";
    int32_t block_sum = 0;
    for (int r = 0; r < size; ++r) block_sum += value(r, static_cast<size_t>(rank) * count + i);
    EXPECT_EQ(scattered[i], block_sum) << how << "reduce_scatter[" << i << "]";
    EXPECT_EQ(broadcast[i], value(root, i)) << how << "broadcast[" << i << "]";
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(gathered[static_cast<size_t>(r) * count + i], value(r, i))
          << how << "allgather from child rank " << r << "[" << i << "]";
    }
  }
  EXPECT_EQ(a2a_recv, a2a_expected) << how << "alltoall";
}

// Blocking, then by name (which starts the child's scheduler), then blocking through it.
void expect_collectives_exact_every_way(hvd::Comm& comm, const std::string& names, int32_t salt,
                                        const std::string& where) {
  expect_every_collective_exact(comm, "", salt, where);
  expect_every_collective_exact(comm, names, salt + 1, where);
  expect_every_collective_exact(comm, "", salt + 2, where + ", after the scheduler started,");
}

bool takes_int32_sums() { return declared(HVD_INT32, &kSum); }

// Color rank % 2, key -rank: the evens and the odds, each ranked from the highest job rank down.
TEST(CommSplit, EvenOddByKeyRanksByKeyAndRunsEveryCollective) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  auto child = g_comm->split(rank % 2, -rank);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  std::vector<int> members;
  for (int r = size - 1; r >= 0; --r) {
    if (r % 2 == rank % 2) members.push_back(r);
  }
  expect_members(*child, members, "even/odd child");
  if (HasFatalFailure()) return;
  expect_collectives_exact_every_way(*child, "split", 1000000, "even/odd child");
  const hvd::Status s = child->finalize();
  EXPECT_TRUE(s.ok()) << s.to_string();
}

// Equal keys keep the parent's order: key rank / 2 descending puts pairs in reverse, each pair in
// the parent's order.
TEST(CommSplit, EqualKeysKeepTheParentsOrder) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  auto child = g_comm->split(7, -(rank / 2));
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  std::vector<int> members;
  for (int pair = (size - 1) / 2; pair >= 0; --pair) {
    for (int r = 2 * pair; r < std::min(size, 2 * pair + 2); ++r) members.push_back(r);
  }
  expect_members(*child, members, "child by pairs");
  if (HasFatalFailure()) return;
  expect_every_collective_exact(*child, "", 2000000, "child by pairs");
}

// HVD_COLOR_NONE: the last rank takes part and gets an empty Comm; the others form a child.
TEST(CommSplit, ColorNoneGetsAnEmptyCommAndTheOthersAChild) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const bool out = rank == size - 1;
  auto child = g_comm->split(out ? HVD_COLOR_NONE : 0, 0);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  if (out) {
    EXPECT_FALSE(static_cast<bool>(*child));
    EXPECT_EQ(child->rank(), -1);
    EXPECT_EQ(child->size(), -1);
    EXPECT_EQ(child->job_rank(0), -1);
  } else {
    std::vector<int> members;
    for (int r = 0; r < size - 1; ++r) members.push_back(r);
    expect_members(*child, members, "child without the last rank");
    if (!HasFatalFailure()) {
      expect_every_collective_exact(*child, "", 3000000, "child without the last rank");
      expect_every_collective_exact(*child, "none", 3000001, "child without the last rank");
    }
  }
  // The job's communicator is not disturbed by a child that lacks one of its ranks.
  int32_t one = 1;
  ASSERT_TRUE(g_comm->allreduce(&one, &one, 1, HVD_INT32, HVD_SUM).ok());
  EXPECT_EQ(one, size);
}

// A child of a child: job ranks, not the parent's ranks, come out of job_rank.
TEST(CommSplit, AChildOfAChildMapsItsRanksToJobRanks) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  auto parent = g_comm->split(0, -rank);  // the whole job, reversed
  ASSERT_TRUE(parent.ok()) << parent.status().to_string();
  std::vector<int> reversed;
  for (int r = size - 1; r >= 0; --r) reversed.push_back(r);
  expect_members(*parent, reversed, "reversed child");
  if (HasFatalFailure()) return;
  const int p = parent->rank();
  auto child = parent->split(p % 2, p);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  std::vector<int> members;  // parent ranks of my parity, ascending: job ranks descending
  for (int q = 0; q < size; ++q) {
    if (q % 2 == p % 2) members.push_back(size - 1 - q);
  }
  expect_members(*child, members, "child of the reversed child");
  if (HasFatalFailure()) return;
  expect_collectives_exact_every_way(*child, "grandchild", 4000000, "child of the reversed child");
  hvd::Status s = child->finalize();
  EXPECT_TRUE(s.ok()) << "the child: " << s.to_string();
  s = parent->finalize();
  EXPECT_TRUE(s.ok()) << "the parent, after its child: " << s.to_string();
}

// Two overlapping process sets (at 4 ranks {0,1,2} and {3,2,1}: ranked in increasing order),
// used at once from two threads, by name with the same tensor names in both.
TEST(CommSplit, OverlappingProcessSetsUsedConcurrentlyWithTheSameTensorNames) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const int members = std::min(size, std::max(2, size - 1));
  std::vector<int> first, second;
  for (int r = 0; r < members; ++r) first.push_back(r);
  for (int r = size - 1; r >= size - members; --r) second.push_back(r);  // in decreasing order
  auto a = g_comm->process_set(first);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = g_comm->process_set(second);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  std::vector<int> second_sorted = second;
  std::sort(second_sorted.begin(), second_sorted.end());
  const bool in_a = std::count(first.begin(), first.end(), rank) > 0;
  const bool in_b = std::count(second.begin(), second.end(), rank) > 0;
  EXPECT_EQ(static_cast<bool>(*a), in_a);
  EXPECT_EQ(static_cast<bool>(*b), in_b);
  if (in_a) expect_members(*a, first, "process set A");
  if (in_b) expect_members(*b, second_sorted, "process set B");
  if (HasFatalFailure()) return;
  const auto use = [](hvd::Comm* set, int32_t salt, const std::string& where) {
    if (!*set) return;
    expect_every_collective_exact(*set, "", salt, where);
    for (int round = 0; round < 3; ++round) {
      expect_every_collective_exact(*set, "process_set", salt + 1 + round,
                                    where + ", round " + std::to_string(round));
    }
    expect_every_collective_exact(*set, "", salt + 4, where + ", after the scheduler started,");
  };
  std::thread thread_a(use, &a.value(), 5000000, "process set A");
  std::thread thread_b(use, &b.value(), 6000000, "process set B");
  thread_a.join();
  thread_b.join();
  for (hvd::Comm* set : {&a.value(), &b.value()}) {
    if (!*set) continue;
    const hvd::Status s = set->finalize();
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

// Every rank must pass the same list: ranks that disagree get the same HVD_ERR_MISMATCH, and a
// list that is wrong alike everywhere the same error; neither leaves anything behind.
TEST(CommSplit, ProcessSetListsThatDisagreeFailWithTheSameMismatchOnEveryRank) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  auto wrong = g_comm->process_set({0, size});  // `size` is no rank of the job
  ASSERT_FALSE(wrong.ok()) << "a process set with rank " << size << " of " << size;
  EXPECT_EQ(wrong.status().code(), HVD_ERR_INVALID_ARGUMENT) << wrong.status().to_string();
  EXPECT_TRUE(failed_alike(*g_comm, wrong.status()));
  auto twice = g_comm->process_set({0, 0});
  ASSERT_FALSE(twice.ok()) << "a process set with rank 0 twice";
  EXPECT_EQ(twice.status().code(), HVD_ERR_INVALID_ARGUMENT) << twice.status().to_string();
  EXPECT_TRUE(failed_alike(*g_comm, twice.status()));
  if (size < 2) GTEST_SKIP() << "one rank cannot disagree with another";
  auto disagree = g_comm->process_set(rank == 0 ? std::vector<int>{0} : std::vector<int>{0, 1});
  ASSERT_FALSE(disagree.ok()) << "rank 0 passed {0}, the others {0, 1}";
  EXPECT_EQ(disagree.status().code(), HVD_ERR_MISMATCH) << disagree.status().to_string();
  EXPECT_TRUE(failed_alike(*g_comm, disagree.status()));
  // The next process set works.
  auto next = g_comm->process_set({0, 1});
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  if (rank < 2) {
    expect_members(*next, {0, 1}, "process set {0, 1}");
    if (!HasFatalFailure()) expect_every_collective_exact(*next, "", 7000000, "process set {0, 1}");
  } else {
    EXPECT_FALSE(static_cast<bool>(*next));
  }
}

// A parent cannot be finalized while a child lives (HVD_ERR_STATE, on every rank), and goes on
// working; once the child is finalized, so can the parent be.
TEST(CommSplit, FinalizingAParentWithALiveChildIsAStateErrorAndTheParentGoesOn) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  auto parent = g_comm->split(0, rank);
  ASSERT_TRUE(parent.ok()) << parent.status().to_string();
  auto child = parent->split(rank % 2, 0);  // every rank has a live child
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  ASSERT_TRUE(static_cast<bool>(*child));
  // The C call: hvd::Comm::finalize lets go of its handle whatever the outcome.
  const hvd_status code = hvd_finalize(parent->get());
  const hvd::Status s =
      code == HVD_SUCCESS ? hvd::Status::success() : hvd::Status(code, hvd_last_error());
  EXPECT_EQ(s.code(), HVD_ERR_STATE) << s.to_string();
  ASSERT_NE(s.code(), HVD_SUCCESS) << "the parent was finalized with a live child";
  EXPECT_TRUE(failed_alike(*parent, s));
  expect_every_collective_exact(*parent, "", 8000000, "the parent after its finalize failed");
  expect_every_collective_exact(*child, "", 8100000, "the live child");
  hvd::Status done = child->finalize();
  EXPECT_TRUE(done.ok()) << "the child: " << done.to_string();
  done = parent->finalize();
  EXPECT_TRUE(done.ok()) << "the parent, after its child: " << done.to_string();
}

// The same through hvd::Comm::finalize: the refusal leaves the handle with the Comm, which goes
// on working and finalizes once its child is gone.
TEST(CommSplit, CppFinalizeOfAParentWithALiveChildKeepsItsHandle) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  auto parent = g_comm->split(0, rank);
  ASSERT_TRUE(parent.ok()) << parent.status().to_string();
  auto child = parent->split(0, rank);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  hvd_comm* const raw = parent->get();
  const hvd::Status s = parent->finalize();
  EXPECT_EQ(s.code(), HVD_ERR_STATE) << s.to_string();
  EXPECT_TRUE(static_cast<bool>(*parent)) << "hvd::Comm::finalize let go of a parent it did not "
                                             "finalize (a live child): the Comm is empty now";
  if (*parent) {
    expect_every_collective_exact(*parent, "", 8200000, "the parent after its finalize failed");
  }
  hvd::Status done = child->finalize();
  EXPECT_TRUE(done.ok()) << "the child: " << done.to_string();
  if (*parent) {
    done = parent->finalize();
  } else {  // released here, so that the job's communicator can be finalized at the end
    const hvd_status code = hvd_finalize(raw);
    done = code == HVD_SUCCESS ? hvd::Status::success() : hvd::Status(code, hvd_last_error());
  }
  EXPECT_TRUE(done.ok()) << "the parent, after its child: " << done.to_string();
}

// hvd_comm_abort on a parent aborts its children too (locally, as every abort).
TEST(CommSplit, AbortingAParentAbortsItsChildren) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  auto parent = g_comm->split(0, rank);
  ASSERT_TRUE(parent.ok()) << parent.status().to_string();
  auto child = parent->split(0, -rank);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  ASSERT_TRUE(parent->abort().ok());
  int32_t x = 1;
  const hvd::Status s = child->allreduce(&x, &x, 1, HVD_INT32, HVD_SUM);
  EXPECT_EQ(s.code(), HVD_ERR_STATE) << s.to_string();
  EXPECT_NE(child->finalize().code(), HVD_SUCCESS);
  EXPECT_NE(parent->finalize().code(), HVD_SUCCESS);
  // The job's communicator goes on.
  ASSERT_TRUE(g_comm->allreduce(&x, &x, 1, HVD_INT32, HVD_SUM).ok());
  EXPECT_EQ(x, g_comm->size());
}

// ---- the ABI's evolution rules, seen from an application ---------------------------------------

// The values a later ABI minor may add (the next dtype, op and memory type) are refused by the
// host on every collective: a plugin never sees a value it cannot know. (The C test backends end
// the process if one reaches them.)
TEST(Abi, EnumValuesOfALaterVersionNeverReachTheBackend) {
  int64_t value[4] = {1, 1, 1, 1};
  const auto next_dtype = static_cast<hvd_dtype>(HVD_DTYPE_COUNT);
  const auto next_op = static_cast<hvd_reduce_op>(HVD_REDUCE_OP_COUNT);
  const int size = g_comm->size();
  std::vector<int64_t> all(static_cast<size_t>(size) * 4);
  const hvd::Status statuses[] = {
      g_comm->allreduce(value, value, 1, next_dtype, HVD_SUM),
      g_comm->allgather(value, all.data(), 1, next_dtype),
      g_comm->broadcast(value, value, 1, next_dtype, 0),
      g_comm->allreduce(value, value, 1, HVD_INT32, next_op),
  };
  for (const hvd::Status& s : statuses) {
    EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT) << s.to_string();
  }
  EXPECT_EQ(statuses[0].message(),
            "allreduce: dtype " + std::to_string(HVD_DTYPE_COUNT) + " is not an hvd_dtype");
  EXPECT_EQ(statuses[3].message(), "allreduce: reduce op " + std::to_string(HVD_REDUCE_OP_COUNT) +
                                       " is not an hvd_reduce_op");
  const hvd_placement next_memory{sizeof(hvd_placement), static_cast<hvd_memory_type>(2), 0,
                                  nullptr};
  const hvd::Status s = g_comm->broadcast(value, value, 1, HVD_UINT8, 0, &next_memory);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT) << s.to_string();
  EXPECT_EQ(s.message(), "broadcast: memory type 2 is not an hvd_memory_type");
}

// A struct from hvd.h 1.0 (struct_size of the 1.0 fields) and one from a later hvd.h (larger)
// are both taken; a struct_size below 1.0's is an error that says what to set, on every rank.
TEST(Abi, StructsOfEveryVersionFromTheFirstAreTaken) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  struct Later {
    hvd_placement placement;
    char fields_of_a_later_version[24];
  } later{};
  later.placement = {sizeof later, HVD_MEMORY_HOST, -1, nullptr};
  hvd_placement first = {HVD_PLACEMENT_SIZE_1_0, HVD_MEMORY_HOST, -1, nullptr};
  for (const hvd_placement* placement : {&first, &later.placement}) {
    int32_t value = 2;
    const hvd::Status s = g_comm->allreduce(&value, &value, 1, HVD_INT32, HVD_SUM, placement);
    ASSERT_TRUE(s.ok()) << "struct_size " << placement->struct_size << ": " << s.to_string();
    EXPECT_EQ(value, 2 * g_comm->size());
  }
  hvd_placement unset = {0, HVD_MEMORY_HOST, -1, nullptr};
  int32_t value = 2;
  const hvd::Status s = g_comm->allreduce(&value, &value, 1, HVD_INT32, HVD_SUM, &unset);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "hvd_placement.struct_size is 0, less than the " +
                             std::to_string(HVD_PLACEMENT_SIZE_1_0) +
                             " bytes of its first version: set it to sizeof(hvd_placement)");
}

// ---- CUDA memory on a backend that takes host memory only: staged through host memory ----------

#ifdef HVD_TEST_WITH_CUDA
// How many CUDA devices this process sees, and the runtime's reason where it sees none.
std::pair<int, std::string> cuda_devices() {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);  // leaves `devices` alone on failure
  if (rc != cudaSuccess) return {0, cudaGetErrorString(rc)};
  return {devices, devices == 0 ? "no CUDA device" : ""};
}

// The CUDA device this rank uses (its local rank's, modulo the devices), made current; or
// kNoDevice (the test skips) or -2 (cudaSetDevice failed: the test fails), and why.
constexpr int kNoDevice = -1;
std::pair<int, std::string> this_ranks_device() {
  const auto [devices, why] = cuda_devices();
  if (devices == 0) return {kNoDevice, "no CUDA device here: " + why};
  const int device = g_comm->local_rank() % devices;
  const cudaError_t rc = cudaSetDevice(device);
  if (rc != cudaSuccess) return {-2, std::string("cudaSetDevice: ") + cudaGetErrorString(rc)};
  return {device, ""};
}

// Device memory for a test, copied to and from host Buffers; freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const Buffer& like) : bytes_(like.bytes().size()) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() { return data_; }
  void from(Buffer& host) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void to(Buffer& host) {
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  size_t bytes_;
  void* data_ = nullptr;
};
#endif

bool takes_cuda_memory() { return (g_comm->capabilities() & HVD_CAP_CUDA_MEMORY) != 0; }

TEST(CudaMemory, WithoutAGpuStagingFailsWithTheRuntimesReasonOnEveryRank) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  if (takes_cuda_memory())
    GTEST_SKIP() << "backend '" << g_comm->backend() << "' takes CUDA memory";
#ifdef HVD_TEST_WITH_CUDA
  if (cuda_devices().first > 0) GTEST_SKIP() << "a CUDA device is present";
#endif
  int32_t value = 1;
  const hvd_placement cuda{sizeof(hvd_placement), HVD_MEMORY_CUDA, 0, nullptr};
  const hvd::Status s = g_comm->allreduce(&value, &value, 1, HVD_INT32, HVD_SUM, &cuda);
  EXPECT_NE(s.code(), HVD_SUCCESS);
  const std::string prefix = "allreduce: staging CUDA memory through host memory for backend '" +
                             std::string(g_comm->backend()) + "': ";
  EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
  // Every rank failed before the collective, so the job goes on.
  EXPECT_TRUE(g_comm->allreduce(&value, &value, 1, HVD_INT32, HVD_SUM).ok());
}

// Device buffers, ordered on a stream of the application's: given to a backend that takes CUDA
// memory, staged through host memory for one that does not.
TEST(CudaMemory, DeviceBuffersOnAStreamEveryCollectiveIsExact) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
#ifndef HVD_TEST_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  const auto [device, why] = this_ranks_device();
  if (device == kNoDevice) GTEST_SKIP() << why;
  ASSERT_GE(device, 0) << why;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const hvd_placement cuda{sizeof(hvd_placement), HVD_MEMORY_CUDA, device, stream};
  // A backend that takes CUDA memory queues the call on the stream: the host waits for it there.
  const auto done = [&] { ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess); };
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  for (uint64_t count : counts()) {
    const std::string at =
        " of " + std::to_string(count) + " on CUDA device " + std::to_string(device);
    Buffer in(HVD_INT32, count), out(HVD_INT32, count * static_cast<uint64_t>(size));
    DeviceBuffer d_in(in), d_out(out);

    for (uint64_t i = 0; i < count; ++i) in.set(i, input(HVD_SUM, HVD_INT32, rank, size, i));
    d_in.from(in);
    ASSERT_TRUE(
        g_comm->allreduce(d_in.data(), d_out.data(), count, HVD_INT32, HVD_SUM, &cuda).ok());
    done();
    d_out.to(out);
    expect_values(
        out, count, [&](uint64_t i) { return expected_reduction(HVD_SUM, HVD_INT32, size, i); },
        "allreduce" + at);

    for (uint64_t i = 0; i < count; ++i) in.set(i, gather_value(HVD_INT32, rank, i));
    d_in.from(in);
    ASSERT_TRUE(g_comm->allgather(d_in.data(), d_out.data(), count, HVD_INT32, &cuda).ok());
    done();
    d_out.to(out);
    expect_values(
        out, count * static_cast<uint64_t>(size),
        [&](uint64_t i) { return gather_value(HVD_INT32, static_cast<int>(i / count), i % count); },
        "allgather" + at);

    const int root = size - 1;
    ASSERT_TRUE(g_comm->broadcast(d_in.data(), d_out.data(), count, HVD_INT32, root, &cuda).ok());
    done();
    d_out.to(out);
    expect_values(
        out, count, [&](uint64_t i) { return gather_value(HVD_INT32, root, i); }, "broadcast" + at);
  }
  cudaStreamDestroy(stream);
#endif
}

// A peer that never calls: the backend itself must end the call within HVD_TIMEOUT.
// The host's watchdog aborts a call that runs past HVD_TIMEOUT + 1 s and reports it in its own
// words; a call that ended that way is a plugin that ignores its timeout. On a communicator of
// its own with a 2 s timeout (the job's keeps its own), the last rank calling nothing.
TEST(Timeouts, APeerThatNeverCallsIsTheBackendsOwnTimeout) {
  const char* enabled = std::getenv("HVD_CONFORMANCE_TIMEOUT_CASE");
  if (enabled == nullptr || std::string(enabled) != "1") {
    GTEST_SKIP() << "waits out a timeout: set HVD_CONFORMANCE_TIMEOUT_CASE=1 to run it "
                    "(hvd-plugin-check does)";
  }
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  if (g_comm->size() < 2) GTEST_SKIP() << "one rank has no peer to wait for";
  // Together first: a rank that leaves the previous case late must not time out the init.
  ASSERT_TRUE(g_comm->barrier().ok());
  hvd::Comm::Options options;
  options.timeout_seconds = 2;
  auto made = hvd::Comm::init(options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  hvd::Comm comm = std::move(made).value();
  const bool absent = comm.rank() == comm.size() - 1;
  if (absent) {
    // Long enough for the others' watchdog (timeout + 1 s) to have fired, were it needed.
    std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  } else {
    int32_t x = 1;
    const auto start = std::chrono::steady_clock::now();
    const hvd::Status s = comm.allreduce(&x, &x, 1, HVD_INT32, HVD_SUM);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(s.ok()) << "allreduce completed although rank " << comm.size() - 1
                         << " never called it";
    if (s.message().find("did not return within HVD_TIMEOUT") != std::string::npos) {
      ADD_FAILURE() << "the host's watchdog had to end the call after " << std::fixed
                    << std::setprecision(1) << waited << " s (HVD_TIMEOUT 2 s + 1 s): backend '"
                    << comm.backend() << "' does not honour its timeout (" << s.to_string() << ")";
    } else if (!s.ok()) {
      // The first to time out may tell the others, who then fail as a peer's failure.
      EXPECT_TRUE(s.code() == HVD_ERR_TIMEOUT || s.code() == HVD_ERR_REMOTE)
          << "a peer that never called should be HVD_ERR_TIMEOUT (or HVD_ERR_REMOTE, a peer "
             "that timed out first), not "
          << s.to_string();
    }
  }
  // The others' communicator is broken, and finalize reports that; but finalize too must end
  // on its own.
  const hvd::Status finalized = comm.finalize();
  EXPECT_EQ(finalized.message().find("finalize on backend"), std::string::npos)
      << "finalize after the timeout had to be abandoned by the host: " << finalized.to_string();
}

// Abort is local and sticks: every later call fails with the abort's error, finalize reports it.
TEST(Abort, EveryLaterCallFailsWithTheAbortAndFinalizeReportsIt) {
  auto made = hvd::Comm::init();
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  hvd::Comm comm = std::move(made).value();
  ASSERT_TRUE(comm.abort().ok());
  ASSERT_TRUE(comm.abort().ok());  // idempotent
  int32_t x = 1;
  const hvd::Status s = comm.allreduce(&x, &x, 1, HVD_INT32, HVD_SUM);
  EXPECT_EQ(s.code(), HVD_ERR_STATE);
  EXPECT_EQ(s.message(), "the communicator was aborted by the application (hvd_comm_abort)");
  const hvd::Status finalized = comm.finalize();
  EXPECT_EQ(finalized.code(), HVD_ERR_STATE);
  EXPECT_EQ(finalized.message(), s.message());
}

// ---- the fusion scheduler on this backend ---------------------------------------------------
// Last in the suite: once the job's scheduler runs, every later blocking call goes through it
// too. GoogleTest runs the parameterized suites after the plain TESTs, in the order of their
// first TEST_P in this file: so these are a parameterized suite (of one value), and the last.

class ZSchedulerLast : public ::testing::TestWithParam<int> {};

// Every dtype and op as named asynchronous allreduces, grouped so they fuse where they can: the
// ones the backend declared are exact, the others fail with the same message on every rank and
// never reach the backend (a backend that cannot carry negotiation negotiates through
// HVD_CONTROLLER).
TEST_P(ZSchedulerLast, EveryDtypeAndOpAsyncExactOrRefusedBeforeTheBackend) {
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const uint64_t count = 7;
  std::vector<Buffer> buffers;
  std::vector<std::pair<hvd_dtype, hvd_reduce_op>> cases;
  std::vector<hvd_tensor> tensors;
  std::vector<std::string> names;
  const int64_t shape[1] = {static_cast<int64_t>(count)};
  for (hvd_dtype dtype : kDtypes) {
    for (hvd_reduce_op op : kOps) {
      cases.emplace_back(dtype, op);
      buffers.emplace_back(dtype, count);
      for (uint64_t i = 0; i < count; ++i) buffers.back().set(i, input(op, dtype, rank, size, i));
      names.push_back(std::string("conformance.async.") + hvd_dtype_name(dtype) + "." +
                      hvd_reduce_op_name(op));
    }
  }
  for (size_t k = 0; k < cases.size(); ++k) {
    hvd_tensor t{};
    t.collective = HVD_COLLECTIVE_ALLREDUCE;
    t.name = names[k].c_str();
    t.sendbuf = buffers[k].data();
    t.recvbuf = buffers[k].data();
    t.dtype = cases[k].first;
    t.ndim = 1;
    t.shape = shape;
    t.op = cases[k].second;
    tensors.push_back(t);
  }
  auto requests = g_comm->grouped_async(tensors);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto [dtype, op] = cases[k];
    const hvd::Status s = (*requests)[k].wait(120);
    if (!declared(dtype, &op)) {
      EXPECT_TRUE(refused_as_undeclared(s, "allreduce", dtype, &op)) << names[k];
      continue;
    }
    ASSERT_TRUE(s.ok()) << names[k] << ": " << s.to_string();
    expect_values(
        buffers[k], count, [&](uint64_t i) { return expected_reduction(op, dtype, size, i); },
        names[k]);
  }
}

// CUDA tensors by name, every floating dtype: produced on one stream of the application's (copies
// queued there, behind 50 ms of other work, before the submission), fused with scale factors (on
// the device by hvd's executor where the backend takes CUDA memory, through host memory where not),
// and consumed on another stream ordered after the requests (hvd_request_wait_on_stream) without
// the host waiting, or waited for on the host.
TEST_P(ZSchedulerLast, CudaTensorsProducedOnAStreamFusedScaledAndConsumedOnAnother) {
  if (!declared(HVD_FLOAT32, &kSum)) GTEST_SKIP() << undeclared(HVD_FLOAT32, &kSum);
#ifndef HVD_TEST_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  const auto [device, why] = this_ranks_device();
  if (device == kNoDevice) GTEST_SKIP() << why;
  ASSERT_GE(device, 0) << why;
  cudaStream_t producer = nullptr, consumer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  const hvd_placement on_producer{sizeof(hvd_placement), HVD_MEMORY_CUDA, device, producer};
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  // Every floating dtype declared, odd sizes; and 1030 small float32 tensors, more than one
  // launch of the copy kernel packs (1024).
  std::vector<std::pair<hvd_dtype, uint64_t>> cases;
  for (hvd_dtype dtype : {HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64}) {
    if (!declared(dtype, &kSum)) continue;
    for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{1023}, uint64_t{(1u << 16) + 1}}) {
      cases.emplace_back(dtype, n);
    }
  }
  for (int k = 0; k < 1030; ++k) cases.emplace_back(HVD_FLOAT32, 3);
  std::vector<Buffer> in, out;
  std::vector<std::unique_ptr<DeviceBuffer>> d_in, d_out;
  std::vector<int64_t> shapes(cases.size());
  std::vector<std::string> names;
  std::vector<hvd_tensor> tensors;
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto [dtype, n] = cases[k];
    in.emplace_back(dtype, n);
    out.emplace_back(dtype, n);
    for (uint64_t i = 0; i < n; ++i) in[k].set(i, input(HVD_SUM, dtype, rank, size, i));
    d_in.push_back(std::make_unique<DeviceBuffer>(in[k]));
    d_out.push_back(std::make_unique<DeviceBuffer>(out[k]));
    // Poison (NaN in every floating dtype): a collective that read its input early shows.
    ASSERT_EQ(cudaMemset(d_in[k]->data(), 0xFF, in[k].bytes().size()), cudaSuccess);
    names.push_back("conformance.cuda." + std::to_string(k));
  }
  // The producer's stream is busy for 50 ms before its copies: hvd must wait for them.
  ASSERT_EQ(cudaLaunchHostFunc(
                producer, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
                nullptr),
            cudaSuccess);
  for (size_t k = 0; k < cases.size(); ++k) {  // produced on the producer stream, not waited for
    ASSERT_EQ(cudaMemcpyAsync(d_in[k]->data(), in[k].data(), in[k].bytes().size(),
                              cudaMemcpyHostToDevice, producer),
              cudaSuccess);
    shapes[k] = static_cast<int64_t>(cases[k].second);
    hvd_tensor t{};
    t.collective = HVD_COLLECTIVE_ALLREDUCE;
    t.name = names[k].c_str();
    t.sendbuf = d_in[k]->data();
    t.recvbuf = d_out[k]->data();
    t.dtype = cases[k].first;
    t.ndim = 1;
    t.shape = &shapes[k];
    t.op = HVD_SUM;
    t.prescale = 0.5;  // integers halved and doubled: exact
    t.postscale = 2;
    t.placement = &on_producer;
    tensors.push_back(t);
  }
  auto requests = g_comm->grouped_async(tensors);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  for (size_t k = 0; k < cases.size(); ++k) {
    const hvd::Status s =
        k % 2 == 0 ? (*requests)[k].wait_on_stream(consumer, 120) : (*requests)[k].wait(120);
    ASSERT_TRUE(s.ok()) << names[k] << ": " << s.to_string();
    ASSERT_EQ(cudaMemcpyAsync(out[k].data(), d_out[k]->data(), out[k].bytes().size(),
                              cudaMemcpyDeviceToHost, consumer),
              cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto [dtype, n] = cases[k];
    EXPECT_TRUE((*requests)[k].ready()) << names[k];
    expect_values(
        out[k], n, [&](uint64_t i) { return expected_reduction(HVD_SUM, dtype, size, i); },
        names[k] + " (" + hvd_dtype_name(dtype) + ")");
  }
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
#endif
}

// Horovod's split of a first dimension of `rows` over `size` ranks: rank r's rows and its first.
std::pair<int64_t, int64_t> rows_of(int64_t rows, int size, int r) {
  const int64_t q = rows / size;
  const int64_t m = rows % size;
  return {q + (r < m ? 1 : 0), r * q + std::min<int64_t>(r, m)};
}

bool is_floating(hvd_dtype dtype) {
  return dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16 || dtype == HVD_FLOAT32 ||
         dtype == HVD_FLOAT64;
}

// One tensor of a by-name test: what was submitted, its buffers, and its request's status.
struct Named {
  std::string name;
  hvd_dtype dtype;
  hvd_reduce_op op;
  std::vector<int64_t> shape;
  double prescale;
  double postscale;
  Buffer send;
  Buffer recv;
};

// A submitted tensor: its request (if the submission succeeded) and its outcome.
struct Submitted {
  std::unique_ptr<hvd::Result<hvd::Request>> request;
  hvd::Status status;
};

// Submits every tensor (in reverse order on odd ranks: all in flight at once, in different
// orders), then waits for each.
template <typename Submit>
std::vector<Submitted> submit_and_wait(const std::vector<Named>& tensors, Submit&& submit) {
  std::vector<size_t> order(tensors.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  if (g_comm->rank() % 2 == 1) std::reverse(order.begin(), order.end());
  std::vector<Submitted> submitted(tensors.size());
  for (size_t k : order) {
    submitted[k].request = std::make_unique<hvd::Result<hvd::Request>>(submit(k));
  }
  for (Submitted& s : submitted) {
    s.status = s.request->ok() ? (*s.request)->wait(120) : s.request->status();
  }
  return submitted;
}

// By name, reduce-scatter splits the first dimension as Horovod does (shape[0] = q * size + m:
// the first m ranks get one row more), in every shape, dtype and op, with scale factors on the
// floating types; the dtypes and ops the backend did not declare are refused before it.
TEST_P(ZSchedulerLast, ReduceScatterByNameSplitsTheFirstDimensionAsHorovodDoes) {
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const int64_t s = size;
  const std::vector<std::vector<int64_t>> shapes = {
      {0}, {1}, {2 * s}, {2 * s + 1}, {3 * s + s - 1, 3}, {s + 1, 2, 5}, {5, 4}};
  std::vector<Named> tensors;
  const auto add = [&](hvd_dtype dtype, hvd_reduce_op op, const std::vector<int64_t>& shape,
                       double prescale, double postscale) {
    uint64_t elements = 1;
    for (int64_t d : shape) elements *= static_cast<uint64_t>(d);
    const uint64_t row = elements / static_cast<uint64_t>(std::max<int64_t>(1, shape[0]));
    const auto [rows, first] = rows_of(shape[0], size, rank);
    (void)first;
    std::string name = std::string("conformance.reduce_scatter.") + hvd_dtype_name(dtype) + "." +
                       hvd_reduce_op_name(op) + "." + std::to_string(tensors.size());
    tensors.push_back({std::move(name), dtype, op, shape, prescale, postscale,
                       Buffer(dtype, elements),
                       Buffer(dtype, static_cast<uint64_t>(rows) * row + 1)});
    Named& t = tensors.back();
    for (uint64_t i = 0; i < elements; ++i) t.send.set(i, input(op, dtype, rank, size, i));
    for (uint64_t i = 0; i <= static_cast<uint64_t>(rows) * row; ++i) t.recv.set(i, 99);
  };
  for (hvd_dtype dtype : kDtypes) {
    for (const auto& shape : shapes) add(dtype, HVD_SUM, shape, 1, 1);
    for (hvd_reduce_op op : kOps) add(dtype, op, {2 * s + s - 1, 2}, 1, 1);
    if (is_floating(dtype)) add(dtype, HVD_SUM, {2 * s + 1, 2}, 3, 0.5);
  }
  const std::vector<Submitted> submitted = submit_and_wait(tensors, [&](size_t k) {
    Named& t = tensors[k];
    return g_comm->reduce_scatter_async(t.name, t.send.data(), t.recv.data(), t.dtype, t.shape,
                                        t.op, t.prescale, t.postscale);
  });
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Named& t = tensors[k];
    const hvd::Status& st = submitted[k].status;
    if (!declared(t.dtype, &t.op)) {
      EXPECT_TRUE(refused_as_undeclared(st, "reduce_scatter", t.dtype, &t.op)) << t.name;
      continue;
    }
    std::string what = t.name + " of shape [";
    for (int64_t d : t.shape) what += std::to_string(d) + (&d == &t.shape.back() ? "]" : ", ");
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    const uint64_t row = elements / static_cast<uint64_t>(std::max<int64_t>(1, t.shape[0]));
    const auto [rows, first] = rows_of(t.shape[0], size, rank);
    const uint64_t mine = static_cast<uint64_t>(rows) * row;
    const double scale = t.prescale * t.postscale;
    expect_values(
        t.recv, mine,
        [&](uint64_t i) {
          return scale * static_cast<double>(expected_reduction(
                             t.op, t.dtype, size, static_cast<uint64_t>(first) * row + i));
        },
        what);
    EXPECT_EQ(t.recv.get(mine), 99) << what << ": written past this rank's rows";
  }
}

// Scale factors are for floating types: on int32 they fail the tensor alike on every rank.
TEST_P(ZSchedulerLast, ReduceScatterByNameRefusesScaleFactorsOnIntegers) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int size = g_comm->size();
  std::vector<int32_t> send(static_cast<size_t>(size) * 2, 1), recv(2, -1);
  auto r = g_comm->reduce_scatter_async("conformance.reduce_scatter.scaled_int32", send.data(),
                                        recv.data(), HVD_INT32, {2 * size}, HVD_SUM, 2, 1);
  const hvd::Status s = r.ok() ? r->wait(120) : r.status();
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT) << s.to_string();
  EXPECT_TRUE(failed_alike(*g_comm, s));
}

// The value of column c of the k-th row rank `from` sends rank `to` by name: exact in every dtype.
int64_t a2a_value(hvd_dtype dtype, int from, int to, int64_t k, int64_t c) {
  return (from * 37 + to * 11 + k * 5 + c) % 97 - (is_unsigned(dtype) ? 0 : 40);
}

// One alltoall by name: rows sent to each rank (by every rank), the row's shape, whether splits
// are passed and whether hvd allocates the output.
struct AlltoallByName {
  std::string what;
  std::function<int64_t(int from, int to)> rows;
  std::vector<int64_t> row_shape;
  bool splits;
  bool allocated;
};

// Horovod's alltoall by name: with splits (uneven, zeros included; each rank its own first
// dimension) and without (even), the output allocated by hvd (Request::output) or given (it holds
// what this rank sends: the patterns where a rank receives more pass recvbuf NULL), rows of
// several dimensions, every dtype bit for bit; received splits as the ranks sent them.
TEST_P(ZSchedulerLast, AlltoallByNameWithAndWithoutSplits) {
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  const auto n = static_cast<size_t>(size);
  const std::vector<AlltoallByName> cases = {
      {"(from + 2 to) % 3 rows of 2x3, output by hvd",
       [](int from, int to) { return int64_t((from + 2 * to) % 3); },
       {2, 3},
       true,
       true},
      {"(from + to) % 3 rows of 4, recvbuf given",
       [](int from, int to) { return int64_t((from + to) % 3); },
       {4},
       true,
       false},
      {"2 rows of 3 each, no splits, recvbuf given",
       [](int, int) { return int64_t{2}; },
       {3},
       false,
       false},
      {"1 row each, no splits, output by hvd",
       [](int, int) { return int64_t{1}; },
       {},
       false,
       true},
      {"no rows at all, output by hvd", [](int, int) { return int64_t{0}; }, {3}, true, true},
  };
  for (const AlltoallByName& c : cases) {
    int64_t row = 1;
    for (int64_t d : c.row_shape) row *= d;
    std::vector<Named> tensors;
    std::vector<std::vector<int64_t>> splits;
    for (hvd_dtype dtype : kDtypes) {
      std::vector<int64_t> mine(n);
      int64_t sends = 0;
      int64_t receives = 0;
      for (int d = 0; d < size; ++d) {
        mine[static_cast<size_t>(d)] = c.rows(rank, d);
        sends += c.rows(rank, d);
        receives += c.rows(d, rank);
      }
      std::vector<int64_t> shape = {sends};
      shape.insert(shape.end(), c.row_shape.begin(), c.row_shape.end());
      std::string name =
          "conformance.alltoall." + std::to_string(&c - cases.data()) + "." + hvd_dtype_name(dtype);
      tensors.push_back({std::move(name), dtype, HVD_SUM, shape, 1, 1,
                         Buffer(dtype, static_cast<uint64_t>(sends * row)),
                         Buffer(dtype, static_cast<uint64_t>(receives * row))});
      Named& t = tensors.back();
      int64_t i = 0;
      for (int d = 0; d < size; ++d) {
        for (int64_t k = 0; k < c.rows(rank, d); ++k) {
          for (int64_t col = 0; col < row; ++col) {
            t.send.set(static_cast<uint64_t>(i++), a2a_value(dtype, rank, d, k, col));
          }
        }
      }
      for (int64_t j = 0; j < receives * row; ++j) t.recv.set(static_cast<uint64_t>(j), 99);
      splits.push_back(c.splits ? mine : std::vector<int64_t>{});
    }
    const std::vector<Submitted> submitted = submit_and_wait(tensors, [&](size_t k) {
      Named& t = tensors[k];
      return g_comm->alltoall_async(t.name, t.send.data(), c.allocated ? nullptr : t.recv.data(),
                                    t.dtype, t.shape, splits[k]);
    });
    std::vector<int64_t> expected_splits(n);
    for (int from = 0; from < size; ++from) {
      expected_splits[static_cast<size_t>(from)] = c.rows(from, rank);
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      Named& t = tensors[k];
      const std::string what = t.name + " (" + c.what + ")";
      const hvd::Status& st = submitted[k].status;
      if (!declared(t.dtype)) {
        EXPECT_TRUE(refused_as_undeclared(st, "alltoall", t.dtype, nullptr)) << what;
        continue;
      }
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      const hvd::Request& request = **submitted[k].request;
      auto received = request.received_splits(size);
      ASSERT_TRUE(received.ok()) << what << ": " << received.status().to_string();
      EXPECT_EQ(*received, expected_splits) << what << ": received splits";
      int64_t receives = 0;
      for (int64_t r : expected_splits) receives += r;
      const auto elements = static_cast<uint64_t>(receives * row);
      if (c.allocated) {
        auto out = request.output();
        ASSERT_TRUE(out.ok()) << what << ": " << out.status().to_string();
        ASSERT_EQ(out->first_dim, receives) << what << ": the output's first dimension";
        if (elements > 0) {
          std::memcpy(t.recv.data(), out->data, elements * hvd_dtype_size(t.dtype));
        }
      } else {
        auto out = request.output();
        EXPECT_EQ(out.status().code(), HVD_ERR_STATE)
            << what << ": an output with recvbuf given: " << out.status().to_string();
      }
      // Rank `from`'s rows arrive in rank order; a row's elements in order.
      std::vector<std::pair<int, int64_t>> row_from;  // received row -> (rank, its index there)
      for (int from = 0; from < size; ++from) {
        for (int64_t j = 0; j < c.rows(from, rank); ++j) row_from.emplace_back(from, j);
      }
      expect_values(
          t.recv, elements,
          [&](uint64_t i) {
            const auto& [from, j] = row_from[i / static_cast<uint64_t>(row)];
            return a2a_value(t.dtype, from, rank, j, static_cast<int64_t>(i) % row);
          },
          what);
    }
  }
}

// A recvbuf given by name holds as many elements as this rank sends: where a rank receives more,
// the tensor fails on every rank alike, and the next one works.
TEST_P(ZSchedulerLast, AlltoallByNameIntoABufferTooSmallFailsOnEveryRankAlike) {
  if (!declared(HVD_INT32)) GTEST_SKIP() << undeclared(HVD_INT32);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  if (size < 2) GTEST_SKIP() << "one rank receives what it sends";
  // One row to each rank, and rank 0 one more to the last rank: the last receives size + 1 rows.
  std::vector<int64_t> splits(static_cast<size_t>(size), 1);
  if (rank == 0) splits.back() = 2;
  const int64_t sends = size + (rank == 0 ? 1 : 0);
  std::vector<int32_t> send(static_cast<size_t>(sends), rank), recv(static_cast<size_t>(sends));
  auto r = g_comm->alltoall_async("conformance.alltoall.short", send.data(), recv.data(), HVD_INT32,
                                  {sends}, splits);
  const hvd::Status s = r.ok() ? r->wait(120) : r.status();
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT) << s.to_string();
  EXPECT_TRUE(failed_alike(*g_comm, s));
  auto again = g_comm->alltoall_async("conformance.alltoall.short", send.data(), nullptr, HVD_INT32,
                                      {sends}, splits);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  const hvd::Status done = again->wait(120);
  ASSERT_TRUE(done.ok()) << done.to_string();
  auto out = again->output();
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const int64_t receives = size + (rank == size - 1 ? 1 : 0);
  ASSERT_EQ(out->first_dim, receives);
  std::vector<int32_t> got(static_cast<size_t>(receives));
  std::memcpy(got.data(), out->data, got.size() * sizeof(int32_t));
  std::vector<int32_t> expected;
  for (int from = 0; from < size; ++from) {
    expected.push_back(from);
    if (from == 0 && rank == size - 1) expected.push_back(from);
  }
  EXPECT_EQ(got, expected);
}

// Once the scheduler runs, the blocking reduce-scatter and alltoall go through it: exact, and an
// alltoall whose recv_capacity is short on one rank fails alike on every rank there too.
TEST_P(ZSchedulerLast, BlockingReduceScatterAndAlltoallThroughTheScheduler) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1023}}) {
    const uint64_t total = count * static_cast<uint64_t>(size);
    Buffer send(HVD_INT32, total), recv(HVD_INT32, count);
    for (uint64_t i = 0; i < total; ++i) send.set(i, input(HVD_SUM, HVD_INT32, rank, size, i));
    const std::string what = "reduce_scatter of " + std::to_string(count);
    const hvd::Status s =
        g_comm->reduce_scatter(send.data(), recv.data(), count, HVD_INT32, HVD_SUM);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    const uint64_t first = static_cast<uint64_t>(rank) * count;
    expect_values(
        recv, count,
        [&](uint64_t i) { return expected_reduction(HVD_SUM, HVD_INT32, size, first + i); }, what);
  }
  alltoall_short_on_one_rank_then_exact(*g_comm);
}

// Once the job's scheduler runs, a split goes in order with the blocking calls; the child's
// tensor names are its own: the same name in flight in the job and in the child at once.
TEST_P(ZSchedulerLast, SplitAfterTheSchedulerStartedAndTheSameNameInParentAndChild) {
  if (!takes_int32_sums()) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  const int rank = g_comm->rank();
  const int size = g_comm->size();
  auto child = g_comm->split(rank % 2, rank);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  std::vector<int> members;
  for (int r = rank % 2; r < size; r += 2) members.push_back(r);
  expect_members(*child, members, "even/odd child of a scheduled job");
  if (HasFatalFailure()) return;
  std::vector<int32_t> in_job(3, rank + 1), in_child(3, 100 * (rank + 1));
  auto job_request = g_comm->allreduce_async("conformance.same_name", in_job.data(), in_job.data(),
                                             HVD_INT32, {3}, HVD_SUM);
  auto child_request = child->allreduce_async("conformance.same_name", in_child.data(),
                                              in_child.data(), HVD_INT32, {3}, HVD_SUM);
  ASSERT_TRUE(job_request.ok()) << job_request.status().to_string();
  ASSERT_TRUE(child_request.ok()) << child_request.status().to_string();
  hvd::Status s = child_request->wait(120);
  ASSERT_TRUE(s.ok()) << "in the child: " << s.to_string();
  s = job_request->wait(120);
  ASSERT_TRUE(s.ok()) << "in the job: " << s.to_string();
  int32_t job_sum = 0, child_sum = 0;
  for (int r = 0; r < size; ++r) job_sum += r + 1;
  for (int r : members) child_sum += 100 * (r + 1);
  EXPECT_EQ(in_job, std::vector<int32_t>(3, job_sum));
  EXPECT_EQ(in_child, std::vector<int32_t>(3, child_sum));
  expect_collectives_exact_every_way(*child, "late", 9000000, "even/odd child of a scheduled job");
  const hvd::Status done = child->finalize();
  EXPECT_TRUE(done.ok()) << done.to_string();
}

INSTANTIATE_TEST_SUITE_P(Finally, ZSchedulerLast, ::testing::Values(0),
                         [](const auto&) { return std::string("job"); });

}  // namespace

namespace {

// One line per case for hvd-plugin-check: "start\t<case>" before it runs (so a crash names the
// case it ended in), then "<pass|fail|skip>\t<case>\t<reason>". Flushed line by line.
class CaseReport : public ::testing::EmptyTestEventListener {
 public:
  explicit CaseReport(const std::string& dir) : dir_(dir) {}

 private:
  static std::string case_name(const ::testing::TestInfo& info) {
    return std::string(info.test_suite_name()) + "." + info.name();
  }
  static std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    std::replace(text.begin(), text.end(), '\t', ' ');
    return text;
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    if (!out_.is_open() && g_comm != nullptr) {
      out_.open(dir_ + "/rank" + std::to_string(g_comm->rank()) + ".txt", std::ios::app);
    }
    out_ << "start\t" << case_name(info) << std::endl;
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& result = *info.result();
    std::string status = "pass", reason;
    if (result.Failed()) {
      status = "fail";
    } else if (result.Skipped()) {
      status = "skip";
    }
    for (int i = 0; i < result.total_part_count(); ++i) {
      const ::testing::TestPartResult& part = result.GetTestPartResult(i);
      if ((status == "fail" && part.failed()) || (status == "skip" && part.skipped())) {
        reason = part.message();
        if (reason.rfind("Failed\n", 0) == 0) reason.erase(0, 7);  // ADD_FAILURE's first line
        break;
      }
    }
    out_ << status << "\t" << case_name(info) << "\t" << one_line(reason) << std::endl;
  }

  std::string dir_;
  std::ofstream out_;
};

// Rank 0 says what it tests: the backend, its capabilities and the rank count.
class Banner : public ::testing::EmptyTestEventListener {
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest&) override {
    if (g_comm == nullptr || g_comm->rank() != 0) return;
    std::printf(
        "hvd conformance: backend '%s' on %d ranks (capabilities %llx, dtypes %llx, "
        "reduce ops %llx)\n",
        g_comm->backend().c_str(), g_comm->size(),
        static_cast<unsigned long long>(g_comm->capabilities()),
        static_cast<unsigned long long>(hvd_backend_dtypes(g_comm->get())),
        static_cast<unsigned long long>(hvd_backend_reduce_ops(g_comm->get())));
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new CommEnvironment);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  listeners.Append(new Banner);
  if (const char* dir = std::getenv("HVD_CONFORMANCE_REPORT"))
    listeners.Append(new CaseReport(dir));
  return RUN_ALL_TESTS();
}
