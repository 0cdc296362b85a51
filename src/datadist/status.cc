// Status text, data-type sizes, and the translation of engine statuses.
#include <cstdio>

#include "datadist/status_util.h"
#include "llm_datadist/llm_datadist.h"

namespace llm_datadist {

const char* StatusCodeName(uint32_t code) {
  switch (code) {
    case LLM_SUCCESS: return "LLM_SUCCESS";
    case LLM_FAILED: return "LLM_FAILED";
    case LLM_WAIT_PROC_TIMEOUT: return "LLM_WAIT_PROC_TIMEOUT";
    case LLM_KV_CACHE_NOT_EXIST: return "LLM_KV_CACHE_NOT_EXIST";
    case LLM_PARAM_INVALID: return "LLM_PARAM_INVALID";
    case LLM_NOT_YET_LINK: return "LLM_NOT_YET_LINK";
    case LLM_ALREADY_LINK: return "LLM_ALREADY_LINK";
    case LLM_LINK_FAILED: return "LLM_LINK_FAILED";
    case LLM_UNLINK_FAILED: return "LLM_UNLINK_FAILED";
    case LLM_CLUSTER_NUM_EXCEED_LIMIT: return "LLM_CLUSTER_NUM_EXCEED_LIMIT";
    case LLM_PROCESSING_LINK: return "LLM_PROCESSING_LINK";
    case LLM_EXIST_LINK: return "LLM_EXIST_LINK";
    case LLM_FEATURE_NOT_ENABLED: return "LLM_FEATURE_NOT_ENABLED";
    case LLM_TIMEOUT: return "LLM_TIMEOUT";
    case LLM_OUT_OF_MEMORY: return "LLM_OUT_OF_MEMORY";
    default: return "LLM_UNKNOWN";
  }
}

std::string Status::ToString() const {
  if (ok()) return "LLM_SUCCESS";
  char hex[16];
  std::snprintf(hex, sizeof(hex), "0x%x", code_);
  std::string s = std::string(StatusCodeName(code_)) + " (" + hex + ")";
  if (!message_.empty()) s += ": " + message_;
  return s;
}

size_t DataTypeSize(int32_t t) {
  switch (t) {
    case DT_FLOAT: case DT_INT32: case DT_UINT32: return 4;
    case DT_FLOAT16: case DT_BF16: case DT_INT16: case DT_UINT16: return 2;
    case DT_INT8: case DT_UINT8: case DT_BOOL: return 1;
    case DT_INT64: case DT_UINT64: case DT_DOUBLE: return 8;
    default: return 0;
  }
}

namespace internal {

Status FromHixl(const hixl::Status& s, const std::string& context) {
  if (s.ok()) return Status();
  uint32_t code = LLM_FAILED;
  switch (s.code()) {
    case hixl::StatusCode::kParamInvalid: code = LLM_PARAM_INVALID; break;
    case hixl::StatusCode::kTimeout: code = LLM_TIMEOUT; break;
    case hixl::StatusCode::kNotConnected: code = LLM_NOT_YET_LINK; break;
    case hixl::StatusCode::kAlreadyConnected: code = LLM_ALREADY_LINK; break;
    case hixl::StatusCode::kResourceExhausted: code = LLM_OUT_OF_MEMORY; break;
    case hixl::StatusCode::kUnsupported: code = LLM_FEATURE_NOT_ENABLED; break;
    default: code = LLM_FAILED; break;
  }
  return Status(code, context + ": " + s.ToString());
}

}  // namespace internal
}  // namespace llm_datadist
