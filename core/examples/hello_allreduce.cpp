// hello_allreduce: the smallest real hvd job. Each rank contributes (rank + 1) in every element;
// after an allreduce every rank holds 1 + 2 + ... + size, and rank 0 says what happened.
//
//   hvdrun -np 2 hello_allreduce [elements]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "hvd/hvd.hpp"

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (1u << 20);
  auto comm = hvd::Comm::init();
  if (!comm) {
    std::fprintf(stderr, "hvd init failed: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  std::vector<float> data(n, static_cast<float>(comm->rank() + 1));
  if (hvd::Status s = comm->allreduce(data.data(), data.data(), n, HVD_SUM); !s.ok()) {
    std::fprintf(stderr, "allreduce failed: %s\n", s.to_string().c_str());
    return 1;
  }
  const int size = comm->size();
  const float expected = static_cast<float>(size * (size + 1) / 2);
  size_t wrong = 0;
  for (float v : data) wrong += v != expected;
  std::printf("rank %d of %d: allreduce(sum) of %zu float32 over '%s': every element %s %g\n",
              comm->rank(), size, n, comm->backend().c_str(), wrong == 0 ? "is" : "is NOT",
              static_cast<double>(expected));
  return wrong == 0 ? 0 : 1;
}
