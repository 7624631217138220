// The conformance suite: one set of tests that every backend must pass, run as a real multi-rank
// job (hvdrun -np N --backend B hvd_conformance_test). Data are small integers, so every
// reduction is exact in every dtype (float16 and bfloat16 included) and results are compared
// for equality, element by element.
//
// HVD_CONFORMANCE_MAX_COUNT caps the element counts (for slow test-only backends).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifdef HVD_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "hvd/hvd.hpp"
#include "hvd/reduce.h"

namespace {

hvd::Comm* g_comm = nullptr;

class CommEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto comm = hvd::Comm::init();
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    comm_ = std::make_unique<hvd::Comm>(std::move(comm).value());
    g_comm = comm_.get();
  }
  void TearDown() override {
    if (comm_) {
      EXPECT_TRUE(comm_->finalize().ok());
    }
    g_comm = nullptr;
  }

 private:
  std::unique_ptr<hvd::Comm> comm_;
};

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

TEST(Errors, InconsistentAllgathervCountsAreRejected) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  int32_t value = 1;
  hvd::Status s = g_comm->allgatherv(&value, &value, nullptr, HVD_INT32);
  EXPECT_EQ(s.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "allgatherv: recv_counts is NULL");
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

TEST(CudaMemory, StagedThroughHostMemoryEveryCollectiveIsExact) {
  if (!declared(HVD_INT32, &kSum)) GTEST_SKIP() << undeclared(HVD_INT32, &kSum);
  if (takes_cuda_memory())
    GTEST_SKIP() << "backend '" << g_comm->backend() << "' takes CUDA memory";
#ifndef HVD_TEST_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  const auto [devices, why] = cuda_devices();
  if (devices == 0) GTEST_SKIP() << "no CUDA device here: " << why;
  const int device = g_comm->local_rank() % devices;
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  const hvd_placement cuda{sizeof(hvd_placement), HVD_MEMORY_CUDA, device, nullptr};
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
    d_out.to(out);
    expect_values(
        out, count, [&](uint64_t i) { return expected_reduction(HVD_SUM, HVD_INT32, size, i); },
        "allreduce" + at);

    for (uint64_t i = 0; i < count; ++i) in.set(i, gather_value(HVD_INT32, rank, i));
    d_in.from(in);
    ASSERT_TRUE(g_comm->allgather(d_in.data(), d_out.data(), count, HVD_INT32, &cuda).ok());
    d_out.to(out);
    expect_values(
        out, count * static_cast<uint64_t>(size),
        [&](uint64_t i) { return gather_value(HVD_INT32, static_cast<int>(i / count), i % count); },
        "allgather" + at);

    const int root = size - 1;
    ASSERT_TRUE(g_comm->broadcast(d_in.data(), d_out.data(), count, HVD_INT32, root, &cuda).ok());
    d_out.to(out);
    expect_values(
        out, count, [&](uint64_t i) { return gather_value(HVD_INT32, root, i); }, "broadcast" + at);
  }
#endif
}

// ---- the fusion scheduler on this backend ---------------------------------------------------
// Last in the suite: once the scheduler runs, every later blocking call goes through it too.

// Every dtype and op as named asynchronous allreduces, grouped so they fuse where they can: the
// ones the backend declared are exact, the others fail with the same message on every rank and
// never reach the backend (a backend that cannot carry negotiation negotiates through
// HVD_CONTROLLER).
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

TEST(ZSchedulerLast, EveryDtypeAndOpAsyncExactOrRefusedBeforeTheBackend) {
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

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new CommEnvironment);
  return RUN_ALL_TESTS();
}
