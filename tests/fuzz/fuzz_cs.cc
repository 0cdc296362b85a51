// Fuzz target: the HiXL CS server description a client receives in the
// engine handshake (cs::DecodeInfo). Whatever it accepts must encode and
// decode again to the same content; nothing may crash, leak or read out of
// bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cs/cs_info.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  hixl::cs::ServerInfo info;
  if (!hixl::cs::DecodeInfo(text, info).ok()) return 0;
  hixl::cs::ServerInfo again;
  if (!hixl::cs::DecodeInfo(hixl::cs::EncodeInfo(info), again).ok()) std::abort();
  if (again.endpoints.size() != info.endpoints.size() || again.mems.size() != info.mems.size()) {
    std::abort();
  }
  for (size_t i = 0; i < info.mems.size(); ++i) {
    if (again.mems[i].tag != info.mems[i].tag || again.mems[i].addr != info.mems[i].addr ||
        again.mems[i].size != info.mems[i].size) {
      std::abort();
    }
  }
  return 0;
}
