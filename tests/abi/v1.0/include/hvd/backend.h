/* hvd/backend.h — the backend plugin ABI, version 1.
 *
 * A backend plugin is a shared library named libhvd-backend-<name>.so that exports exactly one
 * symbol, the entry function
 *
 *     const hvd_backend_v1* hvd_backend_entry_v1(void);
 *
 * which returns a pointer to a table that lives as long as the library stays loaded (hvd never
 * unloads a plugin). The full contract — versioning, threading, lifetime, error reporting — is
 * docs/plugin-abi.md; the comments here are the summary a plugin author needs at hand.
 *
 * C99, no dependencies. Every struct starts with `struct_size`: minor versions only append
 * fields, so a reader checks struct_size before touching a field newer than 1.0. */
#ifndef HVD_BACKEND_H
#define HVD_BACKEND_H

#include "hvd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HVD_BACKEND_ABI_MAJOR 1
#define HVD_BACKEND_ABI_MINOR 0
#define HVD_BACKEND_ENTRY_SYMBOL "hvd_backend_entry_v1"
#define HVD_BACKEND_FILE_PREFIX "libhvd-backend-"
#define HVD_BACKEND_FILE_SUFFIX ".so"

#if defined(__GNUC__)
#define HVD_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define HVD_PLUGIN_EXPORT
#endif

/* Services the host hands a plugin at init. `ctx` is passed back as the first argument of every
 * callback. The table and ctx stay valid until the plugin's finalize returns. Every callback is
 * thread-safe. Keys are private to one communicator: the host prefixes them, so two backends (or
 * two communicators of one backend) never see each other's keys. */
typedef struct hvd_host_services {
  size_t struct_size;
  void* ctx;

  /* Publish `size` bytes under `key` in the job's rendezvous store; a later set replaces. */
  hvd_status (*kv_set)(void* ctx, const char* key, const void* value, size_t size);

  /* Wait up to timeout_ms for `key` to exist, then return a copy of its value in *value (size in
   * *size), allocated by the host: release it with free_value. HVD_ERR_TIMEOUT if it never came. */
  hvd_status (*kv_get)(void* ctx, const char* key, int64_t timeout_ms, void** value, size_t* size);
  void (*free_value)(void* ctx, void* value);

  /* Out-of-band allgather over the rendezvous store: every rank contributes `size` bytes (the
   * same size on every rank) and receives size * world_size bytes in rank order. Collective:
   * every rank must call it the same number of times in the same order. For bootstrap data
   * (NCCL unique ids, fabric addresses), not for payloads. */
  hvd_status (*oob_allgather)(void* ctx, const void* send, size_t size, void* recv,
                              int64_t timeout_ms);

  /* Log a line through hvd's logger (HVD_LOG_LEVEL decides what is shown). */
  void (*log)(void* ctx, hvd_log_level level, const char* message);

  /* Attach a message to the error status the current call is about to return. Call it on the
   * thread that made the call, before returning; the host copies the string. */
  void (*set_error)(void* ctx, const char* message);
} hvd_host_services;

/* What a plugin is told when a communicator is created. */
typedef struct hvd_backend_init_args {
  size_t struct_size;
  int32_t rank;       /* 0 <= rank < size */
  int32_t size;       /* number of ranks in the job */
  int32_t local_rank; /* rank among the processes on this host */
  int32_t local_size;
  int64_t timeout_ms;        /* bound every wait by this (HVD_TIMEOUT) */
  const char* local_address; /* this host's address as its peers can reach it; "" if unknown */
  const hvd_host_services* host;
} hvd_backend_init_args;

/* One collective call. The host validates every field before the call reaches the plugin:
 * enums are in range, root is in [0, size), buffers are non-null when count > 0.
 *
 *   allreduce       sendbuf[count] -> recvbuf[count], reduced with `op` over all ranks
 *   allgather       sendbuf[count] -> recvbuf[count * size] in rank order; with recv_counts
 *                   (HVD_CAP_ALLGATHERV) rank r contributes recv_counts[r] elements, packed
 *   broadcast       root's sendbuf[count] -> every rank's recvbuf[count] (sendbuf is ignored on
 *                   other ranks)
 *   reduce_scatter  sendbuf[count * size] -> recvbuf[count]: this rank's block of the reduction
 *
 * In place: sendbuf == recvbuf, except allgather where it is sendbuf == recvbuf + this rank's
 * offset (the NCCL/MPI convention). Buffers must not otherwise overlap. */
typedef struct hvd_collective_args {
  size_t struct_size;
  const void* sendbuf;
  void* recvbuf;
  uint64_t count; /* elements contributed by this rank */
  hvd_dtype dtype;
  hvd_reduce_op op;            /* allreduce, reduce_scatter */
  int32_t root;                /* broadcast */
  const uint64_t* recv_counts; /* allgather: NULL, or `size` per-rank element counts */
  hvd_memory_type memory_type; /* of both buffers */
  int32_t device;              /* CUDA device ordinal for HVD_MEMORY_CUDA, else -1 */
  void* stream; /* cudaStream_t for HVD_MEMORY_CUDA: the call is ordered on it and may return
                   before it completes; for host memory NULL, and the call is blocking */
} hvd_collective_args;

/* A plugin's communicator: opaque to the host. */
typedef struct hvd_backend_comm hvd_backend_comm;

/* The backend table. Every function returns HVD_SUCCESS or an error status, after calling
 * host->set_error with a message. No C++ exception may leave any of them. */
typedef struct hvd_backend_v1 {
  size_t struct_size; /* sizeof(hvd_backend_v1) as the plugin was compiled */
  uint32_t abi_major; /* HVD_BACKEND_ABI_MAJOR the plugin was compiled against */
  uint32_t abi_minor;
  const char* name;        /* short name, the <name> of libhvd-backend-<name>.so */
  const char* version;     /* the plugin's own version, free form ("1.2.0 (gloo 2022-05-18)") */
  const char* description; /* one line for hvd-info */
  uint64_t capabilities;   /* HVD_CAP_* bits */

  /* Create a communicator over all ranks of the job. Collective: every rank calls it. */
  hvd_status (*init)(const hvd_backend_init_args* args, hvd_backend_comm** comm);
  /* Release everything init made. Called once per successful init, on every rank. */
  hvd_status (*finalize)(hvd_backend_comm* comm);

  hvd_status (*allreduce)(hvd_backend_comm* comm, const hvd_collective_args* args);
  hvd_status (*allgather)(hvd_backend_comm* comm, const hvd_collective_args* args);
  hvd_status (*broadcast)(hvd_backend_comm* comm, const hvd_collective_args* args);
  hvd_status (*barrier)(hvd_backend_comm* comm);
  /* Optional: NULL unless HVD_CAP_REDUCE_SCATTER. */
  hvd_status (*reduce_scatter)(hvd_backend_comm* comm, const hvd_collective_args* args);
} hvd_backend_v1;

typedef const hvd_backend_v1* (*hvd_backend_entry_v1_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* HVD_BACKEND_H */
