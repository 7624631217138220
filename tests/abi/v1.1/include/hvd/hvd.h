/* hvd.h — hvd's public C API: collectives over the backend chosen at run time.
 *
 *   hvd_comm* comm;
 *   if (hvd_init(NULL, &comm) != HVD_SUCCESS) { fprintf(stderr, "%s\n", hvd_last_error()); ... }
 *   hvd_allreduce(comm, grad, grad, n, HVD_FLOAT32, HVD_AVERAGE, NULL);
 *   hvd_finalize(comm);
 *
 * Every function returns a status; on error, hvd_last_error() holds the message for the calling
 * thread until its next hvd call. Collectives must be called by every rank in the same order (as
 * with MPI and NCCL). They are blocking for host memory, and for CUDA memory on a backend that
 * takes host memory only (hvd stages it through host memory, after the work queued on the
 * placement's stream); on a backend that takes CUDA memory they are ordered on that stream. A
 * communicator's blocking calls are made by one thread at a time, and not while another thread
 * makes its first asynchronous call (a second blocking call meanwhile fails with HVD_ERR_STATE);
 * asynchronous calls, request waits and hvd_comm_abort may come from any thread. Configuration
 * comes from the environment: HVD_BACKEND, HVD_PLUGIN_PATH, HVD_TIMEOUT, HVD_CHECK_ARGS,
 * HVD_HIERARCHICAL_ALLREDUCE, HVD_RENDEZVOUS_ADDR, HVD_SECRET, HVD_RANK/SIZE/LOCAL_RANK/ LOCAL_SIZE
 * (set by hvdrun) — see README.md.
 *
 * Failures (docs/reliability.md):
 *  - HVD_TIMEOUT (seconds, default 30) bounds every blocking call from its entry, plus a margin
 *    of 1 s: a call that has not completed by then fails with HVD_ERR_TIMEOUT naming what it
 *    waited for, and hvd aborts the communicator. It does not bound how long an asynchronous
 *    request waits for the other ranks to submit its name (that is the stall inspector's:
 *    HVD_STALL_CHECK_TIME_SECONDS, HVD_STALL_SHUTDOWN_TIME_SECONDS).
 *  - A backend error, a timeout or hvd_comm_abort breaks the communicator: every call in flight
 *    and every later one fails with the error that broke it, and hvd_finalize reports it.
 *    Errors hvd finds itself (bad arguments, ranks that disagree) fail that call only.
 *  - Without HVD_CHECK_ARGS=1, ranks that pass different dtypes, counts, ops or roots to a
 *    blocking collective before the first asynchronous call MAY CORRUPT DATA SILENTLY (the backend
 *    moves bytes as each rank describes them, as MPI and NCCL do), and a call that is invalid
 *    on one rank only leaves the others to time out. HVD_CHECK_ARGS=1 compares every blocking
 *    call's arguments across the ranks first (one small allgather per call: see
 *    docs/performance.md for its cost) and fails a mismatch with HVD_ERR_MISMATCH, or a call
 *    invalid on one rank with that rank's error, on every rank alike. Once the scheduler runs
 *    (below), every call is checked this way anyway.
 *
 * Handles: an hvd_comm* is valid from hvd_init until hvd_finalize, an hvd_request* until
 * hvd_request_free. A finalized, freed or made-up handle gets HVD_ERR_STATE (hvd_rank and the
 * like return -1 or 0), never a crash: handles are looked up, not trusted. */
#ifndef HVD_HVD_H
#define HVD_HVD_H

#include "hvd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HVD_API __attribute__((visibility("default")))
#else
#define HVD_API
#endif

#define HVD_VERSION_MAJOR 0
#define HVD_VERSION_MINOR 1
#define HVD_VERSION_PATCH 0

typedef struct hvd_comm hvd_comm;

/* Every struct below begins with struct_size (set it to sizeof the struct): later versions
 * append fields, and hvd accepts any struct_size from the struct's 1.0 size (HVD_*_SIZE_1_0)
 * on, so an application built against an older hvd.h keeps working (types.h). */

/* Overrides of the environment; zeroed fields mean "use the environment". */
typedef struct hvd_init_options {
  size_t struct_size;     /* sizeof(hvd_init_options) */
  const char* backend;    /* a name or a plugin path, as HVD_BACKEND */
  double timeout_seconds; /* as HVD_TIMEOUT */
} hvd_init_options;
#define HVD_INIT_OPTIONS_SIZE_1_0 HVD_FIELD_END(hvd_init_options, timeout_seconds)

/* Where the buffers of a collective live. NULL means host memory. Each rank may name its own
 * device: ranks must agree on the kind of memory (host or CUDA), not on the device. */
typedef struct hvd_placement {
  size_t struct_size; /* sizeof(hvd_placement) */
  hvd_memory_type memory_type;
  int32_t device; /* CUDA device ordinal, or -1 for host memory */
  void* stream;   /* cudaStream_t the call is ordered on (CUDA memory only) */
} hvd_placement;
#define HVD_PLACEMENT_SIZE_1_0 HVD_FIELD_END(hvd_placement, stream)

/* Load the backend, join the job's other ranks, and create a communicator over all of them.
 * Collective. Fails with the same message on every rank when the ranks disagree on the backend. */
HVD_API hvd_status hvd_init(const hvd_init_options* options, hvd_comm** comm);
/* Release the communicator. Collective while it is healthy; once broken (a failure, a timeout,
 * hvd_comm_abort) it releases this rank's side alone and returns the error that broke it. Each
 * of its steps (the scheduler's last cycle, the controller's and the backend's release) is
 * bounded by HVD_TIMEOUT + 1 s (the scheduler's twice, when its backend must be aborted). The
 * handle is invalid afterwards, whatever the status; except that a communicator with live
 * children (hvd_comm_split) is not released: HVD_ERR_STATE, and the handle stays valid. NULL is
 * accepted and ignored. */
HVD_API hvd_status hvd_finalize(hvd_comm* comm);
/* Break the communicator from any thread, now: a call in progress on another thread returns (a
 * backend with the ABI's abort is interrupted; one without is walked away from), every request
 * in flight fails, and that call and every later one fail with HVD_ERR_STATE "aborted by the
 * application". Not collective: peers learn it as a failure of their own calls.
 * Idempotent. hvd_finalize is still needed to release it. */
HVD_API hvd_status hvd_comm_abort(hvd_comm* comm);

HVD_API int hvd_rank(const hvd_comm* comm);                      /* -1 for NULL */
HVD_API int hvd_size(const hvd_comm* comm);                      /* -1 for NULL */
HVD_API int hvd_local_rank(const hvd_comm* comm);                /* -1 for NULL */
HVD_API int hvd_local_size(const hvd_comm* comm);                /* -1 for NULL */
HVD_API const char* hvd_backend_name(const hvd_comm* comm);      /* "" for NULL */
HVD_API uint64_t hvd_backend_capabilities(const hvd_comm* comm); /* HVD_CAP_* bits; 0 for NULL */
/* The dtypes (HVD_DTYPE_BIT of each) and reduce ops (HVD_REDUCE_OP_BIT of each) the backend
 * takes; a collective on any other fails with HVD_ERR_UNSUPPORTED. 0 for NULL. */
HVD_API uint64_t hvd_backend_dtypes(const hvd_comm* comm);
HVD_API uint64_t hvd_backend_reduce_ops(const hvd_comm* comm);

/* recvbuf[i] = op over ranks of sendbuf[i], i < count. In place when sendbuf == recvbuf. */
HVD_API hvd_status hvd_allreduce(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                                 hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement);
/* recvbuf[r * count + i] = rank r's sendbuf[i]. In place when sendbuf == recvbuf + rank * count. */
HVD_API hvd_status hvd_allgather(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                                 hvd_dtype dtype, const hvd_placement* placement);
/* Rank r contributes recv_counts[r] elements (the same array on every rank); recvbuf receives
 * them packed in rank order. In place when sendbuf == recvbuf + this rank's offset. A backend
 * without HVD_CAP_ALLGATHERV runs it as one broadcast per rank (host memory only). */
HVD_API hvd_status hvd_allgatherv(hvd_comm* comm, const void* sendbuf, void* recvbuf,
                                  const uint64_t* recv_counts, hvd_dtype dtype,
                                  const hvd_placement* placement);
/* recvbuf[i] = root's sendbuf[i] on every rank. In place when sendbuf == recvbuf. */
HVD_API hvd_status hvd_broadcast(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                                 hvd_dtype dtype, int root, const hvd_placement* placement);
HVD_API hvd_status hvd_barrier(hvd_comm* comm);
/* sendbuf holds count elements for each rank, in rank order (count * size in all); rank r's
 * recvbuf[i] = op over ranks of sendbuf[r * count + i], i < count. In place when sendbuf ==
 * recvbuf (the result lands in its first count elements). A backend without
 * HVD_CAP_REDUCE_SCATTER runs it as an allreduce in a host buffer of hvd's, keeping this rank's
 * block: n times the bytes on the wire. */
HVD_API hvd_status hvd_reduce_scatter(hvd_comm* comm, const void* sendbuf, void* recvbuf,
                                      uint64_t count, hvd_dtype dtype, hvd_reduce_op op,
                                      const hvd_placement* placement);
/* Rank r sends send_counts[d] elements to each rank d, packed in rank order in sendbuf, and
 * receives what each rank s sends it, packed in rank order in recvbuf, which holds recv_capacity
 * elements (0 when recvbuf is NULL); recv_counts (NULL, or size entries) receives how many came
 * from each rank. The ranks' counts are exchanged first (one allgather of size + 2 integers per
 * rank), so a recvbuf too
 * small on any rank fails the call on every rank alike. Never in place. A backend without
 * alltoall runs it as one broadcast per rank of what that rank sends (host memory only). */
HVD_API hvd_status hvd_alltoall(hvd_comm* comm, const void* sendbuf, const uint64_t* send_counts,
                                void* recvbuf, uint64_t recv_capacity, uint64_t* recv_counts,
                                hvd_dtype dtype, const hvd_placement* placement);

/* ---- Communicators from communicators ------------------------------------------------------
 *
 * MPI_Comm_split: collective over every rank of `comm`. The ranks that pass the same color >= 0
 * form a child communicator, ranked by key, ties broken by their rank in `comm`; a rank passing
 * a negative color (HVD_COLOR_NONE) takes part and gets *out = NULL. The child has its own
 * ranks, local rank and size (among its members on the same host), scheduler and tensor names
 * (the same name in two communicators never collides), and is used and finalized like any
 * communicator; its parent cannot be finalized while it lives (HVD_ERR_STATE). hvd_comm_abort on
 * a parent aborts its children too. A backend with a native split (MPI_Comm_split) makes the
 * child from the parent; any other is initialized afresh over the child's members. */
#define HVD_COLOR_NONE (-1)
HVD_API hvd_status hvd_comm_split(hvd_comm* comm, int color, int key, hvd_comm** out);
/* Horovod's process set: a child of `comm` over ranks[0..count) (ranks of `comm`, distinct, in
 * any order; the child ranks them in increasing order). Collective over every rank of `comm`:
 * every rank passes the same list (ranks that disagree get the same HVD_ERR_MISMATCH), and a
 * rank not in it gets *out = NULL. */
HVD_API hvd_status hvd_comm_create_process_set(hvd_comm* comm, const int* ranks, int count,
                                               hvd_comm** out);
/* This communicator's rank r as a rank of the job (its world): -1 for NULL or r out of range. */
HVD_API int hvd_comm_job_rank(const hvd_comm* comm, int rank);

/* ---- Named asynchronous collectives: the fusion scheduler ---------------------------------
 *
 * Submit tensors by name and get a request back; a background thread agrees with the other
 * ranks on what is ready everywhere, fuses small allreduces into one backend call, and completes
 * the requests (docs/scheduler.md). Ranks may submit in different orders; a name must be the
 * same on every rank and unique among this rank's tensors in flight. Buffers must stay valid
 * until the request completes. Validation failures (ranks that disagree on dtype, shape, op,
 * root, memory kind or scale factors) complete the request on every rank with the same message.
 * The first asynchronous call starts the scheduler; from then on the blocking collectives above
 * go through it too (in order, as every rank calls them). thread-safe: requests may be submitted
 * and waited on from any thread. */
typedef struct hvd_request hvd_request;

typedef enum hvd_collective {
  HVD_COLLECTIVE_ALLREDUCE = 0,
  HVD_COLLECTIVE_ALLGATHER = 1,
  HVD_COLLECTIVE_BROADCAST = 2,
  HVD_COLLECTIVE_REDUCE_SCATTER = 3,
  HVD_COLLECTIVE_ALLTOALL = 4,
  HVD_ENUM_RANGE(HVD_COLLECTIVE_)
} hvd_collective;

/* One tensor of a grouped submission. Elements: the product of shape[0..ndim) (1 for ndim 0).
 * Allgather concatenates the ranks' tensors along the first dimension, in rank order; the ranks
 * may differ in it (not in the others). Its recvbuf, if given, holds size x this rank's elements,
 * which is enough when every rank's shape is the same; with recvbuf NULL hvd allocates the
 * output once the sizes are known (hvd_request_output). A recvbuf too small for what the ranks
 * sent fails the tensor on every rank. */
typedef struct hvd_tensor {
  size_t struct_size; /* sizeof(hvd_tensor) */
  hvd_collective collective;
  const char* name;
  const void* sendbuf;
  void* recvbuf;
  hvd_dtype dtype;
  int32_t ndim;
  const int64_t* shape;
  hvd_reduce_op op;               /* allreduce */
  int32_t root;                   /* broadcast */
  double prescale;                /* allreduce, floating types: input x prescale; 0 means 1 */
  double postscale;               /* allreduce, floating types: result x postscale; 0 means 1 */
  const hvd_placement* placement; /* NULL: host memory */
  /* 1.1: alltoall: NULL, or the rows (first-dimension entries) sent to each rank, size entries
   * summing to shape[0]. NULL: shape[0] divided evenly (it must divide by size). */
  const int64_t* splits;
} hvd_tensor;
#define HVD_TENSOR_SIZE_1_0 HVD_FIELD_END(hvd_tensor, placement)

HVD_API hvd_status hvd_allreduce_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                       void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                       const int64_t* shape, hvd_reduce_op op, double prescale,
                                       double postscale, const hvd_placement* placement,
                                       hvd_request** request);
HVD_API hvd_status hvd_allgather_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                       void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                       const int64_t* shape, const hvd_placement* placement,
                                       hvd_request** request);
HVD_API hvd_status hvd_broadcast_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                       void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                       const int64_t* shape, int root,
                                       const hvd_placement* placement, hvd_request** request);
/* Reduce-scatter along the first dimension: the shape is the input's, every rank's alike; rank r
 * gets rows [start_r, start_r + rows_r) of the reduction, where shape[0] = q * size + m and the
 * first m ranks get one row more (rows_r = q + (r < m), as Horovod splits it). recvbuf holds
 * rows_r rows. Scales as for allreduce. */
HVD_API hvd_status hvd_reduce_scatter_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                            void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                            const int64_t* shape, hvd_reduce_op op, double prescale,
                                            double postscale, const hvd_placement* placement,
                                            hvd_request** request);
/* Horovod's alltoall: splits[d] rows (of the first dimension) go to rank d (splits NULL: shape[0]
 * divided evenly, which it must be); each rank receives what every rank sends it, in rank order.
 * The ranks may differ in shape[0] and splits, not in the other dimensions. With recvbuf NULL,
 * hvd allocates the output (hvd_request_output); a given recvbuf is taken to hold as many
 * elements as this rank sends (enough when the exchange is symmetric), and a tensor that brings
 * more fails on every rank. hvd_request_received_splits says how many rows came from each
 * rank. */
HVD_API hvd_status hvd_alltoall_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                      void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                      const int64_t* shape, const int64_t* splits,
                                      const hvd_placement* placement, hvd_request** request);
/* count tensors queued atomically; on every rank they complete in the same cycle (and fuse
 * where they can). requests[i] is tensors[i]'s. On failure no tensor was queued. The array is
 * strided by its elements' struct_size (every element's alike), so an application built against
 * an older hvd.h, whose hvd_tensor is smaller, passes its own array as it is. */
HVD_API hvd_status hvd_grouped_async(hvd_comm* comm, const hvd_tensor* tensors, size_t count,
                                     hvd_request** requests);
/* *done = 1 once the request has completed (then wait returns at once), else 0. A request on
 * CUDA memory completes once its work has run on the device, not when it was queued there. */
HVD_API hvd_status hvd_request_poll(hvd_request* request, int* done);
/* Waits until the request completes and returns its status (its message: hvd_last_error()).
 * A timeout_seconds >= 0 bounds the wait: HVD_ERR_TIMEOUT then, and the operation goes on. An
 * error on the device (a CUDA error its completion event reports) is the request's status. */
HVD_API hvd_status hvd_request_wait(hvd_request* request, double timeout_seconds);
/* 1.1. CUDA tensors on a backend that takes CUDA memory (NCCL) run on a stream of hvd's, after
 * the work queued on the placement's stream when they were submitted. Instead of waiting on the
 * host, an application may order its own stream after a request: this waits (up to
 * timeout_seconds, if >= 0) until hvd has queued the operation on the device, makes the work
 * queued on `stream` (a cudaStream_t of the request's device) from then on run after it, and
 * returns without waiting for the device. It returns the operation's error if it failed before
 * reaching the device. A request without device work (host memory, or CUDA memory staged for a
 * host backend) is waited for as by hvd_request_wait; one hvd queued on the stream it was
 * submitted with (where its device executor cannot run: docs/scheduler.md) fails with
 * HVD_ERR_UNSUPPORTED, as only that stream is ordered after it. Until the request completes, other
 * streams must not write its input or read its output unless ordered after it so. */
HVD_API hvd_status hvd_request_wait_on_stream(hvd_request* request, void* stream,
                                              double timeout_seconds);
/* An allgather or alltoall submitted with recvbuf NULL, once it succeeded: *data is the output
 * (host memory, valid until hvd_request_free) and *first_dim its first dimension (the rows it
 * received from every rank, summed); its other dimensions are the submitted ones. HVD_ERR_STATE
 * before completion or for a request without such an output; a failed operation's status otherwise.
 */
HVD_API hvd_status hvd_request_output(hvd_request* request, void** data, int64_t* first_dim);
/* An alltoall, once it succeeded: splits[s] = the rows received from rank s, s < the size of its
 * communicator; `count` is the entries splits holds (HVD_ERR_INVALID_ARGUMENT if fewer). */
HVD_API hvd_status hvd_request_received_splits(hvd_request* request, int64_t* splits, int count);
/* Horovod's join, for ranks whose data ran out before the others': this rank submits nothing
 * more on the communicator, and until every rank has joined it takes part with zeros in the
 * allreduces the others submit (host memory; an average still divides by the communicator's
 * size). Any other collective, or an allreduce of CUDA memory, submitted while a rank has joined
 * fails on every rank with HVD_ERR_UNSUPPORTED. The request completes once every rank has
 * joined; then hvd_request_last_joined gives the rank that joined last, the same on every rank.
 * As any asynchronous call, it starts the scheduler. It is negotiated under the name "hvd.join",
 * which no tensor of this rank may have meanwhile. */
HVD_API hvd_status hvd_join_async(hvd_comm* comm, hvd_request** request);
HVD_API hvd_status hvd_request_last_joined(hvd_request* request, int* rank);
/* Releases the handle (the operation itself goes on). NULL is ignored. */
HVD_API void hvd_request_free(hvd_request* request);

/* The scheduler's counters since it started (all zero before the first asynchronous call). */
typedef struct hvd_scheduler_stats {
  size_t struct_size;         /* sizeof(hvd_scheduler_stats) */
  uint64_t cycles;            /* negotiation cycles run */
  uint64_t full_negotiations; /* cycles that gathered requests (some rank missed the cache) */
  double negotiation_seconds; /* spent negotiating: the cache-bit vote, gathers, validation */
  uint64_t tensors;           /* tensors completed */
  uint64_t backend_calls;     /* data collectives run (a fusion buffer counts once) */
} hvd_scheduler_stats;
#define HVD_SCHEDULER_STATS_SIZE_1_0 HVD_FIELD_END(hvd_scheduler_stats, backend_calls)
HVD_API hvd_status hvd_scheduler_stats_get(hvd_comm* comm, hvd_scheduler_stats* stats);

/* The message of the calling thread's last failed hvd call ("" if none). Never NULL. */
HVD_API const char* hvd_last_error(void);
/* "0.1.0" */
HVD_API const char* hvd_version(void);

#ifdef __cplusplus
}
#endif

#endif /* HVD_HVD_H */
