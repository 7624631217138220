// What hvd-bench prints (nccl-tests' table, OSU's latency columns) and writes (-J JSON).
// Only one rank prints; every rank may call these with printing off.
#ifndef HVD_BENCH_REPORT_HPP
#define HVD_BENCH_REPORT_HPP

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fusion.hpp"
#include "hvd/sdk/result.hpp"
#include "limits.hpp"
#include "options.hpp"

namespace hvd::bench {

struct JobInfo {
  int ranks = 0;
  std::vector<std::string> hosts;  // distinct, in rank order
  std::string hvd_version;
};

struct TableInfo {
  std::string backend;
  std::string backend_version;
  std::string transport;  // what the backend's bytes travel on, as far as hvd-bench can tell
  hvd_collective collective = HVD_COLLECTIVE_ALLREDUCE;
  int ranks = 0;            // of the communicator measured (a process set's, with --process-set)
  std::string path;         // how hvd runs it, where it has a fallback ("hvd's fallback: ...")
  std::string direct_call;  // "MPI_Allreduce"; empty without --baseline (or without one)
  // --baseline asked, but this backend has none ("ofi: no direct library collective ..."): its
  // direct columns read n/a (the reason is printed once per backend, by the caller).
  std::string direct_missing;
  // --compare: the reference backend (as it names itself), for every other backend's tables;
  // empty for the reference's own and without --compare. `compare_missing`: why the reference
  // has no results at all (it could not run), so every ratio reads n/a.
  std::string compare_with;
  std::string compare_missing;
  bool check_args = false;  // --check-args: rows carry `checked`
};

// One timed placement (out of place or in place): seconds per call averaged over the ranks (the
// mean, as nccl-tests; and the median of calls timed one by one, which --baseline's ratios use),
// and the wrong elements summed over the ranks (absent when not checked).
struct Timing {
  double seconds = 0;
  std::optional<double> median_seconds;  // only where calls were timed one by one
  std::optional<uint64_t> wrong;
};

// The message one row measured.
struct Message {
  uint64_t size = 0;   // nccl-tests' size: the buffer; allgather's output; reduce_scatter's
                       // input; alltoall's send buffer (count x ranks elements for those three)
  uint64_t count = 0;  // elements in those bytes
  hvd_dtype dtype = HVD_FLOAT32;
  std::optional<hvd_reduce_op> op;  // allreduce only
  int root = -1;                    // broadcast only
};

struct Row : Message {
  Timing hvd[2];                    // [0] out of place, [1] in place (not for alltoall)
  std::optional<Timing> direct[2];  // absent without a baseline, or where it cannot run
  std::string direct_unsupported;   // why not, then
  // --check-args: the same call on a communicator opened with HVD_CHECK_ARGS=1, timed call by
  // call alternating with `hvd` (both have per-call medians then).
  std::optional<Timing> checked[2];
  // --compare: the reference's time over this one's at the same message (= this busbw over the
  // reference's), per placement; absent where the reference has no such row. Set by Report::row.
  std::optional<double> compared[2];
};

// Per-call latency statistics in microseconds (avg over ranks; percentiles and max of the
// slowest rank; min of the fastest).
struct LatencyStats {
  double avg = 0, p50 = 0, p99 = 0, min = 0, max = 0;
};

struct LatencyRow : Message {
  int iters = 0;
  LatencyStats hvd;
  std::optional<LatencyStats> direct;
  std::string direct_unsupported;
  std::optional<uint64_t> wrong;
  std::optional<double> compared;  // --compare: the reference's p50 over this p50 (Report sets it)
};

// --process-set: how the ranks outside the set waited (the most of any of them).
struct IdleWait {
  int members = 0;
  int waiting = 0;
  double wall_seconds = 0;
  double cpu_seconds = 0;  // the process's user + system time over the wait, every thread
};

class Report {
 public:
  Report(const Options& options, bool printing) : options_(options), printing_(printing) {}

  void header(const JobInfo& job, const PhysicalLimits& limits);
  void skip(const std::string& backend, const std::string& why);
  // The table begun last has no rows: the host or backend has no such call (`why`).
  void skip_table(const std::string& why);
  void idle(const IdleWait& wait);
  void note(const std::string& line);  // a "# ..." line, printed only

  void begin_table(const TableInfo& table);
  void row(const Row& row);
  void latency_row(const LatencyRow& row);
  void end_table();
  // The fusion mode (--tensors): one row per backend.
  void fusion_row(const std::string& backend, const FusionResult& result);

  // Any wrong element, in any table.
  bool any_wrong() const { return any_wrong_; }
  Status write_json(const std::string& path) const;

 private:
  struct Table {
    TableInfo info;
    std::vector<Row> rows;
    std::vector<LatencyRow> latency;
    // --compare: the reference's table of this collective (an index into tables_), or why none.
    std::optional<size_t> reference;
    std::string reference_missing;
  };
  double busbw_factor(const TableInfo& table) const;
  // --compare: the text of the ratio's metric ("busbw", "algbw" at one rank, "p50").
  std::string compare_metric(const TableInfo& table) const;
  // --compare: the row of the reference's table that measured the same message, or null.
  const Row* reference_row(const Table& table, const Message& message) const;
  const LatencyRow* reference_latency_row(const Table& table, const Message& message) const;
  struct Skipped {
    std::string backend, collective, reason;
  };

  const Options& options_;
  bool printing_;
  bool any_wrong_ = false;
  JobInfo job_;
  PhysicalLimits limits_;
  std::vector<Table> tables_;
  std::vector<std::pair<std::string, FusionResult>> fusion_;
  std::vector<Skipped> skipped_;
  std::optional<IdleWait> idle_;
};

}  // namespace hvd::bench

#endif  // HVD_BENCH_REPORT_HPP
