/* shmc: a real multi-rank hvd backend in C, moving data through POSIX shared memory.
 *
 * It serves communicators whose ranks all run on one host. At init, rank 0 creates a shared
 * memory segment, the others map it, and rank 0 unlinks its name as soon as all have: from then
 * on the segment lives exactly as long as some rank maps it, so a crash leaves nothing behind. The
 * segment holds a header, one cache line of barrier state per rank, and one fixed slot per rank.
 * Every collective runs in chunks of at most one slot:
 *
 *     each rank copies its chunk into its own slot      (nobody else writes there)
 *     barrier                                           (every slot is now full)
 *     each rank reads every slot it needs               (nobody writes anywhere)
 *     barrier                                           (every slot may be reused)
 *
 * That is slower than a ring or a tree, but each step is obvious, and every rank reduces the
 * same slots in the same order, so results are bit-identical everywhere.
 *
 * What it shows of the ABI (docs/plugin-abi.md): a hand-written 1.1 table; reading 1.1 fields
 * only where struct_size covers them; declaring a subset of dtypes and ops (the host refuses the
 * others before they get here); bounding every wait by timeout_ms; abort from another thread;
 * errors as a status plus host->set_error on the calling thread. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hvd/backend.h"
#include "hvd/reduce.h"

#if HVD_BACKEND_ABI_MINOR < 1
#error "shmc uses ABI 1.1 (abort, declared dtypes): build it against hvd's 1.1 SDK or later"
#endif
/* A lock-free atomic is a plain word in memory, so it works between processes; one that needs a
 * lock would hide a process-local lock, and silently not. */
#if ATOMIC_LLONG_LOCK_FREE != 2 || ATOMIC_INT_LOCK_FREE != 2
#error "shmc needs lock-free atomics to share them between processes"
#endif

#define SHMC_SLOT_BYTES ((size_t)1 << 20) /* a multiple of every element size */
#define SHMC_LINE 64                      /* a cache line */
#define SHMC_MAGIC 0x53484d43u            /* "SHMC" */
#define SHMC_PROTOCOL 1u                  /* bump when the segment's layout changes */
#define SHMC_DTYPES                                                                     \
  (HVD_DTYPE_BIT(HVD_FLOAT32) | HVD_DTYPE_BIT(HVD_FLOAT64) | HVD_DTYPE_BIT(HVD_INT32) | \
   HVD_DTYPE_BIT(HVD_INT64))
#define SHMC_OPS                                                                          \
  (HVD_REDUCE_OP_BIT(HVD_SUM) | HVD_REDUCE_OP_BIT(HVD_MIN) | HVD_REDUCE_OP_BIT(HVD_MAX) | \
   HVD_REDUCE_OP_BIT(HVD_AVERAGE))

/* What identifies a communicator's segment. Every rank builds its own from what init told it;
 * rank 0 writes its copy at the head of the segment, and every rank compares its own with its
 * peers' (at init) and with the segment's (when mapping it) before trusting a single offset. */
struct shm_ident {
  uint32_t magic;
  uint32_t protocol;
  int32_t size;
  int32_t unused;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  uint64_t comm_id;
};
_Static_assert(sizeof(struct shm_ident) == 40, "no padding: it is compared with memcmp");

struct shm_header {
  struct shm_ident ident;
  /* 0, or 1 + the first rank that gave up (timeout, abort): its peers then fail at once
   * instead of waiting out their own timeouts for a rank that will never come. */
  atomic_int broken_by;
};
_Static_assert(sizeof(struct shm_header) <= SHMC_LINE, "the header fits one line");

/* One per rank, each on a cache line of its own, so that a rank announcing its arrival does not
 * invalidate the line every other rank is polling. */
struct shm_line {
  atomic_ullong arrived; /* the number of the last barrier this rank has reached */
  char pad[SHMC_LINE - sizeof(atomic_ullong)];
};

struct hvd_backend_comm {
  int rank;
  int size;
  int64_t timeout_ms;
  const hvd_host_services* host;
  unsigned char* base; /* the mapping: header, lines, then `size` slots */
  size_t mapped_bytes;
  struct shm_header* header;
  struct shm_line* lines;
  unsigned char* slots;
  unsigned long long barriers; /* barriers this rank has entered so far */
  int64_t deadline_ns;         /* of the call in progress */
  atomic_int aborted;          /* abort's flag: the one field another thread writes */
  hvd_status broken;           /* set once a call failed for good: all later calls fail */
  char why[256];               /* what broke it */
};

/* ---- errors ------------------------------------------------------------------------------- */

/* The one way an error leaves this file: a status, with its message handed to the host on the
 * calling thread (the host copies it, and prefixes the call and the backend's name). */
static hvd_status report(const hvd_host_services* host, hvd_status code, const char* format, ...) {
  char message[512];
  va_list ap;
  va_start(ap, format);
  vsnprintf(message, sizeof message, format, ap);
  va_end(ap);
  host->set_error(host->ctx, message);
  return code;
}

/* Fail, and stay failed: after a timeout or an abort the ranks are out of step (some may have
 * passed a barrier that others have not), so no later call could be trusted. */
static hvd_status break_comm(struct hvd_backend_comm* c, hvd_status code, const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  vsnprintf(c->why, sizeof c->why, format, ap);
  va_end(ap);
  int nobody = 0;
  atomic_compare_exchange_strong(&c->header->broken_by, &nobody, c->rank + 1);
  c->broken = code;
  return report(c->host, code, "%s", c->why);
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- the barrier ---------------------------------------------------------------------------
 * Barrier number k: a rank stores k in its own line, then waits until every line says >= k.
 * The counters only grow, so no sense reversal is needed: a fast rank that already entered
 * barrier k+1 still satisfies a slow one waiting for k. The release store publishes this rank's
 * slot writes; the acquire loads make the peers' slots visible before we read them. */

/* "1, 3": the ranks that have not reached barrier `target`, for the timeout message. */
static void missing_ranks(const struct hvd_backend_comm* c, unsigned long long target, char* out,
                          size_t out_size) {
  size_t used = 0;
  out[0] = '\0';
  for (int r = 0; r < c->size; ++r) {
    if (atomic_load_explicit(&c->lines[r].arrived, memory_order_acquire) >= target) continue;
    if (used + 20 > out_size) { /* room for ", ..." and no more */
      snprintf(out + used, out_size - used, ", ...");
      return;
    }
    used += (size_t)snprintf(out + used, out_size - used, "%s%d", used ? ", " : "", r);
  }
}

/* Several ranks may share one core: spinning would steal the time the late rank needs to arrive.
 * So look again at once a few times (the peer is likely nanoseconds away), then yield the core,
 * then sleep. */
static void back_off(unsigned polls) {
  static const struct timespec nap = {0, 50 * 1000};
  if (polls < 64) return;
  if (polls < 256) {
    sched_yield();
    return;
  }
  nanosleep(&nap, NULL);
}

static hvd_status barrier_wait(struct hvd_backend_comm* c, const char* what) {
  const unsigned long long target = ++c->barriers;
  atomic_store_explicit(&c->lines[c->rank].arrived, target, memory_order_release);
  for (unsigned polls = 0;; polls += polls < 1000u) { /* counts up to 1000, then stays */
    int all = 1;
    for (int r = 0; r < c->size && all; ++r) {
      all = atomic_load_explicit(&c->lines[r].arrived, memory_order_acquire) >= target;
    }
    if (all) return HVD_SUCCESS;
    if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
      return break_comm(c, HVD_ERR_STATE, "shmc: %s was aborted", what);
    }
    const int by = atomic_load_explicit(&c->header->broken_by, memory_order_acquire);
    if (by != 0) {
      return break_comm(c, HVD_ERR_REMOTE,
                        "shmc: %s: rank %d gave up on the communicator (a timeout or an abort)",
                        what, by - 1);
    }
    if (now_ns() > c->deadline_ns) {
      char missing[160];
      missing_ranks(c, target, missing, sizeof missing);
      return break_comm(c, HVD_ERR_TIMEOUT,
                        "shmc: %s timed out after %lld ms on rank %d of %d: rank(s) %s did not "
                        "arrive",
                        what, (long long)c->timeout_ms, c->rank, c->size, missing);
    }
    back_off(polls);
  }
}

/* ---- collectives ---------------------------------------------------------------------------- */

static unsigned char* slot(const struct hvd_backend_comm* c, int r) {
  return c->slots + (size_t)r * SHMC_SLOT_BYTES;
}

/* The elements of a rank's `total` that fall in the chunk starting at element `done`. */
static uint64_t in_chunk(uint64_t total, uint64_t done, uint64_t per_chunk) {
  if (total <= done) return 0;
  return total - done < per_chunk ? total - done : per_chunk;
}

/* Every call starts here: a broken communicator fails at once, and the call's deadline is set,
 * counted from its entry as the host's watchdog counts it. */
static hvd_status begin(struct hvd_backend_comm* c, const char* what) {
  if (c->broken != HVD_SUCCESS || atomic_load_explicit(&c->aborted, memory_order_acquire)) {
    return report(c->host, HVD_ERR_STATE, "shmc: %s: the communicator is broken (%s)", what,
                  c->broken != HVD_SUCCESS ? c->why : "aborted");
  }
  c->deadline_ns = now_ns() + c->timeout_ms * 1000000;
  return HVD_SUCCESS;
}

/* The host promises valid arguments; checking them anyway is cheap, and a plugin must never act
 * on a value it does not know (read a buffer at the wrong width). */
static hvd_status begin_collective(struct hvd_backend_comm* c, const char* what,
                                   const hvd_collective_args* a, int uses_op, int reads_send) {
  if (a == NULL || a->struct_size < HVD_COLLECTIVE_ARGS_SIZE_1_0 || a->dtype < 0 ||
      a->dtype >= HVD_DTYPE_COUNT || (SHMC_DTYPES & HVD_DTYPE_BIT(a->dtype)) == 0 ||
      (uses_op &&
       (a->op < 0 || a->op >= HVD_REDUCE_OP_COUNT || (SHMC_OPS & HVD_REDUCE_OP_BIT(a->op)) == 0)) ||
      a->memory_type != HVD_MEMORY_HOST ||
      (a->count > 0 && ((reads_send && a->sendbuf == NULL) || a->recvbuf == NULL))) {
    return report(c->host, HVD_ERR_INVALID_ARGUMENT,
                  "shmc: %s: arguments the host should never pass (an undeclared dtype, op or "
                  "memory type, a null buffer or a short struct)",
                  what);
  }
  return begin(c, what);
}

static hvd_status shmc_allreduce(hvd_backend_comm* c, const hvd_collective_args* a) {
  hvd_status s = begin_collective(c, "allreduce", a, 1, 1);
  if (s != HVD_SUCCESS) return s;
  const size_t elem = hvd_dtype_size(a->dtype);
  const uint64_t per_chunk = SHMC_SLOT_BYTES / elem;
  /* AVERAGE is a SUM, then one division: dividing each contribution first would round
   * differently from what the ABI specifies (the sum divided by the size). */
  const hvd_reduce_op op = a->op == HVD_AVERAGE ? HVD_SUM : a->op;
  for (uint64_t done = 0; done < a->count; done += per_chunk) {
    const uint64_t n = in_chunk(a->count, done, per_chunk);
    unsigned char* out = (unsigned char*)a->recvbuf + (size_t)done * elem;
    /* In place is free: this chunk of sendbuf is copied away before `out` is written. */
    memcpy(slot(c, c->rank), (const unsigned char*)a->sendbuf + (size_t)done * elem, n * elem);
    if ((s = barrier_wait(c, "allreduce")) != HVD_SUCCESS) return s;
    /* Rank order on every rank: ((s0 op s1) op s2) ..., hence the same bits everywhere. */
    memcpy(out, slot(c, 0), n * elem);
    for (int r = 1; r < c->size && s == HVD_SUCCESS; ++r) {
      s = hvd_reduce(out, out, slot(c, r), n, a->dtype, op);
    }
    if (s == HVD_SUCCESS && a->op == HVD_AVERAGE) s = hvd_divide(out, n, a->dtype, c->size);
    if (s != HVD_SUCCESS) return break_comm(c, s, "shmc: allreduce: hvd_reduce refused");
    if ((s = barrier_wait(c, "allreduce")) != HVD_SUCCESS) return s;
  }
  return HVD_SUCCESS;
}

/* With recv_counts (HVD_CAP_ALLGATHERV) rank r contributes recv_counts[r] elements; without, every
 * rank contributes `count`. Either way every rank knows every count, so the chunk loop runs as
 * many times on every rank. */
static hvd_status shmc_allgather(hvd_backend_comm* c, const hvd_collective_args* a) {
  hvd_status s = begin_collective(c, "allgather", a, 0, 1);
  if (s != HVD_SUCCESS) return s;
  const uint64_t* counts = a->recv_counts;
  if (counts != NULL && counts[c->rank] != a->count) {
    return report(c->host, HVD_ERR_INVALID_ARGUMENT,
                  "shmc: allgather: count %llu but recv_counts[%d] = %llu",
                  (unsigned long long)a->count, c->rank, (unsigned long long)counts[c->rank]);
  }
  const size_t elem = hvd_dtype_size(a->dtype);
  const uint64_t per_chunk = SHMC_SLOT_BYTES / elem;
  uint64_t most = a->count;
  for (int r = 0; counts != NULL && r < c->size; ++r) most = counts[r] > most ? counts[r] : most;
  for (uint64_t done = 0; done < most; done += per_chunk) {
    const uint64_t mine = in_chunk(a->count, done, per_chunk);
    if (mine > 0) {
      memcpy(slot(c, c->rank), (const unsigned char*)a->sendbuf + (size_t)done * elem, mine * elem);
    }
    if ((s = barrier_wait(c, "allgather")) != HVD_SUCCESS) return s;
    /* In place, sendbuf is our own block of recvbuf: we copy the same bits back over it. */
    uint64_t offset = 0; /* of rank r's block in recvbuf, in elements */
    for (int r = 0; r < c->size; ++r) {
      const uint64_t total = counts != NULL ? counts[r] : a->count;
      const uint64_t n = in_chunk(total, done, per_chunk);
      if (n > 0) memcpy((unsigned char*)a->recvbuf + (offset + done) * elem, slot(c, r), n * elem);
      offset += total;
    }
    if ((s = barrier_wait(c, "allgather")) != HVD_SUCCESS) return s;
  }
  return HVD_SUCCESS;
}

/* Only the root writes, so it may use every slot as one big chunk. Only the root's sendbuf is
 * read: the others may pass NULL. */
static hvd_status shmc_broadcast(hvd_backend_comm* c, const hvd_collective_args* a) {
  const int root = a != NULL && a->root == c->rank;
  hvd_status s = begin_collective(c, "broadcast", a, 0, root);
  if (s != HVD_SUCCESS) return s;
  const size_t chunk = SHMC_SLOT_BYTES * (size_t)c->size;
  const size_t total = (size_t)a->count * hvd_dtype_size(a->dtype);
  for (size_t done = 0; done < total; done += chunk) {
    const size_t bytes = in_chunk(total, done, chunk);
    if (root) memcpy(slot(c, 0), (const unsigned char*)a->sendbuf + done, bytes);
    if ((s = barrier_wait(c, "broadcast")) != HVD_SUCCESS) return s;
    if (!root) memcpy((unsigned char*)a->recvbuf + done, slot(c, 0), bytes);
    if ((s = barrier_wait(c, "broadcast")) != HVD_SUCCESS) return s;
  }
  /* The root's own copy needs no peer; memcpy must not be given the same buffer twice. */
  if (root && total > 0 && a->sendbuf != a->recvbuf) memcpy(a->recvbuf, a->sendbuf, total);
  return HVD_SUCCESS;
}

static hvd_status shmc_barrier(hvd_backend_comm* c) {
  const hvd_status s = begin(c, "barrier");
  return s != HVD_SUCCESS ? s : barrier_wait(c, "barrier");
}

/* From any thread, during a call or not, any number of times. It must not wait for peers, so
 * it only raises flags: ours, which the waiting call sees within one poll, and the segment's,
 * which tells the peers not to wait for us. */
static hvd_status shmc_abort(hvd_backend_comm* c) {
  atomic_store_explicit(&c->aborted, 1, memory_order_release);
  int nobody = 0;
  atomic_compare_exchange_strong(&c->header->broken_by, &nobody, c->rank + 1);
  return HVD_SUCCESS;
}

/* Not collective: every collective ended with a barrier, so no peer still reads our slot, and
 * our unmapping leaves theirs alone. */
static hvd_status shmc_finalize(hvd_backend_comm* c) {
  if (c == NULL) return HVD_SUCCESS;
  if (c->base != NULL) munmap(c->base, c->mapped_bytes);
  free(c);
  return HVD_SUCCESS;
}

/* ---- init ------------------------------------------------------------------------------------
 * 1. Every rank tells every other who it thinks it is (oob_allgather); all judge the same data.
 * 2. Only then, with every rank present, rank 0 creates the segment and publishes its name, or
 *    why there is none (kv_set); the others wait for it (kv_get) and map it.
 * 3. Every rank says whether it could map it (oob_allgather), and rank 0 unlinks the name.
 * The segment's name exists only between 2 and 3, while every rank is inside init: a rank killed
 * before init completes leaves nothing behind in all but that brief window.
 * oob_allgather is collective, so each verdict that decides whether a rank takes part in the
 * next round is one every rank reaches alike. */

struct hello {
  struct shm_ident ident;
  int32_t rank;
  int32_t unused;
};
_Static_assert(sizeof(struct hello) == 48, "no padding: its bytes go to other processes");

struct segment_record { /* rank 0's kv entry */
  char name[64];
  char why[128]; /* "" or why rank 0 has no segment */
};

static size_t lines_end(int size) { /* where the slots start: page-aligned */
  return (SHMC_LINE * (1 + (size_t)size) + 4095) & ~(size_t)4095;
}

static void describe_errno(int e, char* why, size_t why_size, const char* step, const char* name) {
  char text[96] = "unknown error";
  (void)strerror_r(e, text, sizeof text);
  snprintf(why, why_size, "%s(%s): %s", step, name, text);
}

/* Rank 0 creates the segment (O_EXCL: a clash of names is an error, never two communicators
 * sharing one); the others open it and believe nothing in it until checked. On failure, `why`
 * says what went wrong and nothing is left mapped, nor created. */
static void map_segment(struct hvd_backend_comm* c, const struct shm_ident* id, const char* name,
                        char* why, size_t why_size) {
  const int create = c->rank == 0;
  const int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) {
    describe_errno(errno, why, why_size, "shm_open", name);
    if (!create) strncat(why, " (do all ranks share /dev/shm?)", why_size - strlen(why) - 1);
    return;
  }
  /* Rank 0 reserves the pages now: a full /dev/shm is then an error here, not a SIGBUS in the
   * middle of a collective. The others check the size, since touching past the end is SIGBUS. */
  struct stat st;
  const int e =
      create ? posix_fallocate(fd, 0, (off_t)c->mapped_bytes) : (fstat(fd, &st) != 0 ? errno : 0);
  void* base = MAP_FAILED;
  if (e != 0) {
    describe_errno(e, why, why_size, create ? "posix_fallocate" : "fstat", name);
  } else if (!create && (uint64_t)st.st_size < c->mapped_bytes) {
    snprintf(why, why_size, "%s has %lld bytes, not %zu", name, (long long)st.st_size,
             c->mapped_bytes);
  } else if ((base = mmap(NULL, c->mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
             MAP_FAILED) {
    describe_errno(errno, why, why_size, "mmap", name);
  }
  close(fd); /* the mapping keeps the segment */
  struct shm_header* h = (struct shm_header*)base;
  if (base == MAP_FAILED) {
    if (create) shm_unlink(name);
    return;
  }
  if (create) {
    h->ident = *id;
    atomic_init(&h->broken_by, 0);
    struct shm_line* lines = (struct shm_line*)((unsigned char*)base + SHMC_LINE);
    for (int r = 0; r < c->size; ++r) atomic_init(&lines[r].arrived, 0);
  } else if (memcmp(&h->ident, id, sizeof *id) != 0) {
    snprintf(why, why_size, "%s is not this communicator's segment (its header differs)", name);
    munmap(base, c->mapped_bytes);
    return;
  }
  c->base = (unsigned char*)base;
}

static hvd_status check_hellos(struct hvd_backend_comm* c, const struct hello* all,
                               const struct shm_ident* id) {
  for (int r = 0; r < c->size; ++r) {
    if (all[r].rank != r || memcmp(&all[r].ident, id, sizeof *id) != 0) {
      return report(c->host, HVD_ERR_MISMATCH,
                    "shmc: init: rank %d says it is rank %d of %d in communicator %016llx "
                    "(protocol %u); this is rank %d of %d in communicator %016llx (protocol %u)",
                    r, (int)all[r].rank, (int)all[r].ident.size,
                    (unsigned long long)all[r].ident.comm_id, (unsigned)all[r].ident.protocol,
                    c->rank, c->size, (unsigned long long)id->comm_id, SHMC_PROTOCOL);
    }
  }
  return HVD_SUCCESS;
}

/* Step 2 on rank 0. The name is the job's (rank 0's pid) and the communicator's (comm_id); the
 * serial number keeps two communicators of one process apart even where comm_id is 0 (a 1.0
 * host). HVD_SUCCESS: the segment exists, and the others were told its name. */
static hvd_status publish_segment(struct hvd_backend_comm* c, const struct shm_ident* id,
                                  struct segment_record* rec) {
  static atomic_uint serial;
  snprintf(rec->name, sizeof rec->name, "/hvd-shmc-%ld-%016llx-%u", (long)getpid(),
           (unsigned long long)id->comm_id, atomic_fetch_add(&serial, 1u));
  map_segment(c, id, rec->name, rec->why, sizeof rec->why);
  const hvd_status s = c->host->kv_set(c->host->ctx, "segment", rec, sizeof *rec);
  if (s != HVD_SUCCESS) {
    return report(c->host, s, "shmc: init: publishing the segment's name failed");
  }
  if (rec->why[0] != '\0') {
    return report(c->host, HVD_ERR_SYSTEM, "shmc: init: rank 0 could not create the segment: %s",
                  rec->why);
  }
  return HVD_SUCCESS;
}

/* Step 2 on ranks other than 0: rank 0's record, checked before its name is opened. `why` says
 * what failed; HVD_SUCCESS here only means the rank goes on to step 3. */
static hvd_status open_published(struct hvd_backend_comm* c, const struct shm_ident* id, char* why,
                                 size_t why_size) {
  const hvd_host_services* host = c->host;
  struct segment_record rec;
  void* value = NULL;
  size_t size = 0;
  const hvd_status s = host->kv_get(host->ctx, "segment", c->timeout_ms, &value, &size);
  if (s != HVD_SUCCESS) return report(host, s, "shmc: init: rank 0 published no segment name");
  if (size == sizeof rec) memcpy(&rec, value, sizeof rec);
  host->free_value(host->ctx, value);
  if (size != sizeof rec || memchr(rec.name, '\0', sizeof rec.name) == NULL ||
      memchr(rec.why, '\0', sizeof rec.why) == NULL) {
    snprintf(why, why_size, "rank 0's segment record is malformed");
  } else if (rec.why[0] != '\0') { /* rank 0 fails with this too, and skips step 3: so do we */
    return report(host, HVD_ERR_SYSTEM, "shmc: init: rank 0 could not create the segment: %s",
                  rec.why);
  } else if (strncmp(rec.name, "/hvd-shmc-", 10) != 0) { /* never open what is not ours */
    snprintf(why, why_size, "rank 0 named no segment of ours");
  } else {
    map_segment(c, id, rec.name, why, why_size);
  }
  return HVD_SUCCESS;
}

static hvd_status attach(struct hvd_backend_comm* c, uint64_t comm_id) {
  const hvd_host_services* host = c->host;
  const struct shm_ident id = {SHMC_MAGIC,      SHMC_PROTOCOL,   c->size, 0,
                               SHMC_SLOT_BYTES, c->mapped_bytes, comm_id};
  const struct hello me = {id, c->rank, 0};
  /* Both allocated before step 1, so that no rank can fail alone between the rounds. */
  struct hello* all = (struct hello*)calloc((size_t)c->size, sizeof *all);
  char(*whys)[128] = (char(*)[128])calloc((size_t)c->size, 128);
  struct segment_record rec;
  char why[128] = "";
  memset(&rec, 0, sizeof rec);
  hvd_status s = HVD_SUCCESS;
  if (all == NULL || whys == NULL) {
    s = report(host, HVD_ERR_SYSTEM, "shmc: init: out of memory"); /* peers: their timeout */
  } else if ((s = host->oob_allgather(host->ctx, &me, sizeof me, all, c->timeout_ms)) != 0) {
    report(host, s, "shmc: init: exchanging the ranks' identities failed");
  } else if ((s = check_hellos(c, all, &id)) == HVD_SUCCESS) {
    s = c->rank == 0 ? publish_segment(c, &id, &rec) : open_published(c, &id, why, sizeof why);
  }
  if (s == HVD_SUCCESS) {
    s = host->oob_allgather(host->ctx, why, sizeof why, whys, c->timeout_ms);
    if (s != HVD_SUCCESS) report(host, s, "shmc: init: exchanging the ranks' mapping failed");
    for (int r = 0; s == HVD_SUCCESS && r < c->size; ++r) {
      whys[r][127] = '\0';
      if (whys[r][0] != '\0') {
        s = report(host, HVD_ERR_SYSTEM, "shmc: init: rank %d could not map the segment: %s", r,
                   whys[r]);
      }
    }
  }
  /* Every rank has mapped it, or init fails everywhere: either way the name can go. */
  if (c->rank == 0 && c->base != NULL) shm_unlink(rec.name);
  free(all);
  free(whys);
  if (s != HVD_SUCCESS) return s;
  c->header = (struct shm_header*)c->base;
  c->lines = (struct shm_line*)(c->base + SHMC_LINE);
  c->slots = c->base + lines_end(c->size);
  return HVD_SUCCESS;
}

static hvd_status shmc_init(const hvd_backend_init_args* args, hvd_backend_comm** out) {
  if (args == NULL || out == NULL || args->struct_size < HVD_BACKEND_INIT_ARGS_SIZE_1_0 ||
      args->host == NULL || args->host->struct_size < HVD_HOST_SERVICES_SIZE_1_0) {
    return HVD_ERR_INVALID_ARGUMENT; /* no host to tell: nothing better to do */
  }
  *out = NULL;
  const hvd_host_services* host = args->host;
  if (args->size < 1 || args->rank < 0 || args->rank >= args->size || args->timeout_ms <= 0) {
    return report(host, HVD_ERR_INVALID_ARGUMENT, "shmc: init: rank %d of %d, timeout %lld ms",
                  (int)args->rank, (int)args->size, (long long)args->timeout_ms);
  }
  /* Fields of 1.1, read only where the host's struct has them; else their documented defaults. */
  int32_t here = args->local_size;
  uint64_t comm_id = 0;
  if (HVD_HAS_FIELD(args, hvd_backend_init_args, member_local_size)) {
    here = args->member_local_size;
  }
  if (HVD_HAS_FIELD(args, hvd_backend_init_args, comm_id)) comm_id = args->comm_id;
  /* Every rank reaches the same verdict: if one host lacks some rank, every host does. */
  if (here != args->size) {
    return report(host, HVD_ERR_UNSUPPORTED,
                  "shmc: the communicator's %d ranks must all run on one host (shared memory), "
                  "but this host has only %d of them: use a network backend such as gloo",
                  (int)args->size, (int)here);
  }
  struct hvd_backend_comm* c = (struct hvd_backend_comm*)calloc(1, sizeof *c);
  if (c == NULL) return report(host, HVD_ERR_SYSTEM, "shmc: init: out of memory");
  c->rank = args->rank;
  c->size = args->size;
  /* Capped at a year, so that deadlines in nanoseconds cannot overflow. */
  c->timeout_ms = args->timeout_ms < 31536000000LL ? args->timeout_ms : 31536000000LL;
  c->host = host;
  c->mapped_bytes = lines_end(c->size) + (size_t)c->size * SHMC_SLOT_BYTES;
  atomic_init(&c->aborted, 0);
  const hvd_status s = attach(c, comm_id);
  if (s != HVD_SUCCESS) {
    shmc_finalize(c);
    return s;
  }
  *out = c;
  return HVD_SUCCESS;
}

static const hvd_backend_v1 shmc_table = {
    .struct_size = sizeof(hvd_backend_v1),
    .abi_major = HVD_BACKEND_ABI_MAJOR,
    .abi_minor = HVD_BACKEND_ABI_MINOR,
    .name = "shmc",
    .version = "1.0.0",
    .description = "example in C: POSIX shared memory between the ranks of one host",
    .capabilities = HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV,
    .init = shmc_init,
    .finalize = shmc_finalize,
    .allreduce = shmc_allreduce,
    .allgather = shmc_allgather,
    .broadcast = shmc_broadcast,
    .barrier = shmc_barrier,
    .dtypes = SHMC_DTYPES,
    .reduce_ops = SHMC_OPS,
    .abort = shmc_abort,
    /* reduce_scatter, split, alltoall: NULL, so the host composes them from the above. */
};

HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) { return &shmc_table; }
