// settings.hpp — every HVD_* knob, in one table: its name, whether Horovod's HOROVOD_* spelling
// is taken (every core knob's is), its default, what values it takes and a line of documentation.
// hvd_init reads and checks the core's knobs once (Settings::read); a communicator keeps what its
// world read, and the scheduler, the controller and the communicators split from it use that. The
// table also lists the knobs read elsewhere (the launcher's world variables, the plugins' own), so
// that it is the one list the README's table is checked against.
#ifndef HVD_CORE_BOOTSTRAP_SETTINGS_HPP
#define HVD_CORE_BOOTSTRAP_SETTINGS_HPP

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/env.hpp"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

// The core's knobs, in the table's order.
enum class Knob : uint8_t {
  kBackend,
  kPluginPath,
  kTimeout,
  kCheckArgs,
  kController,
  kHostname,
  kRendezvousAddr,
  kSecret,
  kRendezvousServer,
  kRendezvousIface,
  kBootstrapBackend,
  kHierarchicalAllreduce,
  kHierarchicalChunkBytes,
  kLogLevel,
  kCycleTime,
  kFusionThreshold,
  kCacheCapacity,
  kTimeline,
  kTimelineMarkCycles,
  kStallCheckTimeSeconds,
  kStallCheckDisable,
  kStallShutdownTimeSeconds,
  kDeviceExecutor,
};
constexpr size_t kKnobCount = static_cast<size_t>(Knob::kDeviceExecutor) + 1;

// What values a knob takes.
enum class KnobType : uint8_t {
  kText,       // any text
  kChoice,     // one of `choices`, in any case (kept in lower case)
  kFlag,       // 0 or 1
  kNumber,     // a finite number from `min` to `max`
  kSeconds,    // seconds above 0, at most `max`
  kBytes,      // 0, or a whole number of bytes of at least `min`
  kElsewhere,  // read by the launcher discovery or a plugin, not by Settings
};

struct KnobSpec {
  const char* name;  // HVD_<name>
  bool horovod;      // HOROVOD_<name> is read where HVD_<name> is unset
  KnobType type;
  const char* fallback;  // the default, as the knob would be written; nullptr: none
  double min;
  double max;
  const char* choices;  // kChoice: "a|b|c"
  const char* doc;      // one line
  const char* reader;   // kElsewhere: who reads it
};

// Every knob hvd documents: the core's (in Knob's order), then those read elsewhere.
const std::vector<KnobSpec>& knob_table();
const KnobSpec& spec(Knob knob);

class Settings {
 public:
  // The core's knobs from `env`, each checked against the table: the first one that is not
  // valid is the error, naming the variable as it was set.
  static Result<Settings> read(const EnvLookup& env);
  // The same, keeping every valid knob and each refused one with why (tools that report rather
  // than stop).
  struct Problem {
    Knob knob;
    Status why;
  };
  static Settings read_leniently(const EnvLookup& env, std::vector<Problem>* problems);
  // Every knob at its default (tests, tools that read no environment).
  Settings();

  // The value as set, or the default (empty where there is none).
  const std::string& text(Knob knob) const { return values_[index(knob)]; }
  bool is_set(Knob knob) const { return set_[index(knob)]; }
  // kText knobs without a default: the value, nullopt where unset.
  std::optional<std::string> optional(Knob knob) const;
  bool flag(Knob knob) const { return text(knob) == "1"; }
  double number(Knob knob) const { return numbers_[index(knob)]; }
  std::chrono::milliseconds timeout() const;
  // HOROVOD_<name> where that was read, else HVD_<name>: how errors name the knob.
  const std::string& variable(Knob knob) const { return variables_[index(knob)]; }

  // A copy with `knob` set to `value`, checked as read() checks it (hvdrun's --timeout).
  Result<Settings> with(Knob knob, const std::string& value) const;

 private:
  static size_t index(Knob knob) { return static_cast<size_t>(knob); }
  Status take(Knob knob, const std::string& variable, const std::optional<std::string>& value);

  std::array<std::string, kKnobCount> values_;
  std::array<std::string, kKnobCount> variables_;
  std::array<double, kKnobCount> numbers_{};
  std::array<bool, kKnobCount> set_{};
};

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_SETTINGS_HPP
