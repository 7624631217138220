// The public C API (hvd.h): a thin hourglass over Communicator. No exception crosses it.
#include <cmath>
#include <string>

#include "communicator.hpp"
#include "hvd/hvd.h"

struct hvd_comm {
  std::unique_ptr<hvd::core::Communicator> impl;
};

namespace {

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

hvd_collective_args make_args(const void* sendbuf, void* recvbuf, uint64_t count, hvd_dtype dtype,
                              const hvd_placement* placement) {
  hvd_collective_args args{};
  args.struct_size = sizeof args;
  args.sendbuf = sendbuf;
  args.recvbuf = recvbuf;
  args.count = count;
  args.dtype = dtype;
  args.memory_type = HVD_MEMORY_HOST;
  args.device = -1;
  if (placement != nullptr) {
    args.memory_type = placement->memory_type;
    args.device = placement->device;
    args.stream = placement->stream;
  }
  return args;
}

}  // namespace

extern "C" {

hvd_status hvd_init(const hvd_init_options* options, hvd_comm** comm) {
  return guarded([&]() -> hvd::Status {
    if (comm == nullptr) return hvd::error(HVD_ERR_INVALID_ARGUMENT, "comm is NULL");
    *comm = nullptr;
    hvd::core::CommOptions opts;
    if (options != nullptr) {
      if (options->struct_size < sizeof(hvd_init_options)) {
        return hvd::error(HVD_ERR_INVALID_ARGUMENT, "hvd_init_options.struct_size is not set");
      }
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
const char* hvd_backend_name(const hvd_comm* comm) {
  return comm ? comm->impl->plugin().name.c_str() : "";
}

hvd_status hvd_allreduce(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, hvd_reduce_op op, const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    hvd_collective_args args = make_args(sendbuf, recvbuf, count, dtype, placement);
    args.op = op;
    return comm->impl->allreduce(args);
  });
}

hvd_status hvd_allgather(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    return comm->impl->allgather(make_args(sendbuf, recvbuf, count, dtype, placement));
  });
}

hvd_status hvd_allgatherv(hvd_comm* comm, const void* sendbuf, void* recvbuf,
                          const uint64_t* recv_counts, hvd_dtype dtype,
                          const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    if (recv_counts == nullptr)
      return hvd::error(HVD_ERR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
    hvd_collective_args args = make_args(sendbuf, recvbuf, 0, dtype, placement);
    args.count = recv_counts[comm->impl->world().rank];
    args.recv_counts = recv_counts;
    return comm->impl->allgather(args);
  });
}

hvd_status hvd_broadcast(hvd_comm* comm, const void* sendbuf, void* recvbuf, uint64_t count,
                         hvd_dtype dtype, int root, const hvd_placement* placement) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    hvd_collective_args args = make_args(sendbuf, recvbuf, count, dtype, placement);
    args.root = root;
    return comm->impl->broadcast(args);
  });
}

hvd_status hvd_barrier(hvd_comm* comm) {
  return guarded([&] {
    HVD_RETURN_IF_ERROR(require(comm));
    return comm->impl->barrier();
  });
}

const char* hvd_last_error(void) { return t_has_last_error ? t_last_error.c_str() : ""; }

const char* hvd_version(void) { return HVD_VERSION_STRING; }

}  // extern "C"
