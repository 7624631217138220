#include "scheduler/timeline.hpp"

#include "common/json.hpp"

#include <cerrno>
#include <cstring>

namespace hvd::core {

Result<std::unique_ptr<Timeline>> Timeline::open(const std::string& path, int rank) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return error(HVD_ERR_SYSTEM,
                 "HVD_TIMELINE: cannot write '" + path + "': " + std::strerror(errno));
  }
  std::fputs("[\n", file);
  return std::unique_ptr<Timeline>(new Timeline(file, rank));
}

Timeline::Timeline(std::FILE* file, int rank) : file_(file), rank_(rank) {
  writer_ = std::thread([this] { write_loop(); });
}

Timeline::~Timeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  wake_.notify_one();
  writer_.join();
  if (dropped_ > 0) {
    std::fprintf(file_,
                 ",\n{\"name\": \"DROPPED %llu EVENTS\", \"ph\": \"i\", \"s\": \"g\", \"ts\": 0, "
                 "\"pid\": %d, \"tid\": 0}",
                 static_cast<unsigned long long>(dropped_), rank_);
  }
  std::fputs("\n]\n", file_);
  std::fclose(file_);
}

void Timeline::span(const std::string& tensor, const char* what, Clock::time_point start,
                    Clock::time_point end) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  push(Event{tensor, what, duration_cast<microseconds>(start - origin_).count(),
             std::max<int64_t>(0, duration_cast<microseconds>(end - start).count())});
}

void Timeline::mark(const char* what, Clock::time_point at) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  push(Event{"", what, duration_cast<microseconds>(at - origin_).count(), -1});
}

void Timeline::push(Event event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.size() >= kMaxQueued) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(event));
  }
  wake_.notify_one();
}

void Timeline::write_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    std::deque<Event> batch;
    batch.swap(queue_);
    const bool closing = closing_;
    lock.unlock();
    for (const Event& e : batch) write(e);
    std::fflush(file_);
    lock.lock();
    if (closing && queue_.empty()) return;
  }
}

void Timeline::write(const Event& e) {
  int track = 0;  // the scheduler's own
  if (!e.tensor.empty()) {
    auto [it, fresh] = tracks_.try_emplace(e.tensor, static_cast<int>(tracks_.size()) + 1);
    track = it->second;
    if (fresh) {
      std::fprintf(file_,
                   "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                   "\"args\": {\"name\": %s}}",
                   first_event_ ? "" : ",\n", rank_, track, json_string(e.tensor).c_str());
      first_event_ = false;
    }
  }
  if (e.duration_us < 0) {
    std::fprintf(file_,
                 "%s{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"p\", \"ts\": %lld, \"pid\": %d, "
                 "\"tid\": 0}",
                 first_event_ ? "" : ",\n", e.what, static_cast<long long>(e.start_us), rank_);
  } else {
    std::fprintf(file_,
                 "%s{\"name\": \"%s\", \"ph\": \"X\", \"ts\": %lld, \"dur\": %lld, \"pid\": %d, "
                 "\"tid\": %d}",
                 first_event_ ? "" : ",\n", e.what, static_cast<long long>(e.start_us),
                 static_cast<long long>(e.duration_us), rank_, track);
  }
  first_event_ = false;
}

}  // namespace hvd::core
