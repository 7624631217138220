// libFuzzer target: the init record every rank sends at init (comm/agreement.hpp), which a peer
// may send as any bytes, and the verdict on every rank's backend choice made from such records.
//
// Checked beyond "no crash": the host part has no line break; a record formatted from what was
// parsed parses to the same; beside a valid choice, the verdict is an error with a message
// exactly when the parsed choice differs from it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/agreement.hpp"

namespace {

// An invariant that failed is a finding: say which, then crash for libFuzzer to keep the input.
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string record(reinterpret_cast<const char*>(data), size);
  const hvd::core::InitRecord parsed = hvd::core::parse_init_record(record);
  CHECK(parsed.host.find('\n') == std::string::npos);

  if (parsed.host.size() <= 255) {
    hvd::core::World world;
    world.local_rank = parsed.said.rank;
    world.local_size = parsed.said.size;
    const hvd::core::InitRecord again = hvd::core::parse_init_record(
        hvd::core::format_init_record(parsed.host, world, parsed.choice));
    CHECK(again.host == parsed.host);
    CHECK(again.choice == parsed.choice);
    CHECK(again.said.rank == parsed.said.rank && again.said.size == parsed.said.size);
  }

  // Three ranks: this record's choice beside a valid one, in both orders.
  const std::string valid = "ok\ngloo 0.1.0 (ABI 1.1) [host; dtypes all]";
  for (const auto& choices : {std::vector<std::string>{parsed.choice, valid, parsed.choice},
                              std::vector<std::string>{valid, parsed.choice}}) {
    const hvd::Status verdict = hvd::core::check_backend_agreement(choices);
    const bool agree = parsed.choice == valid;
    CHECK(verdict.ok() == agree);
    if (!verdict.ok()) CHECK(!verdict.message().empty());
  }
  return 0;
}
