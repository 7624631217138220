// hvd/sdk/backend.hpp — write a backend plugin as a C++ class; this header makes the C table.
//
//   class MyBackend {
//    public:
//     static hvd::Result<std::unique_ptr<MyBackend>> create(const hvd::sdk::InitContext& ctx);
//     hvd::Status allreduce(const hvd_collective_args& args);
//     hvd::Status allgather(const hvd_collective_args& args);
//     hvd::Status broadcast(const hvd_collective_args& args);
//     hvd::Status barrier();
//
//     // Optional: each one that exists fills its slot of the table.
//     hvd::Status reduce_scatter(const hvd_collective_args& args);
//     hvd::Status alltoall(const hvd_collective_args& args);
//     // A child communicator (args null: this rank joins none; return nullptr then).
//     hvd::Result<std::unique_ptr<MyBackend>> split(const hvd::sdk::InitContext* child);
//     hvd::Status abort();  // called from another thread while a call runs: make it return
//     static constexpr uint64_t dtypes = HVD_DTYPE_BIT(HVD_FLOAT32);  // default: every dtype
//     static constexpr uint64_t reduce_ops = HVD_REDUCE_OP_BIT(HVD_SUM);  // default: every op
//   };
//   HVD_BACKEND_PLUGIN(MyBackend, "mine", "1.0.0", "My fabric", HVD_CAP_HOST_MEMORY)
//
// The generated entry points catch every exception (turning it into HVD_ERR_INTERNAL with the
// exception's text) and pass every error message to the host, so nothing C++ crosses the ABI.
// Destroying the object is the plugin's finalize.
#ifndef HVD_SDK_BACKEND_HPP
#define HVD_SDK_BACKEND_HPP

#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hvd/backend.h"
#include "hvd/sdk/env.hpp"
#include "hvd/sdk/result.hpp"

namespace hvd::sdk {

// The host-services table with C++ signatures. Cheap to copy; valid until finalize.
class Host {
 public:
  Host() = default;
  explicit Host(const hvd_host_services* services) : services_(services) {}

  Status kv_set(const std::string& key, const void* value, size_t size) const {
    return from_call(services_->kv_set(services_->ctx, key.c_str(), value, size),
                     "kv_set('" + key + "')");
  }

  Result<std::vector<char>> kv_get(const std::string& key,
                                   std::chrono::milliseconds timeout) const {
    void* value = nullptr;
    size_t size = 0;
    const hvd_status code =
        services_->kv_get(services_->ctx, key.c_str(), timeout.count(), &value, &size);
    if (code != HVD_SUCCESS) return Status(code, "rendezvous key '" + key + "' not available");
    const char* bytes = static_cast<const char*>(value);
    std::vector<char> copy(bytes, bytes + size);
    services_->free_value(services_->ctx, value);
    return copy;
  }

  Status oob_allgather(const void* send, size_t size, void* recv,
                       std::chrono::milliseconds timeout) const {
    return from_call(services_->oob_allgather(services_->ctx, send, size, recv, timeout.count()),
                     "out-of-band allgather");
  }

  void log(hvd_log_level level, const std::string& message) const {
    services_->log(services_->ctx, level, message.c_str());
  }

  void set_error(const std::string& message) const {
    services_->set_error(services_->ctx, message.c_str());
  }

 private:
  static Status from_call(hvd_status code, const std::string& what) {
    return code == HVD_SUCCESS ? Status::success() : Status(code, what + " failed");
  }

  const hvd_host_services* services_ = nullptr;
};

// Everything a backend learns when a communicator is made (hvd_backend_init_args, with the 1.1
// fields' defaults filled in where the host's struct predates them).
struct InitContext {
  int rank = 0;        // in the communicator
  int size = 1;        // of the communicator
  int local_rank = 0;  // of the process among the job's processes on its host
  int local_size = 1;
  std::chrono::milliseconds timeout{0};
  std::string local_address;
  Host host;
  std::vector<int> members;  // members[i]: the job rank of communicator rank i
  uint64_t comm_id = 0;
  int member_local_rank = 0;  // among the communicator's members on this host
  int member_local_size = 1;

  // The context of `args`, read by its struct_size.
  static InitContext from(const hvd_backend_init_args& args) {
    InitContext c{};
    c.rank = args.rank;
    c.size = args.size;
    c.local_rank = args.local_rank;
    c.local_size = args.local_size;
    c.timeout = std::chrono::milliseconds(args.timeout_ms);
    c.local_address = args.local_address != nullptr ? args.local_address : "";
    c.host = Host(args.host);
    if (HVD_HAS_FIELD(&args, hvd_backend_init_args, member_count) && args.members != nullptr) {
      c.members.assign(args.members, args.members + args.member_count);
    } else {
      for (int r = 0; r < args.size; ++r) c.members.push_back(r);
    }
    if (HVD_HAS_FIELD(&args, hvd_backend_init_args, comm_id)) c.comm_id = args.comm_id;
    if (HVD_HAS_FIELD(&args, hvd_backend_init_args, member_local_size)) {
      c.member_local_rank = args.member_local_rank;
      c.member_local_size = args.member_local_size;
    } else {
      c.member_local_rank = args.local_rank;
      c.member_local_size = args.local_size;
    }
    return c;
  }
};

namespace detail {

// Which optional members a backend class has.
template <typename T, typename = void>
struct has_reduce_scatter : std::false_type {};
template <typename T>
struct has_reduce_scatter<T, std::void_t<decltype(std::declval<T&>().reduce_scatter(
                                 std::declval<const hvd_collective_args&>()))>> : std::true_type {};
template <typename T, typename = void>
struct has_alltoall : std::false_type {};
template <typename T>
struct has_alltoall<T, std::void_t<decltype(std::declval<T&>().alltoall(
                           std::declval<const hvd_collective_args&>()))>> : std::true_type {};
template <typename T, typename = void>
struct has_split : std::false_type {};
template <typename T>
struct has_split<
    T, std::void_t<decltype(std::declval<T&>().split(std::declval<const InitContext*>()))>>
    : std::true_type {};
template <typename T, typename = void>
struct has_abort : std::false_type {};
template <typename T>
struct has_abort<T, std::void_t<decltype(std::declval<T&>().abort())>> : std::true_type {};

template <typename T, typename = void>
struct dtypes_of : std::integral_constant<uint64_t, HVD_DTYPES_1_0> {};
template <typename T>
struct dtypes_of<T, std::void_t<decltype(T::dtypes)>>
    : std::integral_constant<uint64_t, T::dtypes> {};
template <typename T, typename = void>
struct reduce_ops_of : std::integral_constant<uint64_t, HVD_REDUCE_OPS_1_0> {};
template <typename T>
struct reduce_ops_of<T, std::void_t<decltype(T::reduce_ops)>>
    : std::integral_constant<uint64_t, T::reduce_ops> {};

// What hvd_backend_comm* points to: the plugin object and the host to report errors to.
template <typename Backend>
struct Comm {
  std::unique_ptr<Backend> backend;
  Host host;
};

template <typename Backend>
Comm<Backend>* comm_of(hvd_backend_comm* comm) {
  return reinterpret_cast<Comm<Backend>*>(comm);
}

// Run `fn` (returning Status) so that no exception escapes and every error reaches the host.
template <typename Fn>
hvd_status guarded(const Host& host, Fn&& fn) noexcept {
  try {
    const Status status = fn();
    if (!status.ok()) host.set_error(status.message());
    return status.code();
  } catch (const std::exception& e) {
    host.set_error(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    host.set_error("unexpected non-standard exception");
  }
  return HVD_ERR_INTERNAL;
}

template <typename Backend>
hvd_status init(const hvd_backend_init_args* args, hvd_backend_comm** comm) noexcept {
  const Host host(args->host);
  return guarded(host, [&]() -> Status {
    Result<std::unique_ptr<Backend>> created = Backend::create(InitContext::from(*args));
    if (!created.ok()) return created.status();
    *comm =
        reinterpret_cast<hvd_backend_comm*>(new Comm<Backend>{std::move(created).value(), host});
    return Status::success();
  });
}

template <typename Backend>
hvd_status finalize(hvd_backend_comm* comm) noexcept {
  Comm<Backend>* self = comm_of<Backend>(comm);
  const Host host = self->host;
  return guarded(host, [&]() -> Status {
    delete self;
    return Status::success();
  });
}

template <typename Backend, Status (Backend::*Method)(const hvd_collective_args&)>
hvd_status collective(hvd_backend_comm* comm, const hvd_collective_args* args) noexcept {
  Comm<Backend>* self = comm_of<Backend>(comm);
  return guarded(self->host, [&] { return ((*self->backend).*Method)(*args); });
}

template <typename Backend>
hvd_status barrier(hvd_backend_comm* comm) noexcept {
  Comm<Backend>* self = comm_of<Backend>(comm);
  return guarded(self->host, [&] { return self->backend->barrier(); });
}

template <typename Backend>
hvd_status split(hvd_backend_comm* parent, const hvd_backend_init_args* args,
                 hvd_backend_comm** child) noexcept {
  Comm<Backend>* self = comm_of<Backend>(parent);
  *child = nullptr;
  return guarded(self->host, [&]() -> Status {
    std::optional<InitContext> context;
    if (args != nullptr) context = InitContext::from(*args);
    Result<std::unique_ptr<Backend>> made = self->backend->split(context ? &*context : nullptr);
    if (!made.ok()) return made.status();
    if ((*made != nullptr) != context.has_value()) {
      return Status(HVD_ERR_INTERNAL, context ? "split made no child for a rank that joins one"
                                              : "split made a child for a rank that joins none");
    }
    if (context) {
      *child = reinterpret_cast<hvd_backend_comm*>(
          new Comm<Backend>{std::move(made).value(), context->host});
    }
    return Status::success();
  });
}

template <typename Backend>
hvd_status abort(hvd_backend_comm* comm) noexcept {
  Comm<Backend>* self = comm_of<Backend>(comm);
  return guarded(self->host, [&] { return self->backend->abort(); });
}

}  // namespace detail

// The C table for `Backend`. A function-local static: built once, lives for the process.
template <typename Backend>
const hvd_backend_v1* backend_table(const char* name, const char* version, const char* description,
                                    uint64_t capabilities) {
  static const hvd_backend_v1 table = [&] {
    hvd_backend_v1 t{};
    t.struct_size = sizeof(hvd_backend_v1);
    t.abi_major = HVD_BACKEND_ABI_MAJOR;
    t.abi_minor = HVD_BACKEND_ABI_MINOR;
    t.name = name;
    t.version = version;
    t.description = description;
    t.capabilities = capabilities;
    t.init = &detail::init<Backend>;
    t.finalize = &detail::finalize<Backend>;
    t.allreduce = &detail::collective<Backend, &Backend::allreduce>;
    t.allgather = &detail::collective<Backend, &Backend::allgather>;
    t.broadcast = &detail::collective<Backend, &Backend::broadcast>;
    t.barrier = &detail::barrier<Backend>;
    if constexpr (detail::has_reduce_scatter<Backend>::value) {
      t.reduce_scatter = &detail::collective<Backend, &Backend::reduce_scatter>;
      t.capabilities |= HVD_CAP_REDUCE_SCATTER;
    }
    t.dtypes = detail::dtypes_of<Backend>::value;
    t.reduce_ops = detail::reduce_ops_of<Backend>::value;
    if constexpr (detail::has_split<Backend>::value) t.split = &detail::split<Backend>;
    if constexpr (detail::has_abort<Backend>::value) t.abort = &detail::abort<Backend>;
    if constexpr (detail::has_alltoall<Backend>::value) {
      t.alltoall = &detail::collective<Backend, &Backend::alltoall>;
    }
    return t;
  }();
  return &table;
}

}  // namespace hvd::sdk

// Define the plugin's one exported symbol. Use once, at namespace scope, in one source file.
#define HVD_BACKEND_PLUGIN(Backend, name, version, description, capabilities)            \
  extern "C" HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) {        \
    return ::hvd::sdk::backend_table<Backend>(name, version, description, capabilities); \
  }

#endif  // HVD_SDK_BACKEND_HPP
