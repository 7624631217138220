// A CUDA device where there is none, for the unit tests of staging and of the device executor.
//
// "Device" memory is host memory. Streams are queues of work that the fake device runs in order,
// events mark a point in a stream, and a stream that waits for an event runs nothing past the
// wait until that point has run. Unpaused, the device runs whatever it can as soon as it is
// queued; paused, it runs nothing until resume(), so a test sees what the host does while the
// device has not caught up. Everything is counted, and misuse (a stream or event of another
// device, an event freed twice) is recorded in `misuse`.
#ifndef HVD_TESTS_FAKE_GPU_HPP
#define HVD_TESTS_FAKE_GPU_HPP

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/device_memory.hpp"
#include "hvd/reduce.h"

namespace hvd::testing {

class FakeDeviceMemory final : public core::DeviceMemory {
 public:
  ~FakeDeviceMemory() override {
    for (auto& [pointer, device] : device_memory_) std::free(pointer);
  }

  // ---- staging: copies queued on a stream, synchronize runs the stream's work ----------------
  Status copy(void* dst, const void* src, size_t bytes, int32_t device, void* stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return Status(HVD_ERR_SYSTEM, "fake: no CUDA device");
    ++copies;
    bytes_copied += bytes;
    devices.insert(device);
    unsynchronized.insert({device, stream});
    return enqueue_locked(device, stream, [dst, src, bytes] {
      if (bytes > 0) std::memcpy(dst, src, bytes);
    });
  }
  // Waits for the stream's work (a paused device runs none) until `deadline`.
  Status synchronize(int32_t device, void* stream,
                     std::chrono::steady_clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (fail) return Status(HVD_ERR_SYSTEM, "fake: no CUDA device");
    devices.insert(device);
    if (synchronizations_until_hang == 0) {
      return Status(HVD_ERR_TIMEOUT, "fake: the stream's work hung (a dead peer's collective)");
    }
    if (synchronizations_until_hang > 0) --synchronizations_until_hang;
    for (;;) {
      run_locked();
      if (stream_locked(device, stream).work.empty()) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status(HVD_ERR_TIMEOUT, "fake: the stream's work did not run by the deadline");
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
    unsynchronized.erase({device, stream});
    return Status::success();
  }

  // Pinned memory is ordinary memory here, counted; with `fail` there is none (as without a GPU).
  void* allocate_pinned(size_t bytes, int32_t /*device*/) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return nullptr;
    ++pinned_allocations;
    ++pinned_live;
    return std::malloc(bytes);
  }
  void free_pinned(void* pointer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    --pinned_live;
    std::free(pointer);
  }

  // ---- streams and events ------------------------------------------------------------------
  Result<void*> create_stream(int32_t device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return Status(HVD_ERR_SYSTEM, "fake: no CUDA device");
    void* handle = reinterpret_cast<void*>(static_cast<uintptr_t>(0x5000 + ++streams_created));
    streams_[handle] = Stream{device, {}, 0, 0};
    ++streams_live;
    return handle;
  }
  void destroy_stream(void* stream, int32_t device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(stream);
    if (it == streams_.end() || it->second.device != device) misuse.push_back("destroy_stream");
    if (it != streams_.end()) {
      if (!it->second.work.empty()) misuse.push_back("stream busy at destroy");
      // Its events stay valid, as CUDA's do: complete (what they marked has run).
      for (Event* e : events_) {
        if (e->stream == &it->second) e->stream = nullptr;
      }
      streams_.erase(it);
    }
    --streams_live;
  }
  Result<void*> create_event(int32_t device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return Status(HVD_ERR_SYSTEM, "fake: no CUDA device");
    auto* event = new Event{device, nullptr, 0};
    events_.insert(event);
    return static_cast<void*>(event);
  }
  void destroy_event(void* event, int32_t device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* e = static_cast<Event*>(event);
    if (events_.erase(e) == 0) {
      misuse.push_back("destroy_event of an unknown event");
      return;
    }
    if (e->device != device) misuse.push_back("destroy_event on another device");
    delete e;
  }
  Status record(void* event, int32_t device, void* stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return Status(HVD_ERR_SYSTEM, "fake: no CUDA device");
    auto* e = static_cast<Event*>(event);
    Stream& s = stream_locked(device, stream);
    if (events_.count(e) == 0 || e->device != device || s.device != device) {
      misuse.push_back("record across devices");
    }
    e->stream = &s;
    e->position = s.queued;
    return Status::success();
  }
  Result<bool> query(void* event, int32_t /*device*/) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_error.ok()) return device_error;
    const auto* e = static_cast<const Event*>(event);
    return e->stream == nullptr || e->stream->ran >= e->position;
  }
  Status wait_event(int32_t device, void* stream, void* event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto* e = static_cast<const Event*>(event);
    Stream& s = stream_locked(device, stream);
    if (e->device != device || s.device != device) misuse.push_back("wait across devices");
    ++waits;
    // What the event marks now, not whatever it marks when the wait runs (re-recorded by then).
    if (e->stream != nullptr) s.work.push_back(Work{nullptr, e->stream, e->position});
    run_locked();
    return Status::success();
  }
  // Allocated at once; freed in stream order, when the device reaches the free.
  void* allocate_device(size_t bytes, int32_t device, void* stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return nullptr;
    (void)stream_locked(device, stream);
    void* pointer = std::malloc(bytes);
    device_memory_[pointer] = device;
    ++device_allocations;
    return pointer;
  }
  void free_device(void* pointer, int32_t device, void* stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = device_memory_.find(pointer);
    if (it == device_memory_.end() || it->second != device) {
      misuse.push_back("free_device of memory it did not allocate there");
      return;
    }
    (void)enqueue_locked(device, stream, [this, pointer] {  // under mutex_, as all work runs
      device_memory_.erase(pointer);
      std::free(pointer);
    });
  }
  Status kernels(int32_t /*device*/) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail || no_kernels) return Status(HVD_ERR_SYSTEM, "fake: no kernel image for the device");
    return Status::success();
  }
  Result<int32_t> current_device() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail) return Status(HVD_ERR_SYSTEM, "fake: no CUDA device");
    return current;
  }
  Status copy_scaled(const core::CopySpan* spans, size_t count, hvd_dtype dtype, double factor,
                     int32_t device, void* stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail || fail_kernels) return Status(HVD_ERR_SYSTEM, "fake: the kernel's launch failed");
    if (factor != 1 && dtype != HVD_FLOAT32 && dtype != HVD_FLOAT64 && dtype != HVD_FLOAT16 &&
        dtype != HVD_BFLOAT16) {
      misuse.push_back("copy_scaled of an integer dtype with a factor");
    }
    launches += (count + kSpansPerLaunch - 1) / kSpansPerLaunch;
    spans_copied += count;
    std::vector<core::CopySpan> copy(spans, spans + count);
    return enqueue_locked(device, stream, [copy, dtype, factor] {
      for (const core::CopySpan& s : copy) scale(s.dst, s.src, s.count, dtype, factor);
    });
  }

  // ---- the test's side ---------------------------------------------------------------------
  // Work of the application's on `stream` (a kernel that writes a tensor, say).
  Status enqueue(int32_t device, void* stream, std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    return enqueue_locked(device, stream, std::move(work));
  }
  void pause() {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = true;
  }
  void resume() {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
    run_locked();
  }
  // Fails every query from now on, as an error on the device does.
  void break_device(Status why) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_error = std::move(why);
  }
  int events_live() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(events_.size());
  }
  size_t device_allocations_live() {
    std::lock_guard<std::mutex> lock(mutex_);
    return device_memory_.size();
  }

  // Read once the work is done.
  bool fail = false;
  bool no_kernels = false;    // streams and events work, hvd's kernels have no code here
  bool fail_kernels = false;  // copy_scaled fails (as a launch that fails)
  int32_t current = 0;        // the device current on every thread
  // Synchronizations that succeed before every later one times out at once (-1: never).
  int synchronizations_until_hang = -1;
  int pinned_allocations = 0;
  int pinned_live = 0;
  int copies = 0;
  uint64_t bytes_copied = 0;
  std::set<int32_t> devices;
  std::set<std::pair<int32_t, void*>> unsynchronized;  // streams copied on, not waited for
  int streams_created = 0, streams_live = 0, waits = 0;
  int device_allocations = 0;
  size_t launches = 0, spans_copied = 0;
  std::vector<std::string> misuse;
  Status device_error;

 private:
  struct Stream;
  struct Work {
    std::function<void()> run;  // null: a wait for `after` to have run `position` items
    const Stream* after = nullptr;
    uint64_t position = 0;
  };
  struct Stream {
    int32_t device;
    std::deque<Work> work;
    uint64_t queued;  // items ever queued
    uint64_t ran;     // items ever run
  };
  struct Event {
    int32_t device;
    const Stream* stream;  // null: never recorded (complete)
    uint64_t position;
  };

  // The stream of that handle: hvd's are created; the application's (any other pointer, null
  // for the default one) come into being when first used, on the device they are used with.
  Stream& stream_locked(int32_t device, void* handle) {
    if (handle == nullptr) handle = reinterpret_cast<void*>(static_cast<uintptr_t>(device + 1));
    auto it = streams_.find(handle);
    if (it == streams_.end()) it = streams_.emplace(handle, Stream{device, {}, 0, 0}).first;
    if (it->second.device != device) misuse.push_back("a stream of another device");
    return it->second;
  }
  Status enqueue_locked(int32_t device, void* stream, std::function<void()> work) {
    Stream& s = stream_locked(device, stream);
    s.work.push_back(Work{std::move(work), nullptr, 0});
    ++s.queued;
    run_locked();
    return Status::success();
  }
  // Runs what may run, in stream order, until nothing more can (unless paused).
  void run_locked() {
    if (paused_) return;
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& [handle, s] : streams_) {
        while (!s.work.empty()) {
          Work& w = s.work.front();
          if (!w.run) {
            if (w.after->ran < w.position) break;
            s.work.pop_front();  // a wait is no item of the stream's count
            progress = true;
            continue;
          }
          const std::function<void()> run = std::move(w.run);
          s.work.pop_front();
          run();
          ++s.ran;
          progress = true;
        }
      }
    }
  }
  // out[i] = in[i] x factor, as the host's and the kernel's arithmetic.
  static void scale(void* out, const void* in, uint64_t count, hvd_dtype dtype, double factor) {
    const size_t bytes = count * hvd_dtype_size(dtype);
    if (factor == 1) {
      if (out != in && bytes > 0) std::memmove(out, in, bytes);
      return;
    }
    for (uint64_t i = 0; i < count; ++i) {
      switch (dtype) {
        case HVD_FLOAT32:
          static_cast<float*>(out)[i] =
              static_cast<const float*>(in)[i] * static_cast<float>(factor);
          break;
        case HVD_FLOAT64:
          static_cast<double*>(out)[i] = static_cast<const double*>(in)[i] * factor;
          break;
        case HVD_FLOAT16:
          static_cast<uint16_t*>(out)[i] =
              hvd_float_to_float16(hvd_float16_to_float(static_cast<const uint16_t*>(in)[i]) *
                                   static_cast<float>(factor));
          break;
        case HVD_BFLOAT16:
          static_cast<uint16_t*>(out)[i] =
              hvd_float_to_bfloat16(hvd_bfloat16_to_float(static_cast<const uint16_t*>(in)[i]) *
                                    static_cast<float>(factor));
          break;
        default:
          break;
      }
    }
  }

  std::mutex mutex_;
  bool paused_ = false;
  std::map<void*, Stream> streams_;
  std::set<Event*> events_;
  std::map<void*, int32_t> device_memory_;
};

}  // namespace hvd::testing

#endif  // HVD_TESTS_FAKE_GPU_HPP
