// split.cpp — Communicator::split: the children of a communicator (hvd_comm_split, process sets,
// the hierarchical allreduce's local and cross communicators), from the plugin's split where it
// has one, else from init over the members.
#include "comm/communicator.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/host.hpp"
#include "comm/host_services.hpp"
#include "common/call_checks.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/sdk/fnv.hpp"

namespace hvd::core {

Result<std::unique_ptr<Communicator>> Communicator::split(const std::vector<SplitRecord>& records,
                                                          const std::string& what) {
  const int n = world_.size;
  for (int r = 1; r < n; ++r) {
    if (records[static_cast<size_t>(r)].check != records[0].check) {
      return error(HVD_ERR_MISMATCH, what +
                                         ": the ranks passed different arguments (rank 0's and "
                                         "rank " +
                                         std::to_string(r) + "'s differ)");
    }
  }
  const uint64_t ordinal = splits_made_++;
  const SplitRecord& mine = records[static_cast<size_t>(world_.rank)];
  std::unique_ptr<Communicator> child;
  if (mine.color >= 0) {
    // MPI_Comm_split's order: by key, ties by rank here.
    std::vector<int> ranks;
    for (int r = 0; r < n; ++r) {
      if (records[static_cast<size_t>(r)].color == mine.color) ranks.push_back(r);
    }
    std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
      return records[static_cast<size_t>(a)].key < records[static_cast<size_t>(b)].key;
    });
    child.reset(new Communicator);
    Communicator& c = *child;
    c.child_ = true;
    c.settings_ = settings_;
    c.world_ = world_;
    c.world_.size = static_cast<int>(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      const auto r = static_cast<size_t>(ranks[i]);
      if (ranks[i] == world_.rank) c.world_.rank = static_cast<int>(i);
      c.members_.push_back(members_[r]);
      if (r < hosts_.size()) c.hosts_.push_back(hosts_[r]);
    }
    if (c.hosts_.size() == ranks.size()) {
      const LocalPlace place = local_place(c.hosts_, c.world_.rank);
      c.world_.local_rank = place.rank;
      c.world_.local_size = place.size;
    }
    c.plugin_ = plugin_;
    c.timeout_ = timeout_;
    c.store_ = store_;  // in-process, or none
    c.store_where_ = store_where_;
    c.store_secret_ = store_secret_;
    if (store_where_) {
      Result<std::unique_ptr<TcpStoreClient>> client =
          TcpStoreClient::connect(*store_where_, store_secret_, timeout_);
      if (!client.ok()) return client.status().with_context(what + ": the rendezvous store");
      c.store_ = std::move(client).value();
    }
    c.device_memory_ = device_memory_;
    c.host_staging_device_ = host_staging_device_;  // a split child runs on its parent's device
    c.local_address_ = local_address_;
    c.job_local_rank_ = job_local_rank_;
    c.job_local_size_ = job_local_size_;
    c.prefix_ = prefix_;
    // Derived alike on every member: the parent's id, its split ordinal and the color (FNV-1a).
    const uint64_t id = hvd::sdk::Fnv1a()
                            .add(comm_id_)
                            .add(ordinal)
                            .add(static_cast<uint64_t>(mine.color))
                            .digest();
    c.comm_id_ = id;
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id));
    c.services_prefix_ = prefix_ + "comm-" + hex + "/";
  }
  if (plugin_.split == nullptr) {
    // Made afresh over its members, who meet through services of their own.
    if (child) {
      HVD_RETURN_IF_ERROR(child->init_backend().with_context(what));
    }
    return child;
  }
  std::vector<int32_t> members;
  hvd_backend_init_args args{};
  if (child) args = child->prepare_backend(&members);
  hvd_backend_comm* made = nullptr;
  HVD_RETURN_IF_ERROR(call_split(child ? &args : nullptr, &made).with_context(what));
  if (child && made == nullptr) {
    return error(HVD_ERR_INTERNAL,
                 what + ": backend '" + plugin_.name + "' made no communicator in its split");
  }
  if (child) {
    std::lock_guard<std::mutex> lock(child->abort_mutex_);
    child->backend_ = made;
  }
  return child;
}

Status Communicator::call_split(const hvd_backend_init_args* args, hvd_backend_comm** child) {
  const bool abortable = plugin_.abort != nullptr;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (broken_.load(std::memory_order_relaxed)) return broken_status_;
    if (closing_) return finalized_already("split");
    if (in_call_) return another_call("split");
    in_call_ = true;
    // A plugin without abort could only be walked away from, its child left half made: it
    // splits on this thread like init, and the watchdog reports an overrun.
    call_abortable_ = abortable;
    call_what_ = "split";
    call_deadline_ = kUnstamped;
    overran_ = false;
  }
  begin_backend_call();
  const hvd_status code =
      guarded(plugin_.name, "split", [&] { return plugin_.split(backend_, args, child); });
  bool overran = false;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    in_call_ = false;
    overran = overran_ && abortable;
  }
  if (overran) return health();
  if (code == HVD_SUCCESS) return Status::success();
  return broken_by("split", code, backend_call_message(code));
}

}  // namespace hvd::core
