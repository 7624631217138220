#include "options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "bootstrap/env.hpp"
#include "hvd/sdk/env.hpp"

namespace hvd::bench {
namespace {

struct Named {
  const char* name;
  int value;
};

// nccl-tests' spellings first (they are what gets printed), then hvd's.
constexpr Named kTypes[] = {
    {"float", HVD_FLOAT32},   {"half", HVD_FLOAT16},    {"bfloat16", HVD_BFLOAT16},
    {"double", HVD_FLOAT64},  {"int8", HVD_INT8},       {"uint8", HVD_UINT8},
    {"int32", HVD_INT32},     {"int64", HVD_INT64},     {"float32", HVD_FLOAT32},
    {"float16", HVD_FLOAT16}, {"float64", HVD_FLOAT64}, {"int", HVD_INT32},
};
constexpr Named kOps[] = {{"sum", HVD_SUM},        {"prod", HVD_PRODUCT}, {"min", HVD_MIN},
                          {"max", HVD_MAX},        {"avg", HVD_AVERAGE},  {"product", HVD_PRODUCT},
                          {"average", HVD_AVERAGE}};
constexpr Named kCollectives[] = {{"allreduce", HVD_COLLECTIVE_ALLREDUCE},
                                  {"allgather", HVD_COLLECTIVE_ALLGATHER},
                                  {"broadcast", HVD_COLLECTIVE_BROADCAST},
                                  {"reduce_scatter", HVD_COLLECTIVE_REDUCE_SCATTER},
                                  {"alltoall", HVD_COLLECTIVE_ALLTOALL}};

Status usage_error(const std::string& why) {
  return error(HVD_ERR_INVALID_ARGUMENT, why + " (see hvd-bench --help)");
}

// "a,b" or "all" against a table; "all" takes the first `distinct` entries.
template <typename T, size_t N>
Result<std::vector<T>> parse_names(const char* flag, const std::string& text,
                                   const Named (&table)[N], size_t distinct) {
  std::vector<T> out;
  for (const std::string& item : core::split(text, ',')) {
    if (item == "all") {
      for (size_t i = 0; i < distinct; ++i) out.push_back(static_cast<T>(table[i].value));
      continue;
    }
    bool found = false;
    for (const Named& n : table) {
      if (item == n.name) {
        out.push_back(static_cast<T>(n.value));
        found = true;
        break;
      }
    }
    if (!found) {
      std::string known;
      for (size_t i = 0; i < distinct; ++i)
        known += std::string(known.empty() ? "" : ", ") + table[i].name;
      return usage_error(std::string(flag) + ": unknown '" + item + "' (one of " + known +
                         ", all)");
    }
  }
  if (out.empty()) return usage_error(std::string(flag) + " needs a value");
  return out;
}

// "8", "64K", "32M", "1G" (binary multiples, as nccl-tests), at most 2^64-1 bytes.
Result<uint64_t> parse_bytes(const char* flag, const std::string& text) {
  uint64_t scale = 1;
  switch (text.empty() ? '\0' : text.back()) {
    case 'k':
    case 'K':
      scale = 1ull << 10;
      break;
    case 'm':
    case 'M':
      scale = 1ull << 20;
      break;
    case 'g':
    case 'G':
      scale = 1ull << 30;
      break;
    default:
      break;
  }
  const std::string_view digits(text.data(), text.size() - (scale == 1 ? 0 : 1));
  const std::optional<uint64_t> value = sdk::parse_whole(digits, UINT64_MAX / scale);
  if (!value) {
    return usage_error(std::string(flag) + ": '" + text +
                       "' is not a size (8, 64K, 32M, 1G) of at most 2^64-1 bytes");
  }
  return *value * scale;
}

Result<long> parse_int(const char* flag, const std::string& text, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || value < min || value > max) {
    return usage_error(std::string(flag) + ": '" + text + "' is not an integer in [" +
                       std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

Result<double> parse_double(const char* flag, const std::string& text, double min) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0' || !(value >= min)) {
    return usage_error(std::string(flag) + ": '" + text +
                       "' is not a number >= " + std::to_string(min));
  }
  return value;
}

// --compare NAME against --backend (a list given, or 'all', checked once the plugins are found).
Status check_compare(const Options& o) {
  const std::string flag = "--compare " + o.compare;
  if (o.tensors > 0)
    return usage_error(flag + ": compares bandwidth and latency tables, not --tensors");
  if (o.backends.empty()) {
    return usage_error(flag + ": no --backend given; name " + o.compare +
                       " and the backends to compare with it (--backend OTHER," + o.compare + ")");
  }
  if (o.backends.size() == 1 && o.backends[0] == "all") return Status::success();
  return check_compare_in(o.compare, o.backends, "--backend " + backend_list(o.backends));
}

}  // namespace

std::string backend_list(const std::vector<std::string>& backends) {
  std::string list;
  for (const std::string& b : backends) list += (list.empty() ? "" : ",") + b;
  return list;
}

Status check_compare_in(const std::string& name, const std::vector<std::string>& backends,
                        const std::string& what) {
  const std::string flag = "--compare " + name;
  if (std::find(backends.begin(), backends.end(), name) == backends.end()) {
    return usage_error(flag + ": not one of the backends of " + what);
  }
  if (std::count_if(backends.begin(), backends.end(),
                    [&](const std::string& b) { return b != name; }) == 0) {
    return usage_error(flag + ": " + what + " has no other backend to compare with it");
  }
  return Status::success();
}

bool has_in_place(hvd_collective c) { return c != HVD_COLLECTIVE_ALLTOALL; }

const char* type_name(hvd_dtype dtype) {
  for (const Named& n : kTypes) {
    if (n.value == dtype) return n.name;
  }
  return "?";
}

const char* usage_text() {
  return "usage: hvdrun -np N hvd-bench [options]     (or under mpirun)\n"
         "\n"
         "Collective bandwidth and latency through hvd's backends, printed as nccl-tests prints\n"
         "them, with the library called directly beside hvd (--baseline).\n"
         "\n"
         "nccl-tests' flags:\n"
         "  -b, --minbytes SIZE     smallest message (default 8; K, M, G suffixes)\n"
         "  -e, --maxbytes SIZE     largest message (default 64M)\n"
         "  -f, --stepfactor F      multiply the size by F (default 2)\n"
         "  -i, --stepbytes SIZE    add SIZE instead (when -f is 1)\n"
         "  -n, --iters N           timed iterations per size (default 20)\n"
         "  -w, --warmup_iters N    untimed iterations first (default 5)\n"
         "  -c, --check 0|1         check every result outside the timed loop (default 1)\n"
         "  -d, --datatype T        float, half, bfloat16, double, int8, uint8, int32, int64,\n"
         "                          a list or 'all' (default float)\n"
         "  -o, --op OP             sum, prod, min, max, avg, a list or 'all' (default sum;\n"
         "                          allreduce and reduce_scatter)\n"
         "  -r, --root R            broadcast root (default 0)\n"
         "  -J, --output_file FILE  write the results as JSON\n"
         "hvd's:\n"
         "  -C, --collective C      allreduce, allgather, broadcast, reduce_scatter, alltoall,\n"
         "                          a list or 'all' (default allreduce). SIZE is nccl-tests':\n"
         "                          allreduce, broadcast: the buffer; allgather: the gathered\n"
         "                          output; reduce_scatter: each rank's input (count x ranks\n"
         "                          elements, count of them its result); alltoall: each\n"
         "                          rank's send buffer, split evenly among the ranks (no\n"
         "                          in-place form). busbw = algbw x 2(n-1)/n for allreduce,\n"
         "                          (n-1)/n for allgather, reduce_scatter and alltoall, 1 for\n"
         "                          broadcast\n"
         "  --backend NAME          a backend, a list, or 'all' (every backend found), run one\n"
         "                          after another in this job (default: HVD_BACKEND, or gloo)\n"
         "  --baseline              time the library directly beside hvd (MPI_Allreduce, the\n"
         "                          Gloo algorithms the plugin runs, ...) and print hvd/direct;\n"
         "                          n/a, with the reason, for a backend without one (ofi)\n"
         "  --compare NAME          NAME is one of --backend's, and runs first; every other\n"
         "                          backend's rows get a column 'vs NAME': its busbw / NAME's at\n"
         "                          the same collective, type, op and size (algbw at one rank;\n"
         "                          with --latency NAME's p50 / its p50). Above 1: it is faster.\n"
         "                          Backends run one after another, not interleaved\n"
         "  --check-args            time every call also on a second communicator opened with\n"
         "                          HVD_CHECK_ARGS=1, alternating, and print the overhead of the\n"
         "                          argument check (with minus without, us and %)\n"
         "  --latency               OSU-style per-call latency: avg, p50, p99 (defaults to 1000\n"
         "                          iterations up to 8 KiB, 100 above)\n"
         "  --tensors K             the fusion mode: K float tensors per step through the\n"
         "                          asynchronous API, fused (HVD_FUSION_THRESHOLD) and unfused\n"
         "                          (threshold 0), beside one allreduce of all their bytes\n"
         "  --tensor-bytes S        bytes per tensor in the fusion mode (default 4K)\n"
         "  --mem host|cuda         where the buffers live (default host)\n"
         "  --huge-pages            host buffers, and the header's memcpy, on 2 MiB pages\n"
         "                          (transparent huge pages, advised): on one host a peer's\n"
         "                          single-copy read then pins 2 MiB at a time, not 4 KiB.\n"
         "                          Default: malloc's pages, as a framework's tensors get\n"
         "                          (4 KiB unless the kernel's THP mode is 'always')\n"
         "  --timeout SECONDS       bound on every wait (default HVD_TIMEOUT)\n"
         "  --process-set R,R,...   run on a process set of these job ranks (a child of the\n"
         "                          job's communicator, hvd_comm_create_process_set); busbw\n"
         "                          counts its ranks. The other ranks wait for it in a\n"
         "                          blocking read on a TCP socket, not in an hvd call: they\n"
         "                          use no CPU, and no HVD_TIMEOUT runs while they wait\n"
         "  --idle-timeout SECONDS  bound on that wait (default 86400)\n"
         "  -h, --help              this text\n";
}

Result<Options> parse_options(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.command_line += std::string(i ? " " : "") + argv[i];
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const size_t eq = arg.find('=');
    const bool has_inline = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (has_inline) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto next = [&]() -> Result<std::string> {
      if (has_inline) return value;
      if (i + 1 >= argc) return usage_error(arg + " needs a value");
      return std::string(argv[++i]);
    };
    auto take = [&](auto&& parse) -> Status {
      Result<std::string> v = next();
      if (!v.ok()) return v.status();
      return parse(*v);
    };
    Status s;
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    } else if (arg == "-b" || arg == "--minbytes") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.min_bytes, parse_bytes("-b", v));
        return Status::success();
      });
    } else if (arg == "-e" || arg == "--maxbytes") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.max_bytes, parse_bytes("-e", v));
        return Status::success();
      });
    } else if (arg == "-i" || arg == "--stepbytes") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.step_bytes, parse_bytes("-i", v));
        return Status::success();
      });
    } else if (arg == "-f" || arg == "--stepfactor") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.step_factor, parse_double("-f", v, 1.0));
        return Status::success();
      });
    } else if (arg == "-n" || arg == "--iters") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(long n, parse_int("-n", v, 1, 100000000));
        o.iters = static_cast<int>(n);
        o.iters_given = true;
        return Status::success();
      });
    } else if (arg == "-w" || arg == "--warmup_iters") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(long n, parse_int("-w", v, 0, 100000000));
        o.warmup_iters = static_cast<int>(n);
        o.warmup_given = true;
        return Status::success();
      });
    } else if (arg == "-c" || arg == "--check") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(long n, parse_int("-c", v, 0, 1000000));
        o.check = n != 0;
        return Status::success();
      });
    } else if (arg == "-d" || arg == "--datatype") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.dtypes, parse_names<hvd_dtype>("-d", v, kTypes, 8));
        return Status::success();
      });
    } else if (arg == "-o" || arg == "--op") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.ops, parse_names<hvd_reduce_op>("-o", v, kOps, 5));
        return Status::success();
      });
    } else if (arg == "-C" || arg == "--collective") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.collectives, parse_names<hvd_collective>("-C", v, kCollectives, 5));
        return Status::success();
      });
    } else if (arg == "-r" || arg == "--root") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(long n, parse_int("-r", v, 0, 1 << 30));
        o.root = static_cast<int>(n);
        return Status::success();
      });
    } else if (arg == "-J" || arg == "--output_file") {
      s = take([&](const std::string& v) -> Status {
        o.json_path = v;
        return Status::success();
      });
    } else if (arg == "--backend") {
      s = take([&](const std::string& v) -> Status {
        for (const std::string& b : core::split(v, ',')) o.backends.push_back(b);
        return Status::success();
      });
    } else if (arg == "--mem") {
      s = take([&](const std::string& v) -> Status {
        if (v == "host") {
          o.memory = HVD_MEMORY_HOST;
        } else if (v == "cuda") {
          o.memory = HVD_MEMORY_CUDA;
        } else {
          return usage_error("--mem: '" + v + "' is not host or cuda");
        }
        return Status::success();
      });
    } else if (arg == "--timeout") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.timeout_seconds, parse_double("--timeout", v, 0.001));
        return Status::success();
      });
    } else if (arg == "--process-set") {
      s = take([&](const std::string& v) -> Status {
        o.process_set.clear();
        for (const std::string& item : core::split(v, ',')) {
          HVD_ASSIGN_OR_RETURN(long r, parse_int("--process-set", item, 0, 1 << 30));
          o.process_set.push_back(static_cast<int>(r));
        }
        std::sort(o.process_set.begin(), o.process_set.end());
        if (o.process_set.empty()) return usage_error("--process-set needs ranks");
        if (std::adjacent_find(o.process_set.begin(), o.process_set.end()) != o.process_set.end()) {
          return usage_error("--process-set: '" + v + "' names a rank twice");
        }
        return Status::success();
      });
    } else if (arg == "--idle-timeout") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.idle_timeout_seconds, parse_double("--idle-timeout", v, 0.001));
        return Status::success();
      });
    } else if (arg == "--baseline") {
      o.baseline = true;
    } else if (arg == "--compare") {
      s = take([&](const std::string& v) -> Status {
        if (v.empty() || v.find(',') != std::string::npos || v == "all") {
          return usage_error("--compare: '" + v + "' is not one backend's name");
        }
        o.compare = v;
        return Status::success();
      });
    } else if (arg == "--check-args") {
      o.check_args = true;
    } else if (arg == "--tensors") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(long n, parse_int("--tensors", v, 1, 1 << 20));
        o.tensors = static_cast<int>(n);
        return Status::success();
      });
    } else if (arg == "--tensor-bytes") {
      s = take([&](const std::string& v) -> Status {
        HVD_ASSIGN_OR_RETURN(o.tensor_bytes, parse_bytes("--tensor-bytes", v));
        if (o.tensor_bytes < 4) return usage_error("--tensor-bytes: at least one float (4)");
        return Status::success();
      });
    } else if (arg == "--latency") {
      o.latency = true;
    } else if (arg == "--huge-pages") {
      o.huge_pages = true;
    } else {
      s = usage_error("unknown argument '" + arg + "'");
    }
    HVD_RETURN_IF_ERROR(s);
  }
  if (o.min_bytes > o.max_bytes) {
    return usage_error("-b " + std::to_string(o.min_bytes) + " is larger than -e " +
                       std::to_string(o.max_bytes));
  }
  if (o.step_factor == 1 && o.step_bytes == 0 && o.min_bytes != o.max_bytes) {
    return usage_error("-f 1 needs -i (a step in bytes)");
  }
  for (const std::string& b : o.backends) {
    if (b == "all" && o.backends.size() > 1) return usage_error("--backend all stands alone");
  }
  if (o.check_args && (o.latency || o.tensors > 0)) {
    return usage_error("--check-args times the bandwidth table: not with --latency or --tensors");
  }
  if (!o.process_set.empty() && (o.check_args || o.tensors > 0)) {
    return usage_error("--process-set runs the bandwidth and latency tables: not with " +
                       std::string(o.check_args ? "--check-args" : "--tensors"));
  }
  if (o.huge_pages && (o.memory != HVD_MEMORY_HOST || o.tensors > 0)) {
    return usage_error("--huge-pages places the tables' host buffers: not with " +
                       std::string(o.tensors > 0 ? "--tensors" : "--mem cuda"));
  }
  if (!o.compare.empty()) HVD_RETURN_IF_ERROR(check_compare(o));
  if (o.latency) {
    if (!o.iters_given) o.iters = 0;  // per size: OSU's 1000 / 100
    if (!o.warmup_given) o.warmup_iters = -1;
  }
  return o;
}

std::vector<uint64_t> message_sizes(const Options& o) {
  std::vector<uint64_t> sizes;
  for (uint64_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    uint64_t next = o.step_factor > 1 ? static_cast<uint64_t>(std::llround(s * o.step_factor))
                                      : s + o.step_bytes;
    if (next <= s) next = s + 1;  // -b 0 with a factor
    s = next;
  }
  return sizes;
}

}  // namespace hvd::bench
