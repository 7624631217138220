// collectives.hpp — what runs a collective: a Communicator (one live backend), or a test's fake.
#ifndef HVD_CORE_COMM_COLLECTIVES_HPP
#define HVD_CORE_COMM_COLLECTIVES_HPP

#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

// The arguments of a collective on host memory (root 0, op sum), struct_size set: the start
// every caller builds on.
inline hvd_collective_args host_args(const void* send, void* recv, uint64_t count,
                                     hvd_dtype dtype) {
  hvd_collective_args args{};
  args.struct_size = sizeof args;
  args.sendbuf = send;
  args.recvbuf = recv;
  args.count = count;
  args.dtype = dtype;
  args.memory_type = HVD_MEMORY_HOST;
  args.device = -1;
  return args;
}

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether CUDA memory goes to the backend as it is (NCCL). Where not, a collective on CUDA
  // memory runs in host memory, staged (device_memory.hpp); it is blocking then.
  virtual bool takes_cuda_memory() const { return false; }
  // The CUDA device the backend is bound to (NCCL binds one per communicator), or -1.
  virtual int32_t cuda_device() const { return -1; }
  // Whether a collective on this memory runs staged through host memory.
  bool stages(hvd_memory_type memory) const {
    return memory == HVD_MEMORY_CUDA && !takes_cuda_memory();
  }
  // args.struct_size set; blocking for host memory, as the plugin ABI.
  virtual Status allreduce(const hvd_collective_args& args) = 0;
  virtual Status allgather(const hvd_collective_args& args) = 0;
  virtual Status broadcast(const hvd_collective_args& args) = 0;
  // args.count elements per rank: sendbuf holds count * size() (hvd_reduce_scatter).
  virtual Status reduce_scatter(const hvd_collective_args& args) {
    (void)args;
    return error(HVD_ERR_UNSUPPORTED, "reduce_scatter is not implemented here");
  }
  // args.send_counts and args.recv_counts set (backend.h); `matrix` holds every rank's send
  // counts, size() x size(), row r = rank r's (what a backend without alltoall needs).
  virtual Status alltoall(const hvd_collective_args& args, const uint64_t* matrix) {
    (void)args;
    (void)matrix;
    return error(HVD_ERR_UNSUPPORTED, "alltoall is not implemented here");
  }

  // The error that broke this communicator (a backend failure or timeout, an abort), or success
  // while it is usable. Once broken, every collective fails with that error.
  virtual Status health() const { return Status::success(); }
  // Breaks the communicator with `why` (the first reason sticks) and interrupts a collective in
  // progress on another thread. Any thread, any number of times.
  virtual void abort(const Status& why) { (void)why; }
};

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_COLLECTIVES_HPP
