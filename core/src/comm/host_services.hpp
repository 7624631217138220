// host_services.hpp — the hvd_host_services table a plugin gets at init (its communicator's keys
// in the rendezvous store, the out-of-band allgather, logging, error messages), and how a
// backend call collects the messages the plugin and these services reported on its thread.
#ifndef HVD_CORE_COMM_HOST_SERVICES_HPP
#define HVD_CORE_COMM_HOST_SERVICES_HPP

#include <atomic>
#include <chrono>
#include <string>

#include "bootstrap/env.hpp"
#include "bootstrap/store.hpp"
#include "hvd/backend.h"

namespace hvd::core {

class HostServices {
 public:
  // `store` may be null (a self-bootstrapping backend in a job without rendezvous): the key-value
  // services then fail with HVD_ERR_STATE. Every key the plugin uses lives under `prefix`.
  HostServices(KvStore* store, std::string prefix, const World& world);
  HostServices(const HostServices&) = delete;
  HostServices& operator=(const HostServices&) = delete;

  // Valid as long as this object.
  const hvd_host_services* table() const { return &table_; }

  // From now on every wait of these services ends within a slice (kAbortSlice) with
  // HVD_ERR_STATE, and later calls fail at once: the host aborted the communicator, and a plugin
  // waiting in the store must not outlive that (any thread).
  void abort() { aborted_.store(true, std::memory_order_release); }
  static constexpr std::chrono::milliseconds kAbortSlice{50};

 private:
  struct Callbacks;
  class Abortable;

  KvStore* store_;
  std::atomic<bool> aborted_{false};
  std::string prefix_;
  World world_;
  std::atomic<uint64_t> oob_calls_{0};
  hvd_host_services table_{};
};

// Before a backend call: forget what earlier calls on this thread reported.
void begin_backend_call();
// After a call that returned `code` (an error): the plugin's message (set_error), or a note that
// it gave none, with a failed host service's own message appended.
std::string backend_call_message(hvd_status code);

// A C++ exception a hand-written table let out of `entry` (the C ABI forbids it): recorded as the
// call's message, naming the backend and the entry, and HVD_ERR_INTERNAL returned.
hvd_status entry_threw(const std::string& backend, const char* entry, const char* what) noexcept;

// Runs one call into a plugin's table; see entry_threw.
template <typename Call>
hvd_status guarded(const std::string& backend, const char* entry, Call&& call) noexcept {
  try {
    return call();
  } catch (const std::exception& e) {
    return entry_threw(backend, entry, e.what());
  } catch (...) {
    return entry_threw(backend, entry, "an exception that is not a std::exception");
  }
}

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_HOST_SERVICES_HPP
