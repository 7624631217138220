// agreement.hpp — before a backend is initialized, every rank says what it loaded, and every rank
// reaches the same verdict on everyone's choice (docs/plugin-abi.md, section 4).
#ifndef HVD_CORE_COMM_AGREEMENT_HPP
#define HVD_CORE_COMM_AGREEMENT_HPP

#include <string>
#include <vector>

#include "hvd/sdk/result.hpp"
#include "loader/plugin_loader.hpp"

namespace hvd::core {

// What a rank tells the others about its backend at init ("ok\ngloo 0.1.0 (ABI 1.1) [host; dtypes
// all; ...]": name, versions and everything declared; or the load error), and the verdict on
// every rank's choice: the same Status on every rank.
std::string describe_backend_choice(const Result<Plugin>& loaded);
Status check_backend_agreement(const std::vector<std::string>& choices);

}  // namespace hvd::core

#endif  // HVD_CORE_COMM_AGREEMENT_HPP
