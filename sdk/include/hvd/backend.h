/* hvd/backend.h — the backend plugin ABI, version 1.2.
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
 * fields, and a reader touches a field newer than 1.0 only where struct_size covers it
 * (HVD_HAS_FIELD in types.h). Fields appended by 1.1 and 1.2 are marked so; each names its
 * default, which is what a reader assumes when the writer's struct_size does not cover it. */
#ifndef HVD_BACKEND_H
#define HVD_BACKEND_H

#include "hvd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HVD_BACKEND_ABI_MAJOR 1
#define HVD_BACKEND_ABI_MINOR 2
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

  /* Out-of-band allgather over the rendezvous store: every rank of the communicator contributes
   * `size` bytes (the same size on every rank) and receives size * communicator size bytes in
   * rank order. Collective: every rank must call it the same number of times in the same order.
   * For bootstrap data (NCCL unique ids, fabric addresses), not for payloads. */
  hvd_status (*oob_allgather)(void* ctx, const void* send, size_t size, void* recv,
                              int64_t timeout_ms);

  /* Log a line through hvd's logger (HVD_LOG_LEVEL decides what is shown). */
  void (*log)(void* ctx, hvd_log_level level, const char* message);

  /* Attach a message to the error status the current call is about to return. Call it on the
   * thread that made the call, before returning; the host copies the string. */
  void (*set_error)(void* ctx, const char* message);
} hvd_host_services;
#define HVD_HOST_SERVICES_SIZE_1_0 HVD_FIELD_END(hvd_host_services, set_error)

/* What a plugin is told when a communicator is created (by init, or by split).
 *
 * A communicator is the world (every rank of the job) or a subset of it made by split: its
 * *members*, ranked 0 .. size-1 among themselves. rank, size, root and per-rank counts are
 * always relative to the communicator; `members` maps them to the job's ranks. init and split
 * run on the application thread that made the communicator (hvd_init, a split), so a backend
 * that binds a CUDA device at creation (NCCL) binds the device current there; except a split of
 * a communicator whose scheduler runs, which runs on the scheduler's thread. */
typedef struct hvd_backend_init_args {
  size_t struct_size;
  int32_t rank;       /* this process's rank in the communicator: 0 <= rank < size */
  int32_t size;       /* the communicator's ranks (the job's, for the world communicator) */
  int32_t local_rank; /* this process's rank among the job's processes on its host (a property
                         of the process: the GPU it drives is usually this one). A 1.0 plugin
                         (abi_minor 0) gets member_local_rank here: to it, its communicator is
                         the job */
  int32_t local_size; /* the job's processes on this host (a 1.0 plugin: member_local_size) */
  int64_t timeout_ms; /* bound each call by this, from its start (HVD_TIMEOUT) */
  const char* local_address;     /* this host's address as its peers can reach it; "" if unknown */
  const hvd_host_services* host; /* this communicator's own services (its own key namespace) */

  /* 1.1: members[i] is the job rank of communicator rank i, so members[rank] is this process;
   * member_count == size. Valid until the call returns: copy what you keep.
   * Default: the identity (the world communicator). */
  const int32_t* members;
  int32_t member_count;
  /* 1.1: a 64-bit hash every member derives alike (the world's from the job's init count; a
   * child's from the parent's id, the parent's split ordinal and the color), distinct for the
   * communicators of a job in practice. Default 0. */
  uint64_t comm_id;
  /* 1.1: this process's rank among the communicator's members on its host, and their number
   * (ranks share a host as hvd's one host identity says: HVD_HOSTNAME, else host name, kernel
   * boot id and network namespace). Default: local_rank and local_size. */
  int32_t member_local_rank;
  int32_t member_local_size;
} hvd_backend_init_args;
#define HVD_BACKEND_INIT_ARGS_SIZE_1_0 HVD_FIELD_END(hvd_backend_init_args, host)

/* One collective call. The host validates every field before the call reaches the plugin:
 * enums are in range, dtype and op are among those the plugin declared, root is in [0, size),
 * buffers are non-null when count > 0, sizes do not overflow.
 *
 *   allreduce       sendbuf[count] -> recvbuf[count], reduced with `op` over all ranks
 *   allgather       sendbuf[count] -> recvbuf[count * size] in rank order; with recv_counts
 *                   (HVD_CAP_ALLGATHERV) rank r contributes recv_counts[r] elements, packed
 *   broadcast       root's sendbuf[count] -> every rank's recvbuf[count] (sendbuf is ignored on
 *                   other ranks)
 *   reduce_scatter  sendbuf[count * size] -> recvbuf[count]: this rank's block of the reduction
 *   alltoall (1.1)  sendbuf holds send_counts[r] elements for each rank r, packed in rank order;
 *                   recvbuf receives recv_counts[r] elements from each rank r, packed in rank
 *                   order. count is the sum of send_counts. Both arrays are always set, and
 *                   consistent: the host derives recv_counts from the peers' send_counts.
 *
 * allgather, broadcast and alltoall move elements bit for bit, whatever the dtype.
 *
 * In place: sendbuf == recvbuf, except allgather where it is sendbuf == recvbuf + this rank's
 * offset (the NCCL/MPI convention); alltoall is never in place. Buffers must not otherwise
 * overlap. */
typedef struct hvd_collective_args {
  size_t struct_size;
  const void* sendbuf;
  void* recvbuf;
  uint64_t count; /* elements contributed by this rank */
  hvd_dtype dtype;
  hvd_reduce_op op;            /* allreduce, reduce_scatter; meaningless for the others */
  int32_t root;                /* broadcast */
  const uint64_t* recv_counts; /* allgather: NULL, or `size` per-rank element counts (with
                                  HVD_CAP_ALLGATHERV); alltoall: `size` per-source counts */
  hvd_memory_type memory_type; /* of both buffers */
  int32_t device;              /* CUDA device ordinal for HVD_MEMORY_CUDA, else -1 */
  void* stream; /* cudaStream_t for HVD_MEMORY_CUDA: the call is ordered on it and may return
                   before it completes; for host memory NULL, and the call is blocking */

  /* 1.1: alltoall: `size` per-destination element counts. Default NULL. */
  const uint64_t* send_counts;

  /* 1.2: when the call must have returned, in nanoseconds of the steady clock (CLOCK_MONOTONIC).
   * The host stamps it once per application call, from HVD_TIMEOUT, so that every backend call
   * one application call makes (a hierarchical allreduce makes several) ends by the same time; it
   * reads the kernel's coarse clock, so the deadline may fall up to a clock tick (1-10 ms) late.
   * A plugin returns HVD_ERR_TIMEOUT once it has waited past it (hvd/sdk/deadline.hpp reads it).
   * Default 0: none given; the plugin bounds the call by init's timeout_ms from its start. */
  int64_t deadline_ns;
  /* 1.2: HVD_CALL_* bits. Default 0. 64 bits, so that the struct has no tail padding a later
   * field could land in. */
  uint64_t flags;
} hvd_collective_args;
#define HVD_COLLECTIVE_ARGS_SIZE_1_0 HVD_FIELD_END(hvd_collective_args, stream)
#define HVD_COLLECTIVE_ARGS_SIZE_1_1 HVD_FIELD_END(hvd_collective_args, send_counts)

/* 1.2, hvd_collective_args.flags: before making this call the host compared its kind, dtype,
 * count(s), op and root across the ranks (the scheduler's negotiation, HVD_CHECK_ARGS), so every
 * rank makes the same call. A plugin that compares its ranks' calls before moving data (Gloo's
 * event loop cannot survive a longer message than it expects) may skip that comparison. */
#define HVD_CALL_RANKS_AGREE (1ull << 0)

/* A plugin's communicator: opaque to the host. */
typedef struct hvd_backend_comm hvd_backend_comm;

/* The backend table. Every function returns HVD_SUCCESS or an error status, after calling
 * host->set_error with a message. No C++ exception may leave any of them. The host makes one
 * call at a time on a communicator, except abort. */
typedef struct hvd_backend_v1 {
  size_t struct_size; /* sizeof(hvd_backend_v1) as the plugin was compiled */
  uint32_t abi_major; /* HVD_BACKEND_ABI_MAJOR the plugin was compiled against */
  uint32_t abi_minor;
  const char* name;        /* short name, the <name> of libhvd-backend-<name>.so */
  const char* version;     /* the plugin's own version, free form ("1.2.0 (gloo 2022-05-18)") */
  const char* description; /* one line for hvd-info */
  uint64_t capabilities;   /* HVD_CAP_* bits */

  /* Create the world communicator, or a communicator over the members `args` names (when the
   * plugin has no split). Collective over the communicator's members. */
  hvd_status (*init)(const hvd_backend_init_args* args, hvd_backend_comm** comm);
  /* Release everything init or split made. Called once per communicator made, on every member,
   * children before their parent, and also after abort. */
  hvd_status (*finalize)(hvd_backend_comm* comm);

  hvd_status (*allreduce)(hvd_backend_comm* comm, const hvd_collective_args* args);
  hvd_status (*allgather)(hvd_backend_comm* comm, const hvd_collective_args* args);
  hvd_status (*broadcast)(hvd_backend_comm* comm, const hvd_collective_args* args);
  hvd_status (*barrier)(hvd_backend_comm* comm);
  /* Optional: NULL unless HVD_CAP_REDUCE_SCATTER. */
  hvd_status (*reduce_scatter)(hvd_backend_comm* comm, const hvd_collective_args* args);

  /* 1.1: the dtypes every collective of this plugin takes (HVD_DTYPE_BIT of each) and the ops
   * its reductions take (HVD_REDUCE_OP_BIT of each); neither may be 0. The host never passes
   * a dtype or an op outside them: it fails such a call with HVD_ERR_UNSUPPORTED before the
   * plugin sees it. Default (a 1.0 table): HVD_DTYPES_1_0 and HVD_REDUCE_OPS_1_0. */
  uint64_t dtypes;
  uint64_t reduce_ops;

  /* The optional 1.1 entries below: abort (the watchdog, hvd_comm_abort, a failed call), split
   * (hvd_comm_split, process sets, hierarchical allreduce) and alltoall (docs/plugin-abi.md). */

  /* 1.1, optional (NULL: the host makes children with init, over their members and with their
   * own host services). Make the child communicator that `args` describes from `parent`, with
   * what the parent has (its connections, a native split such as MPI_Comm_split or
   * ncclCommSplit: color members[0], key rank). Collective over every rank of `parent`, in the
   * order of its collectives. On a rank that joins no child (color < 0) args is NULL and *child
   * must be set to NULL. A self-bootstrapping plugin without split gets its children from init,
   * over `members` (job ranks: the ranks of the world it found by itself). */
  hvd_status (*split)(hvd_backend_comm* parent, const hvd_backend_init_args* args,
                      hvd_backend_comm** child);

  /* 1.1, optional. The one entry the host may call while another thread is inside a call on
   * `comm` (or with none in progress; more than once is allowed): make that call return soon
   * with an error, and every later call on `comm` but finalize fail at once. Work it queued on
   * CUDA streams may be abandoned (as ncclCommAbort does). Not collective; it must not wait on
   * peers, and it touches only `comm` (the host aborts children itself). It may report what it
   * knows of the failure (an asynchronous error its library recorded) through set_error. The
   * host calls finalize only after abort and the interrupted call have returned. NULL: the host
   * can only abandon a call in progress (it runs such a plugin's calls on a thread of its own,
   * with buffers of its own; its caller gets HVD_ERR_TIMEOUT, the plugin's thread is left to
   * finish on its own, and the communicator is never finalized under it). */
  hvd_status (*abort)(hvd_backend_comm* comm);

  /* 1.1, optional (NULL: the host runs alltoall as other collectives of this plugin). */
  hvd_status (*alltoall)(hvd_backend_comm* comm, const hvd_collective_args* args);
} hvd_backend_v1;
#define HVD_BACKEND_V1_SIZE_1_0 HVD_FIELD_END(hvd_backend_v1, reduce_scatter)
#define HVD_BACKEND_V1_SIZE_1_1 HVD_FIELD_END(hvd_backend_v1, alltoall)

typedef const hvd_backend_v1* (*hvd_backend_entry_v1_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* HVD_BACKEND_H */
