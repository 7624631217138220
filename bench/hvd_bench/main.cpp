// hvd-bench: collective bandwidth and latency through hvd's backends, nccl-tests style, with the
// backend's own library timed beside hvd in the same job (--baseline). See docs/performance.md.
//
//   hvdrun -np 2 hvd-bench --backend all --baseline -b 8 -e 64M -f 4 -J result.json
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "bootstrap/env.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/settings.hpp"
#include "bootstrap/store.hpp"
#include "buffer.hpp"
#include "direct.hpp"
#include "fusion.hpp"
#include "hvd/hvd.hpp"
#include "limits.hpp"
#include "loader/plugin_loader.hpp"
#include "options.hpp"
#include "report.hpp"

namespace hvd::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Call = std::function<Status()>;

constexpr uint8_t kPoison = 0xA5;  // what a result buffer holds before a checked call

// ---- small collectives of the benchmark's own, over the communicator under test ----------------

Result<double> sum_over_ranks(Comm& comm, double value) {
  HVD_RETURN_IF_ERROR(comm.allreduce(&value, &value, 1, HVD_SUM));
  return value;
}

Status reduce_over_ranks(Comm& comm, double* values, uint64_t n, hvd_reduce_op op) {
  return comm.allreduce(values, values, n, op);
}

// What bytes travel as: the dtype hvd itself moves its bytes in for this backend (a plugin may
// take no uint8).
hvd_dtype byte_dtype(Comm& comm) {
  core::Plugin declared;
  declared.dtypes = hvd_backend_dtypes(comm.get());
  return declared.byte_dtype();
}

// Every rank's host name, distinct, in rank order.
Result<std::vector<std::string>> host_names(Comm& comm) {
  constexpr size_t kRecord = 256;  // a multiple of every dtype's size
  char mine[kRecord] = {};
  ::gethostname(mine, kRecord - 1);
  std::vector<char> all(kRecord * static_cast<size_t>(comm.size()));
  const hvd_dtype dtype = byte_dtype(comm);
  HVD_RETURN_IF_ERROR(comm.allgather(mine, all.data(), kRecord / hvd_dtype_size(dtype), dtype));
  std::vector<std::string> hosts;
  for (int r = 0; r < comm.size(); ++r) {
    std::string h(all.data() + kRecord * static_cast<size_t>(r));
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return hosts;
}

// What a backend's bytes travel on, as far as the environment tells. `one_host`: every rank of
// the communicator measured is on one host (hvd's host identities: its local size is its size).
std::string transport_of(const std::string& backend, const core::EnvLookup& env, bool one_host) {
  if (backend == "gloo") {
    if (auto iface = env("HVD_GLOO_IFACE")) return "tcp (" + *iface + ")";
    return "tcp";
  }
  if (backend == "mpi") {
    std::string t =
        "Open MPI btl " + env("OMPI_MCA_btl").value_or("default (vader within a host, tcp across)");
    if (auto iface = env("OMPI_MCA_btl_tcp_if_include")) t += ", tcp on " + *iface;
    // The plugin's HVD_MPI_ALGORITHMS: hvd's algorithms unless it says library.
    std::string algorithms = env("HVD_MPI_ALGORITHMS").value_or("hvd");
    for (char& c : algorithms) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t + (algorithms == "library" ? "; MPI's collectives"
                                        : "; hvd's algorithms over point-to-point");
  }
  if (backend == "nccl") return "NCCL (" + env("NCCL_NET").value_or("auto") + ")";
  if (backend == "ofi") {
    // The plugin's own choice: HVD_OFI_PROVIDER, else shared memory within one host, else TCP
    // under the RxM utility provider.
    if (auto provider = env("HVD_OFI_PROVIDER")) return "libfabric " + *provider;
    return one_host ? "libfabric shm" : "libfabric tcp;ofi_rxm";
  }
  if (auto provider = env("FI_PROVIDER")) return "libfabric " + *provider;
  return "backend's own";
}

// Backends for --backend all: every plugin found, hvd's own first in a fixed order.
std::vector<std::string> all_backends(const core::Settings& settings) {
  const core::PluginScan scan = core::scan_plugins(core::plugin_search_path(settings));
  std::vector<std::string> names;
  for (const core::Plugin& p : scan.plugins) names.push_back(p.name);
  const std::vector<std::string> order = {"gloo", "mpi", "nccl", "ofi"};
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    auto rank = [&](const std::string& n) {
      return std::find(order.begin(), order.end(), n) - order.begin();
    };
    return rank(a) < rank(b);
  });
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// ---- one benchmark run on one backend
// ------------------------------------------------------------

class Runner {
 public:
  // `checked`: the same backend opened with HVD_CHECK_ARGS=1 (--check-args), or null.
  Runner(const Options& options, Comm& comm, Report& report, DirectLibrary* direct, Comm* checked,
         int device)
      : o_(options),
        comm_(comm),
        report_(report),
        direct_(direct),
        checked_(checked),
        device_(device) {}

  // Runs the table; `skipped` gets why not where the host or backend has no such call at all
  // (HVD_ERR_UNSUPPORTED on every rank), and the table is then empty.
  Status run(hvd_collective collective, std::string* skipped) {
    const int n = comm_.size();
    // At least one element of the widest type per rank: the probe's call.
    const size_t max_bytes = std::max(static_cast<size_t>(o_.max_bytes), size_t{8} * n);
    const size_t send_bytes = collective == HVD_COLLECTIVE_ALLGATHER ? max_bytes / n : max_bytes;
    HVD_ASSIGN_OR_RETURN(send_, Buffer::allocate(o_.memory, device_, send_bytes, o_.huge_pages));
    HVD_ASSIGN_OR_RETURN(recv_, Buffer::allocate(o_.memory, device_, max_bytes, o_.huge_pages));
    expected_.assign(max_bytes, 0);
    staging_.assign(max_bytes, 0);
    HVD_ASSIGN_OR_RETURN(*skipped, probe(collective));
    if (!skipped->empty()) return Status::success();
    std::vector<std::optional<hvd_reduce_op>> ops;
    if (hvd_collective_reduces(collective)) {
      for (hvd_reduce_op op : o_.ops) ops.emplace_back(op);
    } else {
      ops.emplace_back(std::nullopt);
    }
    for (hvd_dtype dtype : o_.dtypes) {
      for (const auto& op : ops) {
        // Sizes that round to the same element count (1 byte of float) are measured once.
        std::optional<uint64_t> last_count;
        for (uint64_t size : message_sizes(o_)) {
          const uint64_t count = per_rank_count(collective, dtype, size);
          if (last_count == count) continue;
          last_count = count;
          HVD_RETURN_IF_ERROR(measure(collective, dtype, op, size));
        }
      }
    }
    return Status::success();
  }

 private:
  // One call of one element per rank, out of place: "" where it ran on every rank, else why not
  // where every rank's failed with HVD_ERR_UNSUPPORTED (any other failure is an error).
  Result<std::string> probe(hvd_collective collective) {
    const CollectiveCall c = make_call(collective, o_.dtypes.front(), o_.ops.front(), 1, 0);
    const Status s = run_through_hvd(comm_, c);
    if (!s.ok() && s.code() != HVD_ERR_UNSUPPORTED) return s;
    HVD_RETURN_IF_ERROR(synchronize(o_.memory));
    int64_t ran = s.ok() ? 1 : 0;
    HVD_RETURN_IF_ERROR(comm_.allreduce(&ran, &ran, 1, HVD_MIN));
    if (ran == 1) return std::string();
    return s.ok() ? std::string("unsupported on another rank") : s.message();
  }

  // The call for one placement (0 out of place, 1 in place) of `count` elements per rank.
  CollectiveCall make_call(hvd_collective collective, hvd_dtype dtype, hvd_reduce_op op,
                           uint64_t count, int placement) const {
    CollectiveCall c;
    c.collective = collective;
    c.dtype = dtype;
    c.op = op;
    c.root = o_.root;
    c.count = count;
    c.recv = recv_.data();
    c.placement.memory_type = o_.memory;
    c.placement.device = o_.memory == HVD_MEMORY_CUDA ? device_ : -1;
    if (collective == HVD_COLLECTIVE_ALLTOALL) {
      c.send_counts.assign(static_cast<size_t>(comm_.size()), count);
    }
    if (placement == 0) {
      c.send = send_.data();
    } else if (collective == HVD_COLLECTIVE_ALLGATHER) {
      c.send = recv_.data() + static_cast<size_t>(comm_.rank()) * count * hvd_dtype_size(dtype);
    } else {
      c.send = recv_.data();
    }
    return c;
  }

  // Elements of one call's result on each rank (and of its input, `input` true).
  uint64_t elements(const CollectiveCall& c, bool input) const {
    const uint64_t n = static_cast<uint64_t>(comm_.size());
    switch (c.collective) {
      case HVD_COLLECTIVE_ALLGATHER:
        return input ? c.count : c.count * n;
      case HVD_COLLECTIVE_REDUCE_SCATTER:
        return input ? c.count * n : c.count;
      case HVD_COLLECTIVE_ALLTOALL:
        return c.count * n;
      default:
        return c.count;
    }
  }

  // Fill the call's inputs (and poison its outputs); compute what it must produce.
  Status prepare(const CollectiveCall& c, bool in_place) {
    const size_t element = hvd_dtype_size(c.dtype);
    const size_t bytes = c.count * element;
    const int n = comm_.size();
    const int rank = comm_.rank();
    const size_t result_bytes = elements(c, false) * element;
    std::memset(staging_.data(), kPoison, result_bytes);
    HVD_RETURN_IF_ERROR(recv_.upload(staging_.data(), result_bytes));
    char* input = staging_.data();
    switch (c.collective) {
      case HVD_COLLECTIVE_ALLREDUCE:
        fill_allreduce_input(input, c.count, c.dtype, c.op, rank, n);
        expected_allreduce(expected_.data(), c.count, c.dtype, c.op, n);
        break;
      case HVD_COLLECTIVE_ALLGATHER:
        fill_block(input, c.count, c.dtype, rank);
        for (int r = 0; r < n; ++r) {
          fill_block(expected_.data() + static_cast<size_t>(r) * bytes, c.count, c.dtype, r);
        }
        break;
      case HVD_COLLECTIVE_BROADCAST:
        fill_block(input, c.count, c.dtype, c.root);
        std::memcpy(expected_.data(), input, bytes);
        if (rank != c.root && in_place) return Status::success();  // its input is the poison
        break;
      case HVD_COLLECTIVE_REDUCE_SCATTER: {
        // The allreduce's data over count x ranks elements; this rank keeps its block.
        const uint64_t total = c.count * static_cast<uint64_t>(n);
        fill_allreduce_input(input, total, c.dtype, c.op, rank, n);
        expected_allreduce(expected_.data(), total, c.dtype, c.op, n);
        std::memmove(expected_.data(), expected_.data() + static_cast<size_t>(rank) * bytes, bytes);
        break;
      }
      case HVD_COLLECTIVE_ALLTOALL:
        // Block d of rank s's input, which d receives as its block s: a pattern of (s, d) alone.
        for (int d = 0; d < n; ++d) {
          fill_block(input + static_cast<size_t>(d) * bytes, c.count, c.dtype, rank * n + d);
          fill_block(expected_.data() + static_cast<size_t>(d) * bytes, c.count, c.dtype,
                     d * n + rank);
        }
        break;
      default:  // barrier and join are not benchmarked
        break;
    }
    const size_t input_bytes = elements(c, true) * element;
    if (!in_place) return send_.upload(input, input_bytes);
    const size_t offset = static_cast<const char*>(c.send) - recv_.data();
    return recv_.upload(input, input_bytes, offset);
  }

  // Run `call` once on fresh inputs; the wrong elements summed over the ranks.
  Result<uint64_t> check(const CollectiveCall& c, bool in_place, const Call& call) {
    HVD_RETURN_IF_ERROR(prepare(c, in_place));
    HVD_RETURN_IF_ERROR(call());
    HVD_RETURN_IF_ERROR(synchronize(o_.memory));
    const uint64_t result_count = elements(c, false);
    HVD_RETURN_IF_ERROR(recv_.download(staging_.data(), result_count * hvd_dtype_size(c.dtype)));
    int64_t wrong =
        static_cast<int64_t>(count_wrong(staging_.data(), expected_.data(), result_count, c.dtype));
    HVD_RETURN_IF_ERROR(comm_.allreduce(&wrong, &wrong, 1, HVD_SUM));
    return static_cast<uint64_t>(wrong);
  }

  // Seconds per call of `iters` back-to-back calls, started together after a barrier.
  Result<double> time_block(const Call& call, int iters) {
    HVD_RETURN_IF_ERROR(comm_.barrier());
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) HVD_RETURN_IF_ERROR(call());
    HVD_RETURN_IF_ERROR(synchronize(o_.memory));
    return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  }

  // Time one call (to completion, for CUDA) into `samples`, in seconds.
  Status time_call(const Call& call, std::vector<double>& samples) {
    const auto t0 = Clock::now();
    HVD_RETURN_IF_ERROR(call());
    HVD_RETURN_IF_ERROR(synchronize(o_.memory));
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    return Status::success();
  }

  // Mean and median of this rank's samples, each averaged over the ranks.
  Result<Timing> timing_over_ranks(std::vector<double> samples) {
    std::sort(samples.begin(), samples.end());
    double both[2] = {0, samples[samples.size() / 2]};
    for (double s : samples) both[0] += s;
    both[0] /= static_cast<double>(samples.size());
    HVD_RETURN_IF_ERROR(comm_.allreduce(both, both, 2, HVD_SUM));
    Timing t;
    t.seconds = both[0] / comm_.size();
    t.median_seconds = both[1] / comm_.size();
    return t;
  }

  Status warm(const Call& call, int iters) {
    for (int i = 0; i < iters; ++i) HVD_RETURN_IF_ERROR(call());
    return synchronize(o_.memory);
  }

  // hvd's count argument for a message of `size` bytes (nccl-tests' size: allgather's gathered
  // output, reduce_scatter's input and alltoall's send buffer, each count x ranks elements).
  uint64_t per_rank_count(hvd_collective collective, hvd_dtype dtype, uint64_t size) const {
    const uint64_t element = hvd_dtype_size(dtype);
    const bool split = collective == HVD_COLLECTIVE_ALLGATHER ||
                       collective == HVD_COLLECTIVE_REDUCE_SCATTER ||
                       collective == HVD_COLLECTIVE_ALLTOALL;
    return size / (split ? element * comm_.size() : element);
  }

  Status measure(hvd_collective collective, hvd_dtype dtype, std::optional<hvd_reduce_op> op,
                 uint64_t size) {
    const int n = comm_.size();
    const size_t element = hvd_dtype_size(dtype);
    const uint64_t count = per_rank_count(collective, dtype, size);
    const bool split = collective == HVD_COLLECTIVE_ALLGATHER ||
                       collective == HVD_COLLECTIVE_REDUCE_SCATTER ||
                       collective == HVD_COLLECTIVE_ALLTOALL;
    const uint64_t result_count = split ? count * n : count;  // the row's size, in elements
    const uint64_t result_size = result_count * element;
    const bool with_direct = direct_ != nullptr;

    Message message;
    message.size = result_size;
    message.count = result_count;
    message.dtype = dtype;
    message.op = op;
    message.root = collective == HVD_COLLECTIVE_BROADCAST ? o_.root : -1;
    if (o_.latency) return measure_latency(collective, message, count);
    Row row;
    static_cast<Message&>(row) = message;
    const int placements = has_in_place(collective) ? 2 : 1;
    for (int p = 0; p < placements; ++p) {
      const CollectiveCall c = make_call(collective, dtype, op.value_or(HVD_SUM), count, p);
      const Call through_hvd = [&] { return run_through_hvd(comm_, c); };
      std::string unsupported = with_direct ? direct_->unsupported(c) : "not asked";
      const bool direct_here = with_direct && unsupported.empty();
      const Call direct_call = [&] { return direct_->run(c); };
      const Call checked_call = [&] { return run_through_hvd(*checked_, c); };
      if (with_direct && !direct_here) row.direct_unsupported = unsupported;
      HVD_RETURN_IF_ERROR(prepare(c, p == 1));
      HVD_RETURN_IF_ERROR(warm(through_hvd, o_.warmup_iters));
      if (direct_here || checked_ != nullptr) {
        // Call by call, alternating, each timed: every side sees the same moments of a noisy
        // machine, and the medians give a ratio that one hiccup cannot move.
        if (direct_here) HVD_RETURN_IF_ERROR(warm(direct_call, o_.warmup_iters));
        if (checked_ != nullptr) HVD_RETURN_IF_ERROR(warm(checked_call, o_.warmup_iters));
        std::vector<double> hvd_s, direct_s, checked_s;
        HVD_RETURN_IF_ERROR(comm_.barrier());
        for (int i = 0; i < o_.iters; ++i) {
          HVD_RETURN_IF_ERROR(time_call(through_hvd, hvd_s));
          if (direct_here) HVD_RETURN_IF_ERROR(time_call(direct_call, direct_s));
          if (checked_ != nullptr) HVD_RETURN_IF_ERROR(time_call(checked_call, checked_s));
        }
        HVD_ASSIGN_OR_RETURN(row.hvd[p], timing_over_ranks(hvd_s));
        if (direct_here) {
          HVD_ASSIGN_OR_RETURN(Timing direct_timing, timing_over_ranks(direct_s));
          if (o_.check) {
            HVD_ASSIGN_OR_RETURN(uint64_t wrong, check(c, p == 1, direct_call));
            direct_timing.wrong = wrong;
            if (wrong > 0) {
              report_.note("warning: the direct baseline returned " + std::to_string(wrong) +
                           " wrong elements (size " + std::to_string(result_size) + ")");
            }
          }
          row.direct[p] = direct_timing;
        }
        if (checked_ != nullptr) {
          HVD_ASSIGN_OR_RETURN(Timing checked_timing, timing_over_ranks(checked_s));
          if (o_.check) {
            HVD_ASSIGN_OR_RETURN(checked_timing.wrong, check(c, p == 1, checked_call));
          }
          row.checked[p] = checked_timing;
        }
      } else {
        HVD_ASSIGN_OR_RETURN(double seconds, time_block(through_hvd, o_.iters));
        HVD_ASSIGN_OR_RETURN(double sum, sum_over_ranks(comm_, seconds));
        row.hvd[p].seconds = sum / n;
      }
      if (o_.check) {
        HVD_ASSIGN_OR_RETURN(uint64_t wrong, check(c, p == 1, through_hvd));
        row.hvd[p].wrong = wrong;
      }
    }
    report_.row(row);
    return Status::success();
  }

  // OSU-style: each call timed alone; the statistics of every rank's samples, then over ranks.
  Status measure_latency(hvd_collective collective, const Message& message, uint64_t count) {
    const hvd_dtype dtype = message.dtype;
    const std::optional<hvd_reduce_op>& op = message.op;
    const bool small = message.size <= 8192;
    const int iters = o_.iters > 0 ? o_.iters : (small ? 1000 : 100);
    const int warmup = o_.warmup_iters >= 0 ? o_.warmup_iters : (small ? 100 : 10);
    const CollectiveCall c = make_call(collective, dtype, op.value_or(HVD_SUM), count, 0);
    const Call through_hvd = [&] { return run_through_hvd(comm_, c); };
    const std::string unsupported = direct_ ? direct_->unsupported(c) : "not asked";
    const bool direct_here = direct_ != nullptr && unsupported.empty();
    const Call direct_call = [&] { return direct_->run(c); };

    HVD_RETURN_IF_ERROR(prepare(c, false));
    HVD_RETURN_IF_ERROR(warm(through_hvd, warmup));
    if (direct_here) HVD_RETURN_IF_ERROR(warm(direct_call, warmup));
    HVD_RETURN_IF_ERROR(comm_.barrier());
    std::vector<double> hvd_s, direct_s;
    for (int i = 0; i < iters; ++i) {  // interleaved, so both sides see the same conditions
      HVD_RETURN_IF_ERROR(time_call(through_hvd, hvd_s));
      if (direct_here) HVD_RETURN_IF_ERROR(time_call(direct_call, direct_s));
    }
    LatencyRow row;
    static_cast<Message&>(row) = message;
    row.iters = iters;
    HVD_ASSIGN_OR_RETURN(row.hvd, stats_over_ranks(hvd_s));
    if (direct_here) {
      HVD_ASSIGN_OR_RETURN(LatencyStats d, stats_over_ranks(direct_s));
      row.direct = d;
    } else if (direct_ != nullptr) {
      row.direct_unsupported = unsupported;
    }
    if (o_.check) {
      HVD_ASSIGN_OR_RETURN(uint64_t wrong, check(c, false, through_hvd));
      row.wrong = wrong;
    }
    report_.latency_row(row);
    return Status::success();
  }

  // Per-call statistics in microseconds (samples in seconds).
  Result<LatencyStats> stats_over_ranks(std::vector<double> samples) {
    for (double& s : samples) s *= 1e6;
    std::sort(samples.begin(), samples.end());
    auto percentile = [&](double q) {
      const size_t i = static_cast<size_t>(std::ceil(q * samples.size())) - 1;
      return samples[std::min(i, samples.size() - 1)];
    };
    double mean = 0;
    for (double s : samples) mean += s;
    mean /= samples.size();
    double slowest[3] = {percentile(0.50), percentile(0.99), samples.back()};
    double fastest = samples.front();
    HVD_RETURN_IF_ERROR(reduce_over_ranks(comm_, slowest, 3, HVD_MAX));
    HVD_RETURN_IF_ERROR(reduce_over_ranks(comm_, &fastest, 1, HVD_MIN));
    HVD_ASSIGN_OR_RETURN(double mean_sum, sum_over_ranks(comm_, mean));
    return LatencyStats{mean_sum / comm_.size(), slowest[0], slowest[1], fastest, slowest[2]};
  }

  const Options& o_;
  Comm& comm_;
  Report& report_;
  DirectLibrary* direct_;
  Comm* checked_;
  int device_;
  Buffer send_, recv_;
  std::vector<char> expected_, staging_;
};

// ---- the job
// -------------------------------------------------------------------------------------

class Bench {
 public:
  // `printer`: the job rank that prints and writes the JSON (this process: `printing`).
  Bench(const Options& options, core::Settings settings, int printer, bool printing)
      : o_(options),
        env_(core::process_env()),
        settings_(std::move(settings)),
        report_(options, printing),
        printer_(printer),
        printing_(printing) {}

  int run() {
    std::vector<std::string> backends = o_.backends;
    if (backends.empty()) backends = {""};  // HVD_BACKEND, or the default
    if (backends.size() == 1 && backends[0] == "all") backends = all_backends(settings_);
    if (backends.empty()) {
      std::fprintf(stderr, "hvd-bench: no backend plugins found (see hvd-info)\n");
      return 1;
    }
    if (o_.tensors > 0) return run_fusion(backends);
    if (!o_.compare.empty()) {
      if (o_.backends.size() == 1 && o_.backends[0] == "all") {
        const Status s = check_compare_in(o_.compare, backends,
                                          "--backend all (found: " + backend_list(backends) + ")");
        if (!s.ok()) {
          std::fprintf(stderr, "hvd-bench: %s\n", s.message().c_str());
          return 2;
        }
      }
      // The reference runs first, so that every other backend's rows can carry their ratio to it.
      std::stable_partition(backends.begin(), backends.end(),
                            [&](const std::string& b) { return b == o_.compare; });
    }
    bool failed = false;
    for (size_t i = 0; i < backends.size(); ++i) {
      const std::string& name = backends[i];
      is_reference_ = !o_.compare.empty() && i == 0;
      // --check-args: this one without the check, whatever the environment says.
      Result<Comm> comm = o_.check_args ? init_with_check_args(name, "0")
                                        : Comm::init(Comm::Options{name, o_.timeout_seconds});
      if (!comm.ok()) {
        report_.skip(name.empty() ? "(default)" : name, comm.status().message());
        if (is_reference_) {
          compare_reference_ = name;
          compare_missing_ = name + " did not run: " + comm.status().message();
        }
        continue;
      }
      // The reference as it names itself (the tables' name), which --backend may have given as a
      // path.
      if (is_reference_) compare_reference_ = comm->backend();
      const Status s = run_backend(*comm, name);
      if (!s.ok()) {
        std::fprintf(stderr, "hvd-bench: rank %d: backend %s: %s\n", comm->rank(),
                     comm->backend().c_str(), s.to_string().c_str());
        failed = true;
        break;  // the job's ranks may now disagree about what comes next
      }
      // The results so far are on disk before any rank can leave: a launcher that stops the
      // job when one rank exits non-zero (wrong results) would otherwise kill rank 0 first.
      if (!write_json()) failed = true;
      const Status left_together = comm->barrier();
      const Status finalized = left_together.ok() ? comm->finalize() : left_together;
      if (!finalized.ok()) {
        std::fprintf(stderr, "hvd-bench: finalizing %s: %s\n", name.c_str(),
                     finalized.to_string().c_str());
        failed = true;
      }
    }
    return conclude(failed);
  }

 private:
  // --tensors: per backend, three communicators at once: one whose scheduler fuses, one opened
  // with HVD_FUSION_THRESHOLD=0 (hvd_init reads the knobs), and one without a scheduler for the
  // single allreduce.
  int run_fusion(const std::vector<std::string>& backends) {
    bool failed = false;
    const std::optional<std::string> threshold = settings_.optional(core::Knob::kFusionThreshold);
    for (const std::string& name : backends) {
      FusionResult result;
      result.threshold = threshold.value_or("128 MiB (default)");
      Result<Comm> direct = Comm::init(Comm::Options{name, o_.timeout_seconds});
      if (!direct.ok()) {
        report_.skip(name.empty() ? "(default)" : name, direct.status().message());
        continue;
      }
      Status s = header_done_ ? Status::success() : header(*direct, -1);
      Result<Comm> fused = Comm::init(Comm::Options{name, o_.timeout_seconds});
      if (s.ok()) s = fused.ok() ? start_scheduler(*fused) : fused.status();
      Result<Comm> unfused = s.ok() ? start_unfused(name) : Result<Comm>(s);
      if (s.ok()) s = unfused.status();
      if (s.ok()) s = measure_fusion({*fused, *unfused, *direct}, o_, &result);
      for (Result<Comm>* comm : {&unfused, &fused, &direct}) {
        if (s.ok()) s = (*comm)->finalize();
      }
      if (!s.ok()) {
        std::fprintf(stderr, "hvd-bench: backend %s: %s\n", name.c_str(), s.to_string().c_str());
        failed = true;
        break;
      }
      report_.fusion_row(name.empty() ? "(default)" : name, result);
    }
    return conclude(failed);
  }

  // A communicator whose scheduler runs with HVD_FUSION_THRESHOLD=0 and writes no timeline
  // (HVD_TIMELINE keeps the fused steps' trace); the environment is restored afterwards.
  Result<Comm> start_unfused(const std::string& backend) {
    const std::optional<std::string> threshold = settings_.optional(core::Knob::kFusionThreshold);
    const std::optional<std::string> timeline = settings_.optional(core::Knob::kTimeline);
    ::unsetenv("HVD_TIMELINE");
    ::unsetenv("HOROVOD_TIMELINE");
    ::setenv("HVD_FUSION_THRESHOLD", "0", 1);
    Result<Comm> comm = Comm::init(Comm::Options{backend, o_.timeout_seconds});
    Status s = comm.ok() ? start_scheduler(*comm) : comm.status();
    if (threshold) {
      ::setenv("HVD_FUSION_THRESHOLD", threshold->c_str(), 1);
    } else {
      ::unsetenv("HVD_FUSION_THRESHOLD");
    }
    if (timeline) ::setenv("HVD_TIMELINE", timeline->c_str(), 1);
    if (!s.ok()) return s;
    return comm;
  }

  // A communicator opened with HVD_CHECK_ARGS=`value` (hvd_init reads it), every rank alike;
  // the environment is restored afterwards.
  Result<Comm> init_with_check_args(const std::string& backend, const char* value) {
    const char* before = ::getenv("HVD_CHECK_ARGS");
    const std::optional<std::string> saved =
        before != nullptr ? std::optional<std::string>(before) : std::nullopt;
    ::setenv("HVD_CHECK_ARGS", value, 1);
    Result<Comm> comm = Comm::init(Comm::Options{backend, o_.timeout_seconds});
    if (saved) {
      ::setenv("HVD_CHECK_ARGS", saved->c_str(), 1);
    } else {
      ::unsetenv("HVD_CHECK_ARGS");
    }
    return comm;
  }

  // The exit status: the JSON written (with the backends skipped after the last one that ran),
  // and failed if anything was wrong or nothing ran.
  int conclude(bool failed) {
    if (!write_json()) failed = true;
    if (report_.any_wrong()) {
      std::fprintf(stderr, "hvd-bench: wrong results (see #wrong)\n");
      failed = true;
    }
    if (!header_done_ && !failed) {
      std::fprintf(stderr, "hvd-bench: no backend could run\n");
      failed = true;
    }
    return failed ? 1 : 0;
  }

  // Rank 0 writes every result so far (-J); false if that failed.
  bool write_json() {
    if (o_.json_path.empty() || !printing_ || !header_done_) return true;
    const Status s = report_.write_json(o_.json_path);
    if (!s.ok()) std::fprintf(stderr, "hvd-bench: %s\n", s.to_string().c_str());
    return s.ok();
  }

  // Every rank's memcpy at once, as a collective's ranks copy (they share the memory's
  // bandwidth): each rank's fastest of 5 copies, each begun together after a barrier; the mean
  // over the ranks, gathered as bytes (a backend may declare no float64). NaN if a rank could
  // not have its buffers.
  Result<double> memcpy_all_ranks_gbps(Comm& comm) {
    CopyProbe probe(64u << 20, o_.huge_pages);
    HVD_ASSIGN_OR_RETURN(const double mine, probe.best_gbps(5, [&] { return comm.barrier(); }));
    std::vector<double> all(static_cast<size_t>(comm.size()));
    const hvd_dtype dtype = byte_dtype(comm);
    HVD_RETURN_IF_ERROR(
        comm.allgather(&mine, all.data(), sizeof(double) / hvd_dtype_size(dtype), dtype));
    double sum = 0;
    for (double gbps : all) sum += gbps;
    return sum / static_cast<double>(all.size());
  }

  // The job and the physical limits, once, from the first backend that runs.
  Status header(Comm& comm, int device) {
    JobInfo job;
    job.ranks = comm.size();
    job.hvd_version = hvd_version();
    HVD_ASSIGN_OR_RETURN(job.hosts, host_names(comm));
    // One rank measures while the others wait: two measuring at once would share the cores.
    PhysicalLimits limits;
    if (comm.rank() == printer_) limits = measure_limits(device, o_.huge_pages);
    HVD_RETURN_IF_ERROR(comm.barrier());
    if (comm.size() > 1) {
      HVD_ASSIGN_OR_RETURN(limits.memcpy_all_ranks_gbps, memcpy_all_ranks_gbps(comm));
    }
    report_.header(job, limits);
    if (!o_.compare.empty()) {
      report_.note("--compare " + o_.compare + ": " + o_.compare +
                   " runs first; every other backend's table then gets its ratio to " + o_.compare +
                   " in each row\n#");
    }
    header_done_ = true;
    return Status::success();
  }

  Status run_backend(Comm& comm, const std::string& name) {
    int device = -1;
    if (o_.memory == HVD_MEMORY_CUDA) {
      HVD_ASSIGN_OR_RETURN(device, cuda_device_for(comm.local_rank()));
    }
    if (!header_done_) HVD_RETURN_IF_ERROR(header(comm, device));
    if (o_.memory == HVD_MEMORY_CUDA && (comm.capabilities() & HVD_CAP_CUDA_MEMORY) == 0) {
      report_.skip(comm.backend(), "takes host memory only (--mem cuda asked for device buffers)");
      return Status::success();
    }
    if (!o_.process_set.empty()) return run_process_set(comm, name, device);
    return run_tables(comm, name, device);
  }

  // Every table of this backend on `comm` (the job's communicator, or a process set's).
  Status run_tables(Comm& comm, const std::string& name, int device) {
    std::unique_ptr<DirectLibrary> direct;
    std::string direct_missing;
    if (o_.baseline) {
      Result<std::unique_ptr<DirectLibrary>> opened = open_direct(comm);
      // Every rank runs the baseline or none does, or the ranks' calls would not pair up.
      int64_t opened_everywhere = opened.ok() ? 1 : 0;
      HVD_RETURN_IF_ERROR(comm.allreduce(&opened_everywhere, &opened_everywhere, 1, HVD_MIN));
      if (opened_everywhere) {
        direct = std::move(opened).value();
      } else {
        // Its direct columns read n/a; the reason once, here.
        direct_missing =
            opened.ok() ? "the baseline failed on another rank" : opened.status().message();
        report_.note(comm.backend() + ": " + direct_missing);
      }
    }
    // --check-args: the same backend once more, checking every blocking call's arguments.
    std::optional<Comm> checked;
    if (o_.check_args) {
      HVD_ASSIGN_OR_RETURN(Comm opened, init_with_check_args(name, "1"));
      checked.emplace(std::move(opened));
    }
    const Result<core::Plugin> plugin =
        core::resolve_backend(comm.backend(), core::plugin_search_path(settings_));
    for (hvd_collective collective : o_.collectives) {
      TableInfo table;
      table.backend = comm.backend();
      table.backend_version = plugin.ok() ? plugin->version : "";
      table.transport = transport_of(comm.backend(), env_, comm.local_size() == comm.size());
      table.collective = collective;
      table.ranks = comm.size();
      if (plugin.ok()) table.path = path_of(collective, *plugin);
      if (direct) table.direct_call = direct->call_name(collective);
      table.direct_missing = direct_missing;
      if (!compare_reference_.empty() && !is_reference_) {
        table.compare_with = compare_reference_;
        table.compare_missing = compare_missing_;
      }
      table.check_args = checked.has_value();
      report_.begin_table(table);
      Runner runner(o_, comm, report_, direct.get(), checked ? &*checked : nullptr, device);
      std::string skipped;
      HVD_RETURN_IF_ERROR(runner.run(collective, &skipped));
      if (!skipped.empty()) {
        report_.skip_table(skipped);
        continue;
      }
      report_.end_table();
    }
    return checked ? checked->finalize() : Status::success();
  }

  // --process-set: the tables on a process set of the job's ranks, the other ranks waiting.
  //
  // Those wait for the members' word in a get on a store of the benchmark's own (rank 0 serves
  // it), a blocking read on a TCP socket: not in an hvd collective on the job's communicator,
  // which HVD_TIMEOUT would bound (a run may take hours) and which some backends spin in (Open
  // MPI polls), taking the CPUs the members are measured on. --idle-timeout bounds the wait.
  Status run_process_set(Comm& job, const std::string& name, int device) {
    for (int r : o_.process_set) {
      if (r >= job.size()) {
        return error(HVD_ERR_INVALID_ARGUMENT, "--process-set: rank " + std::to_string(r) +
                                                   " is not in this job of " +
                                                   std::to_string(job.size()) + " ranks");
      }
    }
    core::World world;
    world.rank = job.rank();
    world.size = job.size();
    world.local_rank = job.local_rank();
    world.local_size = job.local_size();
    HVD_ASSIGN_OR_RETURN(core::SharedRendezvous rendezvous,
                         core::share_rendezvous(world, settings_, [&](void* record, size_t size) {
                           return job.broadcast(record, record, size, HVD_UINT8, 0);
                         }));
    const std::chrono::milliseconds timeout = settings_.timeout();
    HVD_ASSIGN_OR_RETURN(
        auto store, core::TcpStoreClient::connect(rendezvous.address, rendezvous.secret, timeout));
    Result<Comm> made = job.process_set(o_.process_set);
    if (!made.ok()) {
      if (made.status().code() != HVD_ERR_UNSUPPORTED) return made.status();
      report_.skip(job.backend(), "hvd_comm_create_process_set: " + made.status().message());
      return Status::success();
    }
    Comm set = std::move(made).value();
    IdleWait idle;
    idle.members = static_cast<int>(o_.process_set.size());
    idle.waiting = job.size() - idle.members;
    if (set) {
      std::string ranks;
      for (int r : o_.process_set) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      report_.note("Process set: job ranks " + ranks + " of " + std::to_string(job.size()) +
                   " (hvd_comm_create_process_set); busbw counts its " +
                   std::to_string(set.size()) + " ranks; the other " +
                   std::to_string(idle.waiting) +
                   " wait in a blocking read on a TCP socket (see their CPU time below)");
      Status s = run_tables(set, name, device);
      // The waiting ranks learn the outcome whatever it is: each member's word, in turn.
      const std::string word = s.ok() ? "ok" : s.to_string();
      const Status told = store->set("hvd-bench/done/" + std::to_string(set.rank()),
                                     core::Bytes(word.begin(), word.end()));
      if (!s.ok()) return s;
      HVD_RETURN_IF_ERROR(told);
      HVD_RETURN_IF_ERROR(set.finalize());
    } else {
      const auto wall0 = Clock::now();
      const double cpu0 = process_cpu_seconds();
      const auto limit = std::chrono::milliseconds(
          static_cast<int64_t>(std::ceil(o_.idle_timeout_seconds * 1000)));
      for (int r = 0; r < idle.members; ++r) {
        Result<core::Bytes> word = store->get("hvd-bench/done/" + std::to_string(r), limit);
        if (!word.ok()) {
          return error(word.status().code(), "waiting for the process set (--idle-timeout " +
                                                 seconds_text(o_.idle_timeout_seconds) +
                                                 "): " + word.status().message());
        }
        const std::string text(word->begin(), word->end());
        if (text != "ok") {
          return error(HVD_ERR_REMOTE,
                       "the process set's rank " + std::to_string(r) + " failed: " + text);
        }
      }
      idle.wall_seconds = std::chrono::duration<double>(Clock::now() - wall0).count();
      idle.cpu_seconds = process_cpu_seconds() - cpu0;
    }
    // The waiting ranks' figures to the printer: the longest wait and the most CPU.
    double most[2] = {idle.wall_seconds, idle.cpu_seconds};
    HVD_RETURN_IF_ERROR(job.allreduce(most, most, 2, HVD_MAX));
    idle.wall_seconds = most[0];
    idle.cpu_seconds = most[1];
    report_.idle(idle);
    return Status::success();
  }

  static double process_cpu_seconds() {
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
    return seconds(usage.ru_utime) + seconds(usage.ru_stime);
  }

  static std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", seconds);
    return text;
  }

  // How hvd runs `collective` on this backend, where hvd has a fallback.
  static std::string path_of(hvd_collective collective, const core::Plugin& plugin) {
    if (collective == HVD_COLLECTIVE_REDUCE_SCATTER) {
      return (plugin.capabilities & HVD_CAP_REDUCE_SCATTER) != 0
                 ? "the backend's reduce_scatter"
                 : "hvd's fallback: an allreduce of all count x ranks elements";
    }
    if (collective == HVD_COLLECTIVE_ALLTOALL) {
      return plugin.alltoall != nullptr ? "the backend's alltoall"
                                        : "hvd's fallback: one broadcast per rank";
    }
    return "";
  }

  const Options& o_;
  core::EnvLookup env_;
  core::Settings settings_;
  Report report_;
  bool header_done_ = false;
  // --compare: the reference backend (set once it has started: it runs first), whether the
  // backend running now is it, and why it has no results where it could not run.
  std::string compare_reference_;
  bool is_reference_ = false;
  std::string compare_missing_;
  int printer_;
  bool printing_;
};

}  // namespace
}  // namespace hvd::bench

int main(int argc, char** argv) {
  using namespace hvd::bench;
  hvd::Result<Options> options = parse_options(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "hvd-bench: %s\n", options.status().message().c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(usage_text(), stdout);
    return 0;
  }
  // The rank is known before any communicator exists, so skips are printed once: by rank 0, or
  // by a process set's first rank, which has the results.
  hvd::Result<hvd::core::World> world = hvd::core::discover_world(hvd::core::process_env());
  int printer = 0;
  if (!options->process_set.empty() && world.ok() && options->process_set.front() < world->size) {
    printer = options->process_set.front();
  }
  const bool printing = world.ok() && world->rank == printer;
  hvd::Result<hvd::core::Settings> settings = hvd::core::Settings::read(hvd::core::process_env());
  if (!settings.ok()) {
    std::fprintf(stderr, "hvd-bench: %s\n", settings.status().message().c_str());
    return 2;
  }
  return Bench(*options, std::move(settings).value(), printer, printing).run();
}
