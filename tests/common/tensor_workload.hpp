// A random workload of named tensors, the same on every rank (seeded alike): shapes, dtypes,
// collectives and ops, integer-valued data that every reduction order gets exactly, and the
// result each rank must see. Shared by the scheduler's unit tests and its multi-process job.
#ifndef HVD_TESTS_TENSOR_WORKLOAD_HPP
#define HVD_TESTS_TENSOR_WORKLOAD_HPP

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hvd/hvd.h"
#include "hvd/reduce.h"

namespace hvd::testing {

// One tensor of the random workload: the same on every rank (seeded alike), data per rank.
struct Tensor {
  std::string name;
  hvd_collective collective;  // allreduce, allgather or broadcast
  hvd_dtype dtype;
  std::vector<int64_t> shape;
  hvd_reduce_op op;
  int root;
  uint64_t elements() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

inline std::vector<Tensor> random_tensors(int count, int size, uint32_t seed) {
  std::mt19937 rng(seed);
  const hvd_dtype dtypes[] = {HVD_INT32, HVD_INT64, HVD_FLOAT32, HVD_FLOAT64, HVD_UINT8};
  const hvd_reduce_op ops[] = {HVD_SUM, HVD_MIN, HVD_MAX, HVD_PRODUCT};
  std::vector<Tensor> out;
  for (int i = 0; i < count; ++i) {
    Tensor t;
    t.name = "t" + std::to_string(i);
    t.collective = static_cast<hvd_collective>(rng() % 3);
    t.dtype = dtypes[rng() % 5];
    const int ndim = static_cast<int>(rng() % 3);
    for (int d = 0; d < ndim; ++d) t.shape.push_back(static_cast<int64_t>(rng() % 7));  // 0..6
    t.op = ops[rng() % 4];
    t.root = static_cast<int>(rng() % static_cast<uint32_t>(size));
    out.push_back(t);
  }
  return out;
}

// A small integer for element i of rank r's input: exact under every op and order.
inline int64_t input(const Tensor& t, int rank, uint64_t i) {
  if (t.op == HVD_PRODUCT && t.collective == HVD_COLLECTIVE_ALLREDUCE)
    return (i + static_cast<uint64_t>(rank)) % 3 == 0 ? 2 : 1;
  return static_cast<int64_t>((i * 7 + static_cast<uint64_t>(rank) * 3) % 11);
}

inline void store(std::vector<char>& buf, hvd_dtype dtype, uint64_t i, int64_t v) {
  switch (dtype) {
    case HVD_UINT8:
      reinterpret_cast<uint8_t*>(buf.data())[i] = static_cast<uint8_t>(v);
      break;
    case HVD_INT32:
      reinterpret_cast<int32_t*>(buf.data())[i] = static_cast<int32_t>(v);
      break;
    case HVD_INT64:
      reinterpret_cast<int64_t*>(buf.data())[i] = v;
      break;
    case HVD_FLOAT32:
      reinterpret_cast<float*>(buf.data())[i] = static_cast<float>(v);
      break;
    default:
      reinterpret_cast<double*>(buf.data())[i] = static_cast<double>(v);
      break;
  }
}

// Rank `rank`'s input and the result every rank must get.
inline std::pair<std::vector<char>, std::vector<char>> data_for(const Tensor& t, int rank,
                                                                int size) {
  const size_t element = hvd_dtype_size(t.dtype);
  const uint64_t n = t.elements();
  std::vector<char> in(n * element), want;
  for (uint64_t i = 0; i < n; ++i) store(in, t.dtype, i, input(t, rank, i));
  if (t.collective == HVD_COLLECTIVE_ALLGATHER) {
    want.resize(n * element * static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      std::vector<char> part(n * element);
      for (uint64_t i = 0; i < n; ++i) store(part, t.dtype, i, input(t, r, i));
      std::copy(part.begin(), part.end(), want.begin() + static_cast<ptrdiff_t>(part.size()) * r);
    }
  } else if (t.collective == HVD_COLLECTIVE_BROADCAST) {
    want.resize(n * element);
    for (uint64_t i = 0; i < n; ++i) store(want, t.dtype, i, input(t, t.root, i));
  } else {
    want.resize(n * element);
    for (uint64_t i = 0; i < n; ++i) store(want, t.dtype, i, input(t, 0, i));
    std::vector<char> other(n * element);
    for (int r = 1; r < size; ++r) {
      for (uint64_t i = 0; i < n; ++i) store(other, t.dtype, i, input(t, r, i));
      hvd_reduce(want.data(), want.data(), other.data(), n, t.dtype, t.op);
    }
  }
  return {in, want};
}

}  // namespace hvd::testing

#endif  // HVD_TESTS_TENSOR_WORKLOAD_HPP
