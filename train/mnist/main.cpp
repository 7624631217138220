// hvd-mnist — data-parallel MNIST with LibTorch over hvd, in the style of Horovod's examples.
//
//   scripts/make-mnist.sh
//   hvdrun -np 2 hvd-mnist --threads 1
//
// Every rank builds the same network from the same seed, rank 0's parameters and optimizer state
// are broadcast, each rank trains on its own slice of every epoch's shuffle, and the
// DistributedOptimizer averages the gradients over the ranks before each SGD step. Each rank
// evaluates the whole validation set; the epoch's metrics are averaged over the ranks, and rank 0
// logs them. --compare-bare measures what the gradient exchange costs instead of training.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hvd/hvd.hpp"
#include "hvd/train.hpp"
#include "mnist_data.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// Options

// scripts/make-mnist.sh writes the digits into the build tree, beside bin/: found from any
// working directory.
std::string default_data_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "build/data/mnist-digits";
  return (exe.parent_path().parent_path() / "data" / "mnist-digits").string();
}
constexpr int kCompareBlock = 10;        // --compare-bare: steps per timed block
constexpr int kCompareWarmup = 5;        // --compare-bare: untimed steps of each kind first
constexpr double kProgressSeconds = 10;  // progress lines without --log-interval
constexpr int64_t kEvalBatch = 1000;

struct Options {
  std::string device = "auto";
  std::string data_dir = default_data_dir();
  int64_t epochs = 5;
  int64_t batch_size = 64;
  double lr = 0.025;
  uint64_t seed = 42;
  bool fp16 = false;
  int64_t backward_passes = 1;
  int64_t threads = 0;       // 0: hardware threads / ranks on this host
  int64_t log_interval = 0;  // 0: a progress line every ~10 s
  int64_t train_limit = 0;   // 0: all
  int64_t val_limit = 0;     // 0: all
  std::optional<double> min_accuracy;
  std::string save;
  int64_t compare_bare = 0;  // > 0: benchmark mode
  bool help = false;
};

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: hvdrun -np N hvd-mnist [options]     (or hvd-mnist [options] for one rank)\n"
      "\n"
      "Data-parallel MNIST over hvd: conv 5x5 1->20, ReLU, max pool 2; conv 5x5 20->50, ReLU,\n"
      "max pool 2; dense 800->512, ReLU; dense 512->10; log_softmax + NLL loss (440,812\n"
      "parameters). SGD with momentum 0.9 wrapped in hvd::train::DistributedOptimizer.\n"
      "\n"
      "options:\n"
      "  --device auto|cuda|cpu  where to train (default auto: CUDA if LibTorch sees a GPU,\n"
      "                          rank's GPU = local rank %% GPU count; else the CPU)\n"
      "  --data-dir DIR          MNIST/Fashion-MNIST idx files, plain or .gz (default\n"
      "                          %s, written by scripts/make-mnist.sh;\n"
      "                          Fashion-MNIST: /usr/share/datasets/fashion-mnist)\n"
      "  --epochs N              passes over the training set (default 5)\n"
      "  --batch-size N          samples per batch on each rank (default 64)\n"
      "  --lr X                  learning rate per rank; SGD uses X x world size (default 0.025)\n"
      "  --seed S                seed of the initial weights and of the epochs' shuffles\n"
      "                          (default 42)\n"
      "  --fp16                  send gradients as float16 (Compression::fp16; default off)\n"
      "  --backward-passes N     batches per optimizer step: gradients are summed locally over\n"
      "                          N backward passes of --batch-size samples each (each loss\n"
      "                          divided by N, so the step follows the mean over N batches) and\n"
      "                          exchanged once (default 1)\n"
      "  --threads N             LibTorch (and OpenBLAS) threads per rank (default: hardware\n"
      "                          threads / ranks on this host, at least 1)\n"
      "  --log-interval N        rank 0 prints a progress line every N steps (default: every\n"
      "                          ~10 s of an epoch, so only long epochs get them)\n"
      "  --train-limit N         use only the first N training samples (default: all)\n"
      "  --val-limit N           use only the first N validation samples (default: all)\n"
      "  --min-accuracy X        exit 2 when the final validation accuracy is below X (default:\n"
      "                          no check)\n"
      "  --save PATH             rank 0 saves the trained model there with torch::save\n"
      "                          (default: not saved)\n"
      "  --compare-bare STEPS    benchmark instead of training: samples/s of STEPS steps of\n"
      "                          bare torch SGD (no gradient exchange, no hvd) against STEPS\n"
      "                          steps with the DistributedOptimizer, in alternating blocks of\n"
      "                          %d after %d warmup steps of each (default: off)\n"
      "  -h, --help              this text\n"
      "\n"
      "Sharding: each epoch shuffles the training indices with std::mt19937_64 seeded with\n"
      "(seed, epoch), the same on every rank; rank r takes the r-th of N equal contiguous\n"
      "slices. Every rank takes floor(train samples / (N x batch size)) steps per epoch; the\n"
      "remainder (fewer than N x batch size samples, different ones each epoch) is dropped.\n"
      "Each rank evaluates the whole validation set after every epoch.\n",
      default_data_dir().c_str(), kCompareBlock, kCompareWarmup);
}

class ArgError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int64_t parse_int(const std::string& option, const std::string& text, int64_t min,
                  int64_t max = int64_t{1} << 40) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw ArgError(option + " takes an integer, not '" + text + "'");
  if (v < min)
    throw ArgError(option + " must be at least " + std::to_string(min) + ", not " + text);
  if (v > max) throw ArgError(option + " must be at most " + std::to_string(max) + ", not " + text);
  return static_cast<int64_t>(v);
}

uint64_t parse_seed(const std::string& option, const std::string& text) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    if (!text.empty() && text[0] != '-') v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw ArgError(option + " takes an integer from 0 to 2^64-1, not '" + text + "'");
  return static_cast<uint64_t>(v);
}

double parse_double(const std::string& option, const std::string& text, double min, double max) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v))
    throw ArgError(option + " takes a number, not '" + text + "'");
  if (v < min || v > max) {
    char range[64];
    std::snprintf(range, sizeof range, "from %g to %g", min, max);
    throw ArgError(option + " must be " + range + ", not " + text);
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        inline_value = true;
      }
    }
    auto take = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) throw ArgError(arg + " needs a value (see --help)");
      return argv[++i];
    };
    auto flag = [&]() {
      if (inline_value) throw ArgError(arg + " takes no value");
    };
    if (arg == "-h" || arg == "--help") {
      flag();
      o.help = true;
    } else if (arg == "--device") {
      o.device = take();
      if (o.device != "auto" && o.device != "cuda" && o.device != "cpu")
        throw ArgError("--device takes auto, cuda or cpu, not '" + o.device + "'");
    } else if (arg == "--data-dir") {
      o.data_dir = take();
      if (o.data_dir.empty()) throw ArgError("--data-dir needs a directory");
    } else if (arg == "--epochs") {
      o.epochs = parse_int(arg, take(), 1);
    } else if (arg == "--batch-size") {
      o.batch_size = parse_int(arg, take(), 1);
    } else if (arg == "--lr") {
      o.lr = parse_double(arg, take(), 0, 1e6);
      if (o.lr == 0) throw ArgError("--lr must be above 0");
    } else if (arg == "--seed") {
      o.seed = parse_seed(arg, take());
    } else if (arg == "--fp16") {
      flag();
      o.fp16 = true;
    } else if (arg == "--backward-passes") {
      o.backward_passes = parse_int(arg, take(), 1, 4096);
    } else if (arg == "--threads") {
      o.threads = parse_int(arg, take(), 1, 4096);
    } else if (arg == "--log-interval") {
      o.log_interval = parse_int(arg, take(), 1);
    } else if (arg == "--train-limit") {
      o.train_limit = parse_int(arg, take(), 1);
    } else if (arg == "--val-limit") {
      o.val_limit = parse_int(arg, take(), 1);
    } else if (arg == "--min-accuracy") {
      o.min_accuracy = parse_double(arg, take(), 0, 1);
    } else if (arg == "--save") {
      o.save = take();
      if (o.save.empty()) throw ArgError("--save needs a path");
    } else if (arg == "--compare-bare") {
      o.compare_bare = parse_int(arg, take(), 1);
    } else {
      throw ArgError("unknown option '" + std::string(argv[i]) + "' (see --help)");
    }
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// Output: rank 0 logs; errors are one line on stderr.

int g_rank = -1;  // this process's rank once hvd is up

// Before hvd_init: whether hvdrun made this rank 0 (or no launcher set a rank at all).
bool rank0_by_environment() {
  const char* r = std::getenv("HVD_RANK");
  return r == nullptr || std::strcmp(r, "0") == 0;
}

void log0(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log0(const char* format, ...) {
  if (g_rank != 0) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::fflush(stdout);
}

// The first line of a message, trimmed (LibTorch's messages can run over several lines).
std::string one_line(const std::string& text) {
  std::string s = text.substr(0, text.find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '\t')) s.pop_back();
  return s.empty() ? std::string("(no message)") : s;
}

void print_error(const std::string& message) {
  std::fprintf(stderr, "hvd-mnist: %s\n", one_line(message).c_str());
  std::fflush(stderr);
}

int fail(const std::string& message) {
  print_error(message);
  return 1;
}

std::string describe(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// Declared after the objects whose destructors could wait on the other ranks (a
// DistributedOptimizer with gradients in flight): when an exception unwinds the scope, this
// breaks the communicator first, so those waits end and no peer waits for this rank forever.
class AbortOnException {
 public:
  explicit AbortOnException(hvd::Comm& comm) : comm_(comm), count_(std::uncaught_exceptions()) {}
  ~AbortOnException() {
    if (std::uncaught_exceptions() > count_) (void)comm_.abort();
  }
  AbortOnException(const AbortOnException&) = delete;
  AbortOnException& operator=(const AbortOnException&) = delete;

 private:
  hvd::Comm& comm_;
  int count_;
};

// ---------------------------------------------------------------------------------------------
// The network

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 20, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(20, 50, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(800, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 10))) {}

  // [n, 1, 28, 28] -> log-probabilities [n, 10]
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);  // [n, 20, 12, 12]
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);  // [n, 50, 4, 4]
    x = torch::relu(fc1->forward(x.flatten(1)));               // [n, 512]
    return torch::log_softmax(fc2->forward(x), 1);             // [n, 10]
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

int64_t parameter_count(Net& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

// ---------------------------------------------------------------------------------------------
// Setup

struct Setup {
  torch::Device device = torch::kCPU;
  int threads = 1;
  mnist::Data data;
  int64_t steps = 0;  // per epoch, the same on every rank
};

torch::Device pick_device(const std::string& want, int local_rank) {
  if (want == "cpu") return torch::kCPU;
  const bool available = torch::cuda::is_available();
  if (want == "cuda" && !available)
    throw std::runtime_error(
        "--device cuda: LibTorch sees no CUDA device (torch::cuda::is_available() is false: a "
        "CPU-only LibTorch, or no GPU or driver); use --device cpu or auto");
  if (!available) return torch::kCPU;
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(local_rank % count));
}

// LibTorch's set_num_threads sets OpenMP's threads (and MKL's), not OpenBLAS's; Debian's
// LibTorch does its matrix products in OpenBLAS, whose own pool would otherwise take every
// core in every rank.
void set_threads(int threads) {
  torch::set_num_threads(threads);
  void* symbol = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
  if (symbol != nullptr) {
    void (*set)(int) = nullptr;
    static_assert(sizeof set == sizeof symbol);
    std::memcpy(&set, &symbol, sizeof set);
    set(threads);
  }
}

// The indices 0..n-1 shuffled (Fisher-Yates) by std::mt19937_64 seeded with (seed, epoch):
// the same on every rank, whatever its standard library (the engine and seed_seq are specified
// exactly; std::shuffle and the distributions are not).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(uint64_t(epoch) >> 32)};
  std::mt19937_64 rng(seq);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

// This rank's indices for the epoch: slice `rank` of `size` equal contiguous slices of the
// permutation's first size * steps * batch entries. The rest of the permutation (fewer than
// size * batch indices) is dropped this epoch, so that every rank takes the same number of steps.
torch::Tensor epoch_shard(const Options& o, const Setup& setup, int rank, int64_t epoch) {
  const std::vector<int64_t> perm = epoch_permutation(setup.data.train.size(), o.seed, epoch);
  const int64_t len = setup.steps * o.batch_size;
  std::vector<int64_t> mine(perm.begin() + rank * len, perm.begin() + (rank + 1) * len);
  return torch::tensor(mine, torch::kInt64).to(setup.device);
}

hvd::train::DistributedOptimizerOptions optimizer_options(const Options& o) {
  hvd::train::DistributedOptimizerOptions d;
  d.compression = o.fp16 ? hvd::train::Compression::fp16 : hvd::train::Compression::none;
  d.backward_passes_per_step = static_cast<int>(o.backward_passes);
  return d;
}

torch::optim::SGD make_sgd(Net& model, const Options& o, int size) {
  return torch::optim::SGD(model->parameters(),
                           torch::optim::SGDOptions(o.lr * size).momentum(0.9));
}

// The fraction of the set the model classifies right.
double evaluate(Net& model, const mnist::Dataset& set) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0;
  for (int64_t begin = 0; begin < set.size(); begin += kEvalBatch) {
    const int64_t end = std::min(set.size(), begin + kEvalBatch);
    const torch::Tensor out = model->forward(set.images.slice(0, begin, end));
    correct += out.argmax(1).eq(set.labels.slice(0, begin, end)).sum().item<int64_t>();
  }
  model->train();
  return static_cast<double>(correct) / static_cast<double>(set.size());
}

void synchronize_device(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// ---------------------------------------------------------------------------------------------
// Training

int train(hvd::Comm& comm, const Options& o, const Setup& setup, Net& model) {
  const int rank = comm.rank();
  const int size = comm.size();
  const int64_t steps = setup.steps;
  const int64_t batch = o.batch_size;
  const int64_t passes = o.backward_passes;
  const mnist::Dataset& train_set = setup.data.train;
  const auto start = Clock::now();

  torch::optim::SGD sgd = make_sgd(model, o, size);
  hvd::train::DistributedOptimizer optimizer(comm, sgd, model->named_parameters(),
                                             optimizer_options(o));
  AbortOnException abort_on_exception(comm);  // before `optimizer` goes (see the class)
  if (hvd::Status s = hvd::train::broadcast_optimizer_state(comm, sgd, 0); !s.ok())
    return fail("broadcast_optimizer_state: " + s.to_string());

  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(setup.device);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(setup.device);
  double validation_accuracy = 0;
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    const torch::Tensor shard = epoch_shard(o, setup, rank, epoch);
    model->train();
    torch::Tensor loss_sum = torch::zeros({}, f64);
    torch::Tensor correct_sum = torch::zeros({}, i64);
    // Rank 0's progress lines: its own loss since the last line; no collective is involved.
    torch::Tensor interval_loss = torch::zeros({}, f64);
    int64_t interval_steps = 0;
    auto interval_start = Clock::now();

    const auto epoch_start = Clock::now();
    int64_t group = 1;  // backward passes in the current optimizer step
    for (int64_t i = 0; i < steps; ++i) {
      const torch::Tensor index = shard.slice(0, i * batch, (i + 1) * batch);
      const torch::Tensor x = train_set.images.index_select(0, index);
      const torch::Tensor y = train_set.labels.index_select(0, index);
      if (i % passes == 0) {
        optimizer.zero_grad();
        group = std::min(passes, steps - i);  // the epoch's last step may cover fewer batches
      }
      const torch::Tensor out = model->forward(x);
      const torch::Tensor loss = torch::nll_loss(out, y);
      (group > 1 ? loss / static_cast<double>(group) : loss).backward();
      if ((i + 1) % passes == 0 || i + 1 == steps) {
        if (hvd::Status s = optimizer.step(); !s.ok())
          return fail("epoch " + std::to_string(epoch) + " step " + std::to_string(i) + ": " +
                      s.to_string());
      }
      {
        torch::NoGradGuard no_grad;
        loss_sum += loss.detach();
        correct_sum += out.argmax(1).eq(y).sum();
        if (rank == 0) interval_loss += loss.detach();
      }
      if (rank == 0) {
        ++interval_steps;
        const bool due = o.log_interval > 0 ? (i + 1) % o.log_interval == 0
                                            : seconds_since(interval_start) >= kProgressSeconds;
        if (due) {
          const double mean_loss =
              interval_loss.item<double>() / static_cast<double>(interval_steps);
          const double rate =
              static_cast<double>(interval_steps * batch * size) / seconds_since(interval_start);
          log0("Epoch[%" PRId64 "] Batch[%" PRId64 "/%" PRId64 "] loss=%.6f samples/s=%.2f\n",
               epoch, i + 1, steps, mean_loss, rate);
          interval_loss.zero_();
          interval_steps = 0;
          interval_start = Clock::now();
        }
      }
    }
    // .item() waits for the device, so the time covers all of the epoch's work.
    const double local_loss = loss_sum.item<double>() / static_cast<double>(steps);
    const double local_accuracy =
        static_cast<double>(correct_sum.item<int64_t>()) / static_cast<double>(steps * batch);
    const double epoch_seconds = seconds_since(epoch_start);
    log0("Epoch[%" PRId64 "] Speed=%.2f samples/s Time cost=%.3f\n", epoch,
         static_cast<double>(steps * batch * size) / epoch_seconds, epoch_seconds);

    const double local_validation = evaluate(model, setup.data.validation);
    auto train_accuracy = hvd::train::metric_average(comm, local_accuracy, "train.accuracy");
    auto train_loss = hvd::train::metric_average(comm, local_loss, "train.loss");
    auto validation = hvd::train::metric_average(comm, local_validation, "validation.accuracy");
    for (const hvd::Status& s : {train_accuracy.status(), train_loss.status(), validation.status()})
      if (!s.ok()) return fail("epoch " + std::to_string(epoch) + " metrics: " + s.to_string());
    validation_accuracy = *validation;
    log0("Epoch[%" PRId64 "] Train-accuracy=%.6f Validation-accuracy=%.6f Train-loss=%.6f\n", epoch,
         *train_accuracy, validation_accuracy, *train_loss);
  }
  log0("hvd-mnist: trained %" PRId64 " epochs in %.3f s; final validation accuracy %.6f\n",
       o.epochs, seconds_since(start), validation_accuracy);

  if (!o.save.empty()) {
    double failed = 0;
    if (rank == 0) {
      try {
        torch::save(model, o.save);
        log0("hvd-mnist: saved the model to %s\n", o.save.c_str());
      } catch (const std::exception& e) {
        print_error("--save " + o.save + ": " + one_line(describe(e)));
        failed = 1;
      }
    }
    auto any = hvd::train::metric_average(comm, failed, "save.failed");  // every rank exits alike
    if (!any) return fail("after --save: " + any.status().to_string());
    if (*any > 0) return 1;
  }

  if (o.min_accuracy && validation_accuracy < *o.min_accuracy) {
    if (rank == 0) {
      char line[160];
      std::snprintf(line, sizeof line, "final validation accuracy %.6f is below --min-accuracy %g",
                    validation_accuracy, *o.min_accuracy);
      print_error(line);
    }
    return 2;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// --compare-bare: the same steps with bare torch SGD and with the DistributedOptimizer

int compare_bare(hvd::Comm& comm, const Options& o, const Setup& setup) {
  const int rank = comm.rank();
  const int size = comm.size();
  const int64_t batch = o.batch_size;
  const int64_t passes = o.backward_passes;
  const mnist::Dataset& train_set = setup.data.train;

  // Two copies of the same model: the DistributedOptimizer's hooks sit on its model's
  // parameters for as long as it lives, so the bare steps need parameters of their own.
  torch::manual_seed(o.seed);
  Net bare_model;
  torch::manual_seed(o.seed);
  Net hvd_model;
  bare_model->to(setup.device);
  hvd_model->to(setup.device);
  for (Net* m : {&bare_model, &hvd_model})
    if (hvd::Status s = hvd::train::broadcast_parameters(comm, **m, 0); !s.ok())
      return fail("broadcast_parameters: " + s.to_string());
  torch::optim::SGD bare_sgd = make_sgd(bare_model, o, size);
  torch::optim::SGD hvd_sgd = make_sgd(hvd_model, o, size);
  hvd::train::DistributedOptimizer optimizer(comm, hvd_sgd, hvd_model->named_parameters(),
                                             optimizer_options(o));
  AbortOnException abort_on_exception(comm);
  if (hvd::Status s = hvd::train::broadcast_optimizer_state(comm, hvd_sgd, 0); !s.ok())
    return fail("broadcast_optimizer_state: " + s.to_string());

  const torch::Tensor shard = epoch_shard(o, setup, rank, 0);
  int64_t next_batch = 0;  // both kinds walk the shard's batches in turn, round and round
  // One step: `passes` batches forward and backward, then the optimizer. Returns the last loss.
  auto run_step = [&](Net& model, auto&& zero_grad, auto&& step) -> torch::Tensor {
    zero_grad();
    torch::Tensor loss;
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t b = next_batch++ % setup.steps;
      const torch::Tensor index = shard.slice(0, b * batch, (b + 1) * batch);
      loss = torch::nll_loss(model->forward(train_set.images.index_select(0, index)),
                             train_set.labels.index_select(0, index));
      (passes > 1 ? loss / static_cast<double>(passes) : loss).backward();
    }
    step();
    return loss;
  };
  hvd::Status step_status;
  double exposed_seconds = 0;  // in synchronize(), during the timed hvd steps
  auto bare_step = [&] {
    return run_step(
        bare_model, [&] { bare_sgd.zero_grad(); }, [&] { bare_sgd.step(); });
  };
  auto hvd_step = [&] {
    return run_step(
        hvd_model, [&] { optimizer.zero_grad(); },
        [&] {
          // step() is synchronize() then the wrapped SGD: the wait is communication that the
          // backward pass did not hide.
          const auto waiting = Clock::now();
          hvd::Status s = optimizer.synchronize();
          exposed_seconds += seconds_since(waiting);
          if (s.ok()) hvd_sgd.step();
          if (step_status.ok()) step_status = s;
        });
  };
  // Lines the ranks up (after the device's queued work) so that each timed block starts with
  // every rank ready and ends when the slowest one is done; bare blocks and hvd blocks pay it
  // alike.
  auto barrier = [&]() -> hvd::Status {
    synchronize_device(setup.device);
    return hvd::train::metric_average(comm, 0.0, "compare_bare.barrier").status();
  };

  for (int i = 0; i < kCompareWarmup; ++i) (void)bare_step();
  for (int i = 0; i < kCompareWarmup; ++i) (void)hvd_step();
  if (!step_status.ok()) return fail("--compare-bare warmup: " + step_status.to_string());
  if (hvd::Status s = barrier(); !s.ok()) return fail("--compare-bare: " + s.to_string());

  double bare_seconds = 0, hvd_seconds = 0;
  exposed_seconds = 0;
  std::vector<double> ratios;  // per block pair: hvd samples/s over bare samples/s
  for (int64_t done = 0; done < o.compare_bare; done += kCompareBlock) {
    const int64_t block = std::min<int64_t>(kCompareBlock, o.compare_bare - done);
    auto t = Clock::now();
    for (int64_t i = 0; i < block; ++i) (void)bare_step();
    if (hvd::Status s = barrier(); !s.ok()) return fail("--compare-bare: " + s.to_string());
    const double bare_block = seconds_since(t);
    t = Clock::now();
    for (int64_t i = 0; i < block; ++i) (void)hvd_step();
    if (!step_status.ok()) return fail("--compare-bare: " + step_status.to_string());
    if (hvd::Status s = barrier(); !s.ok()) return fail("--compare-bare: " + s.to_string());
    const double hvd_block = seconds_since(t);
    bare_seconds += bare_block;
    hvd_seconds += hvd_block;
    ratios.push_back(bare_block / hvd_block);
  }
  const double samples = static_cast<double>(o.compare_bare * passes * batch * size);
  const double bare_rate = samples / bare_seconds;
  const double hvd_rate = samples / hvd_seconds;
  std::sort(ratios.begin(), ratios.end());
  log0("hvd-mnist: --compare-bare: %" PRId64 " steps of each kind (%" PRId64
       " samples per step on each of %d ranks), in alternating blocks of %d after %d warmup steps "
       "of each; bare = torch SGD alone%s\n",
       o.compare_bare, passes * batch, size, kCompareBlock, kCompareWarmup,
       size > 1 ? ", no gradient exchange" : "");
  log0("hvd-mnist: per block pair hvd/bare: min %.4f  median %.4f  max %.4f\n", ratios.front(),
       ratios[ratios.size() / 2], ratios.back());
  log0(
      "hvd-mnist: rank 0 waited %.3f ms per hvd step in synchronize() (exposed communication), "
      "of %.3f ms per hvd step and %.3f ms per bare step\n",
      1e3 * exposed_seconds / static_cast<double>(o.compare_bare),
      1e3 * hvd_seconds / static_cast<double>(o.compare_bare),
      1e3 * bare_seconds / static_cast<double>(o.compare_bare));
  log0("bare: %.2f samples/s  hvd: %.2f samples/s  hvd/bare: %.4f\n", bare_rate, hvd_rate,
       hvd_rate / bare_rate);
  return 0;
}

// ---------------------------------------------------------------------------------------------

// Everything that needs torch and hvd; every torch object dies here, before the Comm.
int run_with(hvd::Comm& comm, const Options& o) {
  const auto start = Clock::now();
  const int rank = comm.rank();
  const int size = comm.size();

  // Device, threads and data, on every rank; then every rank learns how it went everywhere, so
  // that a rank that cannot start does not leave the others waiting.
  Setup setup;
  std::string setup_error;
  try {
    setup.device = pick_device(o.device, comm.local_rank());
    const unsigned hardware = std::thread::hardware_concurrency();
    setup.threads = o.threads > 0
                        ? static_cast<int>(o.threads)
                        : std::max(1, static_cast<int>(hardware) / std::max(1, comm.local_size()));
    set_threads(setup.threads);
    setup.data = mnist::load(o.data_dir, o.train_limit, o.val_limit);
  } catch (const std::exception& e) {
    setup_error = one_line(describe(e));
    if (setup_error.empty()) setup_error = "setup failed";
  }
  const int64_t mine[3] = {setup_error.empty() ? 0 : 1, setup.data.train.size(),
                           setup.data.validation.size()};
  std::vector<int64_t> all(3 * static_cast<size_t>(size));
  if (hvd::Status s = comm.allgather(mine, all.data(), 3); !s.ok())
    return fail("exchanging the ranks' setup: " + s.to_string());
  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (all[3 * r] != 0) failed.push_back(r);
  if (!failed.empty()) {
    // Ranks mostly fail alike (the same files): rank 0 says why, the others only where rank 0
    // could not say it for them.
    if (!setup_error.empty() && (rank == 0 || all[0] == 0)) print_error(setup_error);
    if (rank == 0 && setup_error.empty()) {
      std::string ranks;
      for (int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      print_error("rank(s) " + ranks + " could not start (see their messages)");
    }
    return 1;
  }
  for (int r = 1; r < size; ++r)
    if (all[3 * r + 1] != mine[1] || all[3 * r + 2] != mine[2])
      return fail("the ranks read different data: rank 0 has " + std::to_string(all[1]) + " + " +
                  std::to_string(all[2]) + " samples, rank " + std::to_string(r) + " has " +
                  std::to_string(all[3 * r + 1]) + " + " + std::to_string(all[3 * r + 2]));

  const int64_t train_n = setup.data.train.size();
  setup.steps = train_n / (size * o.batch_size);
  if (setup.steps == 0) {
    if (rank == 0)
      print_error("the training set has " + std::to_string(train_n) +
                  " samples, fewer than one step of all ranks takes (" + std::to_string(size) +
                  " ranks x batch " + std::to_string(o.batch_size) + ")");
    return 1;
  }
  if (setup.device.is_cuda()) {
    setup.data.train.images = setup.data.train.images.to(setup.device);
    setup.data.train.labels = setup.data.train.labels.to(setup.device);
    setup.data.validation.images = setup.data.validation.images.to(setup.device);
    setup.data.validation.labels = setup.data.validation.labels.to(setup.device);
  }

  torch::manual_seed(o.seed);
  Net model;
  model->to(setup.device);
  if (hvd::Status s = hvd::train::broadcast_parameters(comm, *model, 0); !s.ok())
    return fail("broadcast_parameters: " + s.to_string());

  log0("hvd-mnist: world size %d, backend %s, device %s, %d threads per rank\n", size,
       comm.backend().c_str(), setup.device.str().c_str(), setup.threads);
  log0("hvd-mnist: data %s: %" PRId64 " training, %" PRId64 " validation samples\n",
       o.data_dir.c_str(), train_n, setup.data.validation.size());
  log0("hvd-mnist: model %" PRId64 " parameters; seed %" PRIu64 "\n", parameter_count(model),
       o.seed);
  if (o.compare_bare > 0) return compare_bare(comm, o, setup);
  log0("hvd-mnist: SGD lr %g (%g x %d ranks), momentum 0.9; batch %" PRId64
       " per rank%s%s; %" PRId64 " epochs of %" PRId64 " steps (%" PRId64
       " samples dropped per epoch)\n",
       o.lr * size, o.lr, size, o.batch_size,
       o.backward_passes > 1
           ? (", " + std::to_string(o.backward_passes) + " backward passes per step").c_str()
           : "",
       o.fp16 ? ", fp16 gradients" : "", o.epochs, setup.steps,
       train_n - setup.steps * size * o.batch_size);
  const int status = train(comm, o, setup, model);
  log0("hvd-mnist: total %.3f s\n", seconds_since(start));
  return status;
}

int run(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const ArgError& e) {
    if (rank0_by_environment()) print_error(e.what());
    return 1;
  }
  if (o.help) {
    if (rank0_by_environment()) usage(stdout);
    return 0;
  }

  hvd::Result<hvd::Comm> init = hvd::Comm::init();
  if (!init) return fail("hvd init failed: " + init.status().to_string());
  hvd::Comm comm = std::move(*init);
  g_rank = comm.rank();
  try {
    return run_with(comm, o);
  } catch (const std::exception& e) {
    print_error(describe(e));
  } catch (...) {
    print_error("an unknown exception");
  }
  (void)comm.abort();  // this rank leaves in the middle: the others' calls fail, not hang
  return 1;
}  // comm finalizes here, after every torch object of run_with is gone

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    print_error(describe(e));
  } catch (...) {
    print_error("an unknown exception");
  }
  return 1;
}
