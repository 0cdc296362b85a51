// The string form of a C API memory handle, which applications pass between
// processes: the owner engine's address and generation, the region's
// address, length and permissions, and an FNV-1a checksum that catches
// truncation and corruption (not forgery: the owner enforces bounds and
// permissions). Parsing is strict: every field is checked, any other format
// is refused with a message saying why.
// Thread safety: stateless functions.
#ifndef HIXL_CAPI_MEM_HANDLE_STRING_H_
#define HIXL_CAPI_MEM_HANDLE_STRING_H_

#include <cstdint>
#include <string>

#include "hixl/status.h"

namespace hixl::capi {

struct MemHandleFields {
  std::string engine_addr;  // "ip:port"
  uint64_t generation = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t perms = 0;
};

std::string SerializeMemHandle(const MemHandleFields& m);
// PARAM_INVALID ("memory handle string is invalid (...)") unless s is exactly
// what SerializeMemHandle produces for valid fields.
Status ParseMemHandle(const std::string& s, MemHandleFields& m);

}  // namespace hixl::capi

#endif  // HIXL_CAPI_MEM_HANDLE_STRING_H_
