// The public C API (hvd.h): a thin hourglass over Communicator. No exception crosses it.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/handles.hpp"
#include "api/session.hpp"
#include "comm/communicator.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/hvd.h"
#include "hvd/sdk/call_shape.hpp"
#include "hvd/sdk/fnv.hpp"
#include "scheduler/scheduler.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using hvd::core::Communicator;
using hvd::core::seconds_text;
using hvd::core::Session;
using hvd::core::Submission;

hvd::core::HandleTable<Session>& comms() {
  static auto* const table = new hvd::core::HandleTable<Session>;  // outlives every caller
  return *table;
}
hvd::core::HandleTable<hvd::core::Completion>& requests() {
  static auto* const table = new hvd::core::HandleTable<hvd::core::Completion>;
  return *table;
}

hvd_request* request_of(std::shared_ptr<hvd::core::Completion> completion) {
  return reinterpret_cast<hvd_request*>(requests().insert(std::move(completion)));
}
std::shared_ptr<hvd::core::Completion> completion_of(hvd_request* request) {
  return requests().find(reinterpret_cast<uintptr_t>(request));
}
std::shared_ptr<Session> state_of(const hvd_comm* comm) {
  return comms().find(reinterpret_cast<uintptr_t>(comm));
}

// The calling thread's last error. The success path only reads a flag, not the string (whose
// thread_local needs an init guard): bench/micro times every call. Not initial-exec: libhvd
// must load with dlopen (Python's extension does), and its TLS block (4 KiB of the static CUDA
// runtime's among it) does not fit the static TLS glibc keeps for that; TLS descriptors
// (core/CMakeLists.txt) make the access as cheap where libhvd was loaded at start.
thread_local std::string t_last_error;
thread_local bool t_has_last_error = false;

hvd_status finish(const hvd::Status& status) {
  if (status.ok()) {
    if (t_has_last_error) {
      t_last_error.clear();
      t_has_last_error = false;
    }
  } else {
    t_last_error = status.message();
    t_has_last_error = true;
  }
  return status.code();
}

template <typename Fn>
hvd_status guarded(Fn&& fn) noexcept {
  try {
    return finish(fn());
  } catch (const std::exception& e) {
    return finish(hvd::error(HVD_ERR_INTERNAL, std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return finish(hvd::error(HVD_ERR_INTERNAL, "unexpected non-standard exception"));
  }
}

// The communicator a handle names, kept alive for the call.
hvd::Result<std::shared_ptr<Session>> require(const hvd_comm* comm) {
  if (comm == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "comm is NULL");
  std::shared_ptr<Session> state = state_of(comm);
  if (!state) {
    return hvd::error(HVD_ERR_STATE,
                      "comm is not a live communicator (finalized already, or never made)");
  }
  return state;
}

// A struct the application filled in: its struct_size must cover at least the struct's 1.0
// fields. An application built against an older hvd.h passes a smaller struct than this hvd's,
// so fields after 1.0 are read only where HVD_HAS_FIELD says the struct has them.
hvd::Status check_size(size_t struct_size, size_t size_1_0, const char* type) {
  if (struct_size >= size_1_0) return hvd::Status::success();
  return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                    std::string(type) + ".struct_size is " + std::to_string(struct_size) +
                        ", less than the " + std::to_string(size_1_0) +
                        " bytes of its first version: set it to sizeof(" + type + ")");
}

// Sets the memory type, device and stream `placement` names on `args` (null: they stay host
// memory); fails where its struct_size is below version 1.0's. It fills the caller's `args`
// rather than returning a copy: on the fast path, a copy's wide loads stall on the narrow stores
// just made.
hvd::Status place(hvd_collective_args& args, const hvd_placement* placement) {
  if (placement == nullptr) return hvd::Status::success();
  HVD_RETURN_IF_ERROR(check_size(placement->struct_size, HVD_PLACEMENT_SIZE_1_0, "hvd_placement"));
  args.memory_type = placement->memory_type;
  args.device = placement->device;
  args.stream = placement->stream;
  return hvd::Status::success();
}

// One tensor of the C API into *s, checked for what the C side alone can get wrong.
hvd::Status unknown_request() {
  return hvd::error(HVD_ERR_STATE, "request is not a live request (freed already, or never made)");
}

// `size`: the communicator's, the number of an alltoall's splits.
hvd::Status submission_of(const hvd_tensor& t, int size, Submission* s) {
  HVD_RETURN_IF_ERROR(check_size(t.struct_size, HVD_TENSOR_SIZE_1_0, "hvd_tensor"));
  if (t.collective < HVD_COLLECTIVE_ALLREDUCE || t.collective > HVD_COLLECTIVE_ALLTOALL) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                      "collective " + std::to_string(t.collective) + " (" +
                          hvd_collective_name(t.collective) +
                          ") is not one a tensor can name: allreduce, allgather, broadcast, "
                          "reduce_scatter or alltoall");
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, "a shape is NULL or has negative ndim");
  }
  s->name = t.name != nullptr ? t.name : "";
  s->send = t.sendbuf;
  s->recv = t.recvbuf;
  hvd::core::TensorSpec& spec = s->spec;
  spec.type = t.collective;
  spec.dtype = t.dtype;
  if (t.ndim > 0) spec.shape.assign(t.shape, t.shape + t.ndim);
  spec.op = t.op;
  spec.root = t.root;
  spec.prescale = t.prescale == 0 ? 1 : t.prescale;
  spec.postscale = t.postscale == 0 ? 1 : t.postscale;
  if (HVD_HAS_FIELD(&t, hvd_tensor, splits) && t.splits != nullptr &&
      t.collective == HVD_COLLECTIVE_ALLTOALL) {
    spec.splits.assign(t.splits, t.splits + size);
  }
  if (t.placement != nullptr) {
    HVD_RETURN_IF_ERROR(
        check_size(t.placement->struct_size, HVD_PLACEMENT_SIZE_1_0, "hvd_placement"));
    spec.memory = t.placement->memory_type;
    spec.device = t.placement->device;
    s->stream = t.placement->stream;
  }
  return hvd::Status::success();
}

hvd::Status enqueue(hvd_comm* comm, const hvd_tensor* tensors, size_t count,
                    hvd_request** requests) {
  HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
  HVD_RETURN_IF_ERROR(c->usable());
  if (requests == nullptr || (count > 0 && tensors == nullptr)) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, "tensors or requests is NULL");
  }
  if (count == 1) {  // every hvd_*_async call: no group to build
    Submission s;
    HVD_RETURN_IF_ERROR(submission_of(tensors[0], c->comm().size(), &s));
    HVD_ASSIGN_OR_RETURN(const auto scheduler, c->scheduler());
    HVD_ASSIGN_OR_RETURN(auto completion, scheduler->submit(std::move(s)));
    requests[0] = request_of(std::move(completion));
    return hvd::Status::success();
  }
  // The array's stride is its elements' struct_size: an application built against an older
  // hvd.h passes smaller elements than this hvd's hvd_tensor.
  const size_t stride = tensors[0].struct_size;
  HVD_RETURN_IF_ERROR(check_size(stride, HVD_TENSOR_SIZE_1_0, "hvd_tensor"));
  std::vector<Submission> group(count);
  for (size_t i = 0; i < count; ++i) {
    const char* element = reinterpret_cast<const char*>(tensors) + i * stride;
    hvd_tensor t{};
    std::memcpy(&t, element, std::min(stride, sizeof t));
    if (t.struct_size != stride) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                        "hvd_tensor[" + std::to_string(i) + "].struct_size is " +
                            std::to_string(t.struct_size) + ", not the " + std::to_string(stride) +
                            " of the first: every element of the array has the same size");
    }
    HVD_RETURN_IF_ERROR(submission_of(t, c->comm().size(), &group[i]));
  }
  HVD_ASSIGN_OR_RETURN(const auto scheduler, c->scheduler());
  HVD_ASSIGN_OR_RETURN(auto completions, scheduler->submit_group(std::move(group)));
  for (size_t i = 0; i < count; ++i) requests[i] = request_of(std::move(completions[i]));
  return hvd::Status::success();
}

// The fields every asynchronous call has; the caller adds op, scales or root.
hvd_tensor tensor_of(hvd_collective collective, const char* name, const void* sendbuf,
                     void* recvbuf, hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                     const hvd_placement* placement) {
  hvd_tensor t{};
  t.struct_size = sizeof t;
  t.collective = collective;
  t.name = name;
  t.sendbuf = sendbuf;
  t.recvbuf = recvbuf;
  t.dtype = dtype;
  t.ndim = ndim;
  t.shape = shape;
  t.placement = placement;
  return t;
}

// A blocking collective on `comm` (Session::collective decides how it runs).
template <typename Check, typename Direct>
hvd::Status collective(const hvd_comm* comm, const char* api, hvd_collective type,
                       hvd_collective_args& args, Check&& check, Direct&& direct) {
  HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
  return c->collective(api, type, args, std::forward<Check>(check), std::forward<Direct>(direct));
}

// A split of `comm`, collective over its ranks; the child's handle in *out.
hvd::Status split_comm(const hvd_comm* comm, const Communicator::SplitRecord& mine,
                       const hvd::Status& mine_valid, const char* api, hvd_comm** out) {
  if (out == nullptr) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, std::string(api) + ": out is NULL");
  }
  *out = nullptr;
  HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
  HVD_ASSIGN_OR_RETURN(std::shared_ptr<Session> child, c->split(mine, mine_valid, api));
  if (child) *out = reinterpret_cast<hvd_comm*>(comms().insert(std::move(child)));
  return hvd::Status::success();
}

}  // namespace

extern "C" {

hvd_status hvd_init(const hvd_init_options* options, hvd_comm** comm) {
  return guarded([&]() -> hvd::Status {
    if (comm == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "comm is NULL");
    *comm = nullptr;
    hvd::core::CommOptions opts;
    if (options != nullptr) {
      HVD_RETURN_IF_ERROR(
          check_size(options->struct_size, HVD_INIT_OPTIONS_SIZE_1_0, "hvd_init_options"));
      if (options->backend != nullptr && *options->backend != '\0') opts.backend = options->backend;
      if (options->timeout_seconds > 0) {
        opts.timeout = std::chrono::milliseconds(
            static_cast<int64_t>(std::ceil(options->timeout_seconds * 1000)));
      }
    }
    const hvd::core::EnvLookup env = hvd::core::process_env();
    HVD_ASSIGN_OR_RETURN(const hvd::core::Settings settings, hvd::core::Settings::read(env));
    hvd::core::set_log_level(settings.text(hvd::core::Knob::kLogLevel));
    HVD_ASSIGN_OR_RETURN(auto session, Session::open(opts, settings, env));
    *comm = reinterpret_cast<hvd_comm*>(comms().insert(std::move(session)));
    return hvd::Status::success();
  });
}

hvd_status hvd_finalize(hvd_comm* comm) {
  return guarded([&]() -> hvd::Status {
    if (comm == nullptr) return hvd::Status::success();
    if (const std::shared_ptr<Session> live = state_of(comm)) {
      const int children = live->live_children();
      if (children > 0) {
        return hvd::error(HVD_ERR_STATE,
                          "hvd_finalize: this communicator has " + std::to_string(children) +
                              " live child communicator" + (children == 1 ? "" : "s") +
                              " (hvd_comm_split, process sets): finalize them first");
      }
    }
    const std::shared_ptr<Session> c = comms().remove(reinterpret_cast<uintptr_t>(comm));
    if (!c) {
      return hvd::error(HVD_ERR_STATE,
                        "hvd_finalize: comm is not a live communicator (finalized already, or "
                        "never made)");
    }
    const hvd::Status finalized = Session::finalize(c);
    c->released();
    return finalized;
  });
}

hvd_status hvd_comm_abort(hvd_comm* comm) {
  return guarded([&]() -> hvd::Status {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
    c->abort(hvd::error(HVD_ERR_STATE,
                        "the communicator was aborted by the application (hvd_comm_abort)"));
    return hvd::Status::success();
  });
}

int hvd_rank(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().world().rank : -1;
}
int hvd_size(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().world().size : -1;
}
int hvd_local_rank(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().world().local_rank : -1;
}
int hvd_local_size(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().world().local_size : -1;
}
uint64_t hvd_backend_capabilities(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().plugin().capabilities : 0;
}
uint64_t hvd_backend_dtypes(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().plugin().dtypes : 0;
}
uint64_t hvd_backend_reduce_ops(const hvd_comm* comm) {
  const auto c = state_of(comm);
  return c ? c->comm().plugin().reduce_ops : 0;
}
const char* hvd_backend_name(const hvd_comm* comm) {
  const auto c = state_of(comm);  // the plugin's name lives as long as the process
  return c ? c->comm().plugin().name.c_str() : "";
}

hvd_status hvd_allreduce(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.op = op;
    return collective(
        comm, "hvd_allreduce", HVD_COLLECTIVE_ALLREDUCE, args,
        [&](Communicator& c) { return c.check_allreduce(args); },
        [&](Communicator& c) { return c.allreduce(args); });
  });
}

hvd_status hvd_allgather(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    return collective(
        comm, "hvd_allgather", HVD_COLLECTIVE_ALLGATHER, args,
        [&](Communicator& c) { return c.check_allgather(args); },
        [&](Communicator& c) { return c.allgather(args); });
  });
}

hvd_status hvd_allgatherv(hvd_comm* comm, const void* sendbuf, void* recvbuf,
                          const uint64_t* recv_counts, hvd_dtype dtype,
                          const hvd_placement* placement) {
  return guarded([&]() -> hvd::Status {
    if (recv_counts == nullptr)
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
    const int rank = hvd_rank(comm);
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, 0, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.count = rank >= 0 ? recv_counts[rank] : 0;
    args.recv_counts = recv_counts;
    return collective(
        comm, "hvd_allgatherv", HVD_COLLECTIVE_ALLGATHER, args,
        [&](Communicator& c) { return c.check_allgather(args); },
        [&](Communicator& c) { return c.allgather(args); });
  });
}

hvd_status hvd_broadcast(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, int root, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.root = root;
    return collective(
        comm, "hvd_broadcast", HVD_COLLECTIVE_BROADCAST, args,
        [&](Communicator& c) { return c.check_broadcast(args); },
        [&](Communicator& c) { return c.broadcast(args); });
  });
}

hvd_status hvd_barrier(hvd_comm* comm) {
  return guarded([&]() -> hvd::Status {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
    return c->barrier();
  });
}

hvd_status hvd_reduce_scatter(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                              hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement) {
  return guarded([&] {
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.op = op;
    return collective(
        comm, "hvd_reduce_scatter", HVD_COLLECTIVE_REDUCE_SCATTER, args,
        [&](Communicator& c) { return c.check_reduce_scatter(args); },
        [&](Communicator& c) { return c.reduce_scatter(args); });
  });
}

hvd_status hvd_alltoall(hvd_comm* comm, const void* sendbuf, const uint64_t* send_counts,
                        void* recvbuf, uint64_t recv_capacity, uint64_t* recv_counts,
                        hvd_dtype dtype, const hvd_placement* placement) {
  return guarded([&]() -> hvd::Status {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
    HVD_RETURN_IF_ERROR(c->usable());
    if (send_counts == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_alltoall: send_counts is NULL");
    }
    const int size = c->comm().size();
    hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, 0, dtype);
    HVD_RETURN_IF_ERROR(place(args, placement));
    args.send_counts = send_counts;
    for (int r = 0; r < size; ++r) {
      if (__builtin_add_overflow(args.count, send_counts[r], &args.count)) {
        return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_alltoall: send_counts overflow");
      }
    }
    std::vector<uint64_t> received(static_cast<size_t>(size));
    HVD_RETURN_IF_ERROR(c->alltoall(args, recv_capacity, received.data()));
    if (recv_counts != nullptr) std::copy(received.begin(), received.end(), recv_counts);
    return hvd::Status::success();
  });
}

hvd_status hvd_allreduce_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                               hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                               hvd_reduce_op op, double prescale, double postscale,
                               const hvd_placement* placement, hvd_request** request) {
  return guarded([&] {
    hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_ALLREDUCE, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    t.op = op;
    t.prescale = prescale;
    t.postscale = postscale;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_allgather_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                               hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                               const hvd_placement* placement, hvd_request** request) {
  return guarded([&] {
    const hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_ALLGATHER, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_broadcast_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                               hvd_dtype dtype, int32_t ndim, const int64_t* shape, int root,
                               const hvd_placement* placement, hvd_request** request) {
  return guarded([&] {
    hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_BROADCAST, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    t.root = root;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_reduce_scatter_async(hvd_comm* comm, const char* name, const void* sendbuf,
                                    void* recvbuf, hvd_dtype dtype, int32_t ndim,
                                    const int64_t* shape, hvd_reduce_op op, double prescale,
                                    double postscale, const hvd_placement* placement,
                                    hvd_request** request) {
  return guarded([&] {
    hvd_tensor t = tensor_of(HVD_COLLECTIVE_REDUCE_SCATTER, name, sendbuf, recvbuf, dtype, ndim,
                             shape, placement);
    t.op = op;
    t.prescale = prescale;
    t.postscale = postscale;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_alltoall_async(hvd_comm* comm, const char* name, const void* sendbuf, void* recvbuf,
                              hvd_dtype dtype, int32_t ndim, const int64_t* shape,
                              const int64_t* splits, const hvd_placement* placement,
                              hvd_request** request) {
  return guarded([&] {
    hvd_tensor t =
        tensor_of(HVD_COLLECTIVE_ALLTOALL, name, sendbuf, recvbuf, dtype, ndim, shape, placement);
    t.splits = splits;
    return enqueue(comm, &t, 1, request);
  });
}

hvd_status hvd_grouped_async(hvd_comm* comm, const hvd_tensor* tensors, size_t count,
                             hvd_request** requests) {
  return guarded([&] { return enqueue(comm, tensors, count, requests); });
}

hvd_status hvd_request_poll(hvd_request* request, int* done) {
  return guarded([&] {
    if (request == nullptr || done == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or done is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    *done = completion->done() ? 1 : 0;
    return hvd::Status::success();
  });
}

hvd_status hvd_request_wait(hvd_request* request, double timeout_seconds) {
  return guarded([&] {
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->wait(std::chrono::duration<double>(timeout_seconds));
  });
}

hvd_status hvd_request_wait_on_stream(hvd_request* request, void* stream, double timeout_seconds) {
  return guarded([&] {
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->order_stream(stream, std::chrono::duration<double>(timeout_seconds));
  });
}

hvd_status hvd_request_output(hvd_request* request, void** data, int64_t* first_dim) {
  return guarded([&] {
    if (request == nullptr || data == nullptr || first_dim == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request, data or first_dim is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->output(data, first_dim);
  });
}

hvd_status hvd_join_async(hvd_comm* comm, hvd_request** request) {
  return guarded([&] {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
    HVD_RETURN_IF_ERROR(c->usable());
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    HVD_ASSIGN_OR_RETURN(const auto scheduler, c->scheduler());
    HVD_ASSIGN_OR_RETURN(auto completion, scheduler->join());
    *request = request_of(std::move(completion));
    return hvd::Status::success();
  });
}

hvd_status hvd_request_last_joined(hvd_request* request, int* rank) {
  return guarded([&] {
    if (request == nullptr || rank == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or rank is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    return completion->last_joined(rank);
  });
}

hvd_status hvd_request_received_splits(hvd_request* request, int64_t* splits, int count) {
  return guarded([&] {
    if (request == nullptr || splits == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or splits is NULL");
    }
    const auto completion = completion_of(request);
    if (!completion) return unknown_request();
    std::vector<int64_t> received;
    HVD_RETURN_IF_ERROR(completion->received_splits(&received));
    if (count < 0 || static_cast<size_t>(count) < received.size()) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_request_received_splits: splits holds " +
                                                      std::to_string(count) +
                                                      " entries, but the communicator has " +
                                                      std::to_string(received.size()) + " ranks");
    }
    std::copy(received.begin(), received.end(), splits);
    return hvd::Status::success();
  });
}

void hvd_request_free(hvd_request* request) {
  // An unknown handle is ignored: there is no status to report it with.
  if (request != nullptr) (void)requests().remove(reinterpret_cast<uintptr_t>(request));
}

hvd_status hvd_scheduler_stats_get(hvd_comm* comm, hvd_scheduler_stats* stats) {
  return guarded([&] {
    HVD_ASSIGN_OR_RETURN(const std::shared_ptr<Session> c, require(comm));
    if (stats == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "stats is NULL");
    HVD_RETURN_IF_ERROR(
        check_size(stats->struct_size, HVD_SCHEDULER_STATS_SIZE_1_0, "hvd_scheduler_stats"));
    const hvd::core::Scheduler::Stats s = c->scheduler_stats();
    stats->cycles = s.cycles;
    stats->full_negotiations = s.full_negotiations;
    stats->negotiation_seconds = s.negotiation_seconds;
    stats->tensors = s.tensors;
    stats->backend_calls = s.backend_calls;
    return hvd::Status::success();
  });
}

hvd_status hvd_comm_split(hvd_comm* comm, int color, int key, hvd_comm** out) {
  return guarded([&] {
    Communicator::SplitRecord mine;
    mine.color = color < 0 ? -1 : color;
    mine.key = key;
    return split_comm(comm, mine, hvd::Status::success(), "hvd_comm_split", out);
  });
}

hvd_status hvd_comm_create_process_set(hvd_comm* comm, const int* ranks, int count,
                                       hvd_comm** out) {
  return guarded([&]() -> hvd::Status {
    // Every rank takes part, even with a bad list: its record then differs, and every rank fails.
    const int size = hvd_size(comm);
    hvd::Status valid;
    std::vector<int> sorted;
    if (count < 1 || ranks == nullptr) {
      valid = hvd::error(HVD_ERR_INVALID_ARGUMENT,
                         "hvd_comm_create_process_set: no ranks (ranks NULL or count < 1)");
    } else {
      sorted.assign(ranks, ranks + count);
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size() && valid.ok(); ++i) {
        if (sorted[i] < 0 || sorted[i] >= size) {
          valid = hvd::error(HVD_ERR_INVALID_ARGUMENT,
                             "hvd_comm_create_process_set: rank " + std::to_string(sorted[i]) +
                                 " is not a rank of this communicator of " + std::to_string(size));
        } else if (i > 0 && sorted[i] == sorted[i - 1]) {
          valid = hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_comm_create_process_set: rank " +
                                                           std::to_string(sorted[i]) +
                                                           " is listed twice");
        }
      }
    }
    Communicator::SplitRecord mine;
    mine.key = hvd_rank(comm);
    hvd::sdk::Fnv1a fnv;  // of the sorted list: every rank's alike
    for (const int r : sorted) fnv.add(static_cast<uint64_t>(r));
    const uint64_t hash = fnv.digest();
    mine.check = hash | 1;  // a plain split passes 0: never a process set's
    mine.error = valid.code();
    mine.color = valid.ok() && std::binary_search(sorted.begin(), sorted.end(), mine.key) ? 0 : -1;
    return split_comm(comm, mine, valid, "hvd_comm_create_process_set", out);
  });
}

int hvd_comm_job_rank(const hvd_comm* comm, int rank) {
  const auto c = state_of(comm);
  if (!c || rank < 0 || rank >= c->comm().size()) return -1;
  return c->comm().members()[static_cast<size_t>(rank)];
}

const char* hvd_last_error(void) { return t_has_last_error ? t_last_error.c_str() : ""; }

const char* hvd_version(void) { return HVD_VERSION_STRING; }

}  // extern "C"
