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
 *   HVD_TEST_DEVICE_ONLY declares CUDA memory only, as NCCL does (a backend that needs a
 *                       host-memory controller for the scheduler's negotiation)
 *   HVD_TEST_DTYPES, HVD_TEST_REDUCE_OPS
 *                       the dtypes and reduce ops it declares (default: every one)
 *
 * Built against the frozen ABI 1.0 headers (tests/abi/v1.0) as well: that build is a plugin
 * written before 1.1 existed, which today's host must still load and run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

struct hvd_backend_comm {
  int rank;
  int size;
  int64_t timeout_ms;
  const hvd_host_services* host;
};

static hvd_status fail(const struct hvd_backend_comm* c, hvd_status code, const char* message) {
  c->host->set_error(c->host->ctx, message);
  return code;
}

/* Everyone's `bytes` bytes, in rank order, in a new buffer (free it). */
static hvd_status gather_all(struct hvd_backend_comm* c, const void* mine, size_t bytes,
                             char** all) {
  *all = (char*)malloc(bytes * (size_t)c->size + 1);
  if (*all == NULL) return fail(c, HVD_ERR_SYSTEM, "kvs: out of memory");
  const hvd_status s = c->host->oob_allgather(c->host->ctx, mine, bytes, *all, c->timeout_ms);
  if (s != HVD_SUCCESS) {
    free(*all);
    *all = NULL;
    return fail(c, s, "kvs: out-of-band allgather failed");
  }
  return HVD_SUCCESS;
}

/* A test plugin that notices when the host breaks its promise: any dtype, reduce op or memory type
 * it did not declare (or does not know) ends the process loudly, so that no test can pass over
 * it. */
static void expect_declared(const hvd_collective_args* a, int uses_op) {
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
}

static hvd_status kvs_init(const hvd_backend_init_args* args, hvd_backend_comm** comm) {
#ifdef HVD_TEST_FAIL_INIT
  (void)comm;
  args->host->set_error(args->host->ctx, "failinit: this test plugin always refuses to start");
  return HVD_ERR_SYSTEM;
#else
  struct hvd_backend_comm* c = (struct hvd_backend_comm*)calloc(1, sizeof *c);
  if (c == NULL) return HVD_ERR_SYSTEM;
  c->rank = args->rank;
  c->size = args->size;
  c->timeout_ms = args->timeout_ms;
  c->host = args->host;
  *comm = c;
  return HVD_SUCCESS;
#endif
}

static hvd_status kvs_finalize(hvd_backend_comm* comm) {
  free(comm);
  return HVD_SUCCESS;
}

static hvd_status kvs_allreduce(hvd_backend_comm* c, const hvd_collective_args* a) {
  expect_declared(a, 1);
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
  expect_declared(a, 0);
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
  expect_declared(a, 0);
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
#endif
};

#if defined(HVD_TEST_ABI2)
HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v2(void) { return &kvs_table; }
#elif defined(HVD_TEST_NO_ENTRY)
HVD_PLUGIN_EXPORT const hvd_backend_v1* some_other_entry(void) { return &kvs_table; }
#else
HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) { return &kvs_table; }
#endif
