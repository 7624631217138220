// collective_calls.cpp — Communicator's collectives as the scheduler and hvd.h call them: the
// arguments validated, CUDA memory staged through host memory (or host memory through device
// memory) where the backend takes only the other, and the collectives a backend lacks built from
// those it has (allgatherv and alltoall as broadcasts, reduce-scatter as an allreduce).
#include "comm/communicator.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/call_checks.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"

namespace hvd::core {

Status Communicator::validate(hvd_collective entry, const char* what,
                              const hvd_collective_args& a) const {
  const bool uses_op = hvd_collective_reduces(entry);
  const bool uses_root = entry == HVD_COLLECTIVE_BROADCAST;
  auto invalid = [&](const std::string& why) {
    return error(HVD_ERR_INVALID_ARGUMENT, std::string(what) + ": " + why);
  };
  const std::string problem =
      call_problem(entry, a.dtype, a.op, a.root, a.memory_type, world_.size);
  if (!problem.empty()) return invalid(problem);
  const size_t element = hvd_dtype_size(a.dtype);
  // A multiplication, not a division: this check runs on every call (see bench/micro).
  uint64_t total_bytes = 0;
  if (__builtin_mul_overflow(a.count, element * static_cast<uint64_t>(world_.size), &total_bytes)) {
    return invalid("count " + std::to_string(a.count) + " overflows the buffer size");
  }
  if (a.recv_counts != nullptr && entry == HVD_COLLECTIVE_ALLGATHER) {
    if ((plugin_.capabilities & HVD_CAP_ALLGATHERV) == 0 && a.memory_type != HVD_MEMORY_HOST &&
        !stages(a.memory_type)) {
      return error(HVD_ERR_UNSUPPORTED,
                   std::string(what) + ": backend '" + plugin_.name +
                       "' has no allgatherv for device memory (capabilities: " +
                       capabilities_to_string(plugin_.capabilities) + ")");
    }
    uint64_t total = 0;
    for (int r = 0; r < world_.size; ++r) {
      const uint64_t n = a.recv_counts[r];
      if (n > UINT64_MAX / element - total) return invalid("recv_counts overflow the buffer size");
      total += n;
    }
    if (total > 0 && a.recvbuf == nullptr) return invalid("recvbuf is NULL");
    if (a.recv_counts[world_.rank] != a.count) {
      return invalid("recv_counts[" + std::to_string(world_.rank) + "] is " +
                     std::to_string(a.recv_counts[world_.rank]) + " but this rank sends " +
                     std::to_string(a.count));
    }
  }
  const bool needs_send = !uses_root || a.root == world_.rank;
  if (entry == HVD_COLLECTIVE_ALLTOALL) {
    if (a.send_counts == nullptr) return invalid("send_counts is NULL");
    uint64_t sent = 0;
    for (int r = 0; r < world_.size; ++r) {
      if (a.send_counts[r] > UINT64_MAX / element - sent) {
        return invalid("send_counts overflow the buffer size");
      }
      sent += a.send_counts[r];
    }
    if (sent != a.count) {
      return invalid("send_counts sum to " + std::to_string(sent) + ", not count " +
                     std::to_string(a.count));
    }
    if (sent > 0 && a.sendbuf == nullptr) return invalid("sendbuf is NULL");
    if (sent > 0 && a.sendbuf == a.recvbuf) return invalid("alltoall cannot run in place");
  } else if (a.count > 0 && (a.recvbuf == nullptr || (needs_send && a.sendbuf == nullptr))) {
    return invalid("buffer is NULL for " + std::to_string(a.count) + " elements");
  }
  const bool cuda = a.memory_type == HVD_MEMORY_CUDA;
  // CUDA memory goes to a backend that takes it, or is staged through host memory; host memory
  // to one that takes it, or through device memory where the backend binds a device.
  const uint64_t takes = cuda || host_staging_device_ >= 0
                             ? HVD_CAP_CUDA_MEMORY | HVD_CAP_HOST_MEMORY
                             : HVD_CAP_HOST_MEMORY;
  if ((plugin_.capabilities & takes) == 0) {
    return error(HVD_ERR_UNSUPPORTED, std::string(what) + ": backend '" + plugin_.name +
                                          "' does not take " + (cuda ? "CUDA" : "host") +
                                          " memory (capabilities: " +
                                          capabilities_to_string(plugin_.capabilities) + ")");
  }
  // Only what the plugin declared reaches it (a 1.0 plugin declared every 1.0 dtype and op).
  const bool op_taken = !uses_op || plugin_.takes(a.op);
  if (!plugin_.takes(a.dtype) || !op_taken) {
    return error(
        HVD_ERR_UNSUPPORTED,
        std::string(what) + ": backend '" + plugin_.name + "' does not take " +
            hvd_dtype_name(a.dtype) + (uses_op ? std::string(" ") + hvd_reduce_op_name(a.op) : "") +
            " (its dtypes: " + dtypes_to_string(plugin_.dtypes) +
            (uses_op ? "; its reduce ops: " + reduce_ops_to_string(plugin_.reduce_ops) : "") + ")");
  }
  return Status::success();
}

template <typename Run>
Status Communicator::staged(const char* what, const hvd_collective_args& a, uint64_t in_offset,
                            uint64_t in_bytes, uint64_t out_bytes, Run&& run) {
  const bool to_host = a.memory_type == HVD_MEMORY_CUDA;
  const auto failed = [&](const Status& s) {
    const std::string why = to_host ? ": staging CUDA memory through host memory for backend '"
                                    : ": staging host memory through CUDA device " +
                                          std::to_string(host_staging_device_) +
                                          "'s memory for backend '";
    return error(s.code(), what + why + plugin_.name + "': " + s.message());
  };
  // Every wait on the device is bounded by HVD_TIMEOUT from here.
  const auto deadline = Clock::now() + timeout_;
  const size_t bytes = std::max(in_offset + in_bytes, out_bytes);
  // The device the copies are made on, and their stream: for CUDA memory the tensor's device
  // and the caller's stream (so after the work queued there); for host memory the device the
  // backend binds and the staging buffer's own stream, on which the collective runs too.
  int32_t device = a.device;
  void* stream = a.stream;
  char* stage = nullptr;
  if (to_host) {
    stage = staging_.reserve(bytes, device_memory_, device);
    if (stage == nullptr) {
      return failed(error(HVD_ERR_SYSTEM, "no host memory for the staging buffer"));
    }
  } else {
    device = host_staging_device_;
    Result<char*> reserved = device_staging_.reserve(bytes, *device_memory_, device);
    if (!reserved.ok()) return failed(reserved.status());
    stage = *reserved;
    stream = device_staging_.stream();
  }
  // The input must be where the backend reads it before it runs. A rank whose copy fails
  // leaves its peers in the collective, to time out as with any rank that fails outside it.
  if (in_bytes > 0) {
    const Status s = device_memory_->copy_and_wait(stage + in_offset, a.sendbuf, in_bytes, device,
                                                   stream, deadline);
    if (!s.ok()) return failed(s);
  }
  hvd_collective_args moved = a;
  moved.memory_type = to_host ? HVD_MEMORY_HOST : HVD_MEMORY_CUDA;
  moved.device = to_host ? -1 : device;
  moved.stream = to_host ? nullptr : stream;
  moved.sendbuf = stage + in_offset;
  moved.recvbuf = stage;
  const Status ran = run(moved);
  if (!to_host) {
    // The collective was queued on the staging stream: wait for it (bounded) before the copy
    // back, which would otherwise block the host until then, and before the buffer serves again.
    // A collective that does not end by the deadline (a dead peer) breaks the communicator, and
    // the abort ends it.
    const Status s = device_memory_->synchronize(device, stream, deadline);
    if (!s.ok()) {
      const Status why = failed(s);
      abort(why);
      return why;
    }
  }
  HVD_RETURN_IF_ERROR(ran);
  if (out_bytes == 0) return Status::success();
  const Status s =
      device_memory_->copy_and_wait(a.recvbuf, stage, out_bytes, device, stream, deadline);
  return s.ok() ? s : failed(s);
}

Status Communicator::allreduce(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate(HVD_COLLECTIVE_ALLREDUCE, "allreduce", args));
  if (through_staging(args.memory_type)) {
    const uint64_t bytes = args.count * hvd_dtype_size(args.dtype);
    return staged("allreduce", args, 0, bytes, bytes,
                  [&](const hvd_collective_args& host) { return allreduce(host); });
  }
  // An integer average of averages would round twice: those run flat.
  if (local_ && args.memory_type == HVD_MEMORY_HOST &&
      args.count * hvd_dtype_size(args.dtype) >= kHierarchicalMinBytes &&
      (args.op != HVD_AVERAGE || args.dtype == HVD_FLOAT16 || args.dtype == HVD_BFLOAT16 ||
       args.dtype == HVD_FLOAT32 || args.dtype == HVD_FLOAT64)) {
    return hierarchical_allreduce(args);
  }
  return call(HVD_COLLECTIVE_ALLREDUCE, "allreduce", &args);
}

Status Communicator::allgather(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate(HVD_COLLECTIVE_ALLGATHER, "allgather", args));
  if (through_staging(args.memory_type)) {
    const size_t element = hvd_dtype_size(args.dtype);
    uint64_t before = static_cast<uint64_t>(world_.rank) * args.count;  // this rank's offset
    uint64_t total = static_cast<uint64_t>(world_.size) * args.count;
    if (args.recv_counts != nullptr) {
      before = 0;
      total = 0;
      for (int r = 0; r < world_.size; ++r) {
        if (r < world_.rank) before += args.recv_counts[r];
        total += args.recv_counts[r];
      }
    }
    return staged("allgather", args, before * element, args.count * element, total * element,
                  [&](const hvd_collective_args& host) { return allgather(host); });
  }
  if (args.recv_counts == nullptr || (plugin_.capabilities & HVD_CAP_ALLGATHERV) != 0) {
    const hvd_collective_args a = without_reduction(args);
    return call(HVD_COLLECTIVE_ALLGATHER, "allgather", &a);
  }
  // A backend without allgatherv (host memory, checked above): each rank's part is broadcast
  // from it, in place in recvbuf.
  const size_t element = hvd_dtype_size(args.dtype);
  char* part = static_cast<char*>(args.recvbuf);
  for (int r = 0; r < world_.size; ++r) {
    const uint64_t count = args.recv_counts[r];
    if (count == 0) continue;
    if (r == world_.rank && part != args.sendbuf) std::memmove(part, args.sendbuf, count * element);
    hvd_collective_args piece = without_reduction(args);
    piece.sendbuf = part;
    piece.recvbuf = part;
    piece.count = count;
    piece.root = r;
    piece.recv_counts = nullptr;
    HVD_RETURN_IF_ERROR(call(HVD_COLLECTIVE_BROADCAST, "allgatherv", &piece));
    part += count * element;
  }
  return Status::success();
}

Status Communicator::broadcast(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate(HVD_COLLECTIVE_BROADCAST, "broadcast", args));
  if (through_staging(args.memory_type)) {
    const uint64_t bytes = args.count * hvd_dtype_size(args.dtype);
    return staged("broadcast", args, 0, args.root == world_.rank ? bytes : 0, bytes,
                  [&](const hvd_collective_args& host) { return broadcast(host); });
  }
  const hvd_collective_args a = without_reduction(args);
  return call(HVD_COLLECTIVE_BROADCAST, "broadcast", &a);
}

Status Communicator::reduce_scatter(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate(HVD_COLLECTIVE_REDUCE_SCATTER, "reduce_scatter", args));
  const size_t element = hvd_dtype_size(args.dtype);
  const uint64_t block = args.count * element;
  const uint64_t all = block * static_cast<uint64_t>(world_.size);
  if (through_staging(args.memory_type)) {
    return staged("reduce_scatter", args, 0, all, block,
                  [&](const hvd_collective_args& host) { return reduce_scatter(host); });
  }
  if ((plugin_.capabilities & HVD_CAP_REDUCE_SCATTER) != 0) {
    return call(HVD_COLLECTIVE_REDUCE_SCATTER, "reduce_scatter", &args);
  }
  if (args.memory_type != HVD_MEMORY_HOST) {
    return error(HVD_ERR_UNSUPPORTED, "reduce_scatter: backend '" + plugin_.name +
                                          "' has no reduce_scatter for device memory");
  }
  // Without the plugin's: the whole reduction, of which this rank keeps its block.
  if (scratch_.size() < all) scratch_.resize(all);
  hvd_collective_args whole = args;
  whole.recvbuf = scratch_.data();
  whole.count = args.count * static_cast<uint64_t>(world_.size);
  HVD_RETURN_IF_ERROR(call(HVD_COLLECTIVE_ALLREDUCE, "reduce_scatter (as allreduce)", &whole));
  if (block > 0) {
    std::memcpy(args.recvbuf, scratch_.data() + static_cast<uint64_t>(world_.rank) * block, block);
  }
  return Status::success();
}

Status Communicator::alltoall(const hvd_collective_args& args, const uint64_t* matrix) {
  HVD_RETURN_IF_ERROR(validate(HVD_COLLECTIVE_ALLTOALL, "alltoall", args));
  const size_t element = hvd_dtype_size(args.dtype);
  const int n = world_.size;
  if (args.recv_counts == nullptr) return error(HVD_ERR_INTERNAL, "alltoall: recv_counts unset");
  uint64_t received = 0;
  for (int r = 0; r < n; ++r) {
    if (args.recv_counts[r] > UINT64_MAX / element - received) {
      return error(HVD_ERR_INVALID_ARGUMENT, "alltoall: recv_counts overflow the buffer size");
    }
    received += args.recv_counts[r];
  }
  if (received > 0 && args.recvbuf == nullptr) {
    return error(HVD_ERR_INVALID_ARGUMENT,
                 "alltoall: recvbuf is NULL for " + std::to_string(received) + " elements");
  }
  if (through_staging(args.memory_type)) {
    // Input after the output in the staging buffer: alltoall is never in place.
    return staged("alltoall", args, received * element, args.count * element, received * element,
                  [&](const hvd_collective_args& host) { return alltoall(host, matrix); });
  }
  if (plugin_.alltoall != nullptr) {
    const hvd_collective_args a = without_reduction(args);
    return call(HVD_COLLECTIVE_ALLTOALL, "alltoall", &a);
  }
  if (args.memory_type != HVD_MEMORY_HOST) {
    return error(HVD_ERR_UNSUPPORTED,
                 "alltoall: backend '" + plugin_.name + "' has no alltoall for device memory");
  }
  if (matrix == nullptr) return error(HVD_ERR_INTERNAL, "alltoall: no count matrix");
  // Without the plugin's: each rank broadcasts all it sends, and every rank keeps its part.
  char* out = static_cast<char*>(args.recvbuf);
  for (int root = 0; root < n; ++root) {
    const uint64_t* row = matrix + static_cast<size_t>(root) * static_cast<size_t>(n);
    const uint64_t total = std::accumulate(row, row + n, uint64_t{0});
    // What root sends the ranks before this one.
    const uint64_t before = std::accumulate(row, row + world_.rank, uint64_t{0});
    if (total > 0) {
      if (scratch_.size() < total * element) scratch_.resize(total * element);
      hvd_collective_args piece = without_reduction(args);
      piece.sendbuf = root == world_.rank ? args.sendbuf : nullptr;
      piece.recvbuf = scratch_.data();
      piece.count = total;
      piece.root = root;
      piece.recv_counts = nullptr;
      piece.send_counts = nullptr;
      HVD_RETURN_IF_ERROR(call(HVD_COLLECTIVE_BROADCAST, "alltoall (as broadcasts)", &piece));
      if (row[world_.rank] > 0) {
        std::memcpy(out, scratch_.data() + before * element, row[world_.rank] * element);
      }
    }
    out += row[world_.rank] * element;
  }
  return Status::success();
}

hvd_collective_args Communicator::without_reduction(const hvd_collective_args& args) const {
  // The op of a call that reduces nothing is whatever the caller left there; the plugin gets one
  // it declared instead (it never sees a value it did not declare).
  hvd_collective_args a = args;
  a.op = plugin_.any_reduce_op();
  return a;
}

hvd_collective_args Communicator::control_args(const void* send, void* recv, size_t bytes) const {
  const hvd_dtype dtype = plugin_.byte_dtype();  // whose size divides any multiple of 8
  return host_args(send, recv, bytes / hvd_dtype_size(dtype), dtype);
}

Status Communicator::barrier() { return call(HVD_COLLECTIVE_BARRIER, "barrier", nullptr); }

Status Communicator::check_allreduce(const hvd_collective_args& args) const {
  return validate(HVD_COLLECTIVE_ALLREDUCE, "allreduce", args);
}
Status Communicator::check_allgather(const hvd_collective_args& args) const {
  return validate(HVD_COLLECTIVE_ALLGATHER, "allgather", args);
}
Status Communicator::check_broadcast(const hvd_collective_args& args) const {
  return validate(HVD_COLLECTIVE_BROADCAST, "broadcast", args);
}
Status Communicator::check_reduce_scatter(const hvd_collective_args& args) const {
  return validate(HVD_COLLECTIVE_REDUCE_SCATTER, "reduce_scatter", args);
}
Status Communicator::check_alltoall_send(const hvd_collective_args& args) const {
  return validate(HVD_COLLECTIVE_ALLTOALL, "alltoall", args);
}

}  // namespace hvd::core
