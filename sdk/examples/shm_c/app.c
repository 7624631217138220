/* A first hvd application in C: three collectives with results known in advance, checked.
 *
 * hvd picks the backend at run time (HVD_BACKEND; hvdrun --backend sets it), so this program
 * runs unchanged on shmc, gloo or mpi:
 *     hvdrun -np 3 --backend ./libhvd-backend-shmc.so -- ./hvd-example-app */
#include <stdio.h>
#include <stdlib.h>

#include "hvd/hvd.h"

/* Every hvd call returns a status; a failed call's message is hvd_last_error(), which holds
 * until this thread's next hvd call, so it is read at once. */
#define CHECK(call)                                                                       \
  do {                                                                                    \
    const hvd_status status_ = (call);                                                    \
    if (status_ != HVD_SUCCESS) {                                                         \
      fprintf(stderr, "%s: %s: %s\n", #call, hvd_status_name(status_), hvd_last_error()); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* A wrong result is an error too: say which, and remember it. */
static int failures = 0;
static void expect(int ok, int rank, const char* what) {
  if (!ok) fprintf(stderr, "rank %d: wrong %s\n", rank, what);
  failures += !ok;
}

int main(void) {
  hvd_comm* comm = NULL;
  CHECK(hvd_init(NULL, &comm)); /* collective: every rank of the job joins */
  const int rank = hvd_rank(comm);
  const int size = hvd_size(comm);

  /* Allreduce, in place (sendbuf == recvbuf). Small integers and floats that are sums of
   * powers of two keep every result exact, whatever order a backend adds in. */
  int32_t ints[2] = {rank + 1, rank};
  CHECK(hvd_allreduce(comm, ints, ints, 2, HVD_INT32, HVD_SUM, NULL));
  expect(ints[0] == size * (size + 1) / 2 && ints[1] == size * (size - 1) / 2, rank, "int32 sum");

  int32_t top = rank * 10;
  CHECK(hvd_allreduce(comm, &top, &top, 1, HVD_INT32, HVD_MAX, NULL));
  expect(top == (size - 1) * 10, rank, "int32 max");

  float halves = 2.0f * (float)(rank + 1); /* the average of 2, 4, ..., 2n is n + 1 */
  CHECK(hvd_allreduce(comm, &halves, &halves, 1, HVD_FLOAT32, HVD_AVERAGE, NULL));
  expect(halves == (float)(size + 1), rank, "float32 average");

  /* Allgather: rank r contributes {r, r * r}; everyone receives all of them in rank order. */
  const int32_t mine[2] = {rank, rank * rank};
  int32_t* all = malloc(2 * (size_t)size * sizeof *all);
  if (all == NULL) return 1;
  CHECK(hvd_allgather(comm, mine, all, 2, HVD_INT32, NULL));
  for (int r = 0; r < size; ++r) expect(all[2 * r] == r && all[2 * r + 1] == r * r, rank, "gather");
  free(all);

  /* Broadcast: rank 0's value reaches every rank; the others' input is ignored. */
  double value = rank == 0 ? 3.25 : -1.0;
  CHECK(hvd_broadcast(comm, &value, &value, 1, HVD_FLOAT64, 0, NULL));
  expect(value == 3.25, rank, "broadcast");

  printf("rank %d of %d: backend %s, allreduce = %d %d max %d avg %g, broadcast = %g: %s\n", rank,
         size, hvd_backend_name(comm), ints[0], ints[1], top, (double)halves, value,
         failures ? "WRONG" : "ok");
  CHECK(hvd_finalize(comm)); /* collective too: releases the backend's communicator */
  return failures ? 1 : 0;
}
