// timeline.hpp — a Chrome trace (chrome://tracing, Perfetto) of what the scheduler did with each
// tensor: NEGOTIATE, QUEUE, MEMCPY_IN_FUSION_BUFFER, the backend op, MEMCPY_OUT_FUSION_BUFFER.
//
// Spans are handed to a writer thread through a bounded queue: recording never blocks the
// scheduler on the disk, and when the writer falls behind, spans are dropped and counted (the
// count is the file's last event).
#ifndef HVD_CORE_SCHEDULER_TIMELINE_HPP
#define HVD_CORE_SCHEDULER_TIMELINE_HPP

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "hvd/sdk/result.hpp"

namespace hvd::core {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxQueued = 1 << 20;

  // Opens `path` for writing; every span is on track `rank`.
  static Result<std::unique_ptr<Timeline>> open(const std::string& path, int rank);
  ~Timeline();  // drains the queue, closes the JSON array, joins the writer
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A finished span of `tensor` (a track of its own), from `start` to `end`.
  void span(const std::string& tensor, const char* what, Clock::time_point start,
            Clock::time_point end);
  // An instant marker on the scheduler's own track ("CYCLE").
  void mark(const char* what, Clock::time_point at);

 private:
  struct Event {
    std::string tensor;  // empty: the scheduler's track
    const char* what;
    int64_t start_us;
    int64_t duration_us;  // < 0: an instant
  };
  Timeline(std::FILE* file, int rank);
  void push(Event event);
  void write_loop();
  void write(const Event& event);

  std::FILE* file_;
  int rank_;
  Clock::time_point origin_ = Clock::now();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Event> queue_;
  bool closing_ = false;
  uint64_t dropped_ = 0;
  std::thread writer_;
  // Writer thread only: each tensor's track id, named once by a metadata event.
  std::unordered_map<std::string, int> tracks_;
  bool first_event_ = true;
};

}  // namespace hvd::core

#endif  // HVD_CORE_SCHEDULER_TIMELINE_HPP
