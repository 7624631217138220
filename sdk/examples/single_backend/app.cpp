// Runs one allreduce on whatever backend HVD_BACKEND names and prints the backend and result.
#include <cstdio>

#include "hvd/hvd.hpp"

int main() {
  auto comm = hvd::Comm::init();
  if (!comm) {
    std::fprintf(stderr, "init failed: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  int32_t value = comm->rank() + 1;
  if (hvd::Status s = comm->allreduce(&value, &value, 1, HVD_SUM); !s.ok()) {
    std::fprintf(stderr, "allreduce failed: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("rank %d: backend %s, allreduce = %d\n", comm->rank(), comm->backend().c_str(),
              value);
  return 0;
}
