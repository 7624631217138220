// call_checks.hpp — what every collective is checked for before it runs, wherever it enters (a
// blocking call on a communicator, a tensor submitted to the scheduler): the enums it reads in
// range and its root a rank. One place, one wording.
#ifndef HVD_CORE_COMMON_CALL_CHECKS_HPP
#define HVD_CORE_COMMON_CALL_CHECKS_HPP

#include <string>

#include "hvd/types.h"

namespace hvd::core {

// Why a call of `kind` with these fields cannot run on `size` ranks, or empty. Only the fields
// the collective reads are checked: an allgather's op is never looked at.
inline std::string call_problem(hvd_collective kind, int dtype, int op, int root, int memory,
                                int size) {
  if (hvd_dtype_size(dtype) == 0) return "dtype " + std::to_string(dtype) + " is not an hvd_dtype";
  if (hvd_collective_reduces(kind) && (op < 0 || op >= HVD_REDUCE_OP_COUNT)) {
    return "reduce op " + std::to_string(op) + " is not an hvd_reduce_op";
  }
  if (kind == HVD_COLLECTIVE_BROADCAST && (root < 0 || root >= size)) {
    return "root " + std::to_string(root) + " is not a rank of this job of " + std::to_string(size);
  }
  if (memory != HVD_MEMORY_HOST && memory != HVD_MEMORY_CUDA) {
    return "memory type " + std::to_string(memory) + " is not an hvd_memory_type";
  }
  return {};
}

}  // namespace hvd::core

#endif  // HVD_CORE_COMMON_CALL_CHECKS_HPP
