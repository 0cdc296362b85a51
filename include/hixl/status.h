// hixl/status.h — the result type every hixl C++ call returns.
//
// A Status is a code (the HiXL status codes) plus a human-readable message
// saying what went wrong and, where it helps, what to do about it. OK carries
// no message and allocates nothing.
//
// Thread safety: a Status is a plain value; distinct objects may be used from
// any thread. Ownership: it owns its message string.
#ifndef HIXL_STATUS_H_
#define HIXL_STATUS_H_

#include <cstdint>
#include <string>
#include <utility>

#if defined(__GNUC__)
#define HIXL_EXPORT [[gnu::visibility("default")]]
#else
#define HIXL_EXPORT
#endif

namespace hixl {

// Stable numeric codes (they appear in the C API and in logs; never renumber).
enum class StatusCode : uint32_t {
  kSuccess = 0,
  kParamInvalid = 1,       // an argument is wrong: fix the call
  kTimeout = 2,            // a deadline passed: the operation stopped
  kNotConnected = 3,       // no link to that peer: Connect first
  kAlreadyConnected = 4,   // Connect to a peer that is already connected
  kNotifyFailed = 5,       // a notification could not be delivered
  kUnsupported = 6,        // not possible with this build, link or peer
  kResourceExhausted = 7,  // a limit or queue is full: retry later
  kFailed = 8,             // anything else: the message says what
  kCancelled = 9,          // the caller cancelled the request
};

// Short upper-case name of a code, e.g. "PARAM_INVALID".
HIXL_EXPORT const char* StatusCodeName(StatusCode code);

class [[nodiscard]] HIXL_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status ParamInvalid(std::string m) { return {StatusCode::kParamInvalid, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status NotConnected(std::string m) { return {StatusCode::kNotConnected, std::move(m)}; }
  static Status AlreadyConnected(std::string m) {
    return {StatusCode::kAlreadyConnected, std::move(m)};
  }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Failed(std::string m) { return {StatusCode::kFailed, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kSuccess; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "SUCCESS" or "PARAM_INVALID: descriptor 3 ...".
  std::string ToString() const;

  bool operator==(StatusCode c) const { return code_ == c; }

 private:
  StatusCode code_ = StatusCode::kSuccess;
  std::string message_;
};

}  // namespace hixl

#endif  // HIXL_STATUS_H_
