// host.hpp — which ranks share a host: hvd's one answer, asked by everything that depends on it
// (local rank and size, a communicator's member-local rank and size, hvdrun's choice of loopback,
// and every later default that groups ranks by host).
//
// A host is a network namespace of one running kernel: HVD_HOSTNAME when set, else the host name
// together with the kernel's boot id and the network namespace. Never the host name alone: the
// network namespaces of one machine share its host name (and containers or cloned machines may
// too) but are different hosts to the network.
#ifndef HVD_CORE_BOOTSTRAP_HOST_HPP
#define HVD_CORE_BOOTSTRAP_HOST_HPP

#include <string>
#include <vector>

#include "bootstrap/settings.hpp"

namespace hvd::core {

// This process's host, as a printable string ("node7 (boot 1f0c..., netns 4026531992)", or
// HVD_HOSTNAME's value). Two processes share a host exactly when their strings are equal.
std::string host_identity(const Settings& settings);

// Where `rank` sits among the ranks of its host, given every rank's host identity in rank order:
// its local rank (how many lower ranks share its host) and local size.
struct LocalPlace {
  int rank = 0;
  int size = 1;
};
LocalPlace local_place(const std::vector<std::string>& identities, int rank);

// Whether `host` (a name or an address, as given to hvdrun's -H or in a hostfile) is the host
// this process runs on: "localhost", a loopback address, or a name or address that resolves to
// an address of one of this network namespace's interfaces.
bool is_this_host(const std::string& host);

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_HOST_HPP
