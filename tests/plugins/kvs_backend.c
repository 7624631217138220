/* kvs: a complete backend written in C99 against hvd/backend.h alone — no C++ helper.
 *
 * Every collective is the host's out-of-band allgather (the rendezvous store) followed by local
 * work, so it is slow and only for tests: it proves the C ABI is usable from C, and it is a
 * second, independent backend for the conformance suite and the agreement checks.
 *
 * Compiled several times with one of these defines to make broken plugins for loader tests:
 *   HVD_TEST_FAIL_INIT  init fails with a message
 *   HVD_TEST_ABI2       exports hvd_backend_entry_v2 (a future major) instead of _v1
 *   HVD_TEST_NO_ENTRY   exports an unrelated symbol only
 *   HVD_TEST_WRONG_SUM  allreduce leaves out the last rank's data: wrong answers, no error
 *   HVD_TEST_IGNORE_TIMEOUT  waits ten times the timeout it was given (until aborted)
 *   HVD_TEST_EXTRA_EXPORT    exports a helper besides the entry (built without the version script)
 *   HVD_TEST_DEVICE_ONLY declares CUDA memory only, as NCCL does (a backend that needs a
 *                       host-memory controller for the scheduler's negotiation)
 *   HVD_TEST_CLASH      says in its description which hvd_test::clash_origin() it calls: the one
 *                       of the library it links (clash_origin.cpp) or the application's
 *   HVD_TEST_DTYPES, HVD_TEST_REDUCE_OPS
 *                       the dtypes and reduce ops it declares (default: every one)
 *
 * Built against the frozen ABI 1.0 headers (tests/abi/v1.0) as well: that build is a plugin
 * written before 1.1 existed, which today's host must still load and run. The 1.1 builds have
 * abort: a flag every call checks, which ends a hang (below) at once; a collective blocked in the
 * host's oob_allgather is the host's to interrupt.
 *
 * Faults on demand, read from the environment at init, for the host's watchdog and reliability
 * tests (with none set, nothing changes). <call> is one of init, allreduce, allgather, broadcast,
 * barrier, finalize; any other value fails init with HVD_ERR_INVALID_ARGUMENT.
 *   HVD_TEST_HANG=<call>       that call spins, ignoring timeout_ms, until the communicator is
 *                              aborted, then fails with HVD_ERR_STATE (a finalize after abort
 *                              returns at once); forever where there is no abort to end it: in
 *                              kvs10 (ABI 1.0), and in init, which has no communicator yet
 *   HVD_TEST_CRASH=<call>      that call raises SIGSEGV
 *   HVD_TEST_HANG_RANK=<r>, HVD_TEST_CRASH_RANK=<r>
 *                              only on communicator rank r (default: every rank)
 *   HVD_TEST_FAULT_SKIP=<n>    the first n calls of that kind run normally (default 0), so that
 *                              a fault can wait until after the host's own first calls */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd/backend.h"
#include "hvd/reduce.h"

#ifndef HVD_TEST_NAME
#define HVD_TEST_NAME "kvs"
#endif
#ifndef HVD_TEST_DTYPES
#define HVD_TEST_DTYPES HVD_DTYPES_1_0
#endif
#ifndef HVD_TEST_REDUCE_OPS
#define HVD_TEST_REDUCE_OPS HVD_REDUCE_OPS_1_0
#endif

enum kvs_call {
  KVS_NONE = -1,
  KVS_INIT,
  KVS_ALLREDUCE,
  KVS_ALLGATHER,
  KVS_BROADCAST,
  KVS_BARRIER,
  KVS_FINALIZE,
  KVS_CALLS
};
static const char* const kvs_call_names[KVS_CALLS] = {"init",      "allreduce", "allgather",
                                                      "broadcast", "barrier",   "finalize"};

/* The fault knobs as init read them. */
struct kvs_faults {
  enum kvs_call hang;
  enum kvs_call crash;
  int hang_rank; /* -1: every rank */
  int crash_rank;
  long skip;
};

struct hvd_backend_comm {
  int rank;
  int size;
  int64_t timeout_ms;
  const hvd_host_services* host;
  struct kvs_faults faults;
  long calls[KVS_CALLS]; /* calls made so far, by kind */
  int aborted;           /* set by abort from any thread: read and written with __atomic only */
  int require_deadline;  /* HVD_TEST_REQUIRE_DEADLINE=1: every call must carry the 1.2 stamp */
};

static hvd_status fail(const struct hvd_backend_comm* c, hvd_status code, const char* message) {
  c->host->set_error(c->host->ctx, message);
  return code;
}

static int is_aborted(const struct hvd_backend_comm* c) {
  return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE);
}

/* Parses HVD_TEST_<knob>; 0 on success, else a message in `error`. */
static int read_call_knob(const char* knob, enum kvs_call* out, char* error, size_t error_size) {
  const char* value = getenv(knob);
  *out = KVS_NONE;
  if (value == NULL || *value == '\0') return 0;
  for (int i = 0; i < KVS_CALLS; ++i) {
    if (strcmp(value, kvs_call_names[i]) == 0) {
      *out = (enum kvs_call)i;
      return 0;
    }
  }
  snprintf(error, error_size,
           "%s: %s='%s' is none of init, allreduce, allgather, broadcast, barrier, finalize",
           HVD_TEST_NAME, knob, value);
  return -1;
}

static long read_number_knob(const char* knob, long fallback) {
  const char* value = getenv(knob);
  return (value == NULL || *value == '\0') ? fallback : strtol(value, NULL, 10);
}

static int read_faults(struct kvs_faults* f, char* error, size_t error_size) {
  if (read_call_knob("HVD_TEST_HANG", &f->hang, error, error_size) != 0) return -1;
  if (read_call_knob("HVD_TEST_CRASH", &f->crash, error, error_size) != 0) return -1;
  f->hang_rank = (int)read_number_knob("HVD_TEST_HANG_RANK", -1);
  f->crash_rank = (int)read_number_knob("HVD_TEST_CRASH_RANK", -1);
  f->skip = read_number_knob("HVD_TEST_FAULT_SKIP", 0);
  return 0;
}

static int fault_applies(enum kvs_call knob, int knob_rank, enum kvs_call call, int rank) {
  return knob == call && (knob_rank < 0 || knob_rank == rank);
}

/* Spins, ignoring every timeout, until `c` is aborted (c NULL, or a 1.0 build: forever). */
static void hang(const struct hvd_backend_comm* c) {
  const struct timespec tick = {0, 1000000};
  for (;;) {
#if HVD_BACKEND_ABI_MINOR >= 1
    if (c != NULL && is_aborted(c)) return;
#else
    (void)c;
#endif
    nanosleep(&tick, NULL);
  }
}

/* The faults the knobs ask of this call of `c`: a crash does not return; a hang returns once `c`
 * is aborted, and then this returns 1 (the call must fail). */
static int fault_in(struct hvd_backend_comm* c, enum kvs_call call) {
  const long n = c->calls[call]++;
  if (n < c->faults.skip) return 0;
  if (fault_applies(c->faults.crash, c->faults.crash_rank, call, c->rank)) raise(SIGSEGV);
  if (fault_applies(c->faults.hang, c->faults.hang_rank, call, c->rank)) {
    hang(c);
    return 1;
  }
  return 0;
}

/* Every collective begins here: a call after abort fails at once, a knob may make it fail. */
static hvd_status begin(struct hvd_backend_comm* c, enum kvs_call call) {
  if (is_aborted(c)) return fail(c, HVD_ERR_STATE, "kvs: the communicator was aborted");
  if (fault_in(c, call)) {
    return fail(c, HVD_ERR_STATE, "kvs: aborted while hanging as HVD_TEST_HANG asked");
  }
  return HVD_SUCCESS;
}

/* Everyone's `bytes` bytes, in rank order, in a new buffer (free it). */
static hvd_status gather_all(struct hvd_backend_comm* c, const void* mine, size_t bytes,
                             char** all) {
  *all = (char*)malloc(bytes * (size_t)c->size + 1);
  if (*all == NULL) return fail(c, HVD_ERR_SYSTEM, "kvs: out of memory");
#ifdef HVD_TEST_IGNORE_TIMEOUT
  const int64_t timeout_ms = 10 * c->timeout_ms;
#else
  const int64_t timeout_ms = c->timeout_ms;
#endif
  const hvd_status s = c->host->oob_allgather(c->host->ctx, mine, bytes, *all, timeout_ms);
  if (s != HVD_SUCCESS) {
    free(*all);
    *all = NULL;
    return fail(c, s,
                is_aborted(c) ? "kvs: the communicator was aborted during the out-of-band allgather"
                              : "kvs: out-of-band allgather failed");
  }
  return HVD_SUCCESS;
}

/* A test plugin that notices when the host breaks its promise: any dtype, reduce op or memory type
 * it did not declare (or does not know) ends the process loudly, so that no test can pass over
 * it. */
static void expect_declared(const struct hvd_backend_comm* c, const hvd_collective_args* a,
                            int uses_op) {
  const int dtype_known = a->dtype >= 0 && a->dtype < HVD_DTYPE_COUNT;
  const int op_known = !uses_op || (a->op >= 0 && a->op < HVD_REDUCE_OP_COUNT);
#ifdef HVD_TEST_DEVICE_ONLY
  const int memory_declared = a->memory_type == HVD_MEMORY_CUDA;
#else
  const int memory_declared = a->memory_type == HVD_MEMORY_HOST;
#endif
  int declared = dtype_known && op_known && memory_declared;
#if HVD_BACKEND_ABI_MINOR >= 1
  declared = declared && (HVD_TEST_DTYPES & HVD_DTYPE_BIT(a->dtype)) != 0 &&
             (!uses_op || (HVD_TEST_REDUCE_OPS & HVD_REDUCE_OP_BIT(a->op)) != 0);
#endif
  if (!declared) {
    fprintf(stderr, "%s: the host passed dtype %d, op %d, memory type %d, which it never may\n",
            HVD_TEST_NAME, (int)a->dtype, (int)a->op, (int)a->memory_type);
    abort();
  }
#if HVD_BACKEND_ABI_MINOR >= 2
  /* 1.2: a stamped deadline lies at most HVD_TIMEOUT ahead (plus the coarse clock's tick);
   * libhvd stamps every call (the conformance runs set HVD_TEST_REQUIRE_DEADLINE=1), a host of
   * its own may not. */
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t now_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
  const int64_t latest = now_ns + (c->timeout_ms + 20) * 1000000;
  const int stamped = HVD_HAS_FIELD(a, hvd_collective_args, deadline_ns) && a->deadline_ns != 0;
  if ((c->require_deadline && !stamped) || (stamped && a->deadline_ns > latest)) {
    fprintf(
        stderr,
        "%s: the host stamped deadline %lld ns with the time %lld ns and a timeout of %lld ms\n",
        HVD_TEST_NAME, (long long)a->deadline_ns, (long long)now_ns, (long long)c->timeout_ms);
    abort();
  }
#else
  (void)c;
#endif
}

static hvd_status kvs_init(const hvd_backend_init_args* args, hvd_backend_comm** comm) {
#ifdef HVD_TEST_FAIL_INIT
  (void)comm;
  (void)read_faults;
  args->host->set_error(args->host->ctx, "failinit: this test plugin always refuses to start");
  return HVD_ERR_SYSTEM;
#else
  struct kvs_faults faults;
  char error[256];
  if (read_faults(&faults, error, sizeof error) != 0) {
    args->host->set_error(args->host->ctx, error);
    return HVD_ERR_INVALID_ARGUMENT;
  }
  if (faults.skip <= 0) {
    if (fault_applies(faults.crash, faults.crash_rank, KVS_INIT, args->rank)) raise(SIGSEGV);
    if (fault_applies(faults.hang, faults.hang_rank, KVS_INIT, args->rank)) hang(NULL);
  }
  struct hvd_backend_comm* c = (struct hvd_backend_comm*)calloc(1, sizeof *c);
  if (c == NULL) return HVD_ERR_SYSTEM;
  c->rank = args->rank;
  c->size = args->size;
  c->timeout_ms = args->timeout_ms;
  const char* require_deadline = getenv("HVD_TEST_REQUIRE_DEADLINE");
  c->require_deadline = require_deadline != NULL && strcmp(require_deadline, "1") == 0;
  c->host = args->host;
  c->faults = faults;
  c->calls[KVS_INIT] = 1;
  *comm = c;
  return HVD_SUCCESS;
#endif
}

static hvd_status kvs_finalize(hvd_backend_comm* comm) {
  (void)fault_in(comm, KVS_FINALIZE); /* a hang here ends with abort; finalize still frees */
  free(comm);
  return HVD_SUCCESS;
}

#if HVD_BACKEND_ABI_MINOR >= 1
/* From any thread, during a call or not: the flag every call and every hang checks. */
static hvd_status kvs_abort(hvd_backend_comm* c) {
  __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
  return HVD_SUCCESS;
}
#endif

static hvd_status kvs_allreduce(hvd_backend_comm* c, const hvd_collective_args* a) {
  expect_declared(c, a, 1);
  const hvd_status begun = begin(c, KVS_ALLREDUCE);
  if (begun != HVD_SUCCESS) return begun;
  const size_t bytes = (size_t)a->count * hvd_dtype_size(a->dtype);
  char* all = NULL;
  hvd_status s = gather_all(c, a->sendbuf, bytes, &all);
  if (s != HVD_SUCCESS) return s;
  if (bytes > 0) memcpy(a->recvbuf, all, bytes);
#ifdef HVD_TEST_WRONG_SUM
  const int reduced = c->size - 1;
#else
  const int reduced = c->size;
#endif
  for (int r = 1; r < reduced && s == HVD_SUCCESS; ++r) {
    s = hvd_reduce(a->recvbuf, a->recvbuf, all + (size_t)r * bytes, a->count, a->dtype, a->op);
  }
  if (s == HVD_SUCCESS && a->op == HVD_AVERAGE)
    s = hvd_divide(a->recvbuf, a->count, a->dtype, c->size);
  free(all);
  return s == HVD_SUCCESS ? s : fail(c, s, "kvs: reduction failed");
}

static hvd_status kvs_allgather(hvd_backend_comm* c, const hvd_collective_args* a) {
  expect_declared(c, a, 0);
  const hvd_status begun = begin(c, KVS_ALLGATHER);
  if (begun != HVD_SUCCESS) return begun;
  const size_t element = hvd_dtype_size(a->dtype);
  if (a->recv_counts != NULL) return fail(c, HVD_ERR_UNSUPPORTED, "kvs: no allgatherv");
  const size_t bytes = (size_t)a->count * element;
  /* In place, this rank's block already sits in recvbuf: copy it out before overwriting. */
  char* mine = (char*)calloc(bytes + 1, 1);
  if (mine == NULL) return fail(c, HVD_ERR_SYSTEM, "kvs: out of memory");
  if (bytes > 0) memcpy(mine, a->sendbuf, bytes);
  char* all = NULL;
  const hvd_status s = gather_all(c, mine, bytes, &all);
  if (s == HVD_SUCCESS && bytes > 0) memcpy(a->recvbuf, all, bytes * (size_t)c->size);
  free(all);
  free(mine);
  return s;
}

static hvd_status kvs_broadcast(hvd_backend_comm* c, const hvd_collective_args* a) {
  expect_declared(c, a, 0);
  const hvd_status begun = begin(c, KVS_BROADCAST);
  if (begun != HVD_SUCCESS) return begun;
  const size_t bytes = (size_t)a->count * hvd_dtype_size(a->dtype);
  /* Only the root's contribution matters; the others send nothing (0 bytes would mismatch the
   * allgather's equal-size rule, so every rank sends `bytes`). */
  char* mine = (char*)calloc(bytes + 1, 1);
  if (mine == NULL) return fail(c, HVD_ERR_SYSTEM, "kvs: out of memory");
  if (c->rank == a->root && bytes > 0) memcpy(mine, a->sendbuf, bytes);
  char* all = NULL;
  const hvd_status s = gather_all(c, mine, bytes, &all);
  if (s == HVD_SUCCESS && bytes > 0) memcpy(a->recvbuf, all + (size_t)a->root * bytes, bytes);
  free(all);
  free(mine);
  return s;
}

static hvd_status kvs_barrier(hvd_backend_comm* c) {
  const hvd_status begun = begin(c, KVS_BARRIER);
  if (begun != HVD_SUCCESS) return begun;
  char* all = NULL;
  const char token = 1;
  const hvd_status s = gather_all(c, &token, 1, &all);
  free(all);
  return s;
}

static const hvd_backend_v1 kvs_table = {
    .struct_size = sizeof(hvd_backend_v1),
    .abi_major = HVD_BACKEND_ABI_MAJOR,
    .abi_minor = HVD_BACKEND_ABI_MINOR,
    .name = HVD_TEST_NAME,
    .version = "1.0.0",
    .description = "test backend in C: every collective through the rendezvous store",
#ifdef HVD_TEST_DEVICE_ONLY
    .capabilities = HVD_CAP_CUDA_MEMORY, /* claims device memory only (it copies what it gets) */
#else
    .capabilities = HVD_CAP_HOST_MEMORY,
#endif
    .init = kvs_init,
    .finalize = kvs_finalize,
    .allreduce = kvs_allreduce,
    .allgather = kvs_allgather,
    .broadcast = kvs_broadcast,
    .barrier = kvs_barrier,
#if HVD_BACKEND_ABI_MINOR >= 1
    .dtypes = HVD_TEST_DTYPES,
    .reduce_ops = HVD_TEST_REDUCE_OPS,
    .abort = kvs_abort,
#endif
};

#if defined(HVD_TEST_CLASH)
/* hvd_test::clash_origin(), by its C++ name: a clash of C++ libraries is what the loader looks
 * for. */
int _ZN8hvd_test12clash_originEv(void);
#ifdef HVD_TEST_CLASH_DATA
extern int _ZN8hvd_test10clash_dataE; /* hvd_test::clash_data: the plugin needs its library */
#endif
HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) {
  static hvd_backend_v1 table;
  table = kvs_table;
#ifdef HVD_TEST_CLASH_DATA
  table.version = _ZN8hvd_test10clash_dataE == 7 ? "1.0.0" : "wrong";
#endif
  table.description = _ZN8hvd_test12clash_originEv() == 1 ? "calls its own library's symbol"
                                                          : "calls the application's symbol";
  return &table;
}
#elif defined(HVD_TEST_ABI2)
HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v2(void) { return &kvs_table; }
#elif defined(HVD_TEST_NO_ENTRY)
HVD_PLUGIN_EXPORT const hvd_backend_v1* some_other_entry(void) { return &kvs_table; }
#else
HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) { return &kvs_table; }
#endif
#ifdef HVD_TEST_EXTRA_EXPORT
HVD_PLUGIN_EXPORT int kvs_helper_that_should_be_hidden(void) { return 1; }
#endif
