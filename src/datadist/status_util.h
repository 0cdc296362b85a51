// Helpers shared by the datadist sources: building statuses and translating
// the engine's (the engine's words are kept in the message).
#ifndef HIXL_DATADIST_STATUS_UTIL_H_
#define HIXL_DATADIST_STATUS_UTIL_H_

#include <string>

#include "hixl/status.h"
#include "llm_datadist/llm_datadist.h"

namespace llm_datadist::internal {

inline Status ParamInvalid(std::string m) { return Status(LLM_PARAM_INVALID, std::move(m)); }
inline Status NotExist(std::string m) { return Status(LLM_KV_CACHE_NOT_EXIST, std::move(m)); }
inline Status Failed(std::string m) { return Status(LLM_FAILED, std::move(m)); }

// context: what was being done ("pull from cluster 2"). TIMEOUT maps to
// LLM_TIMEOUT, NOT_CONNECTED to LLM_NOT_YET_LINK, PARAM_INVALID to
// LLM_PARAM_INVALID, RESOURCE_EXHAUSTED to LLM_OUT_OF_MEMORY, the rest to
// LLM_FAILED.
Status FromHixl(const hixl::Status& s, const std::string& context);

}  // namespace llm_datadist::internal

#endif  // HIXL_DATADIST_STATUS_UTIL_H_
