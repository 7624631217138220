// rendezvous.hpp — what ranks do through the rendezvous store before any backend runs: exchange
// a value with every rank, and share a store that rank 0 serves.
#ifndef HVD_CORE_BOOTSTRAP_RENDEZVOUS_HPP
#define HVD_CORE_BOOTSTRAP_RENDEZVOUS_HPP

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/settings.hpp"
#include "bootstrap/store.hpp"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

// Publish `value` as `key`/<rank> and collect every rank's, in rank order, within `timeout`.
Result<std::vector<Bytes>> exchange(KvStore& store, const std::string& key, const Bytes& value,
                                    const World& world, std::chrono::milliseconds timeout);

// A rendezvous store served by rank 0 and announced to the other ranks.
struct SharedRendezvous {
  HostPort address;
  std::string secret;
  std::unique_ptr<TcpStoreServer> server;  // on rank 0
};

// Rank 0 serves a store on an address every rank can reach (HVD_RENDEZVOUS_IFACE's, loopback
// for a one-host job, else the first external interface) with a fresh secret, and `broadcast`
// (a collective every rank calls) carries address and secret to the others.
using BroadcastFromRank0 = std::function<Status(void* record, size_t size)>;
Result<SharedRendezvous> share_rendezvous(const World& world, const Settings& settings,
                                          const BroadcastFromRank0& broadcast);

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_RENDEZVOUS_HPP
