// hvd.hpp — the C++ face of hvd.h: a move-only Comm whose calls return Status / Result.
//
//   auto comm = hvd::Comm::init();
//   if (!comm) { std::cerr << comm.status().to_string() << '\n'; return 1; }
//   std::vector<float> grad(n, 1.0f);
//   hvd::Status s = comm->allreduce(grad.data(), grad.data(), grad.size(), HVD_AVERAGE);
//
// Header-only over the stable C ABI, so an application built against one libhvd keeps working
// with the next.
#ifndef HVD_HVD_HPP
#define HVD_HVD_HPP

#include <cstdint>
#include <string>
#include <utility>

#include "hvd/hvd.h"
#include "hvd/sdk/result.hpp"

namespace hvd {

// The hvd_dtype of a C++ element type (float16/bfloat16 have none: use the untyped calls).
template <typename T>
struct dtype_of;
template <>
struct dtype_of<uint8_t> {
  static constexpr hvd_dtype value = HVD_UINT8;
};
template <>
struct dtype_of<int8_t> {
  static constexpr hvd_dtype value = HVD_INT8;
};
template <>
struct dtype_of<int32_t> {
  static constexpr hvd_dtype value = HVD_INT32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr hvd_dtype value = HVD_INT64;
};
template <>
struct dtype_of<float> {
  static constexpr hvd_dtype value = HVD_FLOAT32;
};
template <>
struct dtype_of<double> {
  static constexpr hvd_dtype value = HVD_FLOAT64;
};

class Comm {
 public:
  struct Options {
    std::string backend;         // empty: HVD_BACKEND
    double timeout_seconds = 0;  // 0: HVD_TIMEOUT
  };

  static Result<Comm> init() { return init(Options{}); }
  static Result<Comm> init(const Options& options) {
    hvd_init_options raw{sizeof(hvd_init_options), options.backend.c_str(),
                         options.timeout_seconds};
    hvd_comm* comm = nullptr;
    Status s = check(hvd_init(&raw, &comm));
    if (!s.ok()) return s;
    return Comm(comm);
  }

  Comm(Comm&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  Comm& operator=(Comm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { reset(); }

  // Finalize now and report how it went (the destructor finalizes silently).
  Status finalize() { return check(hvd_finalize(std::exchange(comm_, nullptr))); }

  int rank() const { return hvd_rank(comm_); }
  int size() const { return hvd_size(comm_); }
  int local_rank() const { return hvd_local_rank(comm_); }
  int local_size() const { return hvd_local_size(comm_); }
  std::string backend() const { return hvd_backend_name(comm_); }
  uint64_t capabilities() const { return hvd_backend_capabilities(comm_); }
  hvd_comm* get() const { return comm_; }

  Status allreduce(const void* send, void* recv, uint64_t count, hvd_dtype dtype, hvd_reduce_op op,
                   const hvd_placement* placement = nullptr) {
    return check(hvd_allreduce(comm_, send, recv, count, dtype, op, placement));
  }
  Status allgather(const void* send, void* recv, uint64_t count, hvd_dtype dtype,
                   const hvd_placement* placement = nullptr) {
    return check(hvd_allgather(comm_, send, recv, count, dtype, placement));
  }
  Status allgatherv(const void* send, void* recv, const uint64_t* recv_counts, hvd_dtype dtype,
                    const hvd_placement* placement = nullptr) {
    return check(hvd_allgatherv(comm_, send, recv, recv_counts, dtype, placement));
  }
  Status broadcast(const void* send, void* recv, uint64_t count, hvd_dtype dtype, int root,
                   const hvd_placement* placement = nullptr) {
    return check(hvd_broadcast(comm_, send, recv, count, dtype, root, placement));
  }
  Status barrier() { return check(hvd_barrier(comm_)); }

  template <typename T>
  Status allreduce(const T* send, T* recv, uint64_t count, hvd_reduce_op op) {
    return allreduce(send, recv, count, dtype_of<T>::value, op);
  }
  template <typename T>
  Status allgather(const T* send, T* recv, uint64_t count) {
    return allgather(send, recv, count, dtype_of<T>::value);
  }
  template <typename T>
  Status broadcast(const T* send, T* recv, uint64_t count, int root) {
    return broadcast(send, recv, count, dtype_of<T>::value, root);
  }

 private:
  explicit Comm(hvd_comm* comm) : comm_(comm) {}
  void reset() {
    if (comm_ != nullptr) (void)hvd_finalize(std::exchange(comm_, nullptr));
  }
  static Status check(hvd_status code) {
    return code == HVD_SUCCESS ? Status::success() : Status(code, hvd_last_error());
  }

  hvd_comm* comm_ = nullptr;
};

}  // namespace hvd

#endif  // HVD_HVD_HPP
