/* Prints the layout ABI 1.0 fixed: every 1.0 field of every struct of hvd's C interfaces (offset,
 * size), each struct's 1.0 size, and every enum value and capability bit of 1.0; with
 * HVD_LAYOUT_1_1, also what 1.1 appended and each struct's 1.1 size.
 *
 * Built against the frozen headers of a release (HVD_LAYOUT_FROZEN: the release's size of a
 * struct is its sizeof) and against today's (the size is its HVD_*_SIZE_1_x constant, or sizeof
 * where the struct has not grown since). The two outputs must be identical: a field moved,
 * resized or inserted before the end of the release, a renumbered value, or a wrong size constant
 * shows as a difference. Today's build also proves the public headers compile as C99 with
 * -pedantic-errors. */
#include <stddef.h>
#include <stdio.h>

#include "hvd/backend.h"
#include "hvd/hvd.h"
#include "hvd/reduce.h"

/* The frozen headers of the release printed last know its sizes only as sizeof. */
#if defined(HVD_LAYOUT_FROZEN) && !defined(HVD_LAYOUT_1_1)
#define SIZE_1_0(type, constant) sizeof(type)
#else
#define SIZE_1_0(type, constant) (constant)
#endif
#if defined(HVD_LAYOUT_FROZEN)
#define SIZE_1_1(type, constant) sizeof(type)
#else
#define SIZE_1_1(type, constant) (constant)
#endif

#define STRUCT(type, constant) printf("%s: 1.0 size %zu\n", #type, (size_t)SIZE_1_0(type, constant))
#define FIELD(type, field)                                                        \
  printf("  %s.%s: offset %zu, size %zu\n", #type, #field, offsetof(type, field), \
         sizeof(((type*)0)->field))
#define VALUE(name) printf("%s = %lld\n", #name, (long long)(name))

int main(void) {
  STRUCT(hvd_host_services, HVD_HOST_SERVICES_SIZE_1_0);
  FIELD(hvd_host_services, struct_size);
  FIELD(hvd_host_services, ctx);
  FIELD(hvd_host_services, kv_set);
  FIELD(hvd_host_services, kv_get);
  FIELD(hvd_host_services, free_value);
  FIELD(hvd_host_services, oob_allgather);
  FIELD(hvd_host_services, log);
  FIELD(hvd_host_services, set_error);

  STRUCT(hvd_backend_init_args, HVD_BACKEND_INIT_ARGS_SIZE_1_0);
  FIELD(hvd_backend_init_args, struct_size);
  FIELD(hvd_backend_init_args, rank);
  FIELD(hvd_backend_init_args, size);
  FIELD(hvd_backend_init_args, local_rank);
  FIELD(hvd_backend_init_args, local_size);
  FIELD(hvd_backend_init_args, timeout_ms);
  FIELD(hvd_backend_init_args, local_address);
  FIELD(hvd_backend_init_args, host);

  STRUCT(hvd_collective_args, HVD_COLLECTIVE_ARGS_SIZE_1_0);
  FIELD(hvd_collective_args, struct_size);
  FIELD(hvd_collective_args, sendbuf);
  FIELD(hvd_collective_args, recvbuf);
  FIELD(hvd_collective_args, count);
  FIELD(hvd_collective_args, dtype);
  FIELD(hvd_collective_args, op);
  FIELD(hvd_collective_args, root);
  FIELD(hvd_collective_args, recv_counts);
  FIELD(hvd_collective_args, memory_type);
  FIELD(hvd_collective_args, device);
  FIELD(hvd_collective_args, stream);

  STRUCT(hvd_backend_v1, HVD_BACKEND_V1_SIZE_1_0);
  FIELD(hvd_backend_v1, struct_size);
  FIELD(hvd_backend_v1, abi_major);
  FIELD(hvd_backend_v1, abi_minor);
  FIELD(hvd_backend_v1, name);
  FIELD(hvd_backend_v1, version);
  FIELD(hvd_backend_v1, description);
  FIELD(hvd_backend_v1, capabilities);
  FIELD(hvd_backend_v1, init);
  FIELD(hvd_backend_v1, finalize);
  FIELD(hvd_backend_v1, allreduce);
  FIELD(hvd_backend_v1, allgather);
  FIELD(hvd_backend_v1, broadcast);
  FIELD(hvd_backend_v1, barrier);
  FIELD(hvd_backend_v1, reduce_scatter);

  STRUCT(hvd_init_options, HVD_INIT_OPTIONS_SIZE_1_0);
  FIELD(hvd_init_options, struct_size);
  FIELD(hvd_init_options, backend);
  FIELD(hvd_init_options, timeout_seconds);

  STRUCT(hvd_placement, HVD_PLACEMENT_SIZE_1_0);
  FIELD(hvd_placement, struct_size);
  FIELD(hvd_placement, memory_type);
  FIELD(hvd_placement, device);
  FIELD(hvd_placement, stream);

  STRUCT(hvd_tensor, HVD_TENSOR_SIZE_1_0);
  FIELD(hvd_tensor, struct_size);
  FIELD(hvd_tensor, collective);
  FIELD(hvd_tensor, name);
  FIELD(hvd_tensor, sendbuf);
  FIELD(hvd_tensor, recvbuf);
  FIELD(hvd_tensor, dtype);
  FIELD(hvd_tensor, ndim);
  FIELD(hvd_tensor, shape);
  FIELD(hvd_tensor, op);
  FIELD(hvd_tensor, root);
  FIELD(hvd_tensor, prescale);
  FIELD(hvd_tensor, postscale);
  FIELD(hvd_tensor, placement);

  STRUCT(hvd_scheduler_stats, HVD_SCHEDULER_STATS_SIZE_1_0);
  FIELD(hvd_scheduler_stats, struct_size);
  FIELD(hvd_scheduler_stats, cycles);
  FIELD(hvd_scheduler_stats, full_negotiations);
  FIELD(hvd_scheduler_stats, negotiation_seconds);
  FIELD(hvd_scheduler_stats, tensors);
  FIELD(hvd_scheduler_stats, backend_calls);

  VALUE(sizeof(hvd_status));
  VALUE(sizeof(hvd_dtype));
  VALUE(sizeof(hvd_reduce_op));
  VALUE(sizeof(hvd_memory_type));
  VALUE(sizeof(hvd_log_level));
  VALUE(sizeof(hvd_collective));
  VALUE(HVD_SUCCESS);
  VALUE(HVD_ERR_INVALID_ARGUMENT);
  VALUE(HVD_ERR_UNSUPPORTED);
  VALUE(HVD_ERR_TIMEOUT);
  VALUE(HVD_ERR_REMOTE);
  VALUE(HVD_ERR_MISMATCH);
  VALUE(HVD_ERR_NOT_FOUND);
  VALUE(HVD_ERR_PLUGIN);
  VALUE(HVD_ERR_SYSTEM);
  VALUE(HVD_ERR_INTERNAL);
  VALUE(HVD_ERR_STATE);
  VALUE(HVD_ERR_IN_PROGRESS);
  VALUE(HVD_UINT8);
  VALUE(HVD_INT8);
  VALUE(HVD_INT32);
  VALUE(HVD_INT64);
  VALUE(HVD_FLOAT16);
  VALUE(HVD_BFLOAT16);
  VALUE(HVD_FLOAT32);
  VALUE(HVD_FLOAT64);
  VALUE(HVD_SUM);
  VALUE(HVD_AVERAGE);
  VALUE(HVD_MIN);
  VALUE(HVD_MAX);
  VALUE(HVD_PRODUCT);
  VALUE(HVD_MEMORY_HOST);
  VALUE(HVD_MEMORY_CUDA);
  VALUE(HVD_LOG_ERROR);
  VALUE(HVD_LOG_WARNING);
  VALUE(HVD_LOG_INFO);
  VALUE(HVD_LOG_DEBUG);
  VALUE(HVD_COLLECTIVE_ALLREDUCE);
  VALUE(HVD_COLLECTIVE_ALLGATHER);
  VALUE(HVD_COLLECTIVE_BROADCAST);
  VALUE(HVD_CAP_HOST_MEMORY);
  VALUE(HVD_CAP_CUDA_MEMORY);
  VALUE(HVD_CAP_ALLGATHERV);
  VALUE(HVD_CAP_REDUCE_SCATTER);
  VALUE(HVD_CAP_SELF_BOOTSTRAP);
  VALUE(HVD_BACKEND_ABI_MAJOR);
#ifdef HVD_LAYOUT_1_1
  printf("%s: 1.1 size %zu\n", "hvd_backend_init_args", sizeof(hvd_backend_init_args));
  FIELD(hvd_backend_init_args, members);
  FIELD(hvd_backend_init_args, member_count);
  FIELD(hvd_backend_init_args, comm_id);
  FIELD(hvd_backend_init_args, member_local_rank);
  FIELD(hvd_backend_init_args, member_local_size);
  printf("%s: 1.1 size %zu\n", "hvd_collective_args",
         (size_t)SIZE_1_1(hvd_collective_args, HVD_COLLECTIVE_ARGS_SIZE_1_1));
  FIELD(hvd_collective_args, send_counts);
  printf("%s: 1.1 size %zu\n", "hvd_backend_v1",
         (size_t)SIZE_1_1(hvd_backend_v1, HVD_BACKEND_V1_SIZE_1_1));
  FIELD(hvd_backend_v1, dtypes);
  FIELD(hvd_backend_v1, reduce_ops);
  FIELD(hvd_backend_v1, split);
  FIELD(hvd_backend_v1, abort);
  FIELD(hvd_backend_v1, alltoall);
  printf("%s: 1.1 size %zu\n", "hvd_tensor", sizeof(hvd_tensor));
  FIELD(hvd_tensor, splits);
  printf("%s: 1.1 size %zu\n", "hvd_scheduler_stats", sizeof(hvd_scheduler_stats));
  printf("%s: 1.1 size %zu\n", "hvd_host_services", sizeof(hvd_host_services));
  printf("%s: 1.1 size %zu\n", "hvd_init_options", sizeof(hvd_init_options));
  printf("%s: 1.1 size %zu\n", "hvd_placement", sizeof(hvd_placement));
  VALUE(HVD_COLLECTIVE_REDUCE_SCATTER);
  VALUE(HVD_COLLECTIVE_ALLTOALL);
  VALUE(HVD_DTYPES_1_0);
  VALUE(HVD_REDUCE_OPS_1_0);
  VALUE(HVD_DTYPE_BIT(HVD_FLOAT64));
  VALUE(HVD_REDUCE_OP_BIT(HVD_PRODUCT));
  VALUE(HVD_COLOR_NONE);
#endif
  return 0;
}
