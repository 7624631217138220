// hvd's element types and reduce ops as MPI's built-ins. Shared by the mpi backend and by
// hvd-bench's MPI baseline, which must call MPI the way the backend does.
#ifndef HVD_PLUGINS_MPI_TYPES_HPP
#define HVD_PLUGINS_MPI_TYPES_HPP

#include <mpi.h>

#include "hvd/types.h"

namespace hvd::mpi {

// MPI_DATATYPE_NULL for float16 and bfloat16, which MPI lacks.
inline MPI_Datatype builtin_type(hvd_dtype dtype) {
  switch (dtype) {
    case HVD_UINT8:
      return MPI_UINT8_T;
    case HVD_INT8:
      return MPI_INT8_T;
    case HVD_INT32:
      return MPI_INT32_T;
    case HVD_INT64:
      return MPI_INT64_T;
    case HVD_FLOAT32:
      return MPI_FLOAT;
    case HVD_FLOAT64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

// MPI_OP_NULL for average, which MPI lacks (it is a sum, then a division).
inline MPI_Op builtin_op(hvd_reduce_op op) {
  switch (op) {
    case HVD_SUM:
      return MPI_SUM;
    case HVD_MIN:
      return MPI_MIN;
    case HVD_MAX:
      return MPI_MAX;
    case HVD_PRODUCT:
      return MPI_PROD;
    default:
      return MPI_OP_NULL;
  }
}

}  // namespace hvd::mpi

#endif  // HVD_PLUGINS_MPI_TYPES_HPP
