#include "hixl/status.h"

#include "hixl/hixl.h"

namespace hixl {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kSuccess: return "SUCCESS";
    case StatusCode::kParamInvalid: return "PARAM_INVALID";
    case StatusCode::kTimeout: return "TIMEOUT";
    case StatusCode::kNotConnected: return "NOT_CONNECTED";
    case StatusCode::kAlreadyConnected: return "ALREADY_CONNECTED";
    case StatusCode::kNotifyFailed: return "NOTIFY_FAILED";
    case StatusCode::kUnsupported: return "UNSUPPORTED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailed: return "FAILED";
    case StatusCode::kCancelled: return "CANCELLED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  std::string s = StatusCodeName(code_);
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

const char* LinkTypeName(LinkType t) {
  switch (t) {
    case LinkType::AUTO: return "AUTO";
    case LinkType::SHM: return "SHM";
    case LinkType::TCP: return "TCP";
    case LinkType::UCX: return "UCX";
  }
  return "UNKNOWN";
}

}  // namespace hixl
