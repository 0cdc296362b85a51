// Fuzz target: what an LLM-DataDist instance reads from peers — the
// handshake info string, the cache-table root and table (read one-sidedly
// from the peer's memory), and transfer-event notifications (possibly in
// parts). The first byte picks which; nothing may crash, leak or read out
// of bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "datadist/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llm_datadist::internal;
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  ++data;
  --size;
  switch (which) {
    case 0: {
      InstanceInfo info;
      (void)DecodeInfo(std::string(reinterpret_cast<const char*>(data), size), info);
      break;
    }
    case 1: {
      if (size >= kRootSize) {
        Root r;
        (void)DecodeRoot(data, r);
      }
      break;
    }
    case 2: {
      Table t;
      (void)DecodeTable(data, size, t);
      break;
    }
    default: {
      // A sequence of event parts: each prefixed by a 2-byte length.
      EventAssembler a;
      size_t off = 0;
      for (int i = 0; i < 256 && off + 2 <= size; ++i) {
        size_t n = (static_cast<size_t>(data[off]) | static_cast<size_t>(data[off + 1]) << 8) % 1100;
        off += 2;
        n = std::min(n, size - off);
        EventMsg out;
        std::string why;
        (void)a.Feed(i % 3 == 0 ? "a" : "b", std::string(reinterpret_cast<const char*>(data + off), n),
                     out, why);
        off += n;
      }
      break;
    }
  }
  return 0;
}
