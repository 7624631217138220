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
#include <vector>

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

// A submitted asynchronous collective (move-only): poll it, or wait for its status.
class Request {
 public:
  Request(Request&& other) noexcept : request_(std::exchange(other.request_, nullptr)) {}
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      hvd_request_free(request_);
      request_ = std::exchange(other.request_, nullptr);
    }
    return *this;
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { hvd_request_free(request_); }

  bool ready() const {
    int done = 0;
    return hvd_request_poll(request_, &done) == HVD_SUCCESS && done != 0;
  }
  // The operation's status; a timeout >= 0 bounds the wait (HVD_ERR_TIMEOUT, the operation goes
  // on).
  Status wait(double timeout_seconds = -1) const {
    const hvd_status code = hvd_request_wait(request_, timeout_seconds);
    return code == HVD_SUCCESS ? Status::success() : Status(code, hvd_last_error());
  }
  // CUDA tensors on a backend that takes CUDA memory: `stream` (a cudaStream_t) runs what is
  // queued on it from now on after the operation, without the host waiting for the device
  // (hvd_request_wait_on_stream).
  Status wait_on_stream(void* stream, double timeout_seconds = -1) const {
    const hvd_status code = hvd_request_wait_on_stream(request_, stream, timeout_seconds);
    return code == HVD_SUCCESS ? Status::success() : Status(code, hvd_last_error());
  }

  // An allgather submitted without a recv buffer, once it succeeded: the gathered tensor hvd
  // allocated (valid while this Request lives) and its first dimension, the ranks' summed.
  struct Output {
    void* data = nullptr;
    int64_t first_dim = 0;
  };
  Result<Output> output() const {
    Output out;
    const hvd_status code = hvd_request_output(request_, &out.data, &out.first_dim);
    if (code != HVD_SUCCESS) return Status(code, hvd_last_error());
    return out;
  }
  // A join (Comm::join_async), once it succeeded: the rank that joined last.
  Result<int> last_joined() const {
    int rank = -1;
    const hvd_status code = hvd_request_last_joined(request_, &rank);
    if (code != HVD_SUCCESS) return Status(code, hvd_last_error());
    return rank;
  }
  // An alltoall, once it succeeded: the rows received from each rank (`size` of its comm).
  Result<std::vector<int64_t>> received_splits(int size) const {
    std::vector<int64_t> splits(static_cast<size_t>(size > 0 ? size : 0));
    const hvd_status code = hvd_request_received_splits(request_, splits.data(), size);
    if (code != HVD_SUCCESS) return Status(code, hvd_last_error());
    return splits;
  }

 private:
  friend class Comm;
  explicit Request(hvd_request* request) : request_(request) {}
  hvd_request* request_ = nullptr;
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

  // A child of this communicator (hvd_comm_split): collective over every rank of this one. A
  // rank that joins none (color < 0) gets an empty Comm (false).
  Result<Comm> split(int color, int key) {
    hvd_comm* child = nullptr;
    Status s = check(hvd_comm_split(comm_, color, key, &child));
    if (!s.ok()) return s;
    return Comm(child);
  }
  // Horovod's process set over `ranks` of this communicator (hvd_comm_create_process_set): the
  // same list on every rank of this one; a rank not in it gets an empty Comm (false).
  Result<Comm> process_set(const std::vector<int>& ranks) {
    hvd_comm* child = nullptr;
    Status s = check(
        hvd_comm_create_process_set(comm_, ranks.data(), static_cast<int>(ranks.size()), &child));
    if (!s.ok()) return s;
    return Comm(child);
  }
  explicit operator bool() const { return comm_ != nullptr; }
  // This communicator's rank r as a rank of the job.
  int job_rank(int rank) const { return hvd_comm_job_rank(comm_, rank); }

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

  // Finalize now and report how it went (the destructor finalizes silently). A communicator with
  // live children is not released (HVD_ERR_STATE): this Comm keeps it then. So destroy children
  // before their parent (declare them after it).
  Status finalize() {
    const Status s = check(hvd_finalize(comm_));
    if (s.ok() || hvd_rank(comm_) < 0) comm_ = nullptr;  // released, or no longer live
    return s;
  }
  // Break the communicator from any thread (hvd_comm_abort): calls in progress return, every
  // later one fails; finalize (or the destructor) still releases it.
  Status abort() { return check(hvd_comm_abort(comm_)); }

  int rank() const { return hvd_rank(comm_); }
  int size() const { return hvd_size(comm_); }
  int local_rank() const { return hvd_local_rank(comm_); }
  int local_size() const { return hvd_local_size(comm_); }
  std::string backend() const { return hvd_backend_name(comm_); }
  uint64_t capabilities() const { return hvd_backend_capabilities(comm_); }
  // Whether the backend takes this dtype, and this reduce op (hvd_backend_dtypes/reduce_ops).
  bool takes(hvd_dtype dtype) const {
    return dtype >= 0 && dtype < 64 && (hvd_backend_dtypes(comm_) & HVD_DTYPE_BIT(dtype)) != 0;
  }
  bool takes(hvd_reduce_op op) const {
    return op >= 0 && op < 64 && (hvd_backend_reduce_ops(comm_) & HVD_REDUCE_OP_BIT(op)) != 0;
  }
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
  Status reduce_scatter(const void* send, void* recv, uint64_t count, hvd_dtype dtype,
                        hvd_reduce_op op, const hvd_placement* placement = nullptr) {
    return check(hvd_reduce_scatter(comm_, send, recv, count, dtype, op, placement));
  }
  // recv_counts, if given, gets size() entries.
  Status alltoall(const void* send, const uint64_t* send_counts, void* recv, uint64_t recv_capacity,
                  uint64_t* recv_counts, hvd_dtype dtype,
                  const hvd_placement* placement = nullptr) {
    return check(
        hvd_alltoall(comm_, send, send_counts, recv, recv_capacity, recv_counts, dtype, placement));
  }

  // Named asynchronous collectives (see hvd.h). Shapes are element counts per dimension.
  Result<Request> allreduce_async(const std::string& name, const void* send, void* recv,
                                  hvd_dtype dtype, const std::vector<int64_t>& shape,
                                  hvd_reduce_op op, double prescale = 1, double postscale = 1,
                                  const hvd_placement* placement = nullptr) {
    hvd_request* r = nullptr;
    Status s = check(hvd_allreduce_async(comm_, name.c_str(), send, recv, dtype,
                                         static_cast<int32_t>(shape.size()), shape.data(), op,
                                         prescale, postscale, placement, &r));
    if (!s.ok()) return s;
    return Request(r);
  }
  Result<Request> allgather_async(const std::string& name, const void* send, void* recv,
                                  hvd_dtype dtype, const std::vector<int64_t>& shape,
                                  const hvd_placement* placement = nullptr) {
    hvd_request* r = nullptr;
    Status s =
        check(hvd_allgather_async(comm_, name.c_str(), send, recv, dtype,
                                  static_cast<int32_t>(shape.size()), shape.data(), placement, &r));
    if (!s.ok()) return s;
    return Request(r);
  }
  Result<Request> broadcast_async(const std::string& name, const void* send, void* recv,
                                  hvd_dtype dtype, const std::vector<int64_t>& shape, int root,
                                  const hvd_placement* placement = nullptr) {
    hvd_request* r = nullptr;
    Status s = check(hvd_broadcast_async(comm_, name.c_str(), send, recv, dtype,
                                         static_cast<int32_t>(shape.size()), shape.data(), root,
                                         placement, &r));
    if (!s.ok()) return s;
    return Request(r);
  }
  Result<Request> reduce_scatter_async(const std::string& name, const void* send, void* recv,
                                       hvd_dtype dtype, const std::vector<int64_t>& shape,
                                       hvd_reduce_op op, double prescale = 1, double postscale = 1,
                                       const hvd_placement* placement = nullptr) {
    hvd_request* r = nullptr;
    Status s = check(hvd_reduce_scatter_async(comm_, name.c_str(), send, recv, dtype,
                                              static_cast<int32_t>(shape.size()), shape.data(), op,
                                              prescale, postscale, placement, &r));
    if (!s.ok()) return s;
    return Request(r);
  }
  // splits empty: shape[0] divided evenly.
  Result<Request> alltoall_async(const std::string& name, const void* send, void* recv,
                                 hvd_dtype dtype, const std::vector<int64_t>& shape,
                                 const std::vector<int64_t>& splits = {},
                                 const hvd_placement* placement = nullptr) {
    hvd_request* r = nullptr;
    Status s = check(hvd_alltoall_async(comm_, name.c_str(), send, recv, dtype,
                                        static_cast<int32_t>(shape.size()), shape.data(),
                                        splits.empty() ? nullptr : splits.data(), placement, &r));
    if (!s.ok()) return s;
    return Request(r);
  }
  // Horovod's join (hvd_join_async): this rank submits nothing more; it serves the others'
  // allreduces with zeros until every rank has joined.
  Result<Request> join_async() {
    hvd_request* r = nullptr;
    Status s = check(hvd_join_async(comm_, &r));
    if (!s.ok()) return s;
    return Request(r);
  }
  // The tensors queued together (hvd_grouped_async); struct_size is filled in here.
  Result<std::vector<Request>> grouped_async(std::vector<hvd_tensor> tensors) {
    for (hvd_tensor& t : tensors) t.struct_size = sizeof(hvd_tensor);
    std::vector<hvd_request*> raw(tensors.size(), nullptr);
    Status s = check(hvd_grouped_async(comm_, tensors.data(), tensors.size(), raw.data()));
    if (!s.ok()) return s;
    std::vector<Request> out;
    for (hvd_request* r : raw) out.push_back(Request(r));
    return out;
  }

  hvd_scheduler_stats scheduler_stats() const {
    hvd_scheduler_stats stats{};
    stats.struct_size = sizeof stats;
    (void)hvd_scheduler_stats_get(comm_, &stats);
    return stats;
  }

  template <typename T>
  Result<Request> allreduce_async(const std::string& name, const T* send, T* recv, uint64_t count,
                                  hvd_reduce_op op) {
    return allreduce_async(name, send, recv, dtype_of<T>::value, {static_cast<int64_t>(count)}, op);
  }

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
