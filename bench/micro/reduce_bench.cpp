// The SDK's reduction kernels (hvd/reduce.h) in GB/s of output, beside memcpy of the same bytes
// in the same process: "vs_memcpy" is the kernel's rate over memcpy's.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "hvd/reduce.h"
#include "limits.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void BM_memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> from(bytes, 1), to(bytes, 0);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_memcpy)->Arg(256 << 10)->Arg(16 << 20);

// Gradient-like values: normal numbers in every floating type (zeros would take the 16-bit
// conversions' rare subnormal path), small integers otherwise.
std::vector<char> sample_data(hvd_dtype dtype, size_t count, int seed) {
  std::vector<char> data(count * hvd_dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float v = 0.25f + static_cast<float>((i * 7 + static_cast<size_t>(seed)) % 13);
    switch (dtype) {
      case HVD_FLOAT16:
        reinterpret_cast<uint16_t*>(data.data())[i] = hvd_float_to_float16(v);
        break;
      case HVD_BFLOAT16:
        reinterpret_cast<uint16_t*>(data.data())[i] = hvd_float_to_bfloat16(v);
        break;
      case HVD_FLOAT32:
        reinterpret_cast<float*>(data.data())[i] = v;
        break;
      case HVD_FLOAT64:
        reinterpret_cast<double*>(data.data())[i] = v;
        break;
      default:
        data[i * hvd_dtype_size(dtype)] = static_cast<char>(v);
    }
  }
  return data;
}

// out = a (op) b over `bytes` of output, as a backend's reduction step does.
void BM_reduce(benchmark::State& state, hvd_dtype dtype, hvd_reduce_op op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / hvd_dtype_size(dtype);
  std::vector<char> a = sample_data(dtype, count, 1), b = sample_data(dtype, count, 2);
  std::vector<char> out(bytes, 0);
  const double yardstick = hvd::bench::memcpy_gbps(bytes, 20);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    hvd_reduce(out.data(), a.data(), b.data(), count, dtype, op);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["vs_memcpy"] = (state.iterations() * bytes / seconds / 1e9) / yardstick;
}

// Every dtype x op, at an in-cache and an out-of-cache size.
const bool registered = [] {
  for (int d = 0; d < HVD_DTYPE_COUNT; ++d) {
    for (int o = 0; o < HVD_REDUCE_OP_COUNT; ++o) {
      const auto dtype = static_cast<hvd_dtype>(d);
      const auto op = static_cast<hvd_reduce_op>(o);
      const std::string name =
          std::string("BM_reduce/") + hvd_dtype_name(dtype) + "/" + hvd_reduce_op_name(op);
      benchmark::RegisterBenchmark(name.c_str(), BM_reduce, dtype, op)
          ->Arg(256 << 10)
          ->Arg(16 << 20);
    }
  }
  return true;
}();

}  // namespace
