#include "bootstrap/settings.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "fake_env.hpp"

namespace hvd::core {
namespace {

Status refused(std::map<std::string, std::string> vars) {
  return Settings::read(fake_env(std::move(vars))).status();
}

TEST(Settings, EveryCoreKnobHasItsDefaultWhenNothingIsSet) {
  const Result<Settings> s = Settings::read(fake_env({}));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->text(Knob::kBackend), "gloo");
  EXPECT_EQ(s->timeout().count(), 30000);
  EXPECT_FALSE(s->flag(Knob::kCheckArgs));
  EXPECT_TRUE(s->flag(Knob::kDeviceExecutor));
  EXPECT_EQ(s->number(Knob::kCycleTime), 1);
  EXPECT_EQ(s->number(Knob::kFusionThreshold), 134217728);
  EXPECT_EQ(s->number(Knob::kHierarchicalChunkBytes), 2097152);
  EXPECT_EQ(s->text(Knob::kRendezvousServer), "rank0");
  EXPECT_FALSE(s->optional(Knob::kRendezvousAddr).has_value());
  EXPECT_FALSE(s->is_set(Knob::kBackend));
  // The table's order is Knob's: each enumerator has its own row.
  const std::map<Knob, std::string> names = {
      {Knob::kBackend, "BACKEND"},
      {Knob::kPluginPath, "PLUGIN_PATH"},
      {Knob::kTimeout, "TIMEOUT"},
      {Knob::kCheckArgs, "CHECK_ARGS"},
      {Knob::kController, "CONTROLLER"},
      {Knob::kHostname, "HOSTNAME"},
      {Knob::kRendezvousAddr, "RENDEZVOUS_ADDR"},
      {Knob::kSecret, "SECRET"},
      {Knob::kRendezvousServer, "RENDEZVOUS_SERVER"},
      {Knob::kRendezvousIface, "RENDEZVOUS_IFACE"},
      {Knob::kBootstrapBackend, "BOOTSTRAP_BACKEND"},
      {Knob::kHierarchicalAllreduce, "HIERARCHICAL_ALLREDUCE"},
      {Knob::kHierarchicalChunkBytes, "HIERARCHICAL_CHUNK_BYTES"},
      {Knob::kLogLevel, "LOG_LEVEL"},
      {Knob::kCycleTime, "CYCLE_TIME"},
      {Knob::kFusionThreshold, "FUSION_THRESHOLD"},
      {Knob::kCacheCapacity, "CACHE_CAPACITY"},
      {Knob::kTimeline, "TIMELINE"},
      {Knob::kTimelineMarkCycles, "TIMELINE_MARK_CYCLES"},
      {Knob::kStallCheckTimeSeconds, "STALL_CHECK_TIME_SECONDS"},
      {Knob::kStallCheckDisable, "STALL_CHECK_DISABLE"},
      {Knob::kStallShutdownTimeSeconds, "STALL_SHUTDOWN_TIME_SECONDS"},
      {Knob::kDeviceExecutor, "DEVICE_EXECUTOR"},
  };
  ASSERT_EQ(names.size(), kKnobCount);
  for (const auto& [knob, name] : names) {
    EXPECT_EQ(spec(knob).name, name);
    EXPECT_NE(spec(knob).type, KnobType::kElsewhere) << name;
  }
  for (size_t i = kKnobCount; i < knob_table().size(); ++i) {
    EXPECT_EQ(knob_table()[i].type, KnobType::kElsewhere) << knob_table()[i].name;
  }
}

TEST(Settings, HvdNameWinsOverHorovodNameWhereHorovodHasTheKnob) {
  auto timeout = [](std::map<std::string, std::string> vars) {
    return Settings::read(fake_env(std::move(vars)))->timeout().count();
  };
  EXPECT_EQ(timeout({{"HVD_TIMEOUT", "1"}, {"HOROVOD_TIMEOUT", "2"}}), 1000);
  EXPECT_EQ(timeout({{"HOROVOD_TIMEOUT", "2"}}), 2000);
  EXPECT_TRUE(Settings::read(fake_env({{"HOROVOD_CHECK_ARGS", "1"}}))->flag(Knob::kCheckArgs));
  EXPECT_EQ(Settings::read(fake_env({{"HOROVOD_CYCLE_TIME", "5"}}))->variable(Knob::kCycleTime),
            "HOROVOD_CYCLE_TIME");
  EXPECT_EQ(Settings::read(fake_env({{"HVD_CYCLE_TIME", "5"}, {"HOROVOD_CYCLE_TIME", "x"}}))
                ->number(Knob::kCycleTime),
            5);
}

TEST(Settings, ParsesSecondsAndRejectsNonsense) {
  EXPECT_EQ(Settings::read(fake_env({{"HVD_TIMEOUT", "2.5"}}))->timeout().count(), 2500);
  EXPECT_EQ(Settings::read(fake_env({{"HVD_TIMEOUT", "1e7"}}))->timeout().count(), 10000000000);
  EXPECT_EQ(refused({{"HVD_TIMEOUT", "0"}}).code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(
      refused({{"HVD_TIMEOUT", "soon"}}).message(),
      "HVD_TIMEOUT='soon' is not a number of seconds above 0 and at most 10000000 (115 days)");
  EXPECT_EQ(refused({{"HVD_TIMEOUT", "1e9"}}).message(),
            "HVD_TIMEOUT='1e9' is not a number of seconds above 0 and at most 10000000 (115 days)");
  // An error names the variable the user set: Horovod's spelling where only that is set.
  EXPECT_EQ(
      refused({{"HOROVOD_TIMEOUT", "0"}}).message(),
      "HOROVOD_TIMEOUT='0' is not a number of seconds above 0 and at most 10000000 (115 days)");
}

TEST(Settings, EveryKindOfKnobIsChecked) {
  EXPECT_EQ(refused({{"HVD_CHECK_ARGS", "yes"}}).message(), "HVD_CHECK_ARGS='yes' is not 0 or 1");
  EXPECT_EQ(refused({{"HOROVOD_STALL_CHECK_DISABLE", "2"}}).message(),
            "HOROVOD_STALL_CHECK_DISABLE='2' is not 0 or 1");
  EXPECT_EQ(refused({{"HVD_TIMELINE_MARK_CYCLES", "true"}}).message(),
            "HVD_TIMELINE_MARK_CYCLES='true' is not 0 or 1");
  EXPECT_EQ(refused({{"HVD_CYCLE_TIME", "-1"}}).message(),
            "HVD_CYCLE_TIME='-1' is not a number from 0 to 1000000");
  EXPECT_EQ(refused({{"HOROVOD_FUSION_THRESHOLD", "64MB"}}).message(),
            "HOROVOD_FUSION_THRESHOLD='64MB' is not a number from 0 to 1099511627776");
  EXPECT_EQ(refused({{"HVD_FUSION_THRESHOLD", "1e30"}}).message(),
            "HVD_FUSION_THRESHOLD='1e30' is not a number from 0 to 1099511627776");
  EXPECT_EQ(refused({{"HVD_HIERARCHICAL_CHUNK_BYTES", "1000"}}).message(),
            "HVD_HIERARCHICAL_CHUNK_BYTES='1000' is not 0 or a byte count of at least 65536");
  EXPECT_EQ(refused({{"HVD_LOG_LEVEL", "loud"}}).message(),
            "HVD_LOG_LEVEL='loud' is not one of error, warning, info, debug, trace or fatal (in "
            "any case)");
  EXPECT_EQ(refused({{"HVD_RENDEZVOUS_SERVER", "rank1"}}).message(),
            "HVD_RENDEZVOUS_SERVER='rank1' is not one of rank0 or external (in any case)");
  // Horovod's launcher writes its log level in upper case.
  EXPECT_EQ(Settings::read(fake_env({{"HOROVOD_LOG_LEVEL", "INFO"}}))->text(Knob::kLogLevel),
            "info");
  const Result<Settings> s = Settings::read(fake_env({{"HVD_HIERARCHICAL_CHUNK_BYTES", "0"},
                                                      {"HVD_STALL_CHECK_TIME_SECONDS", "0.5"},
                                                      {"HOROVOD_LOG_LEVEL", "trace"}}));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->number(Knob::kHierarchicalChunkBytes), 0);
  EXPECT_EQ(s->number(Knob::kStallCheckTimeSeconds), 0.5);
  EXPECT_EQ(s->text(Knob::kLogLevel), "trace");
}

TEST(Settings, WithChecksTheOneValueAsReadDoes) {
  EXPECT_EQ(Settings().with(Knob::kTimeout, "2")->timeout().count(), 2000);
  EXPECT_EQ(Settings().with(Knob::kTimeout, "-1").status().message(),
            "HVD_TIMEOUT='-1' is not a number of seconds above 0 and at most 10000000 (115 days)");
}

// The README's configuration table and the knob table list the same variables, and every
// default the README gives for a core knob is the table's.
TEST(Settings, TheReadmesTableIsTheKnobTable) {
  std::ifstream file(std::string(HVD_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  const std::string readme = text.str();
  const size_t start = readme.find("## Configuration");
  ASSERT_NE(start, std::string::npos);
  const size_t end = readme.find("\n## ", start + 1);
  std::istringstream table(readme.substr(start, end - start));
  std::set<std::string> documented;
  std::map<std::string, std::string> defaults;
  const std::regex variable("`HVD_([A-Z0-9_]+)`");
  for (std::string line; std::getline(table, line);) {
    if (line.rfind("| `", 0) != 0) continue;  // the header, the rule, the prose
    EXPECT_EQ(line.rfind("| `HVD_", 0), 0u) << "a row that names no HVD_ variable: " << line;
    const size_t first_cell_end = line.find(" | ");
    ASSERT_NE(first_cell_end, std::string::npos) << line;
    const std::string names = line.substr(0, first_cell_end);
    const size_t last_bar = line.rfind(" |");
    const size_t default_start = line.rfind("| ", last_bar - 1);
    const std::string fallback = line.substr(default_start + 2, last_bar - default_start - 2);
    for (auto it = std::sregex_iterator(names.begin(), names.end(), variable);
         it != std::sregex_iterator(); ++it) {
      documented.insert((*it)[1]);
      defaults[(*it)[1]] = fallback;
    }
  }
  std::set<std::string> tabled;
  for (const KnobSpec& knob : knob_table()) tabled.insert(knob.name);
  for (const std::string& name : tabled) {
    EXPECT_EQ(documented.count(name), 1u) << "HVD_" << name << " has no row in README.md";
  }
  for (const std::string& name : documented) {
    EXPECT_EQ(tabled.count(name), 1u)
        << "README.md documents HVD_" << name << ", which is not in the knob table (settings.cpp)";
  }
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobSpec& knob = knob_table()[i];
    if (knob.fallback == nullptr || documented.count(knob.name) == 0) continue;
    EXPECT_EQ(defaults[knob.name].rfind(std::string("`") + knob.fallback + "`", 0), 0u)
        << "README.md gives HVD_" << knob.name << " the default " << defaults[knob.name]
        << ", the knob table " << knob.fallback;
  }
}

}  // namespace
}  // namespace hvd::core
