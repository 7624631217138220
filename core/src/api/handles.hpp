// handles.hpp — what an hvd_comm* or hvd_request* is: a number naming a slot and its generation,
// never a pointer hvd trusts. A handle that was released, or never made, finds nothing (the
// caller gets HVD_ERR_STATE) instead of reading freed memory.
#ifndef HVD_CORE_API_HANDLES_HPP
#define HVD_CORE_API_HANDLES_HPP

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace hvd::core {

template <typename T>
class HandleTable {
 public:
  // A handle no earlier insert returned (until a slot has been reused 2^32 times), never 0.
  uintptr_t insert(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& slot = slots_[index];
    slot.object = std::move(object);
    return encode(index, slot.generation);
  }

  // The object, kept alive for the caller; null for an unknown or released handle.
  std::shared_ptr<T> find(uintptr_t handle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const Slot* slot = slot_of(handle);
    return slot != nullptr ? slot->object : nullptr;
  }

  // Releases the handle (later finds fail) and returns its object; null if it was unknown.
  std::shared_ptr<T> remove(uintptr_t handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot* slot = const_cast<Slot*>(slot_of(handle));
    if (slot == nullptr) return nullptr;
    std::shared_ptr<T> object = std::move(slot->object);
    ++slot->generation;
    free_.push_back(static_cast<uint32_t>(slot - slots_.data()));
    return object;
  }

 private:
  struct Slot {
    uint32_t generation = 1;
    std::shared_ptr<T> object;  // null while free
  };
  static_assert(sizeof(uintptr_t) >= 8, "handles need 64-bit pointers");
  static uintptr_t encode(uint32_t index, uint32_t generation) {
    return (static_cast<uintptr_t>(index) + 1) << 32 | generation;
  }
  const Slot* slot_of(uintptr_t handle) const {
    const uint64_t index = (static_cast<uint64_t>(handle) >> 32) - 1;  // 0 wraps: not found
    if (index >= slots_.size()) return nullptr;
    const Slot& slot = slots_[index];
    const bool current = slot.object && slot.generation == static_cast<uint32_t>(handle);
    return current ? &slot : nullptr;
  }

  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
};

}  // namespace hvd::core

#endif  // HVD_CORE_API_HANDLES_HPP
