// The public C API (hvd.h): a thin hourglass over Communicator. No exception crosses it.
#include <cmath>
#include <string>

#include <atomic>
#include <mutex>

#include "comm/communicator.hpp"
#include "hvd/hvd.h"
#include "scheduler/scheduler.hpp"

// Members are destroyed in reverse: the scheduler stops before the backend it runs on.
struct hvd_comm {
  std::unique_ptr<hvd::core::Communicator> impl;
  std::unique_ptr<hvd::core::Communicator> controller;  // negotiation, when impl cannot carry it
  std::mutex scheduler_mutex;                           // guards starting the scheduler
  std::unique_ptr<hvd::core::Scheduler> scheduler;
  std::atomic<bool> scheduled{false};       // set once the scheduler runs every collective
  std::atomic<uint64_t> blocking_calls{0};  // names blocking calls once they go through it
};

// A request is the completion itself, holding the caller's reference until hvd_request_free:
// one allocation per operation, not two.
namespace {

hvd_request* request_of(std::shared_ptr<hvd::core::Completion> completion) {
  return reinterpret_cast<hvd_request*>(hvd::core::Completion::hold(std::move(completion)));
}
hvd::core::Completion* completion_of(hvd_request* request) {
  return reinterpret_cast<hvd::core::Completion*>(request);
}

// The calling thread's last error. The success path only reads a flag with the cheapest TLS
// model, not the string (whose thread_local needs an init guard): bench/micro times every call.
thread_local std::string t_last_error;
__attribute__((tls_model("initial-exec"))) thread_local bool t_has_last_error = false;

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

hvd::Status require(const hvd_comm* comm) {
  return comm != nullptr && comm->impl ? hvd::Status::success()
                                       : hvd::error(HVD_ERR_INVALID_ARGUMENT, "comm is NULL");
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

hvd::Result<hvd_collective_args> make_args(const void* sendbuf, void* recvbuf, uint64_t count,
                                           hvd_dtype dtype, const hvd_placement* placement) {
  hvd_collective_args args = hvd::core::host_args(sendbuf, recvbuf, count, dtype);
  if (placement != nullptr) {
    HVD_RETURN_IF_ERROR(
        check_size(placement->struct_size, HVD_PLACEMENT_SIZE_1_0, "hvd_placement"));
    args.memory_type = placement->memory_type;
    args.device = placement->device;
    args.stream = placement->stream;
  }
  return args;
}

using hvd::core::OpType;
using hvd::core::Submission;

// A barrier once the scheduler runs: a one-element allreduce in a dtype and op the backend
// takes (token holds any of them).
hvd_collective_args barrier_args(const hvd::core::Plugin& plugin, uint64_t* token) {
  hvd_collective_args args = hvd::core::host_args(token, token, 1, plugin.byte_dtype());
  args.op = plugin.any_reduce_op();
  return args;
}

// The scheduler of `comm`, started on first use (HVD_CYCLE_TIME and friends read then).
hvd::Result<hvd::core::Scheduler*> scheduler_of(hvd_comm* comm) {
  if (comm->scheduled.load(std::memory_order_acquire)) return comm->scheduler.get();
  std::lock_guard<std::mutex> lock(comm->scheduler_mutex);
  if (!comm->scheduler) {
    const hvd::core::EnvLookup env = hvd::core::process_env();
    HVD_ASSIGN_OR_RETURN(auto options, hvd::core::SchedulerOptions::from_env(env));
    // Negotiation moves host bytes: a backend that cannot carry it (NCCL has no host memory; a
    // plugin may lack the dtypes or the op it needs) negotiates through a controller backend
    // (HVD_CONTROLLER, default gloo), made now on every rank alike.
    hvd::core::Collectives* control = comm->impl.get();
    const hvd::core::Plugin& plugin = comm->impl->plugin();
    if (!hvd::core::Scheduler::can_negotiate_over(plugin.capabilities, plugin.dtypes,
                                                  plugin.reduce_ops)) {
      hvd::core::CommOptions controller;
      controller.backend = hvd::core::knob(env, "CONTROLLER").value_or("gloo");
      controller.purpose = "the controller of " + comm->impl->plugin().name;
      HVD_ASSIGN_OR_RETURN(comm->controller, hvd::core::Communicator::create(controller, env));
      control = comm->controller.get();
    }
    HVD_ASSIGN_OR_RETURN(comm->scheduler,
                         hvd::core::Scheduler::start(*comm->impl, *control, std::move(options)));
    comm->scheduled.store(true, std::memory_order_release);
  }
  return comm->scheduler.get();
}

// One tensor of the C API into *s, checked for what the C side alone can get wrong.
hvd::Status submission_of(const hvd_tensor& t, Submission* s) {
  HVD_RETURN_IF_ERROR(check_size(t.struct_size, HVD_TENSOR_SIZE_1_0, "hvd_tensor"));
  if (t.collective < HVD_COLLECTIVE_ALLREDUCE || t.collective > HVD_COLLECTIVE_BROADCAST) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT,
                      "collective " + std::to_string(t.collective) + " is not an hvd_collective");
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, "a shape is NULL or has negative ndim");
  }
  s->name = t.name != nullptr ? t.name : "";
  s->send = t.sendbuf;
  s->recv = t.recvbuf;
  hvd::core::TensorSpec& spec = s->spec;
  spec.type = static_cast<OpType>(t.collective);
  spec.dtype = t.dtype;
  if (t.ndim > 0) spec.shape.assign(t.shape, t.shape + t.ndim);
  spec.op = t.op;
  spec.root = t.root;
  spec.prescale = t.prescale == 0 ? 1 : t.prescale;
  spec.postscale = t.postscale == 0 ? 1 : t.postscale;
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
  HVD_RETURN_IF_ERROR(require(comm));
  if (requests == nullptr || (count > 0 && tensors == nullptr)) {
    return hvd::error(HVD_ERR_INVALID_ARGUMENT, "tensors or requests is NULL");
  }
  if (count == 1) {  // every hvd_*_async call: no group to build
    Submission s;
    HVD_RETURN_IF_ERROR(submission_of(tensors[0], &s));
    HVD_ASSIGN_OR_RETURN(hvd::core::Scheduler * scheduler, scheduler_of(comm));
    HVD_ASSIGN_OR_RETURN(auto completion, scheduler->submit(std::move(s)));
    requests[0] = request_of(std::move(completion));
    return hvd::Status::success();
  }
  std::vector<Submission> group(count);
  for (size_t i = 0; i < count; ++i) HVD_RETURN_IF_ERROR(submission_of(tensors[i], &group[i]));
  HVD_ASSIGN_OR_RETURN(hvd::core::Scheduler * scheduler, scheduler_of(comm));
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

// A blocking collective once the scheduler runs: submitted under a name every rank derives
// alike (the n-th blocking call), then waited for.
hvd::Status through_scheduler(hvd_comm* comm, OpType type, const hvd_collective_args& a) {
  Submission s;
  s.name = "hvd.blocking." + std::to_string(comm->blocking_calls++);
  s.send = a.sendbuf;
  s.recv = a.recvbuf;
  s.spec.type = type;
  s.spec.dtype = a.dtype;
  s.spec.shape = {static_cast<int64_t>(a.count)};
  s.spec.op = a.op;
  s.spec.root = a.root;
  s.spec.memory = a.memory_type;
  s.spec.device = a.device;
  s.stream = a.stream;
  if (a.recv_counts != nullptr) {  // allgatherv: recv holds the counts' sum
    const int size = comm->impl->world().size;
    uint64_t total = 0;
    for (int r = 0; r < size; ++r) {
      if (__builtin_add_overflow(total, a.recv_counts[r], &total)) {
        return hvd::error(HVD_ERR_INVALID_ARGUMENT, "allgatherv: recv_counts overflow");
      }
    }
    s.spec.output_capacity = total;
  }
  HVD_ASSIGN_OR_RETURN(auto completion, comm->scheduler->submit(std::move(s)));
  return completion->wait(std::chrono::duration<double>(-1));
}

// The collective on the backend directly, or through the scheduler once it runs.
template <typename Direct>
hvd::Status collective(hvd_comm* comm, OpType type, const hvd_collective_args& args,
                       Direct&& direct) {
  if (comm->scheduled.load(std::memory_order_acquire)) return through_scheduler(comm, type, args);
  return direct();
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
    HVD_ASSIGN_OR_RETURN(auto impl,
                         hvd::core::Communicator::create(opts, hvd::core::process_env()));
    *comm = new hvd_comm{std::move(impl)};
    return hvd::Status::success();
  });
}

hvd_status hvd_finalize(hvd_comm* comm) {
  return guarded([&] {
    delete comm;
    return hvd::Status::success();
  });
}

int hvd_rank(const hvd_comm* comm) { return comm ? comm->impl->world().rank : -1; }
int hvd_size(const hvd_comm* comm) { return comm ? comm->impl->world().size : -1; }
int hvd_local_rank(const hvd_comm* comm) { return comm ? comm->impl->world().local_rank : -1; }
int hvd_local_size(const hvd_comm* comm) { return comm ? comm->impl->world().local_size : -1; }
uint64_t hvd_backend_capabilities(const hvd_comm* comm) {
  return comm ? comm->impl->plugin().capabilities : 0;
}
uint64_t hvd_backend_dtypes(const hvd_comm* comm) { return comm ? comm->impl->plugin().dtypes : 0; }
uint64_t hvd_backend_reduce_ops(const hvd_comm* comm) {
  return comm ? comm->impl->plugin().reduce_ops : 0;
}
const char* hvd_backend_name(const hvd_comm* comm) {
  return comm ? comm->impl->plugin().name.c_str() : "";
}

hvd_status hvd_allreduce(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    HVD_ASSIGN_OR_RETURN(hvd_collective_args args,
                         make_args(sendbuf, recvbuf, count, dtype, placement));
    args.op = op;
    return collective(comm, OpType::kAllreduce, args, [&] { return comm->impl->allreduce(args); });
  });
}

hvd_status hvd_allgather(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    HVD_ASSIGN_OR_RETURN(const hvd_collective_args args,
                         make_args(sendbuf, recvbuf, count, dtype, placement));
    return collective(comm, OpType::kAllgather, args, [&] { return comm->impl->allgather(args); });
  });
}

hvd_status hvd_allgatherv(hvd_comm* comm, const void* sendbuf, void* recvbuf,
                          const uint64_t* recv_counts, hvd_dtype dtype,
                          const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    if (recv_counts == nullptr)
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
    HVD_ASSIGN_OR_RETURN(hvd_collective_args args,
                         make_args(sendbuf, recvbuf, 0, dtype, placement));
    args.count = recv_counts[comm->impl->world().rank];
    args.recv_counts = recv_counts;
    return collective(comm, OpType::kAllgather, args, [&] { return comm->impl->allgather(args); });
  });
}

hvd_status hvd_broadcast(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, int root, const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    HVD_ASSIGN_OR_RETURN(hvd_collective_args args,
                         make_args(sendbuf, recvbuf, count, dtype, placement));
    args.root = root;
    return collective(comm, OpType::kBroadcast, args, [&] { return comm->impl->broadcast(args); });
  });
}

hvd_status hvd_barrier(hvd_comm* comm) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    if (comm->scheduled.load(std::memory_order_acquire)) {
      uint64_t token = 0;  // a one-element allreduce, in the scheduler's order
      return through_scheduler(comm, OpType::kAllreduce,
                               barrier_args(comm->impl->plugin(), &token));
    }
    return comm->impl->barrier();
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

hvd_status hvd_grouped_async(hvd_comm* comm, const hvd_tensor* tensors, size_t count,
                             hvd_request** requests) {
  return guarded([&] { return enqueue(comm, tensors, count, requests); });
}

hvd_status hvd_request_poll(hvd_request* request, int* done) {
  return guarded([&] {
    if (request == nullptr || done == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request or done is NULL");
    }
    *done = completion_of(request)->done() ? 1 : 0;
    return hvd::Status::success();
  });
}

hvd_status hvd_request_wait(hvd_request* request, double timeout_seconds) {
  return guarded([&] {
    if (request == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request is NULL");
    return completion_of(request)->wait(std::chrono::duration<double>(timeout_seconds));
  });
}

hvd_status hvd_request_output(hvd_request* request, void** data, int64_t* first_dim) {
  return guarded([&] {
    if (request == nullptr || data == nullptr || first_dim == nullptr) {
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "request, data or first_dim is NULL");
    }
    return completion_of(request)->output(data, first_dim);
  });
}

void hvd_request_free(hvd_request* request) {
  if (request != nullptr) hvd::core::Completion::release(completion_of(request));
}

hvd_status hvd_scheduler_stats_get(hvd_comm* comm, hvd_scheduler_stats* stats) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    if (stats == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "stats is NULL");
    HVD_RETURN_IF_ERROR(
        check_size(stats->struct_size, HVD_SCHEDULER_STATS_SIZE_1_0, "hvd_scheduler_stats"));
    hvd::core::Scheduler::Stats s;
    {
      std::lock_guard<std::mutex> lock(comm->scheduler_mutex);
      if (comm->scheduler) s = comm->scheduler->stats();
    }
    stats->cycles = s.cycles;
    stats->full_negotiations = s.full_negotiations;
    stats->negotiation_seconds = s.negotiation_seconds;
    stats->tensors = s.tensors;
    stats->backend_calls = s.backend_calls;
    return hvd::Status::success();
  });
}

const char* hvd_last_error(void) { return t_has_last_error ? t_last_error.c_str() : ""; }

const char* hvd_version(void) { return HVD_VERSION_STRING; }

}  // extern "C"
