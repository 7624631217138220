#include "report.hpp"

#include "common/json.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace hvd::bench {
namespace {

constexpr uint64_t kRatioFloor = 1u << 20;  // the host-overhead goal is stated from 1 MiB

// nccl-tests' time column: fewer decimals as the figure grows.
std::string time_text(double us) {
  char text[32];
  if (us >= 10000.0) {
    std::snprintf(text, sizeof text, "%7.0f", us);
  } else if (us >= 100.0) {
    std::snprintf(text, sizeof text, "%7.1f", us);
  } else {
    std::snprintf(text, sizeof text, "%7.2f", us);
  }
  return text;
}

std::string number(double value, const char* format = "%6.2f") {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string wrong_text(const std::optional<uint64_t>& wrong) {
  return wrong ? std::to_string(*wrong) : "N/A";
}

// The direct columns are there with --baseline: the library's figures, or n/a where it has none.
bool direct_columns(const TableInfo& table) {
  return !table.direct_call.empty() || !table.direct_missing.empty();
}

// --compare's column: the ratio, or n/a.
std::string ratio_text(const std::optional<double>& ratio) {
  return ratio && std::isfinite(*ratio) ? number(*ratio, "%12.3f") : "n/a";
}

// --baseline's ratio: direct time over hvd time, from the per-call medians (both sides have them
// wherever there is a direct timing).
double hvd_over_direct(const Timing& hvd, const Timing& direct) {
  return direct.median_seconds.value_or(NAN) / hvd.median_seconds.value_or(NAN);
}

// --check-args' overhead: the checked call's per-call median over (or minus) the unchecked one's.
double check_overhead_us(const Timing& plain, const Timing& checked) {
  return (checked.median_seconds.value_or(NAN) - plain.median_seconds.value_or(NAN)) * 1e6;
}
double check_overhead_percent(const Timing& plain, const Timing& checked) {
  return (checked.median_seconds.value_or(NAN) / plain.median_seconds.value_or(NAN) - 1) * 100;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// A small JSON emitter: objects and arrays built as text, numbers printed with %.6g, and
// non-finite numbers as null.
using core::json_string;

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& raw_value) {
    text_ += (text_.empty() ? "" : ", ") + json_string(key) + ": " + raw_value;
    return *this;
  }
  JsonObject& str(const std::string& key, const std::string& value) {
    return add(key, json_string(value));
  }
  JsonObject& num(const std::string& key, double value) { return add(key, json_number(value)); }
  JsonObject& integer(const std::string& key, int64_t value) {
    return add(key, std::to_string(value));
  }
  std::string text() const { return "{" + text_ + "}"; }

 private:
  std::string text_;
};

std::string json_array(const std::vector<std::string>& items, const char* separator = ", ") {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out + "]";
}

}  // namespace

double Report::busbw_factor(const TableInfo& table) const {
  const double n = table.ranks;
  if (table.ranks <= 1) return NAN;  // no bus at one rank: N/A, as nccl-tests' convention asks
  switch (table.collective) {
    case HVD_COLLECTIVE_ALLREDUCE:
      return 2 * (n - 1) / n;
    case HVD_COLLECTIVE_ALLGATHER:
    case HVD_COLLECTIVE_REDUCE_SCATTER:
    case HVD_COLLECTIVE_ALLTOALL:
      return (n - 1) / n;
    case HVD_COLLECTIVE_BROADCAST:
      return 1;
    default:  // barrier and join are not benchmarked
      break;
  }
  return NAN;
}

void Report::header(const JobInfo& job, const PhysicalLimits& limits) {
  job_ = job;
  limits_ = limits;
  if (!printing_) return;
  std::string hosts;
  for (const std::string& h : job.hosts) hosts += (hosts.empty() ? "" : ", ") + h;
  std::printf("# hvd-bench %s: %d rank%s on %zu host%s (%s)\n", job.hvd_version.c_str(), job.ranks,
              job.ranks == 1 ? "" : "s", job.hosts.size(), job.hosts.size() == 1 ? "" : "s",
              hosts.c_str());
  const Options& o = options_;
  std::printf("#  minBytes %llu maxBytes %llu step: ", static_cast<unsigned long long>(o.min_bytes),
              static_cast<unsigned long long>(o.max_bytes));
  if (o.step_factor > 1) {
    std::printf("%g(factor)", o.step_factor);
  } else {
    std::printf("%llu(bytes)", static_cast<unsigned long long>(o.step_bytes));
  }
  if (o.latency) {
    std::printf(" warmup iters: %s iters: %s",
                o.warmup_given ? std::to_string(o.warmup_iters).c_str() : "100/10",
                o.iters_given ? std::to_string(o.iters).c_str() : "1000/100 (<= 8 KiB / above)");
  } else {
    std::printf(" warmup iters: %d iters: %d", o.warmup_iters, o.iters);
  }
  std::printf(" validation: %d memory: %s\n#\n", o.check ? 1 : 0,
              o.memory == HVD_MEMORY_CUDA ? "cuda" : "host");
  std::printf(
      "# Physical limits measured now: memcpy %.2f GB/s (one thread, 64 MiB), loopback TCP "
      "%.2f GB/s (one stream)",
      limits.memcpy_gbps, limits.tcp_loopback_gbps);
  if (limits.cuda_d2d_gbps >= 0) {
    std::printf(", CUDA device-to-device copy %.1f GB/s", limits.cuda_d2d_gbps);
  } else if (o.memory == HVD_MEMORY_CUDA) {
    std::printf(", CUDA copy not measured (%s)", limits.cuda_note.c_str());
  }
  if (job.ranks > 1) {
    std::printf(",\n#   memcpy %.2f GB/s per rank, the %d ranks copying at once",
                limits.memcpy_all_ranks_gbps, job.ranks);
  }
  std::printf("\n");
  if (o.memory == HVD_MEMORY_HOST) {
    const std::string& thp = limits.transparent_huge_pages;
    if (o.huge_pages) {
      std::printf(
          "# Host buffers and the memcpy on huge pages, advised (--huge-pages; transparent "
          "huge pages: %s%s)\n",
          thp.c_str(), thp == "never" ? ", so 4 KiB pages after all" : "");
    } else {
      std::printf("# Host buffers from malloc (transparent huge pages: %s%s)\n", thp.c_str(),
                  thp == "always" ? ", so large ones on huge pages too" : ": 4 KiB pages");
    }
  }
  std::printf("#\n");
  std::fflush(stdout);
}

void Report::skip(const std::string& backend, const std::string& why) {
  skipped_.push_back(Skipped{backend, "", why});
  if (!printing_) return;
  std::printf("# Backend %s: skipped: %s\n#\n", backend.c_str(), why.c_str());
  std::fflush(stdout);
}

void Report::skip_table(const std::string& why) {
  const TableInfo info = tables_.back().info;
  tables_.pop_back();
  skipped_.push_back(Skipped{info.backend, hvd_collective_name(info.collective), why});
  if (!printing_) return;
  std::printf("# skipped: %s\n#\n", why.c_str());
  std::fflush(stdout);
}

void Report::idle(const IdleWait& wait) {
  idle_ = wait;
  if (!printing_ || wait.waiting == 0) return;
  std::printf(
      "# The %d rank%s outside the process set waited up to %.2f s and used at most %.3f s of "
      "CPU meanwhile (%.2f %% of one core)\n#\n",
      wait.waiting, wait.waiting == 1 ? "" : "s", wait.wall_seconds, wait.cpu_seconds,
      wait.wall_seconds > 0 ? 100 * wait.cpu_seconds / wait.wall_seconds : 0.0);
  std::fflush(stdout);
}

void Report::note(const std::string& line) {
  if (!printing_) return;
  std::printf("# %s\n", line.c_str());
  std::fflush(stdout);
}

std::string Report::compare_metric(const TableInfo& table) const {
  if (options_.latency) return "p50";
  return table.ranks <= 1 ? "algbw" : "busbw";
}

const Row* Report::reference_row(const Table& table, const Message& m) const {
  if (!table.reference) return nullptr;
  for (const Row& r : tables_[*table.reference].rows) {
    if (r.size == m.size && r.count == m.count && r.dtype == m.dtype && r.op == m.op &&
        r.root == m.root) {
      return &r;
    }
  }
  return nullptr;
}

const LatencyRow* Report::reference_latency_row(const Table& table, const Message& m) const {
  if (!table.reference) return nullptr;
  for (const LatencyRow& r : tables_[*table.reference].latency) {
    if (r.size == m.size && r.count == m.count && r.dtype == m.dtype && r.op == m.op &&
        r.root == m.root) {
      return &r;
    }
  }
  return nullptr;
}

void Report::begin_table(const TableInfo& table) {
  Table added{table, {}, {}, std::nullopt, ""};
  if (!table.compare_with.empty()) {
    // The reference ran first, so its table of this collective is here, or it was skipped.
    added.reference_missing = table.compare_missing;
    for (size_t i = 0; i < tables_.size() && added.reference_missing.empty(); ++i) {
      if (tables_[i].info.backend == table.compare_with &&
          tables_[i].info.collective == table.collective) {
        added.reference = i;
        break;
      }
    }
    if (!added.reference && added.reference_missing.empty()) {
      added.reference_missing =
          table.compare_with + " has no " + hvd_collective_name(table.collective) + " table";
      for (const Skipped& k : skipped_) {
        if (k.backend == table.compare_with &&
            k.collective == hvd_collective_name(table.collective)) {
          added.reference_missing += " (" + k.reason + ")";
        }
      }
    }
  }
  tables_.push_back(added);
  if (!printing_) return;
  std::printf("# Backend %s %s over %s: %s", table.backend.c_str(), table.backend_version.c_str(),
              table.transport.c_str(), hvd_collective_name(table.collective));
  if (!table.path.empty()) std::printf(" (%s)", table.path.c_str());
  if (table.ranks != job_.ranks) std::printf(" on a process set of %d ranks", table.ranks);
  if (!table.direct_call.empty()) std::printf("; baseline: %s", table.direct_call.c_str());
  if (!table.direct_missing.empty()) std::printf("; baseline: n/a");
  if (!table.compare_with.empty()) std::printf("; compared with %s", table.compare_with.c_str());
  std::printf("\n");
  const bool direct = direct_columns(table);
  const bool compare = !table.compare_with.empty();
  const std::string metric = compare_metric(table);
  const std::string vs = "vs " + table.compare_with;
  if (compare && !added.reference_missing.empty()) {
    std::printf("# %s: n/a: %s\n", vs.c_str(), added.reference_missing.c_str());
  } else if (compare && options_.latency) {
    std::printf("# %s: %s's p50 / this p50 at the same size; above 1: %s is faster\n", vs.c_str(),
                table.compare_with.c_str(), table.backend.c_str());
  } else if (compare) {
    std::printf(
        "# %s: %s / %s's %s at the same size, from each one's mean time per call (the %s "
        "columns)%s;\n# above 1: %s is faster. %s ran first, then the others one after another "
        "(not interleaved)\n",
        vs.c_str(), metric.c_str(), table.compare_with.c_str(), metric.c_str(), metric.c_str(),
        table.ranks <= 1 ? ", as busbw is N/A at one rank" : "", table.backend.c_str(),
        table.compare_with.c_str());
  }
  std::printf("#\n");
  if (options_.latency) {
    std::printf(
        "# OSU-style latency, out of place, one call at a time: avg over the ranks; p50, p99 "
        "and max of the slowest rank\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %6s  %8s  %8s  %8s  %8s  %8s  %6s", "size", "count",
                "type", "redop", "root", "iters", "avg", "p50", "p99", "min", "max", "#wrong");
    if (direct) std::printf("  |  %8s  %8s  %8s  %8s  %8s", "direct", "p50", "p99", "+avg", "+p50");
    if (compare) std::printf("  |  %12s", vs.c_str());
    std::printf("\n# %10s  %12s  %8s  %6s  %6s  %6s  %8s  %8s  %8s  %8s  %8s  %6s", "(B)",
                "(elements)", "", "", "", "", "(us)", "(us)", "(us)", "(us)", "(us)", "");
    if (direct)
      std::printf("  |  %8s  %8s  %8s  %8s  %8s", "avg(us)", "(us)", "(us)", "(us)", "(us)");
    if (compare) std::printf("  |  %12s", "(p50 ratio)");
    std::printf("\n");
  } else {
    std::printf("# %10s  %12s  %8s  %6s  %6s  %32s  %32s", "", "", "", "", "",
                "out-of-place           ", "in-place           ");
    if (direct) std::printf("  |  %25s  %25s", "direct out-of-place", "direct in-place");
    if (table.check_args)
      std::printf("  |  %26s  %26s", "check-args out-of-place", "check-args in-place");
    if (compare) std::printf("  |  %26s", (metric + " " + vs + "    ").c_str());
    std::printf("\n# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    for (int p = 0; p < 2; ++p)
      std::printf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
    if (direct) {
      std::printf("  |");
      for (int p = 0; p < 2; ++p) std::printf("  %7s  %6s  %7s", "time", "busbw", "hvd/dir");
    }
    if (table.check_args) {
      std::printf("  |");
      for (int p = 0; p < 2; ++p) std::printf("  %7s  %8s  %7s", "time", "overhead", "overhead");
    }
    if (compare) std::printf("  |  %12s  %12s", "out-of-place", "in-place");
    std::printf("\n# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
    for (int p = 0; p < 2; ++p) std::printf("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
    if (direct) {
      std::printf("  |");
      for (int p = 0; p < 2; ++p) std::printf("  %7s  %6s  %7s", "(us)", "(GB/s)", "");
    }
    if (table.check_args) {
      std::printf("  |");
      for (int p = 0; p < 2; ++p) std::printf("  %7s  %8s  %7s", "(us)", "(us)", "(%)");
    }
    if (compare) std::printf("  |  %12s  %12s", "(ratio)", "(ratio)");
    std::printf("\n");
  }
  std::fflush(stdout);
}

void Report::row(const Row& measured) {
  Table& table = tables_.back();
  const int placements = has_in_place(table.info.collective) ? 2 : 1;
  Row r = measured;
  if (const Row* reference = reference_row(table, r)) {
    for (int p = 0; p < placements; ++p)
      r.compared[p] = reference->hvd[p].seconds / r.hvd[p].seconds;
  }
  table.rows.push_back(r);
  for (const Timing& t : r.hvd) {
    if (t.wrong && *t.wrong > 0) any_wrong_ = true;
  }
  for (const std::optional<Timing>& t : r.checked) {
    if (t && t->wrong && *t->wrong > 0) any_wrong_ = true;
  }
  if (!printing_) return;
  const double factor = busbw_factor(table.info);
  std::printf("  %10llu  %12llu  %8s  %6s  %6d", static_cast<unsigned long long>(r.size),
              static_cast<unsigned long long>(r.count), type_name(r.dtype),
              r.op ? hvd_reduce_op_name(*r.op) : "none", r.root);
  for (int p = 0; p < 2; ++p) {
    if (p >= placements) {
      std::printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    const Timing& t = r.hvd[p];
    const double algbw = r.size / t.seconds / 1e9;
    std::printf("  %7s  %6.2f  %6s  %6s", time_text(t.seconds * 1e6).c_str(), algbw,
                std::isnan(factor) ? "N/A" : number(algbw * factor).c_str(),
                wrong_text(t.wrong).c_str());
  }
  if (direct_columns(table.info)) {
    std::printf("  |");
    for (int p = 0; p < 2; ++p) {
      if (!r.direct[p]) {
        std::printf("  %7s  %6s  %7s", "n/a", "", "");
        continue;
      }
      const double algbw = r.size / r.direct[p]->seconds / 1e9;
      std::printf("  %7s  %6s  %7.3f", time_text(r.direct[p]->seconds * 1e6).c_str(),
                  std::isnan(factor) ? "N/A" : number(algbw * factor).c_str(),
                  hvd_over_direct(r.hvd[p], *r.direct[p]));
    }
  }
  if (table.info.check_args) {
    std::printf("  |");
    for (int p = 0; p < 2; ++p) {
      if (!r.checked[p]) {
        std::printf("  %7s  %8s  %7s", "n/a", "", "");
        continue;
      }
      std::printf("  %7s  %+8.2f  %+7.1f", time_text(r.checked[p]->seconds * 1e6).c_str(),
                  check_overhead_us(r.hvd[p], *r.checked[p]),
                  check_overhead_percent(r.hvd[p], *r.checked[p]));
    }
  }
  if (!table.info.compare_with.empty()) {
    std::printf("  |");
    for (int p = 0; p < 2; ++p) {
      std::printf("  %12s", p >= placements ? "N/A" : ratio_text(r.compared[p]).c_str());
    }
  }
  std::printf("\n");
  std::fflush(stdout);
}

void Report::latency_row(const LatencyRow& measured) {
  Table& table = tables_.back();
  LatencyRow r = measured;
  if (const LatencyRow* reference = reference_latency_row(table, r)) {
    r.compared = reference->hvd.p50 / r.hvd.p50;
  }
  table.latency.push_back(r);
  if (r.wrong && *r.wrong > 0) any_wrong_ = true;
  if (!printing_) return;
  std::printf("  %10llu  %12llu  %8s  %6s  %6d  %6d  %8.2f  %8.2f  %8.2f  %8.2f  %8.2f  %6s",
              static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(r.count),
              type_name(r.dtype), r.op ? hvd_reduce_op_name(*r.op) : "none", r.root, r.iters,
              r.hvd.avg, r.hvd.p50, r.hvd.p99, r.hvd.min, r.hvd.max, wrong_text(r.wrong).c_str());
  if (direct_columns(table.info)) {
    if (r.direct) {
      std::printf("  |  %8.2f  %8.2f  %8.2f  %+8.2f  %+8.2f", r.direct->avg, r.direct->p50,
                  r.direct->p99, r.hvd.avg - r.direct->avg, r.hvd.p50 - r.direct->p50);
    } else {
      std::printf("  |  %8s  %8s  %8s  %8s  %8s", "n/a", "", "", "", "");
    }
  }
  if (!table.info.compare_with.empty()) std::printf("  |  %12s", ratio_text(r.compared).c_str());
  std::printf("\n");
  std::fflush(stdout);
}

void Report::end_table() {
  const Table& table = tables_.back();
  if (!printing_) return;
  uint64_t wrong = 0;
  bool checked = false;
  for (const Row& r : table.rows) {
    for (const Timing& t : r.hvd) {
      if (t.wrong) {
        checked = true;
        wrong += *t.wrong;
      }
    }
    for (const std::optional<Timing>& t : r.checked) {
      if (t && t->wrong) wrong += *t->wrong;
    }
  }
  for (const LatencyRow& r : table.latency) {
    if (r.wrong) {
      checked = true;
      wrong += *r.wrong;
    }
  }
  std::printf("# Out of bounds values : %s\n",
              checked ? (std::to_string(wrong) + (wrong ? " FAILED" : " OK")).c_str()
                      : "N/A (not checked: -c 0)");
  if (!options_.latency) {
    const double factor = busbw_factor(table.info);
    const int placements = has_in_place(table.info.collective) ? 2 : 1;
    double sum = 0;
    int n = 0;
    std::vector<double> ratios_large, ratios_all;
    for (const Row& r : table.rows) {
      for (int p = 0; p < placements; ++p) {
        sum += r.size / r.hvd[p].seconds / 1e9 * factor;
        ++n;
        if (r.direct[p]) {
          const double ratio = hvd_over_direct(r.hvd[p], *r.direct[p]);
          ratios_all.push_back(ratio);
          if (r.size >= kRatioFloor) ratios_large.push_back(ratio);
        }
      }
    }
    std::printf("# Avg bus bandwidth    : %s\n",
                std::isnan(factor) || n == 0 ? "N/A" : number(sum / n, "%g").c_str());
    if (!ratios_all.empty()) {
      std::printf(
          "# hvd/direct bandwidth (direct time / hvd time, per-call medians): median %.3f, min "
          "%.3f over all %zu",
          median(ratios_all), *std::min_element(ratios_all.begin(), ratios_all.end()),
          ratios_all.size());
      if (!ratios_large.empty()) {
        std::printf("; at >= 1 MiB median %.3f, min %.3f", median(ratios_large),
                    *std::min_element(ratios_large.begin(), ratios_large.end()));
      }
      std::printf("\n");
    }
    if (table.info.check_args && !table.rows.empty() && table.rows.front().checked[0]) {
      const Row& first = table.rows.front();
      std::printf("# HVD_CHECK_ARGS=1 overhead (with - without, per-call medians): at %llu B",
                  static_cast<unsigned long long>(first.size));
      for (int p = 0; p < 2; ++p) {
        if (!first.checked[p]) continue;
        std::printf(" %+.2f us (%+.1f %%) %s", check_overhead_us(first.hvd[p], *first.checked[p]),
                    check_overhead_percent(first.hvd[p], *first.checked[p]),
                    p == 0 ? "out of place," : "in place");
      }
      std::vector<double> percent_large, us_large;
      for (const Row& r : table.rows) {
        for (int p = 0; p < 2; ++p) {
          if (r.size < kRatioFloor || !r.checked[p]) continue;
          percent_large.push_back(check_overhead_percent(r.hvd[p], *r.checked[p]));
          us_large.push_back(check_overhead_us(r.hvd[p], *r.checked[p]));
        }
      }
      if (!percent_large.empty()) {
        std::printf("; at >= 1 MiB median %+.2f %% (%+.1f us), max %+.2f %% over %zu",
                    median(percent_large), median(us_large),
                    *std::max_element(percent_large.begin(), percent_large.end()),
                    percent_large.size());
      }
      std::printf("\n");
    }
  } else if (!table.latency.empty() && table.latency.front().direct) {
    const LatencyRow& first = table.latency.front();
    std::printf("# Added latency at %llu B: %+.2f us at p50, %+.2f us on average\n",
                static_cast<unsigned long long>(first.size), first.hvd.p50 - first.direct->p50,
                first.hvd.avg - first.direct->avg);
  }
  if (!table.info.compare_with.empty()) {
    // --compare's summary: every ratio of the table, and those of 1 MiB and more.
    std::vector<double> all, large;
    auto add = [&](uint64_t size, const std::optional<double>& ratio) {
      if (!ratio || !std::isfinite(*ratio)) return;
      all.push_back(*ratio);
      if (size >= kRatioFloor) large.push_back(*ratio);
    };
    for (const Row& r : table.rows) {
      for (const std::optional<double>& ratio : r.compared) add(r.size, ratio);
    }
    for (const LatencyRow& r : table.latency) add(r.size, r.compared);
    const std::string metric = compare_metric(table.info);
    const char* name = table.info.compare_with.c_str();
    if (all.empty()) {
      std::printf("# %s vs %s: n/a\n", metric.c_str(), name);
    } else {
      std::printf("# %s vs %s (%s): median %.3f, min %.3f, max %.3f over all %zu", metric.c_str(),
                  name,
                  options_.latency ? (std::string(name) + "'s / this").c_str()
                                   : (std::string("this / ") + name + "'s").c_str(),
                  median(all), *std::min_element(all.begin(), all.end()),
                  *std::max_element(all.begin(), all.end()), all.size());
      if (!large.empty()) {
        std::printf("; at >= 1 MiB median %.3f, min %.3f", median(large),
                    *std::min_element(large.begin(), large.end()));
      }
      std::printf("\n");
    }
  }
  std::printf("#\n");
  std::fflush(stdout);
}

void Report::fusion_row(const std::string& backend, const FusionResult& r) {
  if (r.wrong > 0) any_wrong_ = true;
  const bool first = fusion_.empty();
  fusion_.emplace_back(backend, r);
  if (!printing_) return;
  if (first) {
    std::printf(
        "# Fusion: %d float tensors of %llu B per step (sum) through the asynchronous API, waited "
        "for; beside them one\n# blocking allreduce of all their bytes (single). fused: "
        "submitted one by one, HVD_FUSION_THRESHOLD %s, end to end in memory (reduced where they "
        "lie);\n# apart: the same, 64 B apart (through the fusion buffer); grouped: one "
        "hvd_grouped_async per step; unfused: one by\n# one, threshold 0. Times per step: the "
        "median over steps timed one by one, averaged over the ranks; single, fused,\n# apart and "
        "unfused take turns, and grouped takes turns with single in a round of its own "
        "(grouped/single is to that round's\n# single). unfused/single bounds unfused/fused: no "
        "fused step is faster than the single allreduce.\n#\n",
        r.tensors, static_cast<unsigned long long>(r.tensor_bytes), r.threshold.c_str());
    const char* format =
        "# %-8s  %9s  %9s  %9s  %9s  %10s  %7s  %7s  %8s  %8s  %8s  %10s  %10s  %11s  %12s  %6s  "
        "%6s\n";
    std::printf(format, "backend", "single", "fused", "apart", "grouped", "unfused", "fused/",
                "apart/", "grouped/", "unfused/", "unfused/", "calls/step", "calls/step",
                "cycles/step", "negotiation/", "cache", "#wrong");
    std::printf(format, "", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "single", "single", "single",
                "fused", "single", "(fused)", "(unfused)", "(fused)", "cycle (us)", "misses", "");
  }
  std::printf(
      "  %-8s  %9.3f  %9.3f  %9.3f  %9.3f  %10.3f  %7.3f  %7.3f  %8.3f  %8.1f  %8.1f  %10.1f  "
      "%10.1f  %11.2f  %12.1f  %6llu  %6llu\n",
      backend.c_str(), r.single_seconds * 1e3, r.fused_seconds * 1e3, r.apart_seconds * 1e3,
      r.grouped_seconds * 1e3, r.unfused_seconds * 1e3, r.fused_seconds / r.single_seconds,
      r.apart_seconds / r.single_seconds, r.grouped_seconds / r.grouped_single_seconds,
      r.unfused_seconds / r.fused_seconds, r.unfused_seconds / r.single_seconds,
      r.calls_per_step_fused, r.calls_per_step_unfused, r.cycles_per_step,
      r.negotiation_seconds_per_cycle * 1e6, static_cast<unsigned long long>(r.full_negotiations),
      static_cast<unsigned long long>(r.wrong));
  std::printf(
      "# %s: fusion gave %.1fx the unfused throughput (goal >= 10; at most %.1fx here, where "
      "unfused steps took that many single\n# allreduces); a fused step took %.2fx one allreduce "
      "of all its bytes submitted one by one (goal <= 1.3), %.2fx with the\n# tensors apart, "
      "%.2fx as one group\n#\n",
      backend.c_str(), r.unfused_seconds / r.fused_seconds, r.unfused_seconds / r.single_seconds,
      r.fused_seconds / r.single_seconds, r.apart_seconds / r.single_seconds,
      r.grouped_seconds / r.grouped_single_seconds);
  std::fflush(stdout);
}

Status Report::write_json(const std::string& path) const {
  auto timing = [&](const Timing& t, uint64_t size, double factor) {
    JsonObject o;
    const double algbw = size / t.seconds / 1e9;
    o.num("time", t.seconds * 1e6).num("alg_bw", algbw).num("bus_bw", algbw * factor);
    if (t.median_seconds) o.num("time_median", *t.median_seconds * 1e6);
    if (t.wrong) {
      o.integer("nwrong", static_cast<int64_t>(*t.wrong));
    } else {
      o.add("nwrong", "null");
    }
    return o.text();
  };
  auto stats = [](const LatencyStats& s) {
    return JsonObject()
        .num("avg", s.avg)
        .num("p50", s.p50)
        .num("p99", s.p99)
        .num("min", s.min)
        .num("max", s.max)
        .text();
  };
  std::vector<std::string> results;
  for (const Table& table : tables_) {
    const double factor = busbw_factor(table.info);
    auto common = [&](JsonObject& o, const Message& m) {
      o.str("backend", table.info.backend)
          .str("backend_version", table.info.backend_version)
          .str("transport", table.info.transport)
          .str("collective", hvd_collective_name(table.info.collective))
          .integer("ranks", table.info.ranks);
      if (!table.info.path.empty()) o.str("path", table.info.path);
      o.integer("size", static_cast<int64_t>(m.size))
          .integer("count", static_cast<int64_t>(m.count))
          .str("type", type_name(m.dtype))
          .str("redop", m.op ? hvd_reduce_op_name(*m.op) : "none")
          .integer("root", m.root);
    };
    // --baseline: the library's call, or null and why there is none.
    auto direct_call = [&](JsonObject& d) {
      if (table.info.direct_call.empty()) {
        d.add("call", "null").str("unsupported", table.info.direct_missing);
      } else {
        d.str("call", table.info.direct_call);
      }
    };
    // --compare: the reference and the ratio's metric; the caller adds the ratios (null: n/a).
    auto compared = [&](const Message& m) {
      JsonObject k;
      k.str("backend", table.info.compare_with).str("metric", compare_metric(table.info));
      if (!table.reference_missing.empty()) {
        k.str("unavailable", table.reference_missing);
      } else if (options_.latency ? reference_latency_row(table, m) == nullptr
                                  : reference_row(table, m) == nullptr) {
        k.str("unavailable", table.info.compare_with + " measured no such row");
      }
      return k;
    };
    for (const Row& r : table.rows) {
      JsonObject o;
      common(o, r);
      o.add("out_of_place", timing(r.hvd[0], r.size, factor));
      if (has_in_place(table.info.collective)) o.add("in_place", timing(r.hvd[1], r.size, factor));
      if (direct_columns(table.info)) {
        JsonObject d;
        direct_call(d);
        if (!r.direct_unsupported.empty()) d.str("unsupported", r.direct_unsupported);
        const char* keys[2] = {"out_of_place", "in_place"};
        for (int p = 0; p < 2; ++p) {
          if (!r.direct[p]) continue;
          d.add(keys[p], timing(*r.direct[p], r.size, factor));
          d.num(std::string("ratio_") + keys[p], hvd_over_direct(r.hvd[p], *r.direct[p]));
        }
        o.add("direct", d.text());
      }
      if (table.info.check_args) {
        JsonObject k;
        const char* keys[2] = {"out_of_place", "in_place"};
        for (int p = 0; p < 2; ++p) {
          if (!r.checked[p]) continue;
          k.add(keys[p], timing(*r.checked[p], r.size, factor))
              .num(std::string("overhead_us_") + keys[p],
                   check_overhead_us(r.hvd[p], *r.checked[p]))
              .num(std::string("overhead_percent_") + keys[p],
                   check_overhead_percent(r.hvd[p], *r.checked[p]));
        }
        o.add("check_args", k.text());
      }
      if (!table.info.compare_with.empty()) {
        JsonObject k = compared(r);
        k.num("ratio_out_of_place", r.compared[0].value_or(NAN));
        if (has_in_place(table.info.collective)) {
          k.num("ratio_in_place", r.compared[1].value_or(NAN));
        }
        o.add("compare", k.text());
      }
      results.push_back(o.text());
    }
    for (const LatencyRow& r : table.latency) {
      JsonObject o;
      common(o, r);
      o.integer("iters", r.iters).add("latency_us", stats(r.hvd));
      if (r.wrong) {
        o.integer("nwrong", static_cast<int64_t>(*r.wrong));
      } else {
        o.add("nwrong", "null");
      }
      if (direct_columns(table.info)) {
        JsonObject d;
        direct_call(d);
        if (r.direct) {
          d.add("latency_us", stats(*r.direct))
              .num("added_us_p50", r.hvd.p50 - r.direct->p50)
              .num("added_us_avg", r.hvd.avg - r.direct->avg);
        } else if (!r.direct_unsupported.empty()) {
          d.str("unsupported", r.direct_unsupported);
        }
        o.add("direct", d.text());
      }
      if (!table.info.compare_with.empty()) {
        o.add("compare", compared(r).num("ratio", r.compared.value_or(NAN)).text());
      }
      results.push_back(o.text());
    }
  }
  for (const auto& [backend, r] : fusion_) {
    JsonObject o;
    o.str("backend", backend)
        .str("collective", "allreduce")
        .str("mode", "fusion")
        .integer("tensors", r.tensors)
        .integer("tensor_bytes", static_cast<int64_t>(r.tensor_bytes))
        .str("fusion_threshold", r.threshold)
        .num("single_time", r.single_seconds * 1e6)
        .num("fused_time", r.fused_seconds * 1e6)
        .num("apart_time", r.apart_seconds * 1e6)
        .num("grouped_time", r.grouped_seconds * 1e6)
        .num("unfused_time", r.unfused_seconds * 1e6)
        .num("grouped_over_single", r.grouped_seconds / r.grouped_single_seconds)
        .num("fused_over_single", r.fused_seconds / r.single_seconds)
        .num("apart_over_single", r.apart_seconds / r.single_seconds)
        .num("fused_speedup_over_unfused", r.unfused_seconds / r.fused_seconds)
        .num("unfused_over_single", r.unfused_seconds / r.single_seconds)
        .num("backend_calls_per_step_fused", r.calls_per_step_fused)
        .num("backend_calls_per_step_unfused", r.calls_per_step_unfused)
        .num("cycles_per_step", r.cycles_per_step)
        .num("negotiation_us_per_cycle", r.negotiation_seconds_per_cycle * 1e6)
        .integer("cache_misses", static_cast<int64_t>(r.full_negotiations))
        .integer("nwrong", static_cast<int64_t>(r.wrong));
    results.push_back(o.text());
  }
  std::vector<std::string> hosts, skipped;
  for (const std::string& h : job_.hosts) hosts.push_back(json_string(h));
  for (const Skipped& k : skipped_) {
    JsonObject o;
    o.str("backend", k.backend);
    if (!k.collective.empty()) o.str("collective", k.collective);
    skipped.push_back(o.str("reason", k.reason).text());
  }
  JsonObject limits;
  limits.num("memcpy_GBps", limits_.memcpy_gbps)
      .num("memcpy_all_ranks_GBps",
           limits_.memcpy_all_ranks_gbps >= 0 ? limits_.memcpy_all_ranks_gbps : NAN)
      .num("tcp_loopback_GBps", limits_.tcp_loopback_gbps);
  limits.num("cuda_d2d_GBps", limits_.cuda_d2d_gbps >= 0 ? limits_.cuda_d2d_gbps : NAN)
      .str("transparent_huge_pages", limits_.transparent_huge_pages);
  const Options& o = options_;
  JsonObject settings;
  settings.integer("min_bytes", static_cast<int64_t>(o.min_bytes))
      .integer("max_bytes", static_cast<int64_t>(o.max_bytes))
      .num("step_factor", o.step_factor)
      .integer("step_bytes", static_cast<int64_t>(o.step_bytes))
      .integer("iters", o.iters)
      .integer("warmup_iters", o.warmup_iters)
      .integer("check", o.check ? 1 : 0)
      .str("mode", o.tensors > 0 ? "fusion"
                   : o.latency   ? "latency"
                                 : "bandwidth")
      .str("memory", o.memory == HVD_MEMORY_CUDA ? "cuda" : "host")
      .add("huge_pages", o.huge_pages ? "true" : "false")
      .add("baseline", o.baseline ? "true" : "false")
      .add("check_args", o.check_args ? "true" : "false")
      .add("compare", o.compare.empty() ? "null" : json_string(o.compare));
  JsonObject top;
  top.str("benchmark", "hvd-bench")
      .str("version", job_.hvd_version)
      .str("command", o.command_line)
      .integer("ranks", job_.ranks)
      .add("hosts", json_array(hosts));
  if (!o.process_set.empty()) {
    std::vector<std::string> ranks;
    for (int r : o.process_set) ranks.push_back(std::to_string(r));
    top.add("process_set", json_array(ranks));
  }
  if (idle_) {
    top.add("idle", JsonObject()
                        .integer("members", idle_->members)
                        .integer("waiting", idle_->waiting)
                        .num("wait_s", idle_->wall_seconds)
                        .num("cpu_s", idle_->cpu_seconds)
                        .text());
  }
  top.add("settings", settings.text())
      .add("limits", limits.text())
      .add("results", json_array(results, ",\n  "))
      .add("skipped", json_array(skipped));

  std::ofstream out(path);
  if (!out) return error(HVD_ERR_SYSTEM, "cannot write " + path);
  out << top.text() << "\n";
  out.close();
  if (!out) return error(HVD_ERR_SYSTEM, "writing " + path + " failed");
  return Status::success();
}

}  // namespace hvd::bench
