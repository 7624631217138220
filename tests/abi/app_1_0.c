/* An application written against hvd.h 1.0 (built with the frozen headers of tests/abi/v1.0, and
 * again with those of v1.1, HVD_APP_1_1): it must keep working with today's libhvd. It uses every
 * struct of the 1.0 public API, at its 1.0 size: init options, placements, grouped tensors and
 * scheduler statistics; blocking and asynchronous collectives, checked exactly. Prints "ok" and
 * exits 0, or says what went wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/hvd.h"

#if defined(HVD_APP_1_1)
#if !defined(HVD_PLACEMENT_SIZE_1_0) || defined(HVD_COLLECTIVE_COUNT)
#error "built against today's hvd.h, not the frozen 1.1 one"
#endif
#elif defined(HVD_PLACEMENT_SIZE_1_0)
#error "built against today's hvd.h, not the frozen 1.0 one"
#endif

static int g_rank = -1;

#define CHECK(call)                                                                 \
  do {                                                                              \
    const hvd_status status_ = (call);                                              \
    if (status_ != HVD_SUCCESS) {                                                   \
      fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, hvd_last_error()); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

#define EXPECT(condition, ...)                                       \
  do {                                                               \
    if (!(condition)) {                                              \
      fprintf(stderr, "rank %d: %s is false: ", g_rank, #condition); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fprintf(stderr, "\n");                                         \
      exit(1);                                                       \
    }                                                                \
  } while (0)

int main(void) {
  hvd_init_options options;
  memset(&options, 0, sizeof options);
  options.struct_size = sizeof options;
  options.timeout_seconds = 60;
  hvd_comm* comm = NULL;
  CHECK(hvd_init(&options, &comm));
  g_rank = hvd_rank(comm);
  const int size = hvd_size(comm);
  const hvd_placement host = {sizeof(hvd_placement), HVD_MEMORY_HOST, -1, NULL};

  /* Blocking: allreduce, allgather, broadcast, barrier. */
  int32_t sum[7];
  for (int i = 0; i < 7; ++i) sum[i] = g_rank + i;
  CHECK(hvd_allreduce(comm, sum, sum, 7, HVD_INT32, HVD_SUM, &host));
  for (int i = 0; i < 7; ++i) {
    EXPECT(sum[i] == size * (size - 1) / 2 + size * i, "element %d is %d", i, sum[i]);
  }
  double mine[3] = {g_rank * 10.0, g_rank * 10.0 + 1, g_rank * 10.0 + 2};
  double* all = calloc((size_t)size * 3, sizeof(double));
  CHECK(hvd_allgather(comm, mine, all, 3, HVD_FLOAT64, NULL));
  for (int i = 0; i < size * 3; ++i) {
    EXPECT(all[i] == (i / 3) * 10.0 + i % 3, "gathered element %d is %g", i, all[i]);
  }
  int64_t word = g_rank == size - 1 ? 4242 : -1;
  CHECK(hvd_broadcast(comm, &word, &word, 1, HVD_INT64, size - 1, &host));
  EXPECT(word == 4242, "broadcast gave %lld", (long long)word);
  CHECK(hvd_barrier(comm));

  /* Asynchronous: one named allreduce, then a group of all three collectives. */
  float grad[5] = {1, 2, 3, 4, 5};
  const int64_t grad_shape[1] = {5};
  hvd_request* request = NULL;
  CHECK(hvd_allreduce_async(comm, "abi10.grad", grad, grad, HVD_FLOAT32, 1, grad_shape, HVD_AVERAGE,
                            2.0, 0.5, &host, &request));
  CHECK(hvd_request_wait(request, 60));
  hvd_request_free(request);
  for (int i = 0; i < 5; ++i) EXPECT(grad[i] == i + 1.0f, "averaged element %d is %g", i, grad[i]);

  int32_t a[4] = {g_rank, g_rank, g_rank, g_rank};
  int32_t* gathered = calloc((size_t)size * 2, sizeof(int32_t));
  int32_t b[2] = {g_rank, g_rank + 100};
  int32_t c[3] = {g_rank, g_rank, g_rank};
  const int64_t shape_a[2] = {2, 2};
  const int64_t shape_b[1] = {2};
  const int64_t shape_c[1] = {3};
  hvd_tensor tensors[3];
  memset(tensors, 0, sizeof tensors);
  for (int i = 0; i < 3; ++i) {
    tensors[i].struct_size = sizeof(hvd_tensor);
    tensors[i].placement = &host;
  }
  tensors[0].collective = HVD_COLLECTIVE_ALLREDUCE;
  tensors[0].name = "abi10.a";
  tensors[0].sendbuf = a;
  tensors[0].recvbuf = a;
  tensors[0].dtype = HVD_INT32;
  tensors[0].ndim = 2;
  tensors[0].shape = shape_a;
  tensors[0].op = HVD_MAX;
  tensors[1].collective = HVD_COLLECTIVE_ALLGATHER;
  tensors[1].name = "abi10.b";
  tensors[1].sendbuf = b;
  tensors[1].recvbuf = gathered;
  tensors[1].dtype = HVD_INT32;
  tensors[1].ndim = 1;
  tensors[1].shape = shape_b;
  tensors[2].collective = HVD_COLLECTIVE_BROADCAST;
  tensors[2].name = "abi10.c";
  tensors[2].sendbuf = c;
  tensors[2].recvbuf = c;
  tensors[2].dtype = HVD_INT32;
  tensors[2].ndim = 1;
  tensors[2].shape = shape_c;
  tensors[2].root = 0;
  hvd_request* requests[3] = {NULL, NULL, NULL};
  CHECK(hvd_grouped_async(comm, tensors, 3, requests));
  for (int i = 0; i < 3; ++i) {
    CHECK(hvd_request_wait(requests[i], 60));
    hvd_request_free(requests[i]);
  }
  for (int i = 0; i < 4; ++i) EXPECT(a[i] == size - 1, "max element %d is %d", i, a[i]);
  for (int r = 0; r < size; ++r) {
    EXPECT(gathered[2 * r] == r && gathered[2 * r + 1] == r + 100, "gathered part of rank %d", r);
  }
  for (int i = 0; i < 3; ++i) EXPECT(c[i] == 0, "broadcast element %d is %d", i, c[i]);

  hvd_scheduler_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(hvd_scheduler_stats_get(comm, &stats));
  EXPECT(stats.tensors >= 4, "the scheduler completed %llu tensors",
         (unsigned long long)stats.tensors);

  free(gathered);
  free(all);
  CHECK(hvd_finalize(comm));
  printf("rank %d of %d: an application of hvd.h 1.0 ran on today's libhvd: ok\n", g_rank, size);
  return 0;
}
