#include "limits.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "bootstrap/socket.hpp"
#include "buffer.hpp"
#include "common/host_memory.hpp"

#ifdef HVD_BENCH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hvd::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double tcp_loopback_gbps() {
  constexpr size_t kBytes = 512u << 20;
  constexpr size_t kChunk = 4u << 20;
  const auto deadline = core::deadline_after(std::chrono::seconds(30));
  core::HostPort bound;
  Result<core::Fd> listener = core::listen_tcp(core::HostPort{"127.0.0.1", 0}, &bound);
  if (!listener.ok()) return 0;
  Result<core::Fd> client = core::connect_tcp(bound, deadline);
  if (!client.ok()) return 0;
  core::Fd server(::accept(listener->get(), nullptr, nullptr));
  if (!server.valid()) return 0;
  std::vector<char> out(kChunk, 7);
  std::vector<char> in(kChunk);
  const auto t0 = Clock::now();
  std::thread sender([&] {
    for (size_t sent = 0; sent < kBytes; sent += kChunk) {
      if (!core::send_all(client->get(), out.data(), kChunk, deadline).ok()) return;
    }
  });
  bool ok = true;
  for (size_t got = 0; got < kBytes && ok; got += kChunk) {
    ok = core::recv_all(server.get(), in.data(), kChunk, deadline).ok();
  }
  const double elapsed = seconds_since(t0);
  sender.join();
  return ok ? kBytes / elapsed / 1e9 : 0;
}

}  // namespace

CopyProbe::CopyProbe(size_t bytes, bool huge_pages)
    : bytes_(bytes),
      from_(Buffer::allocate(HVD_MEMORY_HOST, -1, bytes, huge_pages)),
      to_(Buffer::allocate(HVD_MEMORY_HOST, -1, bytes, huge_pages)) {}

double CopyProbe::copy_seconds() {
  const auto t0 = Clock::now();
  std::memcpy(to_->data(), from_->data(), bytes_);
  const double seconds = seconds_since(t0);
  // Read what was written, so the copy cannot be dropped.
  const size_t at = static_cast<size_t>(copies_++);
  from_->data()[at % bytes_] = to_->data()[(at + 1) % bytes_];
  return seconds;
}

double memcpy_gbps(size_t bytes, int reps, bool huge_pages) {
  return *CopyProbe(bytes, huge_pages).best_gbps(reps, [] { return Status::success(); });
}

PhysicalLimits measure_limits(int cuda_device, bool huge_pages) {
  PhysicalLimits limits;
  limits.memcpy_gbps = memcpy_gbps(64u << 20, 5, huge_pages);
  limits.transparent_huge_pages = core::transparent_huge_pages();
  limits.tcp_loopback_gbps = tcp_loopback_gbps();
  if (cuda_device < 0) return limits;
#ifdef HVD_BENCH_WITH_CUDA
  constexpr size_t kBytes = 256u << 20;
  void* a = nullptr;
  void* b = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  if (cudaSetDevice(cuda_device) == cudaSuccess && cudaMalloc(&a, kBytes) == cudaSuccess &&
      cudaMalloc(&b, kBytes) == cudaSuccess && cudaEventCreate(&start) == cudaSuccess &&
      cudaEventCreate(&stop) == cudaSuccess) {
    cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice);  // warm up
    constexpr int kReps = 10;
    cudaEventRecord(start);
    for (int i = 0; i < kReps; ++i) cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (ms > 0) limits.cuda_d2d_gbps = static_cast<double>(kBytes) * kReps / (ms / 1e3) / 1e9;
  } else {
    limits.cuda_note = cudaGetErrorString(cudaGetLastError());
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (a) cudaFree(a);
  if (b) cudaFree(b);
#else
  limits.cuda_note = "built without the CUDA toolkit";
#endif
  return limits;
}

}  // namespace hvd::bench
