// NCCL's data types and reduction ops for hvd's enums, shared by the nccl plugin and hvd-bench's
// direct baseline (target hvd_nccl_types). The host passes only the dtypes and ops the plugin
// declares, all of which NCCL has.
#ifndef HVD_PLUGINS_NCCL_TYPES_HPP
#define HVD_PLUGINS_NCCL_TYPES_HPP

#include <nccl.h>

#include "hvd/types.h"

namespace hvd::nccl {

inline ncclDataType_t data_type(hvd_dtype dtype) {
  switch (dtype) {
    case HVD_UINT8:
      return ncclUint8;
    case HVD_INT8:
      return ncclInt8;
    case HVD_INT32:
      return ncclInt32;
    case HVD_INT64:
      return ncclInt64;
    case HVD_FLOAT16:
      return ncclFloat16;
    case HVD_BFLOAT16:
      return ncclBfloat16;
    case HVD_FLOAT32:
      return ncclFloat32;
    default:
      return ncclFloat64;
  }
}

// HVD_AVERAGE is ncclAvg: for integers the sum divided once, truncated (NCCL's SumPostDiv); for
// floating types NCCL premultiplies by 1/n (docs/gpu.md).
inline ncclRedOp_t reduce_op(hvd_reduce_op op) {
  switch (op) {
    case HVD_AVERAGE:
      return ncclAvg;
    case HVD_MIN:
      return ncclMin;
    case HVD_MAX:
      return ncclMax;
    case HVD_PRODUCT:
      return ncclProd;
    default:
      return ncclSum;
  }
}

}  // namespace hvd::nccl

#endif  // HVD_PLUGINS_NCCL_TYPES_HPP
