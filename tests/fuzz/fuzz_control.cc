// Fuzz target: the control protocol as a peer's bytes reach an engine —
// frames through FrameReader, every decoded message through every decoder
// (hello, welcome, reject, radd, rdel, rdel_ack, notify, nack). Nothing may
// crash, leak or read out of bounds, whatever the bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/wire.h"
#include "control/protocol.h"

namespace {

void DecodeAll(const hixl::wire::Msg& m) {
  using namespace hixl::control;
  (void)TypeOf(m);
  Hello h;
  (void)DecodeHello(m, h);
  Welcome w;
  (void)DecodeWelcome(m, w);
  (void)DecodeRejectReason(m);
  std::vector<RegionDesc> regions;
  (void)DecodeRegionAdd(m, regions);
  uint64_t seq = 0;
  std::vector<uint64_t> ids;
  (void)DecodeRegionDel(m, seq, ids);
  (void)DecodeRegionDelAck(m, seq);
  std::string name, msg, why;
  (void)DecodeNotify(m, seq, name, msg);
  uint32_t code = 0;
  (void)DecodeNotifyAck(m, seq, code, why);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As a stream: frames split at arbitrary points (the first byte picks the chunk size).
  hixl::wire::FrameReader reader;
  const size_t chunk = size == 0 ? 1 : 1 + data[0] % 61;
  for (size_t off = 0; off < size; off += chunk) {
    reader.Append(data + off, std::min(chunk, size - off));
    for (int i = 0; i < 64; ++i) {
      hixl::wire::Msg m;
      bool has = false;
      if (!reader.Next(m, has).ok() || !has) break;
      DecodeAll(m);
    }
  }
  // As one frame body.
  hixl::wire::Msg m;
  if (hixl::wire::DecodeBody(data, size, m).ok()) DecodeAll(m);
  return 0;
}
