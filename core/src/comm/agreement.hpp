// agreement.hpp — before a backend is initialized, every rank says what it loaded, and every rank
// reaches the same verdict on everyone's choice (docs/plugin-abi.md, section 4).
#ifndef HVD_CORE_COMM_AGREEMENT_HPP
#define HVD_CORE_COMM_AGREEMENT_HPP

#include <string>
#include <vector>

#include "bootstrap/env.hpp"
#include "bootstrap/host.hpp"
#include "hvd/sdk/result.hpp"
#include "loader/plugin_loader.hpp"

namespace hvd::core {

// What a rank tells the others about its backend at init ("ok\ngloo 0.1.0 (ABI 1.1) [host; dtypes
// all; ...]": name, versions and everything declared; or the load error), and the verdict on
// every rank's choice: the same Status on every rank.
std::string describe_backend_choice(const Result<Plugin>& loaded);
Status check_backend_agreement(const std::vector<std::string>& choices);

// What a rank tells the others at init: its host identity (one line, cut at 255 characters: the
// record through a self-bootstrapping backend has a fixed size), what its launcher said of its
// place on that host, and its backend choice (last: it may have lines of its own).
struct InitRecord {
  std::string host;
  LocalPlace said;  // by the rank's launcher; {0, 1} where the record does not say
  std::string choice;
};
std::string format_init_record(std::string host, const World& world, const std::string& choice);
// Any bytes a peer sent: a malformed record parses to what it holds (an empty choice fails the
// agreement, naming the rank), never to an error or a crash.
InitRecord parse_init_record(const std::string& record);

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_AGREEMENT_HPP
