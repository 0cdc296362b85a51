// What the C API's source files share (c_api.cc defines these): status
// conversion with the thread's last error message, links made on demand,
// request objects and notification checks.
// Thread safety: as the C API's entry points (capi/handles.h); RefreshLocked
// needs the request's mutex held.
#ifndef HIXL_CAPI_CAPI_UTIL_H_
#define HIXL_CAPI_CAPI_UTIL_H_

#include <cstddef>
#include <string>

#include "capi/handles.h"
#include "hixl/hixl.h"
#include "hixl/hixl_c.h"

namespace hixl::capi {

// Sets the last error message and returns code.
HixlStatus Fail(HixlStatus code, std::string msg);
// HIXL_SUCCESS, or s's code with its text as the last error message.
HixlStatus FromCxx(const hixl::Status& s);
HixlStatus Invalid(const std::string& what);

// Connects e to addr ("ip:port") unless a live link exists; ForgetConnection
// drops a stale one so that the next EnsureConnected makes a new link.
hixl::Status EnsureConnected(HixlEngineObj* e, const std::string& addr);
void ForgetConnection(HixlEngineObj* e, const std::string& addr);

// A new request handle of e (tracked); cxx 0 for one that already ended
// with final_status.
RequestImpl* NewRequest(HixlEngineObj* e, hixl::TransferReq cxx, HixlStatus final_status);
// Asks the engine about an unfinished request; r->mu held.
void RefreshLocked(RequestImpl* r);
void DeleteRequest(RequestImpl* r);

// Checks a notification's name and message (hixl_c.h's limits) and builds it.
HixlStatus MakeNotify(const char* name, const void* msg, size_t msg_len, hixl::NotifyDesc& out);

}  // namespace hixl::capi

#endif  // HIXL_CAPI_CAPI_UTIL_H_
