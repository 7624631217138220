// The NCCL baseline: ncclAllReduce / ncclAllGather / ncclBroadcast / ncclReduceScatter and
// grouped ncclSend/ncclRecv (alltoall) on a communicator of its own over the same ranks, on the
// call's stream (the benchmark waits for the default stream after each timed loop, as for hvd's).
// Its unique id travels through hvd's own broadcast, in CUDA memory (the nccl backend takes no
// other).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "bootstrap/env.hpp"
#include "bootstrap/settings.hpp"

#include "buffer.hpp"
#include "direct.hpp"
#include "nccl_types.hpp"

namespace hvd::bench {
namespace {

using nccl::data_type;
using nccl::reduce_op;

class DirectNccl final : public DirectLibrary {
 public:
  DirectNccl(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~DirectNccl() override { (void)ncclCommDestroy(comm_); }
  DirectNccl(const DirectNccl&) = delete;
  DirectNccl& operator=(const DirectNccl&) = delete;

  std::string call_name(hvd_collective c) const override {
    switch (c) {
      case HVD_COLLECTIVE_ALLREDUCE:
        return "ncclAllReduce";
      case HVD_COLLECTIVE_ALLGATHER:
        return "ncclAllGather";
      case HVD_COLLECTIVE_BROADCAST:
        return "ncclBroadcast";
      case HVD_COLLECTIVE_REDUCE_SCATTER:
        return "ncclReduceScatter";
      case HVD_COLLECTIVE_ALLTOALL:
        return "ncclSend/ncclRecv";
      default:  // barrier and join are not benchmarked
        break;
    }
    return "?";
  }

  std::string unsupported(const CollectiveCall& c) const override {
    if (c.placement.memory_type != HVD_MEMORY_CUDA) return "CUDA memory only";
    if (c.collective == HVD_COLLECTIVE_ALLTOALL && c.send == c.recv) return "never in place";
    // hvd's in-place reduce-scatter leaves the result at the buffer's start, NCCL's at the rank's
    // block: not the same call.
    if (c.collective == HVD_COLLECTIVE_REDUCE_SCATTER && c.send == c.recv) {
      return "NCCL's in-place reduce-scatter is another layout";
    }
    return "";
  }

  Status run(const CollectiveCall& c) override {
    const auto stream = static_cast<cudaStream_t>(c.placement.stream);
    const ncclDataType_t type = data_type(c.dtype);
    ncclResult_t rc = ncclSuccess;
    switch (c.collective) {
      case HVD_COLLECTIVE_ALLREDUCE:
        rc = ncclAllReduce(c.send, c.recv, c.count, type, reduce_op(c.op), comm_, stream);
        break;
      case HVD_COLLECTIVE_ALLGATHER:
        rc = ncclAllGather(c.send, c.recv, c.count, type, comm_, stream);
        break;
      case HVD_COLLECTIVE_BROADCAST:
        rc = ncclBroadcast(c.send, c.recv, c.count, type, c.root, comm_, stream);
        break;
      case HVD_COLLECTIVE_REDUCE_SCATTER:
        rc = ncclReduceScatter(c.send, c.recv, c.count, type, reduce_op(c.op), comm_, stream);
        break;
      case HVD_COLLECTIVE_ALLTOALL: {
        const size_t block = c.count * hvd_dtype_size(c.dtype);
        rc = ncclGroupStart();
        for (int r = 0; r < size_ && rc == ncclSuccess; ++r) {
          rc = ncclSend(static_cast<const char*>(c.send) + r * block, c.count, type, r, comm_,
                        stream);
          if (rc == ncclSuccess) {
            rc = ncclRecv(static_cast<char*>(c.recv) + r * block, c.count, type, r, comm_, stream);
          }
        }
        const ncclResult_t ended = ncclGroupEnd();
        if (rc == ncclSuccess) rc = ended;
        break;
      }
      default:  // barrier and join are not benchmarked
        break;
    }
    if (rc == ncclSuccess) return Status::success();
    return error(HVD_ERR_REMOTE, call_name(c.collective) + ": " + ncclGetErrorString(rc) + " (" +
                                     ncclGetLastError(comm_) + ")");
  }

 private:
  ncclComm_t comm_;
  int rank_;
  int size_;
};

Status cuda(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return Status::success();
  return error(HVD_ERR_SYSTEM, std::string(what) + ": " + cudaGetErrorString(rc));
}

}  // namespace

Result<std::unique_ptr<DirectLibrary>> open_direct_nccl(Comm& comm) {
  ncclUniqueId id{};
  if (comm.rank() == 0) {
    if (const ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) {
      return error(HVD_ERR_SYSTEM, std::string("ncclGetUniqueId: ") + ncclGetErrorString(rc));
    }
  }
  int device = 0;
  HVD_RETURN_IF_ERROR(cuda(cudaGetDevice(&device), "cudaGetDevice"));
  void* staged = nullptr;
  HVD_RETURN_IF_ERROR(cuda(cudaMalloc(&staged, sizeof id), "cudaMalloc"));
  Status s = cuda(cudaMemcpy(staged, &id, sizeof id, cudaMemcpyHostToDevice), "cudaMemcpy");
  const hvd_placement on_device{sizeof(hvd_placement), HVD_MEMORY_CUDA, device, nullptr};
  if (s.ok()) s = comm.broadcast(staged, staged, sizeof id, HVD_UINT8, 0, &on_device);
  if (s.ok()) s = synchronize(HVD_MEMORY_CUDA);
  if (s.ok()) s = cuda(cudaMemcpy(&id, staged, sizeof id, cudaMemcpyDeviceToHost), "cudaMemcpy");
  (void)cudaFree(staged);
  HVD_RETURN_IF_ERROR(s);
  // Non-blocking, polled against HVD_TIMEOUT: a rank that never joins is an error, not a hang.
  HVD_ASSIGN_OR_RETURN(const core::Settings settings, core::Settings::read(core::process_env()));
  const std::chrono::milliseconds timeout = settings.timeout();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t nccl = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&nccl, comm.size(), id, comm.rank(), &config);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (rc == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(nccl, &rc) != ncclSuccess) break;
  }
  if (rc != ncclSuccess) {
    if (nccl != nullptr) (void)ncclCommAbort(nccl);
    return error(
        rc == ncclInProgress ? HVD_ERR_TIMEOUT : HVD_ERR_SYSTEM,
        std::string("ncclCommInitRankConfig: ") +
            (rc == ncclInProgress ? "not done within HVD_TIMEOUT" : ncclGetErrorString(rc)));
  }
  return std::unique_ptr<DirectLibrary>(new DirectNccl(nccl, comm.rank(), comm.size()));
}

}  // namespace hvd::bench
