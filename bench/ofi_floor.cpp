// hvd-ofi-floor: the fastest a small 2-rank allreduce can be over libfabric, beside hvd's ofi
// backend and Open MPI's MPI_Allreduce.
//
//   hvdrun --mpi -np 2 --mpi-args "--bind-to core" hvd-ofi-floor [-b BYTES] [-n ITERS] [-w WARMUP]
//                                                                [-p PROVIDER]
//
// The floor is what hvd's ofi backend does for a small allreduce of 2 ranks, and nothing else:
// post a tagged receive from the peer, send the same bytes to it inline (fi_tinject), read the
// completion queue until the receive completes, add the two halves. It runs call by call with
// hvd_allreduce on the ofi backend (the same provider: -p sets HVD_OFI_PROVIDER) and with
// MPI_Allreduce, on the same bytes, each call timed, so all three see the same moments of a noisy
// machine. It prints each one's p50 (of the slower rank) and their ratios: hvd over the floor is
// what hvd's host and its plugin add; the floor over MPI_Allreduce is what libfabric's provider
// costs against Open MPI's own shared-memory path. MPI starts the job and exchanges the endpoint
// names. The floor's waits end with an error after 10 s and hvd's at HVD_TIMEOUT; MPI's are the
// launcher's to end. The order of the three turns with each call, so that none always follows the
// same one (whatever skew between the ranks a call leaves, the next absorbs). MPI runs with
// MPI_THREAD_MULTIPLE, as under hvd's mpi backend (so hvd-bench's direct MPI_Allreduce too).
#include <mpi.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hvd/hvd.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  size_t bytes = 8;
  int iters = 100000;
  int warmup = 1000;
  std::string provider = "shm";
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "hvd-ofi-floor: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

// libfabric's calls return 0 or a negative error code.
void check(const char* what, long code) {
  if (code != 0) fail(std::string(what) + " failed: " + fi_strerror(static_cast<int>(-code)));
}

Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      if (rank == 0) {
        std::printf(
            "usage: hvd-ofi-floor [-b BYTES] [-n ITERS] [-w WARMUP] [-p PROVIDER]\n"
            "  under mpirun with 2 ranks: a libfabric exchange (tagged receive, fi_tinject,\n"
            "  completion polled), hvd_allreduce on ofi and MPI_Allreduce, call by call;\n"
            "  their p50s and ratios\n");
      }
      MPI_Finalize();
      std::exit(0);
    }
    if (i + 1 >= argc) fail("'" + arg + "' needs a value (see --help)");
    const char* value = argv[++i];
    char* end = nullptr;
    const long long number = std::strtoll(value, &end, 10);
    const bool whole = end != value && *end == '\0' && number >= 0;
    if (arg == "-p") {
      o.provider = value;
    } else if (!whole) {
      fail("'" + arg + " " + value + "': not a whole number");
    } else if (arg == "-b") {
      o.bytes = static_cast<size_t>(number);
    } else if (arg == "-n") {
      if (number == 0) fail("-n must be at least 1");
      o.iters = static_cast<int>(number);
    } else if (arg == "-w") {
      o.warmup = static_cast<int>(number);
    } else {
      fail("unknown argument '" + arg + "' (see --help)");
    }
  }
  if (o.bytes % sizeof(float) != 0) fail("-b must be a multiple of 4 (float32 elements)");
  return o;
}

// One libfabric RDM endpoint with tagged messages, as hvd's ofi backend opens it.
class Exchange {
 public:
  Exchange(const Options& o, int rank) : rank_(rank) {
    fi_info* hints = fi_allocinfo();
    if (hints == nullptr) fail("fi_allocinfo failed");
    hints->caps = FI_TAGGED | FI_DIRECTED_RECV;
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = 0;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = strdup(o.provider.c_str());
    const int found = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr,
                                 0, hints, &info_);
    fi_freeinfo(hints);
    if (found != 0) fail("no libfabric provider '" + o.provider + "' with tagged RDM messages");
    check("fi_fabric", fi_fabric(info_->fabric_attr, &fabric_, nullptr));
    check("fi_domain", fi_domain(fabric_, info_, &domain_, nullptr));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = info_->rx_attr->size + info_->tx_attr->size;
    check("fi_cq_open", fi_cq_open(domain_, &cq_attr, &cq_, nullptr));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = 2;
    check("fi_av_open", fi_av_open(domain_, &av_attr, &av_, nullptr));
    check("fi_endpoint", fi_endpoint(domain_, info_, &ep_, nullptr));
    check("fi_ep_bind", fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV));
    check("fi_ep_bind", fi_ep_bind(ep_, &av_->fid, 0));
    check("fi_enable", fi_enable(ep_));
    if (o.bytes > info_->tx_attr->inject_size) {
      fail("-b " + std::to_string(o.bytes) + " is above the provider's inject size (" +
           std::to_string(info_->tx_attr->inject_size) + " B)");
    }
    char names[2][256] = {};
    size_t length = sizeof(names[0]);
    check("fi_getname", fi_getname(&ep_->fid, names[rank], &length));
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, names, sizeof(names[0]), MPI_CHAR,
                  MPI_COMM_WORLD);
    const int peer = 1 - rank;
    if (fi_av_insert(av_, names[peer], 1, &peer_, 0, nullptr) != 1) fail("fi_av_insert failed");
  }

  ~Exchange() {
    fi_close(&ep_->fid);
    fi_close(&av_->fid);
    fi_close(&cq_->fid);
    fi_close(&domain_->fid);
    fi_close(&fabric_->fid);
    fi_freeinfo(info_);
  }

  // out = the lower rank's in + the higher rank's, as ofi's recursive doubling combines them.
  void allreduce(const float* in, float* theirs, float* out, size_t count, uint64_t tag) {
    const size_t bytes = count * sizeof(float);
    const Clock::time_point until = Clock::now() + std::chrono::seconds(10);
    ssize_t posted;
    while ((posted = fi_trecv(ep_, theirs, bytes, nullptr, peer_, tag, 0, &context_)) ==
           -FI_EAGAIN) {
      progress(until);
    }
    check("fi_trecv", posted);
    while ((posted = fi_tinject(ep_, in, bytes, peer_, tag)) == -FI_EAGAIN) progress(until);
    check("fi_tinject", posted);
    for (int polls = 1;; ++polls) {
      fi_cq_tagged_entry entry;
      const ssize_t n = fi_cq_read(cq_, &entry, 1);
      if (n == 1) break;
      if (n == -FI_EAVAIL) fail("a transfer failed (the completion queue holds an error)");
      if (n != -FI_EAGAIN) check("fi_cq_read", n);
      if (polls % 1024 == 0 && Clock::now() > until) fail("no message from the peer in 10 s");
    }
    const float* low = rank_ == 0 ? in : theirs;
    const float* high = rank_ == 0 ? theirs : in;
    for (size_t i = 0; i < count; ++i) out[i] = low[i] + high[i];
  }

 private:
  void progress(Clock::time_point until) {
    (void)fi_cq_read(cq_, nullptr, 0);
    if (Clock::now() > until) fail("the provider's queue stayed full for 10 s");
  }

  int rank_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  fi_context2 context_{};
};

// This rank's p50, then the slower rank's.
double slower_p50(std::vector<double>& seconds) {
  std::sort(seconds.begin(), seconds.end());
  double mine = seconds[seconds.size() / 2];
  double slower = 0;
  MPI_Allreduce(&mine, &slower, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slower;
}

}  // namespace

int main(int argc, char** argv) {
  // Multiple threads: under a plain mpirun, hvd makes its rendezvous through MPI from its threads.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Options o = parse(argc, argv, rank);
  if (size != 2) fail("run 2 ranks (hvdrun --mpi -np 2 ...), not " + std::to_string(size));

  const size_t count = o.bytes / sizeof(float);
  std::vector<float> in(count), theirs(count), out(count), expected(count);
  for (size_t i = 0; i < count; ++i) {
    in[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
    expected[i] = static_cast<float>(3 + 2 * static_cast<int>(i % 7));
  }
  Exchange exchange(o, rank);
  if (!o.provider.empty()) setenv("HVD_OFI_PROVIDER", o.provider.c_str(), 1);
  hvd_init_options options{};
  options.struct_size = sizeof options;
  options.backend = "ofi";
  hvd_comm* comm = nullptr;
  if (hvd_init(&options, &comm) != HVD_SUCCESS) fail(std::string("hvd_init: ") + hvd_last_error());

  enum { kFloor, kHvd, kMpi };
  std::vector<double> seconds[3];
  for (auto& s : seconds) s.reserve(static_cast<size_t>(o.iters));
  MPI_Barrier(MPI_COMM_WORLD);
  uint64_t tag = 0;
  auto run = [&](int which) {
    if (which == kFloor) {
      exchange.allreduce(in.data(), theirs.data(), out.data(), count, ++tag);
    } else if (which == kHvd) {
      if (hvd_allreduce(comm, in.data(), out.data(), count, HVD_FLOAT32, HVD_SUM, nullptr) !=
          HVD_SUCCESS) {
        fail(std::string("hvd_allreduce: ") + hvd_last_error());
      }
    } else {
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
  };
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    for (int k = 0; k < 3; ++k) {
      const int which = (i + k) % 3;
      const Clock::time_point start = Clock::now();
      run(which);
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      if (i >= o.warmup) seconds[which].push_back(took);
    }
  }
  exchange.allreduce(in.data(), theirs.data(), out.data(), count, ++tag);
  if (out != expected) fail("the libfabric exchange summed wrong");
  std::fill(out.begin(), out.end(), 0.0f);
  if (hvd_allreduce(comm, in.data(), out.data(), count, HVD_FLOAT32, HVD_SUM, nullptr) !=
          HVD_SUCCESS ||
      out != expected) {
    fail("hvd_allreduce on ofi summed wrong or failed");
  }
  if (hvd_finalize(comm) != HVD_SUCCESS) fail(std::string("hvd_finalize: ") + hvd_last_error());

  const double floor = slower_p50(seconds[kFloor]) * 1e6;
  const double hvd = slower_p50(seconds[kHvd]) * 1e6;
  const double mpi = slower_p50(seconds[kMpi]) * 1e6;
  if (rank == 0) {
    std::printf(
        "# libfabric %s: %zu B each way (fi_trecv, fi_tinject, fi_cq_read), hvd_allreduce on ofi "
        "and MPI_Allreduce (%s), call by call, %d calls after %d; p50 of the slower rank\n",
        o.provider.c_str(), o.bytes,
        provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "not MPI_THREAD_MULTIPLE",
        o.iters, o.warmup);
    std::printf("libfabric_exchange_p50_us %.3f\n", floor);
    std::printf("hvd_ofi_p50_us %.3f\n", hvd);
    std::printf("MPI_Allreduce_p50_us %.3f\n", mpi);
    std::printf("exchange_over_MPI_Allreduce %.3f\n", floor / mpi);
    std::printf("hvd_ofi_over_exchange %.3f\n", hvd / floor);
    std::printf("hvd_ofi_over_MPI_Allreduce %.3f\n", hvd / mpi);
  }
  MPI_Finalize();
  return 0;
}
