#include "hvd/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

TEST(Float16, ConvertsExactValuesAndRoundsToNearestEven) {
  EXPECT_EQ(hvd_float_to_float16(0.0f), 0x0000);
  EXPECT_EQ(hvd_float_to_float16(-0.0f), 0x8000);
  EXPECT_EQ(hvd_float_to_float16(1.0f), 0x3c00);
  EXPECT_EQ(hvd_float_to_float16(-2.0f), 0xc000);
  EXPECT_EQ(hvd_float_to_float16(65504.0f), 0x7bff);                        // largest finite
  EXPECT_EQ(hvd_float_to_float16(65520.0f), 0x7c00);                        // rounds up to infinity
  EXPECT_EQ(hvd_float_to_float16(std::ldexp(1.0f, -24)), 0x0001);           // smallest subnormal
  EXPECT_EQ(hvd_float_to_float16(2049.0f), hvd_float_to_float16(2048.0f));  // tie -> even
  EXPECT_EQ(hvd_float_to_float16(2051.0f), hvd_float_to_float16(2052.0f));  // tie -> even
  EXPECT_EQ(hvd_float_to_float16(std::numeric_limits<float>::infinity()), 0x7c00);
  const uint16_t nan = hvd_float_to_float16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(hvd_float16_to_float(nan)));
  EXPECT_EQ(hvd_float16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(hvd_float16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(hvd_float16_to_float(0xfbff), -65504.0f);
  // Every finite half survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(hvd_float_to_float16(hvd_float16_to_float(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(Bfloat16, ConvertsAndRoundsToNearestEven) {
  EXPECT_EQ(hvd_float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(hvd_float_to_bfloat16(-1.0f), 0xbf80);
  EXPECT_EQ(hvd_bfloat16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(hvd_float_to_bfloat16(256.0f), 0x4380);
  EXPECT_EQ(hvd_float_to_bfloat16(257.0f), hvd_float_to_bfloat16(256.0f));  // tie -> even
  EXPECT_EQ(hvd_float_to_bfloat16(259.0f), hvd_float_to_bfloat16(260.0f));  // tie -> even
  const uint16_t nan = hvd_float_to_bfloat16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(hvd_bfloat16_to_float(nan)));
}

template <typename T>
std::vector<T> apply(hvd_dtype dtype, hvd_reduce_op op, std::vector<T> a, const std::vector<T>& b) {
  EXPECT_EQ(hvd_reduce(a.data(), a.data(), b.data(), a.size(), dtype, op), HVD_SUCCESS);
  return a;
}

TEST(Reduce, EveryOpOnNativeTypes) {
  const std::vector<int32_t> a = {1, -2, 7, 0, 5};
  const std::vector<int32_t> b = {3, 4, -7, 9, 5};
  EXPECT_EQ(apply(HVD_INT32, HVD_SUM, a, b), (std::vector<int32_t>{4, 2, 0, 9, 10}));
  EXPECT_EQ(apply(HVD_INT32, HVD_AVERAGE, a, b), (std::vector<int32_t>{4, 2, 0, 9, 10}));
  EXPECT_EQ(apply(HVD_INT32, HVD_PRODUCT, a, b), (std::vector<int32_t>{3, -8, -49, 0, 25}));
  EXPECT_EQ(apply(HVD_INT32, HVD_MIN, a, b), (std::vector<int32_t>{1, -2, -7, 0, 5}));
  EXPECT_EQ(apply(HVD_INT32, HVD_MAX, a, b), (std::vector<int32_t>{3, 4, 7, 9, 5}));
  EXPECT_EQ(apply(HVD_FLOAT64, HVD_MAX, std::vector<double>{1.5, -3}, {0.5, -2}),
            (std::vector<double>{1.5, -2}));
  EXPECT_EQ(apply(HVD_UINT8, HVD_SUM, std::vector<uint8_t>{250, 1}, {10, 2}),
            (std::vector<uint8_t>{4, 3}));  // wraps
  EXPECT_EQ(apply(HVD_INT8, HVD_MIN, std::vector<int8_t>{-128, 127}, {0, -1}),
            (std::vector<int8_t>{-128, -1}));
}

TEST(Reduce, SignedOverflowWrapsInsteadOfBeingUndefined) {
  const auto max = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(apply(HVD_INT32, HVD_SUM, std::vector<int32_t>{max}, {1}),
            std::vector<int32_t>{std::numeric_limits<int32_t>::min()});
  const auto max64 = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(apply(HVD_INT64, HVD_PRODUCT, std::vector<int64_t>{max64}, {2}),
            std::vector<int64_t>{-2});
}

TEST(Reduce, HalfTypesReduceInFloatAndRoundBack) {
  for (hvd_dtype dtype : {HVD_FLOAT16, HVD_BFLOAT16}) {
    auto to = dtype == HVD_FLOAT16 ? hvd_float_to_float16 : hvd_float_to_bfloat16;
    auto from = dtype == HVD_FLOAT16 ? hvd_float16_to_float : hvd_bfloat16_to_float;
    std::vector<uint16_t> a = {to(1), to(-3), to(8)}, b = {to(2), to(5), to(-8)};
    std::vector<uint16_t> out(3);
    ASSERT_EQ(hvd_reduce(out.data(), a.data(), b.data(), 3, dtype, HVD_SUM), HVD_SUCCESS);
    EXPECT_EQ(from(out[0]), 3.0f);
    EXPECT_EQ(from(out[1]), 2.0f);
    EXPECT_EQ(from(out[2]), 0.0f);
    ASSERT_EQ(hvd_reduce(out.data(), a.data(), b.data(), 3, dtype, HVD_PRODUCT), HVD_SUCCESS);
    EXPECT_EQ(from(out[1]), -15.0f);
    ASSERT_EQ(hvd_reduce(out.data(), a.data(), b.data(), 3, dtype, HVD_MIN), HVD_SUCCESS);
    EXPECT_EQ(from(out[2]), -8.0f);
  }
}

// The vector kernels (F16C / AVX2, where the CPU has them) must give the scalar conversions'
// bits for every non-NaN input: random bit patterns (normals, subnormals, infinities, signed
// zeros, overflow to infinity), in place and out of place, with a tail that is not a multiple of
// eight.
TEST(Reduce, HalfTypesMatchTheScalarDefinitionBitForBit) {
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<uint16_t>(state >> 16);
  };
  constexpr size_t kCount = 4099;
  for (hvd_dtype dtype : {HVD_FLOAT16, HVD_BFLOAT16}) {
    auto to = dtype == HVD_FLOAT16 ? hvd_float_to_float16 : hvd_float_to_bfloat16;
    auto from = dtype == HVD_FLOAT16 ? hvd_float16_to_float : hvd_bfloat16_to_float;
    std::vector<uint16_t> a(kCount), b(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      do a[i] = next();
      while (std::isnan(from(a[i])));
      do b[i] = next();
      while (std::isnan(from(b[i])));
    }
    for (int o = 0; o < HVD_REDUCE_OP_COUNT; ++o) {
      const auto op = static_cast<hvd_reduce_op>(o);
      std::vector<uint16_t> out(kCount), in_place = a;
      ASSERT_EQ(hvd_reduce(out.data(), a.data(), b.data(), kCount, dtype, op), HVD_SUCCESS);
      ASSERT_EQ(hvd_reduce(in_place.data(), in_place.data(), b.data(), kCount, dtype, op),
                HVD_SUCCESS);
      for (size_t i = 0; i < kCount; ++i) {
        const float x = from(a[i]), y = from(b[i]);
        float r = x + y;
        if (op == HVD_PRODUCT) r = x * y;
        if (op == HVD_MIN) r = y < x ? y : x;
        if (op == HVD_MAX) r = y > x ? y : x;
        const uint16_t want = to(r);
        if (std::isnan(r)) continue;  // inf - inf: any NaN will do
        ASSERT_EQ(out[i], want) << hvd_dtype_name(dtype) << " " << hvd_reduce_op_name(op) << " at "
                                << i << ": " << x << ", " << y;
        ASSERT_EQ(in_place[i], want) << "in place, at " << i;
      }
    }
  }
}

TEST(Divide, TruncatesIntegersAndDividesFloats) {
  std::vector<int32_t> ints = {7, -7, 8};
  ASSERT_EQ(hvd_divide(ints.data(), 3, HVD_INT32, 2), HVD_SUCCESS);
  EXPECT_EQ(ints, (std::vector<int32_t>{3, -3, 4}));
  std::vector<float> floats = {3, -1};
  ASSERT_EQ(hvd_divide(floats.data(), 2, HVD_FLOAT32, 4), HVD_SUCCESS);
  EXPECT_EQ(floats, (std::vector<float>{0.75f, -0.25f}));
  uint16_t half = hvd_float_to_float16(6);
  ASSERT_EQ(hvd_divide(&half, 1, HVD_FLOAT16, 3), HVD_SUCCESS);
  EXPECT_EQ(hvd_float16_to_float(half), 2.0f);
  EXPECT_EQ(hvd_divide(&half, 1, HVD_FLOAT16, 0), HVD_ERR_INVALID_ARGUMENT);
}

// The kernels work in blocks with a scalar tail: every size around a block's edge, with the
// output separate and aliasing either input, against the element-wise definition.
template <typename T, typename W>
void expect_blocks_match_the_definition(hvd_dtype dtype) {
  for (const size_t n : {0, 1, 15, 16, 17, 31, 33, 1027}) {
    std::vector<T> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(static_cast<int>(i % 23) - 11);
      b[i] = static_cast<T>(static_cast<int>(i % 7) - 3);
    }
    const hvd_reduce_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_PRODUCT, HVD_MIN, HVD_MAX};
    for (const hvd_reduce_op op : ops) {
      std::vector<T> want(n);
      for (size_t i = 0; i < n; ++i) {
        const T x = a[i], y = b[i];
        want[i] = op == HVD_PRODUCT ? static_cast<T>(static_cast<W>(x) * static_cast<W>(y))
                  : op == HVD_MIN   ? (y < x ? y : x)
                  : op == HVD_MAX   ? (y > x ? y : x)
                                    : static_cast<T>(static_cast<W>(x) + static_cast<W>(y));
      }
      std::vector<T> out(n), in_a = a, in_b = b;
      ASSERT_EQ(hvd_reduce(out.data(), a.data(), b.data(), n, dtype, op), HVD_SUCCESS);
      ASSERT_EQ(hvd_reduce(in_a.data(), in_a.data(), b.data(), n, dtype, op), HVD_SUCCESS);
      ASSERT_EQ(hvd_reduce(in_b.data(), a.data(), in_b.data(), n, dtype, op), HVD_SUCCESS);
      EXPECT_EQ(out, want) << "dtype " << dtype << " op " << op << " count " << n;
      EXPECT_EQ(in_a, want) << "out == a, dtype " << dtype << " op " << op << " count " << n;
      EXPECT_EQ(in_b, want) << "out == b, dtype " << dtype << " op " << op << " count " << n;
    }
    std::vector<T> divided = a, want(n);
    for (size_t i = 0; i < n; ++i) want[i] = static_cast<T>(a[i] / static_cast<T>(3));
    ASSERT_EQ(hvd_divide(divided.data(), n, dtype, 3), HVD_SUCCESS);
    EXPECT_EQ(divided, want) << "divide, dtype " << dtype << " count " << n;
  }
}

TEST(Reduce, BlocksAndTailsMatchTheDefinitionForEveryNativeType) {
  expect_blocks_match_the_definition<uint8_t, uint8_t>(HVD_UINT8);
  expect_blocks_match_the_definition<int8_t, uint8_t>(HVD_INT8);
  expect_blocks_match_the_definition<int32_t, uint32_t>(HVD_INT32);
  expect_blocks_match_the_definition<int64_t, uint64_t>(HVD_INT64);
  expect_blocks_match_the_definition<float, float>(HVD_FLOAT32);
  expect_blocks_match_the_definition<double, double>(HVD_FLOAT64);
}

TEST(Reduce, RejectsUnknownEnums) {
  int32_t x = 0;
  EXPECT_EQ(hvd_reduce(&x, &x, &x, 1, static_cast<hvd_dtype>(99), HVD_SUM),
            HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hvd_reduce(&x, &x, &x, 1, HVD_INT32, static_cast<hvd_reduce_op>(99)),
            HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hvd_dtype_size(99), 0u);
}

}  // namespace
