// The physical limits of this machine, measured on the spot: what a collective's bandwidth can be
// compared with in the same run.
#ifndef HVD_BENCH_LIMITS_HPP
#define HVD_BENCH_LIMITS_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "buffer.hpp"

namespace hvd::bench {

struct PhysicalLimits {
  double memcpy_gbps = 0;  // one thread, 64 MiB, best of 5 (bytes copied per second)
  // Each rank's memcpy while every rank of the job copies at once (each rank's fastest of 5
  // copies, each begun by every rank together; the mean over the ranks): what each rank gets
  // when the ranks of a host share its memory. < 0: not measured (one rank); NaN: a rank
  // could not have its buffers.
  double memcpy_all_ranks_gbps = -1;
  std::string transparent_huge_pages;  // the kernel's mode: always, madvise, never
  double tcp_loopback_gbps = 0;        // one TCP stream over 127.0.0.1, 512 MiB
  double cuda_d2d_gbps = -1;           // cudaMemcpy device to device, 256 MiB; < 0: not measured
  std::string cuda_note;               // why the CUDA figure is missing
};

// Measures memcpy (between buffers on huge pages with `huge_pages`, as hvd-bench's then are) and
// loopback TCP; the device copy too when `cuda_device` >= 0.
PhysicalLimits measure_limits(int cuda_device, bool huge_pages);

// memcpy between two buffers of `bytes` (on huge pages with `huge_pages`), every page touched
// when made, so that each copy can start at a moment of the caller's choosing (after a barrier).
class CopyProbe {
 public:
  CopyProbe(size_t bytes, bool huge_pages);
  // False if the buffers could not be had.
  bool ok() const { return from_.ok() && to_.ok() && bytes_ > 0; }
  // The fastest of `reps` copies in GB/s, each begun once `before_each()` (a Status) succeeds;
  // NaN if !ok() (the header prints nan). `before_each` runs even then, so that ranks meeting in
  // it (a barrier) stay in step.
  template <typename Before>
  Result<double> best_gbps(int reps, Before&& before_each) {
    double best = INFINITY;
    for (int rep = 0; rep < reps; ++rep) {
      HVD_RETURN_IF_ERROR(before_each());
      if (ok()) best = std::min(best, copy_seconds());
    }
    return ok() ? static_cast<double>(bytes_) / best / 1e9 : NAN;
  }

 private:
  double copy_seconds();
  size_t bytes_;
  int copies_ = 0;
  Result<Buffer> from_, to_;
};

// One thread's memcpy of `bytes`, best of `reps`, in GB/s of bytes copied: the yardstick of the
// header and of hvd-micro's reduction kernels.
double memcpy_gbps(size_t bytes, int reps, bool huge_pages = false);

}  // namespace hvd::bench

#endif  // HVD_BENCH_LIMITS_HPP
