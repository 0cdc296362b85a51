// The calling thread's last error message, shared by the C APIs in libhixl
// (hixl_c.h and hixl_cs.h) and returned by hixlGetLastErrorMessage.
// Thread safety: one string per thread.
#ifndef HIXL_CAPI_LAST_ERROR_H_
#define HIXL_CAPI_LAST_ERROR_H_

#include <string>

namespace hixl::capi {
std::string& LastError();
}  // namespace hixl::capi

#endif  // HIXL_CAPI_LAST_ERROR_H_
