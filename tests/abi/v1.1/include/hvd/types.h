/* hvd/types.h — the vocabulary shared by the public API (hvd.h) and the backend ABI (backend.h).
 *
 * C99, no dependencies. Every enum value below is part of the stable ABI: values are never
 * renumbered or reused; new ones are appended (see docs/plugin-abi.md). A reader never acts on
 * an enum value it does not know: the host rejects it before any plugin sees it, and passes a
 * plugin only the dtypes and reduce ops that plugin declared. */
#ifndef HVD_TYPES_H
#define HVD_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How structs evolve. Every struct of hvd's C interfaces begins with `size_t struct_size`, which
 * its writer sets to sizeof the struct as it was compiled. Minor versions only append fields.
 * A reader accepts any struct_size of at least the struct's 1.0 size (each struct has a named
 * constant, HVD_<STRUCT>_SIZE_1_0) and reads a field newer than 1.0 only where the writer's
 * struct_size covers it:
 *
 *     if (HVD_HAS_FIELD(args, hvd_backend_init_args, comm_id)) id = args->comm_id;
 *
 * A field the writer did not know takes the default its comment names. */
#define HVD_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))
#define HVD_HAS_FIELD(ptr, type, field) ((ptr)->struct_size >= HVD_FIELD_END(type, field))

/* Every enum carries two sentinels that are not values: they pin it to 32 signed bits, so its
 * size is fixed in the ABI and any int32 a C caller passes is a representable (and then
 * validated) value in C++ too. */
#define HVD_ENUM_RANGE(prefix) prefix##ENUM_MIN_ = -0x7fffffff - 1, prefix##ENUM_MAX_ = 0x7fffffff

/* Status codes. HVD_SUCCESS is 0; every other value is an error whose message is available
 * through the channel of the boundary that returned it (hvd_last_error() for the public API,
 * hvd_host_services.set_error for plugins). */
typedef enum hvd_status {
  HVD_SUCCESS = 0,
  HVD_ERR_INVALID_ARGUMENT = 1, /* the caller passed something malformed (null buffer, bad enum) */
  HVD_ERR_UNSUPPORTED = 2,      /* well-formed, but this backend cannot do it (dtype, memory) */
  HVD_ERR_TIMEOUT = 3,          /* a wait ran past its timeout (HVD_TIMEOUT) */
  HVD_ERR_REMOTE = 4,           /* a peer failed or vanished; the communicator is unusable */
  HVD_ERR_MISMATCH = 5,         /* ranks disagree (backend, ABI version, shape, dtype, root) */
  HVD_ERR_NOT_FOUND = 6,        /* a named thing does not exist (backend, plugin file, key) */
  HVD_ERR_PLUGIN = 7,           /* a file is not a usable plugin (not loadable, no entry, ABI) */
  HVD_ERR_SYSTEM = 8,           /* the operating system or a library refused (socket, memory) */
  HVD_ERR_INTERNAL = 9,         /* a bug: an invariant broke or an unexpected exception escaped */
  HVD_ERR_STATE = 10,           /* the call is not valid now (finalized communicator, ...) */
  HVD_ERR_IN_PROGRESS = 11,     /* an asynchronous operation has not completed yet */
  HVD_ENUM_RANGE(HVD_STATUS_)
} hvd_status;

/* Element types. Sizes: hvd_dtype_size(). */
typedef enum hvd_dtype {
  HVD_UINT8 = 0,
  HVD_INT8 = 1,
  HVD_INT32 = 2,
  HVD_INT64 = 3,
  HVD_FLOAT16 = 4,  /* IEEE 754 binary16 */
  HVD_BFLOAT16 = 5, /* the upper 16 bits of a binary32 */
  HVD_FLOAT32 = 6,
  HVD_FLOAT64 = 7,
  HVD_ENUM_RANGE(HVD_DTYPE_)
} hvd_dtype;
#define HVD_DTYPE_COUNT 8
/* A set of dtypes, as a bit mask (hvd_backend_v1.dtypes, hvd_backend_dtypes()). */
#define HVD_DTYPE_BIT(dtype) (1ull << (dtype))
#define HVD_DTYPES_1_0 0xffull /* the eight dtypes of ABI 1.0, uint8 to float64 */

/* Reduction operators. AVERAGE is SUM divided by the number of ranks; for integer types the
 * division truncates toward zero, as C's integer division does. */
typedef enum hvd_reduce_op {
  HVD_SUM = 0,
  HVD_AVERAGE = 1,
  HVD_MIN = 2,
  HVD_MAX = 3,
  HVD_PRODUCT = 4,
  HVD_ENUM_RANGE(HVD_REDUCE_OP_)
} hvd_reduce_op;
#define HVD_REDUCE_OP_COUNT 5
/* A set of reduce ops, as a bit mask (hvd_backend_v1.reduce_ops, hvd_backend_reduce_ops()). */
#define HVD_REDUCE_OP_BIT(op) (1ull << (op))
#define HVD_REDUCE_OPS_1_0 0x1full /* the five ops of ABI 1.0, sum to product */

/* Where a buffer lives. */
typedef enum hvd_memory_type {
  HVD_MEMORY_HOST = 0, /* pageable or pinned host memory */
  HVD_MEMORY_CUDA = 1, /* CUDA device memory on the device named by the accompanying id */
  HVD_ENUM_RANGE(HVD_MEMORY_)
} hvd_memory_type;

typedef enum hvd_log_level {
  HVD_LOG_ERROR = 0,
  HVD_LOG_WARNING = 1,
  HVD_LOG_INFO = 2,
  HVD_LOG_DEBUG = 3,
  HVD_ENUM_RANGE(HVD_LOG_)
} hvd_log_level;

/* Capability bits of a backend (hvd_backend_v1.capabilities, hvd_backend_capabilities()). */
#define HVD_CAP_HOST_MEMORY (1ull << 0)    /* buffers in HVD_MEMORY_HOST */
#define HVD_CAP_CUDA_MEMORY (1ull << 1)    /* buffers in HVD_MEMORY_CUDA, stream-ordered */
#define HVD_CAP_ALLGATHERV (1ull << 2)     /* allgather honours recv_counts */
#define HVD_CAP_REDUCE_SCATTER (1ull << 3) /* the reduce_scatter entry is set */
#define HVD_CAP_SELF_BOOTSTRAP                                    \
  (1ull << 4) /* finds its peers itself (MPI under mpirun): a job \
                 of several ranks needs no rendezvous */

/* Size in bytes of one element of `dtype`, or 0 when `dtype` is not a valid hvd_dtype. */
static inline size_t hvd_dtype_size(int dtype) {
  switch (dtype) {
    case HVD_UINT8:
    case HVD_INT8:
      return 1;
    case HVD_FLOAT16:
    case HVD_BFLOAT16:
      return 2;
    case HVD_INT32:
    case HVD_FLOAT32:
      return 4;
    case HVD_INT64:
    case HVD_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

/* Lower-case names used in messages and tables ("float32", "sum", ...); "?" for unknown. */
static inline const char* hvd_dtype_name(int dtype) {
  static const char* const names[HVD_DTYPE_COUNT] = {"uint8",   "int8",     "int32",   "int64",
                                                     "float16", "bfloat16", "float32", "float64"};
  return (dtype >= 0 && dtype < HVD_DTYPE_COUNT) ? names[dtype] : "?";
}

static inline const char* hvd_reduce_op_name(int op) {
  static const char* const names[HVD_REDUCE_OP_COUNT] = {"sum", "avg", "min", "max", "prod"};
  return (op >= 0 && op < HVD_REDUCE_OP_COUNT) ? names[op] : "?";
}

static inline const char* hvd_status_name(int status) {
  switch (status) {
    case HVD_SUCCESS:
      return "success";
    case HVD_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case HVD_ERR_UNSUPPORTED:
      return "unsupported";
    case HVD_ERR_TIMEOUT:
      return "timeout";
    case HVD_ERR_REMOTE:
      return "remote failure";
    case HVD_ERR_MISMATCH:
      return "mismatch between ranks";
    case HVD_ERR_NOT_FOUND:
      return "not found";
    case HVD_ERR_PLUGIN:
      return "plugin error";
    case HVD_ERR_SYSTEM:
      return "system error";
    case HVD_ERR_INTERNAL:
      return "internal error";
    case HVD_ERR_STATE:
      return "invalid state";
    case HVD_ERR_IN_PROGRESS:
      return "in progress";
    default:
      return "unknown status";
  }
}

#ifdef __cplusplus
}
#endif

#endif /* HVD_TYPES_H */
