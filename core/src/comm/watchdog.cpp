#include "comm/watchdog.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace hvd::core {
namespace {

// Lives as long as the process (never destroyed, so no thread is joined at exit); its thread
// sleeps without a timeout while nothing is watched.
struct Dog {
  std::mutex mutex;  // held while checking: unwatch() waits for a check in progress
  std::condition_variable changed;
  std::vector<Watchdog::Watched*> watched;

  Dog() {
    std::thread([this] { loop(); }).detach();
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      if (watched.empty()) {
        changed.wait(lock, [&] { return !watched.empty(); });
      }
      changed.wait_for(lock, Watchdog::kPeriod);
      const auto now = Watchdog::Clock::now();
      for (Watchdog::Watched* w : watched) {
        try {
          w->check(now);
        } catch (...) {  // out of memory for a message: that check waits for the next period
        }
      }
    }
  }
};

Dog& dog() {
  static Dog* const instance = new Dog;  // NOLINT: deliberately never destroyed
  return *instance;
}

}  // namespace

void Watchdog::watch(Watched* watched) {
  Dog& d = dog();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.watched.push_back(watched);
  d.changed.notify_all();
}

void Watchdog::unwatch(Watched* watched) {
  Dog& d = dog();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.watched.erase(std::remove(d.watched.begin(), d.watched.end(), watched), d.watched.end());
}

}  // namespace hvd::core
