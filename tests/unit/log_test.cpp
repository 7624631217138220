// The logger: HVD_LOG_LEVEL's words as thresholds, and the one line format on stderr.
#include "common/log.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvd::core {
namespace {

// The logger is process-wide: each test leaves it as the process starts with it.
class Log : public ::testing::Test {
 protected:
  void TearDown() override {
    set_log_level("warning");
    set_log_rank(-1);
  }
};

// The levels enabled after set_log_level(word), from the most severe.
std::vector<bool> enabled_after(const std::string& word) {
  set_log_level(word);
  return {log_enabled(HVD_LOG_ERROR), log_enabled(HVD_LOG_WARNING), log_enabled(HVD_LOG_INFO),
          log_enabled(HVD_LOG_DEBUG)};
}

TEST_F(Log, EachWordEnablesItsLevelAndTheMoreSevereOnes) {
  const std::vector<bool> error{true, false, false, false};
  const std::vector<bool> warning{true, true, false, false};
  const std::vector<bool> info{true, true, true, false};
  const std::vector<bool> debug{true, true, true, true};
  EXPECT_EQ(enabled_after("error"), error);
  EXPECT_EQ(enabled_after("warning"), warning);
  EXPECT_EQ(enabled_after("info"), info);
  EXPECT_EQ(enabled_after("debug"), debug);
  // Horovod's words.
  EXPECT_EQ(enabled_after("fatal"), error);
  EXPECT_EQ(enabled_after("trace"), debug);
}

TEST_F(Log, AWordItDoesNotKnowIsTheDefaultWarningNotTheLevelBefore) {
  EXPECT_EQ(enabled_after("debug"), std::vector<bool>(4, true));
  EXPECT_EQ(enabled_after("verbose"), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(enabled_after("error"), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(enabled_after(""), (std::vector<bool>{true, true, false, false}));
}

// What log(level, message) writes to stderr.
std::string logged(hvd_log_level level, const std::string& message) {
  ::testing::internal::CaptureStderr();
  log(level, message);
  return ::testing::internal::GetCapturedStderr();
}

TEST_F(Log, ALineNamesTheRankAndTheLevel) {
  set_log_level("debug");
  set_log_rank(3);
  EXPECT_EQ(logged(HVD_LOG_ERROR, "it broke"), "[hvd rank 3] error: it broke\n");
  EXPECT_EQ(logged(HVD_LOG_WARNING, "careful"), "[hvd rank 3] warning: careful\n");
  EXPECT_EQ(logged(HVD_LOG_INFO, "hello"), "[hvd rank 3] info: hello\n");
  EXPECT_EQ(logged(HVD_LOG_DEBUG, "details"), "[hvd rank 3] debug: details\n");
  set_log_rank(0);
  EXPECT_EQ(logged(HVD_LOG_INFO, "rank zero"), "[hvd rank 0] info: rank zero\n");
}

TEST_F(Log, BeforeTheRankIsKnownALineSaysHvdAlone) {
  set_log_rank(-1);
  EXPECT_EQ(logged(HVD_LOG_ERROR, "early"), "[hvd] error: early\n");
}

TEST_F(Log, AMessageIsWrittenAsItIsNotAsAFormat) {
  set_log_rank(1);
  EXPECT_EQ(logged(HVD_LOG_WARNING, "100% %s %d"), "[hvd rank 1] warning: 100% %s %d\n");
}

TEST_F(Log, LevelsBelowTheThresholdWriteNothing) {
  set_log_rank(2);
  set_log_level("warning");
  EXPECT_EQ(logged(HVD_LOG_INFO, "quiet"), "");
  EXPECT_EQ(logged(HVD_LOG_DEBUG, "quieter"), "");
  set_log_level("error");
  EXPECT_EQ(logged(HVD_LOG_WARNING, "still quiet"), "");
  EXPECT_EQ(logged(HVD_LOG_ERROR, "loud"), "[hvd rank 2] error: loud\n");
}

}  // namespace
}  // namespace hvd::core
