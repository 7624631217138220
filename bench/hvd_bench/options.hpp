// hvd-bench's command line: nccl-tests' flags with their meanings, plus hvd's own.
#ifndef HVD_BENCH_OPTIONS_HPP
#define HVD_BENCH_OPTIONS_HPP

#include <cstdint>
#include <string>
#include <vector>

#include "hvd/sdk/result.hpp"
#include "hvd/types.h"

namespace hvd::bench {

// Whether a collective has an in-place form (hvd_collective_reduces: whether it takes -o).
bool has_in_place(hvd_collective c);

struct Options {
  std::vector<hvd_collective> collectives = {HVD_COLLECTIVE_ALLREDUCE};
  std::vector<std::string> backends;  // empty: HVD_BACKEND (or gloo); {"all"}: every one found
  uint64_t min_bytes = 8;             // -b
  uint64_t max_bytes = 64ull << 20;   // -e
  uint64_t step_bytes = 0;            // -i (used when the factor is 1)
  double step_factor = 2;             // -f
  int iters = 20;                     // -n
  int warmup_iters = 5;               // -w
  bool iters_given = false;           // latency mode picks OSU's counts otherwise
  bool warmup_given = false;
  bool check = true;  // -c
  std::vector<hvd_dtype> dtypes = {HVD_FLOAT32};
  std::vector<hvd_reduce_op> ops = {HVD_SUM};
  int root = 0;  // -r
  bool baseline = false;
  // --compare NAME: every other backend's rows carry its busbw over NAME's (latency: NAME's p50
  // over its own); NAME is one of `backends` and runs first.
  std::string compare;
  bool check_args = false;  // --check-args: each call also timed with HVD_CHECK_ARGS=1
  bool latency = false;
  int tensors = 0;               // --tensors K: the fusion mode (K named tensors per step)
  uint64_t tensor_bytes = 4096;  // --tensor-bytes
  hvd_memory_type memory = HVD_MEMORY_HOST;
  bool huge_pages = false;  // --huge-pages: the host buffers and the memcpy on 2 MiB pages
  std::string json_path;    // -J
  double timeout_seconds = 0;
  // --process-set: the benchmark runs on a child of the job's communicator over these job ranks
  // (increasing, distinct); the other ranks wait without spinning, bounded by idle_timeout.
  std::vector<int> process_set;
  double idle_timeout_seconds = 24 * 3600;
  std::string command_line;  // for the report
  bool help = false;
};

// Parses argv; a usage error says which flag and why.
Result<Options> parse_options(int argc, char** argv);
const char* usage_text();

// "a,b,c".
std::string backend_list(const std::vector<std::string>& backends);
// --compare NAME: a usage error unless NAME is one of `backends` and another backend is there too
// (`what` names the list in the message: "--backend gloo,mpi").
Status check_compare_in(const std::string& name, const std::vector<std::string>& backends,
                        const std::string& what);

// nccl-tests' names: "float", "half", "bfloat16", "double", "int8", "uint8", "int32", "int64".
const char* type_name(hvd_dtype dtype);

// The message sizes from min to max: multiplied by the factor, or stepped by step_bytes.
std::vector<uint64_t> message_sizes(const Options& options);

}  // namespace hvd::bench

#endif  // HVD_BENCH_OPTIONS_HPP
