#include "comm/host_services.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "bootstrap/rendezvous.hpp"
#include "common/log.hpp"

namespace hvd::core {
namespace {

// What a plugin and the host services reported during this thread's current backend call. A
// call that reports nothing touches only the flag (no init guard): bench/micro times every call.
struct CallErrors {
  std::string plugin;
  std::string service;
};
thread_local CallErrors t_call_errors;
thread_local bool t_call_errors_set = false;

}  // namespace

// The store as the plugin's waits see it: a long get is a series of short ones, so that an abort
// ends it within a slice.
class HostServices::Abortable final : public KvStore {
 public:
  explicit Abortable(const HostServices& services) : services_(services) {}
  Status set(const std::string& key, const Bytes& value) override {
    if (aborted()) return refused();
    return services_.store_->set(key, value);
  }
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (aborted()) return refused();
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      const bool last = left <= kAbortSlice;  // a late slice must not leave a sliver to spin on
      Result<Bytes> got = services_.store_->get(key, last ? left : kAbortSlice);
      if (got.ok() || got.status().code() != HVD_ERR_TIMEOUT || last) {
        if (!got.ok() && got.status().code() == HVD_ERR_TIMEOUT) {
          return error(HVD_ERR_TIMEOUT, "rendezvous key '" + key + "' was not published within " +
                                            std::to_string(timeout.count()) + " ms");
        }
        return got;
      }
    }
  }

 private:
  bool aborted() const { return services_.aborted_.load(std::memory_order_acquire); }
  static Status refused() {
    return error(HVD_ERR_STATE, "the communicator was aborted (its host services refuse)");
  }
  const HostServices& services_;
};

struct HostServices::Callbacks {
  static HostServices* of(void* ctx) { return static_cast<HostServices*>(ctx); }

  static hvd_status fail(const Status& status) {
    t_call_errors.service = status.message();
    t_call_errors_set = true;
    return status.code();
  }

  // A self-bootstrapping backend in a job without rendezvous has no store to use.
  static hvd_status no_store() {
    return fail(error(HVD_ERR_STATE, "this job has no rendezvous store (HVD_RENDEZVOUS_ADDR)"));
  }

  static hvd_status kv_set(void* ctx, const char* key, const void* value, size_t size) noexcept {
    if (of(ctx)->store_ == nullptr) return no_store();
    try {
      const char* bytes = static_cast<const char*>(value);
      const Status s = Abortable(*of(ctx)).set(of(ctx)->prefix_ + key, Bytes(bytes, bytes + size));
      return s.ok() ? HVD_SUCCESS : fail(s);
    } catch (const std::exception& e) {
      return fail(error(HVD_ERR_SYSTEM, e.what()));
    }
  }

  static hvd_status kv_get(void* ctx, const char* key, int64_t timeout_ms, void** value,
                           size_t* size) noexcept {
    if (of(ctx)->store_ == nullptr) return no_store();
    try {
      Result<Bytes> got =
          Abortable(*of(ctx)).get(of(ctx)->prefix_ + key, std::chrono::milliseconds(timeout_ms));
      if (!got.ok()) return fail(got.status());
      *size = got->size();
      *value = std::malloc(std::max<size_t>(1, got->size()));
      if (*value == nullptr) return fail(error(HVD_ERR_SYSTEM, "out of memory"));
      if (!got->empty()) std::memcpy(*value, got->data(), got->size());
      return HVD_SUCCESS;
    } catch (const std::exception& e) {
      return fail(error(HVD_ERR_SYSTEM, e.what()));
    }
  }

  static void free_value(void* /*ctx*/, void* value) noexcept { std::free(value); }

  static hvd_status oob_allgather(void* ctx, const void* send, size_t size, void* recv,
                                  int64_t timeout_ms) noexcept {
    if (of(ctx)->store_ == nullptr) return no_store();
    try {
      HostServices* self = of(ctx);
      const std::string key = self->prefix_ + "oob/" + std::to_string(self->oob_calls_++);
      const char* bytes = static_cast<const char*>(send);
      Abortable store(*self);
      Result<std::vector<Bytes>> all =
          exchange(store, key, Bytes(bytes, bytes + size), self->world_,
                   std::chrono::milliseconds(timeout_ms));
      if (!all.ok()) return fail(all.status().with_context("out-of-band allgather"));
      char* out = static_cast<char*>(recv);
      for (size_t r = 0; r < all->size(); ++r) {
        const Bytes& part = (*all)[r];
        if (part.size() != size) {
          return fail(error(HVD_ERR_MISMATCH, "out-of-band allgather: rank " + std::to_string(r) +
                                                  " sent " + std::to_string(part.size()) +
                                                  " bytes, this rank " + std::to_string(size)));
        }
        if (size > 0) std::memcpy(out + r * size, part.data(), size);
      }
      return HVD_SUCCESS;
    } catch (const std::exception& e) {
      return fail(error(HVD_ERR_SYSTEM, e.what()));
    }
  }

  static void log_line(void* /*ctx*/, hvd_log_level level, const char* message) noexcept {
    // A level this hvd does not know (a later minor's) is logged as debug, never louder.
    const bool known = level >= HVD_LOG_ERROR && level <= HVD_LOG_DEBUG;
    try {
      log(known ? level : HVD_LOG_DEBUG, message != nullptr ? message : "");
    } catch (...) {
    }
  }

  static void set_error(void* /*ctx*/, const char* message) noexcept {
    try {
      t_call_errors.plugin = message != nullptr ? message : "";
      t_call_errors_set = true;
    } catch (...) {
    }
  }
};

HostServices::HostServices(KvStore* store, std::string prefix, const World& world)
    : store_(store), prefix_(std::move(prefix)), world_(world) {
  table_.struct_size = sizeof(hvd_host_services);
  table_.ctx = this;
  table_.kv_set = &Callbacks::kv_set;
  table_.kv_get = &Callbacks::kv_get;
  table_.free_value = &Callbacks::free_value;
  table_.oob_allgather = &Callbacks::oob_allgather;
  table_.log = &Callbacks::log_line;
  table_.set_error = &Callbacks::set_error;
}

void begin_backend_call() {
  if (t_call_errors_set) {
    t_call_errors.plugin.clear();
    t_call_errors.service.clear();
    t_call_errors_set = false;
  }
}

hvd_status entry_threw(const std::string& backend, const char* entry, const char* what) noexcept {
  try {
    t_call_errors.plugin = "backend '" + backend + "' let a C++ exception out of its " + entry +
                           " entry (" + what +
                           "): entries must return a status (the SDK's HVD_BACKEND_PLUGIN "
                           "catches exceptions for you)";
    t_call_errors_set = true;
  } catch (...) {
  }
  return HVD_ERR_INTERNAL;
}

std::string backend_call_message(hvd_status code) {
  const CallErrors& errors = t_call_errors;
  std::string message = errors.plugin;
  if (message.empty()) {
    message = std::string("it returned '") + hvd_status_name(code) + "' without a message";
  }
  if (!errors.service.empty() && message.find(errors.service) == std::string::npos) {
    message += " (" + errors.service + ")";
  }
  return message;
}

}  // namespace hvd::core
