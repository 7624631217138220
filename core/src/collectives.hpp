// collectives.hpp — what runs a collective: a Communicator (one live backend), or a test's fake.
#ifndef HVD_CORE_COLLECTIVES_HPP
#define HVD_CORE_COLLECTIVES_HPP

#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // args.struct_size set; blocking for host memory, as the plugin ABI.
  virtual Status allreduce(const hvd_collective_args& args) = 0;
  virtual Status allgather(const hvd_collective_args& args) = 0;
  virtual Status broadcast(const hvd_collective_args& args) = 0;
};

}  // namespace hvd::core

#endif  // HVD_CORE_COLLECTIVES_HPP
