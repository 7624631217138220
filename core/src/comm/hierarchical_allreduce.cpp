// hierarchical_allreduce.cpp — Communicator's hierarchical allreduce (HVD_HIERARCHICAL_ALLREDUCE):
// a reduce-scatter within each host, an allreduce across hosts and an allgather within each host,
// pipelined in chunks on a thread of its own.
#include "comm/communicator.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/host.hpp"
#include "common/call_checks.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"

namespace hvd::core {

Status Communicator::enable_hierarchical(uint64_t chunk_bytes) {
  // Every rank knows every rank's host: the records need no gather.
  const int n = world_.size;
  std::vector<int> host_of(static_cast<size_t>(n));  // the first rank on each rank's host
  std::vector<int> on_host(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    const auto first = std::find(hosts_.begin(), hosts_.end(), hosts_[static_cast<size_t>(r)]);
    host_of[static_cast<size_t>(r)] = static_cast<int>(first - hosts_.begin());
    ++on_host[static_cast<size_t>(host_of[static_cast<size_t>(r)])];
  }
  const int local = on_host[static_cast<size_t>(host_of[static_cast<size_t>(world_.rank)])];
  bool uniform = local >= 2 && local < n;
  for (int r = 0; r < n; ++r) {
    if (host_of[static_cast<size_t>(r)] == r && on_host[static_cast<size_t>(r)] != local) {
      uniform = false;
    }
  }
  if (!uniform || hosts_.size() != static_cast<size_t>(n)) {
    log(HVD_LOG_INFO,
        "HVD_HIERARCHICAL_ALLREDUCE=1 has no effect: it needs two hosts or more "
        "with the same number of ranks (two or more) on each");
    return Status::success();
  }
  std::vector<SplitRecord> within(static_cast<size_t>(n)), across(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const LocalPlace place = local_place(hosts_, r);
    within[static_cast<size_t>(r)] = SplitRecord{host_of[static_cast<size_t>(r)], r, 0};
    across[static_cast<size_t>(r)] = SplitRecord{place.rank, r, 0};
  }
  HVD_ASSIGN_OR_RETURN(local_, split(within, "HVD_HIERARCHICAL_ALLREDUCE (within the host)"));
  HVD_ASSIGN_OR_RETURN(cross_, split(across, "HVD_HIERARCHICAL_ALLREDUCE (across hosts)"));
  hierarchical_chunk_bytes_ = chunk_bytes;
  log(HVD_LOG_INFO, "hierarchical allreduce: " + std::to_string(local_->size()) +
                        " ranks within each of " + std::to_string(cross_->size()) + " hosts");
  return Status::success();
}

Status Communicator::hierarchical_allreduce(const hvd_collective_args& unstamped) {
  // One deadline for every phase and chunk: each backend call keeps this stamp.
  const hvd_collective_args a = stamped(unstamped);
  // The guards of call(): its phases run on the children, but the call is this communicator's.
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (broken_.load(std::memory_order_relaxed)) return broken_status_;
    if (closing_) return finalized_already("allreduce");
    if (in_call_ || in_hierarchical_) return another_call("allreduce");
    in_hierarchical_ = true;
  }
  struct EndCall {
    Communicator* self;
    ~EndCall() {
      std::lock_guard<std::mutex> lock(self->call_mutex_);
      self->in_hierarchical_ = false;
    }
  } end_call{this};
  const uint64_t L = static_cast<uint64_t>(local_->size());
  const size_t element = hvd_dtype_size(a.dtype);
  const uint64_t tail = a.count % L;  // fewer than L elements: a flat allreduce
  const uint64_t body = a.count - tail;
  uint64_t chunk = hierarchical_chunk_bytes_ / element / L * L;
  if (chunk == 0 || chunk > body) chunk = body;
  const uint64_t chunks = (body + chunk - 1) / chunk;
  if (blocks_.size() < body / L * element) blocks_.resize(body / L * element);
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  // Chunk k: elements [k * chunk, ...) of the buffer, whose reduced block (1/L of it) this rank
  // holds at blocks_ + k * chunk / L between the phases.
  auto length = [&](uint64_t k) { return std::min(chunk, body - k * chunk); };
  auto block = [&](uint64_t k) { return blocks_.data() + k * chunk / L * element; };
  // A phase's exception (no memory for a buffer) becomes its status: the pipeline's second thread
  // must never end the process, and this thread must always reach the join.
  auto caught = [](const char* what, auto&& run) -> Status {
    try {
      return run();
    } catch (const std::exception& e) {
      return error(HVD_ERR_SYSTEM,
                   std::string("hierarchical allreduce, ") + what + ": " + e.what());
    }
  };
  auto reduce_scatter = [&](uint64_t k) {
    hvd_collective_args p = a;
    p.sendbuf = send + k * chunk * element;
    p.recvbuf = block(k);
    p.count = length(k) / L;
    return caught("reduce-scatter within the host", [&] { return local_->reduce_scatter(p); });
  };
  auto allreduce = [&](uint64_t k) {
    hvd_collective_args p = a;
    p.sendbuf = p.recvbuf = block(k);
    p.count = length(k) / L;
    return caught("allreduce across hosts", [&] { return cross_->allreduce(p); });
  };
  auto allgather = [&](uint64_t k) {
    hvd_collective_args p = a;
    p.sendbuf = block(k);
    p.recvbuf = recv + k * chunk * element;
    p.count = length(k) / L;
    return caught("allgather within the host", [&] { return local_->allgather(p); });
  };
  // The phases serve what this call serves, if anything (a blocking hvd_* call), until they end
  // however they end.
  struct Serving {
    Communicator& local;
    Communicator& cross;
    ~Serving() {
      local.end_serving();
      cross.end_serving();
    }
  } serving{*local_, *cross_};
  local_->serve_for(*this);
  cross_->serve_for(*this);
  Status status = Status::success();
  if (chunks <= 1) {
    for (uint64_t k = 0; k < chunks && status.ok(); ++k) {
      status = reduce_scatter(k);
      if (status.ok()) status = allreduce(k);
      if (status.ok()) status = allgather(k);
    }
  } else {
    // Pipelined: a thread of this call runs the cross-host allreduces in chunk order as the
    // reduce-scatters finish; this thread runs the local phases in one order every local rank
    // shares (reduce-scatter k, then allgather k - 1).
    std::mutex mutex;
    std::condition_variable changed;
    uint64_t scattered = 0, reduced = 0;
    bool failed = false;
    std::thread across([&] {
      for (uint64_t k = 0; k < chunks; ++k) {
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return failed || scattered > k; });
          if (failed) return;
        }
        const Status s = allreduce(k);
        std::lock_guard<std::mutex> lock(mutex);
        if (!s.ok()) {
          if (!failed) status = s;
          failed = true;
        } else {
          reduced = k + 1;
        }
        changed.notify_all();
        if (failed) return;
      }
    });
    auto fail = [&](const Status& s) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failed) status = s;
      failed = true;
      changed.notify_all();
    };
    auto gather = [&](uint64_t k) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return failed || reduced > k; });
        if (failed) return false;
      }
      const Status s = allgather(k);
      if (!s.ok()) fail(s);
      return s.ok();
    };
    bool ok = true;
    for (uint64_t k = 0; k < chunks && ok; ++k) {
      const Status s = reduce_scatter(k);
      if (!s.ok()) {
        fail(s);
        ok = false;
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        scattered = k + 1;
        changed.notify_all();
      }
      if (k > 0) ok = gather(k - 1);
    }
    if (ok) (void)gather(chunks - 1);
    across.join();
  }
  if (status.ok() && tail > 0) {
    hvd_collective_args p = a;
    p.sendbuf = send + body * element;
    p.recvbuf = recv + body * element;
    p.count = tail;
    status = call(HVD_COLLECTIVE_ALLREDUCE, "allreduce", &p);
  }
  // A failure in a phase broke that communicator: it breaks this one too, and peers learn.
  if (!status.ok()) abort(status);
  return status;
}

}  // namespace hvd::core
