// hvd-gpu-bench: what hvd's own device code costs on one GPU, as ratios against the CUDA runtime
// measured beside it in the same run (docs/gpu.md; run by scripts/gpu-check.sh).
//
//   hvd-gpu-bench [--device N] [--reps N]
//
//  - staging: 64 MiB host -> device -> host through hvd's pinned staging buffer against the same
//    copies from pageable memory (goal: >= 1.5x);
//  - device fusion: 1024 float32 tensors of 16 KiB packed into the fusion buffer and unpacked by
//    the device executor's copy-and-scale launches, against one device-to-device cudaMemcpy of
//    the whole batch (goal: <= 2x), from the host's first launch to completion and on the device
//    alone (the launches queued behind other work, as the executor's are in training), and the
//    executor's host time per tensor (ready event, ordering, launches; goal: <= 2 us); the same
//    bytes as one tensor of 12 MiB and 1023 of 4 KiB (a batch whose spans differ in size) and as
//    128 tensors of 128 KiB (a launch's smaller parameters); a launch of the kernel that copies
//    nothing beside a 4-byte cudaMemsetAsync (what a launch costs).
// Each figure is the median of --reps repetitions. Exit 77 (skipped) where no GPU is usable.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/device_memory.hpp"
#include "scheduler/device_executor.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using hvd::Status;
using hvd::core::CopySpan;
using hvd::core::DeviceExecutor;
using hvd::core::DeviceMemory;

constexpr int kSkipped = 77;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool ok(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return true;
  std::fprintf(stderr, "hvd-gpu-bench: %s: %s\n", what, cudaGetErrorString(rc));
  return false;
}

bool ok(const Status& s, const char* what) {
  if (s.ok()) return true;
  std::fprintf(stderr, "hvd-gpu-bench: %s: %s\n", what, s.to_string().c_str());
  return false;
}

// Seconds for `work` (which queues on `stream`) to be queued and run, median of `reps`; the
// stream is spun on (no sleep to skew the figure), at most 60 s. Negative: it failed or hung.
template <typename Work>
double timed(int reps, cudaStream_t stream, Work&& work) {
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    work();
    cudaError_t rc;
    while ((rc = cudaStreamQuery(stream)) == cudaErrorNotReady) {
      if (Clock::now() - start > std::chrono::seconds(60)) return -1;
    }
    if (!ok(rc, "cudaStreamQuery")) return -1;
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(seconds);
}

// Seconds the device spends on `work` (which queues on `stream`), median of `reps`: its launches
// are queued behind `gate` (a memset long enough for the host to queue them all: checked), so the
// events around them time the device alone, not the host's launches. The stream is spun on, at
// most 60 s. Negative: it failed, and says why.
template <typename Work>
double device_timed(int reps, cudaStream_t stream, void* gate, size_t gate_bytes, Work&& work) {
  cudaEvent_t start = nullptr, stop = nullptr;
  const bool made = ok(cudaEventCreate(&start), "cudaEventCreate") &&
                    ok(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> seconds;
  for (int r = 0; made && r < reps; ++r) {
    if (!ok(cudaMemsetAsync(gate, r, gate_bytes, stream), "cudaMemsetAsync") ||
        !ok(cudaEventRecord(start, stream), "cudaEventRecord")) {
      break;
    }
    work();
    if (cudaEventQuery(start) != cudaErrorNotReady) {
      std::fprintf(stderr, "hvd-gpu-bench: the gate ended before the work was queued\n");
      break;
    }
    if (!ok(cudaEventRecord(stop, stream), "cudaEventRecord")) break;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    cudaError_t rc;
    while ((rc = cudaStreamQuery(stream)) == cudaErrorNotReady && Clock::now() < deadline) {
    }
    float ms = 0;
    if (!ok(rc, "cudaStreamQuery") || !ok(cudaEventElapsedTime(&ms, start, stop), "events")) break;
    seconds.push_back(ms / 1e3);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  return static_cast<int>(seconds.size()) == reps ? median(seconds) : -1;
}

void row(const char* what, double value, const char* unit, const char* goal) {
  std::printf("  %-58s %10.3f %-5s %s\n", what, value, unit, goal);
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  int reps = 21;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--device" || arg == "--reps") && i + 1 < argc) {
      (arg == "--device" ? device : reps) = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: hvd-gpu-bench [--device N] [--reps N]\n");
      return 2;
    }
  }
  reps = std::max(reps, 3);
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices <= device) {
    std::printf("hvd-gpu-bench: no usable GPU: %s\n",
                counted != cudaSuccess ? cudaGetErrorString(counted)
                                       : ("no CUDA device " + std::to_string(device)).c_str());
    return kSkipped;
  }
  cudaDeviceProp properties{};
  if (!ok(cudaSetDevice(device), "cudaSetDevice") ||
      !ok(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties")) {
    return 1;
  }
  std::printf("hvd-gpu-bench: %s (device %d, sm_%d%d), median of %d repetitions\n", properties.name,
              device, properties.major, properties.minor, reps);
  DeviceMemory& runtime = hvd::core::cuda_memory();
  auto made = runtime.create_stream(device);
  if (!ok(made.status(), "create_stream")) return 1;
  const auto stream = static_cast<cudaStream_t>(*made);

  // ---- staging: the copy spans alone, 64 MiB each way ----------------------------------------
  const size_t staged = 64ull << 20;
  void* on_device = nullptr;
  if (!ok(cudaMalloc(&on_device, staged), "cudaMalloc")) return 1;
  std::vector<char> pageable(staged, 1);
  hvd::core::StagingBuffer pinned;
  char* host = pinned.reserve(staged, &runtime, device);
  if (host == nullptr || !pinned.pinned()) {
    std::fprintf(stderr, "hvd-gpu-bench: no page-locked memory of %zu bytes\n", staged);
    return 1;
  }
  std::memset(host, 1, staged);
  const auto round_trip = [&](char* from) {
    return timed(reps, stream, [&] {
      (void)runtime.copy(on_device, from, staged, device, stream);
      (void)runtime.copy(from, on_device, staged, device, stream);
    });
  };
  const double pageable_s = round_trip(pageable.data());
  const double pinned_s = round_trip(host);
  if (pageable_s < 0 || pinned_s < 0) return 1;
  const double gb = 2.0 * static_cast<double>(staged) / 1e9;
  std::printf("staging, 64 MiB host -> device -> host (DeviceMemory::copy)\n");
  row("pageable memory", gb / pageable_s, "GB/s", "");
  row("pinned staging buffer (StagingBuffer)", gb / pinned_s, "GB/s", "");
  row("pinned / pageable", pageable_s / pinned_s, "x", "goal >= 1.5");

  // ---- device fusion: 1024 x 16 KiB float32 ------------------------------------------------
  const size_t tensors = 1024, elements = 4096, bytes = elements * sizeof(float);
  const size_t batch_bytes = tensors * bytes;
  char *inputs = nullptr, *outputs = nullptr, *fusion = nullptr;
  if (!ok(cudaMalloc(reinterpret_cast<void**>(&inputs), batch_bytes), "cudaMalloc") ||
      !ok(cudaMalloc(reinterpret_cast<void**>(&outputs), batch_bytes), "cudaMalloc") ||
      !ok(cudaMalloc(reinterpret_cast<void**>(&fusion), batch_bytes), "cudaMalloc")) {
    return 1;
  }
  // Inputs of whole numbers 1 .. 65536, a different one at each position of the span it is in:
  // halved and doubled they come back bit for bit, and a span copied to another's place shows.
  {
    std::vector<float> numbers(batch_bytes / sizeof(float));
    for (size_t i = 0; i < numbers.size(); ++i) numbers[i] = static_cast<float>(i % 65536 + 1);
    if (!ok(cudaMemcpy(inputs, numbers.data(), batch_bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy")) {
      return 1;
    }
  }
  // The gate that device_timed queues work behind: 512 MiB of memset, which outlasts the host's
  // queueing of the work (device_timed checks that it does).
  const size_t gate_bytes = 512u << 20;
  void* gate = nullptr;
  if (!ok(cudaMalloc(&gate, gate_bytes), "cudaMalloc")) return 1;
  const auto one_copy = [&] {
    (void)cudaMemcpyAsync(fusion, inputs, batch_bytes, cudaMemcpyDeviceToDevice, stream);
  };
  const double copy_s = timed(reps, stream, one_copy);
  const double copy_device_s = device_timed(reps, stream, gate, gate_bytes, one_copy);
  if (copy_s < 0 || copy_device_s < 0) return 1;
  // Tensors of `sizes` bytes, one after another from the start of the inputs (and outputs): one
  // span each, as tensors of their own would be, packed and unpacked (x0.5, x2; or x1, a copy of
  // bytes). `work` queues the two passes; `gives_back` runs them once and checks the outputs.
  struct Batch {
    std::vector<CopySpan> pack, unpack;
    size_t bytes = 0;
    double factor = 0.5;
    Status queued;
    void work(DeviceMemory& memory, int32_t on, cudaStream_t s) {
      queued = memory.copy_scaled(pack.data(), pack.size(), HVD_FLOAT32, factor, on, s);
      if (queued.ok()) {
        queued = memory.copy_scaled(unpack.data(), unpack.size(), HVD_FLOAT32, 1 / factor, on, s);
      }
    }
  };
  const auto batch_of = [&](const std::vector<size_t>& sizes, double factor) {
    Batch b;
    b.factor = factor;
    for (size_t size : sizes) {
      b.pack.push_back({fusion + b.bytes, inputs + b.bytes, size / sizeof(float)});
      b.unpack.push_back({outputs + b.bytes, fusion + b.bytes, size / sizeof(float)});
      b.bytes += size;
    }
    return b;
  };
  const auto gives_back = [&](Batch& b) {
    if (!ok(cudaMemset(outputs, 0, batch_bytes), "cudaMemset")) return false;
    if (timed(1, stream, [&] { b.work(runtime, device, stream); }) < 0 ||
        !ok(b.queued, "copy_scaled")) {
      return false;
    }
    std::vector<char> in(b.bytes), out(b.bytes);
    if (!ok(cudaMemcpy(in.data(), inputs, b.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy") ||
        !ok(cudaMemcpy(out.data(), outputs, b.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy")) {
      return false;
    }
    if (in != out) {
      std::fprintf(stderr,
                   "hvd-gpu-bench: pack + unpack (x%g, x%g) of %zu spans did not give the inputs "
                   "back\n",
                   b.factor, 1 / b.factor, b.pack.size());
      return false;
    }
    return true;
  };
  // Seconds from the host's first launch to completion and on the device alone, or negative
  // when a launch or the check failed.
  struct Seconds {
    double wall, device;
  };
  const auto pack_and_unpack = [&](const std::vector<size_t>& sizes) -> Seconds {
    Batch b = batch_of(sizes, 0.5);
    const auto work = [&] {
      if (b.queued.ok()) b.work(runtime, device, stream);
    };
    const Seconds seconds{timed(reps, stream, work),
                          device_timed(reps, stream, gate, gate_bytes, work)};
    if (!ok(b.queued, "copy_scaled") || seconds.wall < 0 || seconds.device < 0 || !gives_back(b)) {
      return {-1, -1};
    }
    return seconds;
  };

  // Batches whose spans end within a group of 32 and just past one, of a launch's small and large
  // parameters, of odd sizes (vectors and single elements), some empty and one of 1 MiB + 4:
  // each block must find its own span.
  std::mt19937 random(11);
  for (const size_t count : {1, 2, 31, 32, 33, 127, 128, 129, 1023, 1024}) {
    std::vector<size_t> sizes(count);
    for (size_t& size : sizes) size = random() % 4 == 0 ? 0 : (random() % 3500) * sizeof(float);
    sizes[count / 2] = (1u << 20) + sizeof(float);
    for (const double factor : {0.5, 1.0}) {
      Batch b = batch_of(sizes, factor);
      if (!gives_back(b)) return 1;
    }
  }
  std::printf("device fusion: batches of 1 to 1024 spans of odd sizes come back bit for bit\n");
  const Seconds fused = pack_and_unpack(std::vector<size_t>(tensors, bytes));
  if (fused.wall < 0) return 1;
  std::printf("device fusion, 1024 float32 tensors of 16 KiB (16 MiB)\n");
  row("one cudaMemcpyAsync device -> device of the batch", copy_s * 1e6, "us", "");
  row("pack + unpack, copy-and-scale launches (x0.5, x2)", fused.wall * 1e6, "us", "");
  row("pack + unpack / one copy", fused.wall / copy_s, "x", "goal <= 2");
  row("on the device alone: one copy", copy_device_s * 1e6, "us", "");
  row("on the device alone: pack + unpack", fused.device * 1e6, "us", "");
  row("on the device alone: pack + unpack / one copy", fused.device / copy_device_s, "x", "");

  // Nearly the same bytes as one tensor of 12 MiB and 1023 of 4 KiB: each span's blocks are its
  // own, so the large one does not multiply the small ones' (copy_blocks.hpp).
  std::vector<size_t> mixed(tensors, 4u << 10);
  mixed[0] = 12u << 20;
  const Seconds mixed_s = pack_and_unpack(mixed);
  if (mixed_s.wall < 0) return 1;
  std::printf("device fusion, one float32 tensor of 12 MiB and 1023 of 4 KiB (16 MiB - 4 KiB)\n");
  row("pack + unpack, copy-and-scale launches (x0.5, x2)", mixed_s.wall * 1e6, "us", "");
  row("pack + unpack / one copy of 16 MiB (above)", mixed_s.wall / copy_s, "x", "");
  row("on the device alone: pack + unpack / one copy", mixed_s.device / copy_device_s, "x", "");

  // The same bytes as 128 tensors of 128 KiB: a launch of up to 128 spans carries 3.6 KiB of
  // parameters (copy_scaled.cu).
  const Seconds few = pack_and_unpack(std::vector<size_t>(128, 128u << 10));
  if (few.wall < 0) return 1;
  std::printf("device fusion, 128 float32 tensors of 128 KiB (16 MiB)\n");
  row("pack + unpack, copy-and-scale launches (x0.5, x2)", few.wall * 1e6, "us", "");
  row("pack + unpack / one copy of 16 MiB (above)", few.wall / copy_s, "x", "");
  row("on the device alone: pack + unpack / one copy", few.device / copy_device_s, "x", "");

  // The executor's host time per tensor: its ready event at submission, then the batch queued
  // (waits, launches, the completion event). The backend's call is left out (a no-op here).
  std::vector<double> host_us;
  {
    DeviceExecutor executor(runtime);
    for (int r = 0; r < reps; ++r) {
      const auto start = Clock::now();
      std::vector<DeviceExecutor::Tensor> batch;
      batch.reserve(tensors);
      for (size_t i = 0; i < tensors; ++i) {
        auto ready = executor.record_ready(device, stream);
        if (!ok(ready.status(), "record_ready")) return 1;
        batch.push_back({inputs + i * bytes, outputs + i * bytes, elements, *ready});
      }
      auto done =
          executor.allreduce(batch, HVD_FLOAT32, 0.5, 2, device,
                             [](const void*, void*, uint64_t, void*) { return Status::success(); });
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (!ok(done.status(), "DeviceExecutor::allreduce")) return 1;
      for (const auto& t : batch) executor.release(t.ready, device);
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      while (true) {
        auto ran = (*done)->query();
        if (!ok(ran.status(), "the batch's event")) return 1;
        if (*ran) break;
        if (Clock::now() > deadline) {
          std::fprintf(stderr, "hvd-gpu-bench: the executor's batch did not complete in 60 s\n");
          return 1;
        }
      }
      host_us.push_back(seconds * 1e6 / static_cast<double>(tensors));
    }
  }
  std::printf("device executor, 1024 float32 tensors of 16 KiB\n");
  row("host time per tensor", median(host_us), "us", "goal <= 2");

  // What a launch costs before any copying: the kernel's parameters hold every span the launch
  // can take (3.6 KiB up to 128 spans, 28 KiB above), where a runtime call's carry a few bytes.
  // 128 and 129 empty spans: nearly the same grid, with the small and the large parameters.
  std::printf("a launch that copies nothing, from the host's call to completion\n");
  const std::vector<CopySpan> nothing(129, CopySpan{fusion, inputs, 0});
  Status launched;
  const auto empty_launch = [&](size_t spans) {
    return timed(reps, stream, [&] {
      const Status s = runtime.copy_scaled(nothing.data(), spans, HVD_FLOAT32, 0.5, device, stream);
      if (!s.ok()) launched = s;
    });
  };
  const double small_launch_s = empty_launch(128);
  const double large_launch_s = empty_launch(129);
  const double memset_s = timed(reps, stream, [&] { (void)cudaMemsetAsync(fusion, 0, 4, stream); });
  if (!ok(launched, "copy_scaled") || small_launch_s < 0 || large_launch_s < 0 || memset_s < 0) {
    return 1;
  }
  row("copy-and-scale launch of 128 empty spans (3.6 KiB params)", small_launch_s * 1e6, "us", "");
  row("copy-and-scale launch of 129 empty spans (28 KiB params)", large_launch_s * 1e6, "us", "");
  row("cudaMemsetAsync of 4 bytes", memset_s * 1e6, "us", "");

  cudaFree(inputs);
  cudaFree(outputs);
  cudaFree(fusion);
  cudaFree(gate);
  cudaFree(on_device);
  runtime.destroy_stream(stream, device);
  return 0;
}
