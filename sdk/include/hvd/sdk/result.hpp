// hvd/sdk/result.hpp — errors as values for C++ code on either side of the ABI.
//
// Status is a code from hvd/types.h plus a message; Result<T> is a T or a non-success Status.
// Header-only, C++17, used by libhvd, the public C++ wrapper (hvd.hpp) and plugin helpers.
#ifndef HVD_SDK_RESULT_HPP
#define HVD_SDK_RESULT_HPP

#include <cassert>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "hvd/types.h"

namespace hvd {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(hvd_status code, std::string message)
      : code_(code),
        message_(message.empty() ? nullptr : std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& other)
      : code_(other.code_),
        message_(other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) {
      message_ = other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr;
      code_ = other.code_;
    }
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status success() { return {}; }

  bool ok() const { return code_ == HVD_SUCCESS; }
  hvd_status code() const { return code_; }
  const std::string& message() const { return message_ ? *message_ : no_message(); }

  // "timeout: rank 2 did not publish ..." — the code's name and the message.
  std::string to_string() const {
    return ok() ? "success" : std::string(hvd_status_name(code_)) + ": " + message();
  }

  // The same code with context prepended: "loading backend 'gloo': <message>".
  Status with_context(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message());
  }

 private:
  static const std::string& no_message() {
    // Never destroyed: a thread that outlives main (a call walked away from) may still ask.
    static const std::string* const empty = new std::string();
    return *empty;
  }

  // A success, the status of nearly every call, is two words with nothing to free: a message,
  // which errors have, lives on the heap.
  hvd_status code_ = HVD_SUCCESS;
  std::unique_ptr<std::string> message_;
};

inline Status error(hvd_status code, std::string message) { return {code, std::move(message)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(state_).ok() && "a Result holding a Status must hold an error");
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

  // The error; Status::success() when this holds a value.
  Status status() const { return ok() ? Status::success() : std::get<Status>(state_); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace hvd

#define HVD_CONCAT_INNER_(a, b) a##b
#define HVD_CONCAT_(a, b) HVD_CONCAT_INNER_(a, b)

// Return the Status from the enclosing function when `expr` (a Status) is an error.
#define HVD_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::hvd::Status hvd_status_ = (expr);        \
    if (!hvd_status_.ok()) return hvd_status_; \
  } while (0)

// `HVD_ASSIGN_OR_RETURN(auto x, make_x());` binds the value or returns the error.
#define HVD_ASSIGN_OR_RETURN(lhs, expr)                 \
  auto HVD_CONCAT_(hvd_result_, __LINE__) = (expr);     \
  if (!HVD_CONCAT_(hvd_result_, __LINE__).ok())         \
    return HVD_CONCAT_(hvd_result_, __LINE__).status(); \
  lhs = std::move(HVD_CONCAT_(hvd_result_, __LINE__)).value()

#endif  // HVD_SDK_RESULT_HPP
