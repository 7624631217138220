// The timeline: the Chrome trace file it writes, event by event, once it is closed.
#include "scheduler/timeline.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace hvd::core {
namespace {

using namespace std::chrono_literals;
using Clock = Timeline::Clock;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "hvd_timeline_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The file's text with every timestamp replaced by T; the timestamps, in order, in *ts. They
// count from when the timeline opened, which the test cannot know to the microsecond.
std::string without_timestamps(const std::string& text, std::vector<long long>* ts) {
  static const std::regex stamp("\"ts\": (-?[0-9]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), stamp);
       it != std::sregex_iterator(); ++it) {
    ts->push_back(std::stoll((*it)[1]));
  }
  return std::regex_replace(text, stamp, "\"ts\": T");
}

TEST(Timeline, WritesEverySpanAndMarkAsOneJsonArray) {
  const std::string path = temp_path("trace.json");
  const std::string tricky = "grad/\"a\"\\b\tc";  // quotes, a backslash, a control character
  auto opened = Timeline::open(path, 3);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  std::unique_ptr<Timeline> timeline = std::move(opened).value();
  const Clock::time_point t0 = Clock::now();
  timeline->span(tricky, "NEGOTIATE", t0, t0 + 3ms);
  timeline->mark("CYCLE", t0 + 1ms);
  timeline->span("b", "QUEUE", t0 + 2ms, t0 + 1ms);  // ends before it starts: no duration
  timeline->span(tricky, "ALLREDUCE", t0 + 3ms, t0 + 5ms);
  timeline.reset();  // drains what is queued, then closes the array

  std::vector<long long> ts;
  EXPECT_EQ(
      without_timestamps(read_file(path), &ts),
      "[\n"
      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 3, \"tid\": 1, \"args\": "
      "{\"name\": \"grad/\\\"a\\\"\\\\b\\u0009c\"}},\n"
      "{\"name\": \"NEGOTIATE\", \"ph\": \"X\", \"ts\": T, \"dur\": 3000, \"pid\": 3, "
      "\"tid\": 1},\n"
      "{\"name\": \"CYCLE\", \"ph\": \"i\", \"s\": \"p\", \"ts\": T, \"pid\": 3, \"tid\": 0},\n"
      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 3, \"tid\": 2, \"args\": "
      "{\"name\": \"b\"}},\n"
      "{\"name\": \"QUEUE\", \"ph\": \"X\", \"ts\": T, \"dur\": 0, \"pid\": 3, \"tid\": 2},\n"
      "{\"name\": \"ALLREDUCE\", \"ph\": \"X\", \"ts\": T, \"dur\": 2000, \"pid\": 3, "
      "\"tid\": 1}\n"
      "]\n");
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_GE(ts[0], 0);  // t0 came after the timeline opened
  EXPECT_EQ(ts[1] - ts[0], 1000);
  EXPECT_EQ(ts[2] - ts[0], 2000);
  EXPECT_EQ(ts[3] - ts[0], 3000);
  std::remove(path.c_str());
}

TEST(Timeline, ATimelineWithNothingInItIsAnEmptyArray) {
  const std::string path = temp_path("empty.json");
  {
    auto opened = Timeline::open(path, 0);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  }
  EXPECT_EQ(read_file(path), "[\n\n]\n");
  std::remove(path.c_str());
}

TEST(Timeline, EveryEventRecordedBeforeTheCloseIsInTheFile) {
  const std::string path = temp_path("many.json");
  constexpr int kSpans = 5000;
  {
    auto opened = Timeline::open(path, 1);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < kSpans; ++i) {
      (*opened)->span("t" + std::to_string(i % 7), "MEMCPY_IN_FUSION_BUFFER", t0, t0 + 1us);
    }
  }
  const std::string text = read_file(path);
  size_t spans = 0;
  for (size_t at = text.find("\"ph\": \"X\""); at != std::string::npos;
       at = text.find("\"ph\": \"X\"", at + 1)) {
    ++spans;
  }
  EXPECT_EQ(spans, static_cast<size_t>(kSpans));
  EXPECT_EQ(text.find("DROPPED"), std::string::npos);
  EXPECT_NE(text.find("\"tid\": 7, \"args\": {\"name\": \"t6\"}"), std::string::npos);
  EXPECT_EQ(text.find("\"tid\": 8"), std::string::npos);  // seven tensors, seven tracks
  std::remove(path.c_str());
}

TEST(Timeline, AFileItCannotWriteIsAnErrorNamingIt) {
  const std::string path = "/nonexistent-hvd-dir/trace.json";
  auto opened = Timeline::open(path, 0);
  EXPECT_EQ(opened.status().code(), HVD_ERR_SYSTEM);
  EXPECT_EQ(opened.status().message(),
            "HVD_TIMELINE: cannot write '" + path + "': No such file or directory");
}

}  // namespace
}  // namespace hvd::core
