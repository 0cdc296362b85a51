// Fuzz target: serialized memory handles of the C API
// (hixlMemHandleDeserialize), the strings applications pass between
// processes. Syntax, ranges and checksum are checked; nothing may crash,
// leak or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hixl/hixl.h"

namespace {

HixlEngine Engine() {
  static HixlEngine engine = [] {
    HixlConfig cfg = nullptr;
    HixlEngine e = nullptr;
    if (hixlCreateConfig(&cfg) != HIXL_SUCCESS) std::abort();
    if (hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1") != HIXL_SUCCESS) std::abort();
    if (hixlCreateEngine(cfg, &e) != HIXL_SUCCESS) std::abort();
    hixlDestroyConfig(cfg);
    return e;
  }();
  return engine;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string s(reinterpret_cast<const char*>(data), size);  // embedded NULs cut it short, as in C
  HixlMemHandle h = nullptr;
  if (hixlMemHandleDeserialize(Engine(), s.c_str(), &h) == HIXL_SUCCESS) {
    (void)hixlMemHandleGetSize(h);
    (void)hixlMemHandleGetEngine(h);
    (void)hixlMemHandleSerialize(h);
    (void)hixlUnregisterMemory(Engine(), h);
  }
  return 0;
}
