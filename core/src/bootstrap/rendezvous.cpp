#include "bootstrap/rendezvous.hpp"

#include <algorithm>
#include <cstring>

namespace hvd::core {

Result<std::vector<Bytes>> exchange(KvStore& store, const std::string& key, const Bytes& value,
                                    const World& world, std::chrono::milliseconds timeout) {
  HVD_RETURN_IF_ERROR(store.set(key + "/" + std::to_string(world.rank), value));
  const Deadline deadline = deadline_after(timeout);
  std::vector<Bytes> all(static_cast<size_t>(world.size));
  for (int r = 0; r < world.size; ++r) {
    const auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    Result<Bytes> got = store.get(key + "/" + std::to_string(r), left);
    if (!got.ok()) {
      if (got.status().code() == HVD_ERR_TIMEOUT) {
        return error(HVD_ERR_TIMEOUT, "rank " + std::to_string(r) + " did not arrive within " +
                                          std::to_string(timeout.count()) +
                                          " ms (HVD_TIMEOUT): did it start, "
                                          "and does it use the same HVD_RENDEZVOUS_ADDR?");
      }
      // Typically the rendezvous host (rank 0 or hvdrun) gave up or died first.
      return got.status().with_context("while waiting for rank " + std::to_string(r) +
                                       " to arrive");
    }
    all[static_cast<size_t>(r)] = std::move(got).value();
  }
  return all;
}

Result<SharedRendezvous> share_rendezvous(const World& world, const Settings& settings,
                                          const BroadcastFromRank0& broadcast) {
  SharedRendezvous made;
  constexpr size_t kRecord = 512;
  std::vector<char> record(kRecord, '\0');
  if (world.rank == 0) {
    // An address the other ranks can reach: the named interface, loopback when every rank is
    // on this host, else the first interface that is up and not loopback.
    std::string host;
    if (const auto iface = settings.optional(Knob::kRendezvousIface)) {
      HVD_ASSIGN_OR_RETURN(host, interface_address(*iface));
    } else if (world.local_size == world.size) {
      host = "127.0.0.1";
    } else {
      host = first_external_address();
      if (host.empty()) return error(HVD_ERR_SYSTEM, "rank 0 has no network interface that is up");
    }
    made.secret = random_secret();
    HVD_ASSIGN_OR_RETURN(made.server, TcpStoreServer::start(HostPort{host, 0}, made.secret));
    const std::string text = made.server->address().to_string() + "\n" + made.secret;
    std::memcpy(record.data(), text.data(), std::min(text.size(), kRecord - 1));
  }
  HVD_RETURN_IF_ERROR(broadcast(record.data(), kRecord));
  const std::string text(record.data());
  const size_t newline = text.find('\n');
  HVD_ASSIGN_OR_RETURN(made.address, parse_host_port(text.substr(0, newline)));
  made.secret = text.substr(newline + 1);
  return made;
}

}  // namespace hvd::core
