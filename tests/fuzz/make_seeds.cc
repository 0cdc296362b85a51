// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/): valid
// inputs built with the real encoders, so the fuzzers start from messages
// that reach deep into the decoders.
//   make_seeds CORPUS_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/wire.h"
#include "control/protocol.h"
#include "datadist/metadata.h"
#include "hixl/hixl.h"

namespace fs = std::filesystem;
using namespace hixl;

namespace {

void Write(const fs::path& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                    static_cast<std::streamsize>(bytes.size()));
}
std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::vector<uint8_t> Prefixed(uint8_t which, std::vector<uint8_t> b) {
  b.insert(b.begin(), which);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  // Control frames.
  {
    const fs::path d = root / "control";
    control::Hello h;
    h.engine = "127.0.0.1:4000";
    h.generation = 7;
    h.host = "boot-id/ns";
    h.pid = 42;
    Write(d, "hello", wire::EncodeFrame(control::EncodeHello(h)));
    control::Welcome w;
    w.engine = "127.0.0.1:5000";
    w.generation = 9;
    w.host = "boot-id/ns";
    w.pid = 43;
    w.regions = {{1, 0x7f0000000000, 4096, 3, true}, {2, 0x7f0000100000, 1 << 20, 1, false}};
    w.transports["shm"] = wire::Msg{{"sock", "hixl-abc"}, {"token", 12345}};
    w.info = "{\"llmdd\":1,\"cluster\":1,\"role\":1,\"root\":4096}";
    Write(d, "welcome", wire::EncodeFrame(control::EncodeWelcome(w)));
    Write(d, "reject", wire::EncodeFrame(control::EncodeReject("version mismatch")));
    Write(d, "radd", wire::EncodeFrame(control::EncodeRegionAdd(w.regions)));
    Write(d, "rdel", wire::EncodeFrame(control::EncodeRegionDel(3, {1, 2})));
    Write(d, "rdel_ack", wire::EncodeFrame(control::EncodeRegionDelAck(3)));
    Write(d, "notify", wire::EncodeFrame(control::EncodeNotify(5, "kv-ready", std::string("\0\1msg", 5))));
    Write(d, "nack", wire::EncodeFrame(control::EncodeNotifyAck(5, 7, "queue full")));
    auto two = wire::EncodeFrame(control::EncodeHeartbeat());
    auto bye = wire::EncodeFrame(control::EncodeBye());
    two.insert(two.end(), bye.begin(), bye.end());
    Write(d, "hb_bye", two);
  }
  // LLM-DataDist metadata (first byte: which decoder).
  {
    using namespace llm_datadist::internal;
    const fs::path d = root / "datadist";
    Write(d, "info", Prefixed(0, Bytes(EncodeInfo({3, 2, 0x7f0000001000}))));
    std::vector<uint8_t> rb(kRootSize);
    EncodeRoot({4, 0x7f0000002000, 512}, rb.data());
    Write(d, "root", Prefixed(1, rb));
    Table t;
    t.version = 4;
    t.cluster_id = 3;
    CacheEntry c;
    c.id = 1;
    c.num_tensors = 4;
    c.data_type = 1;
    c.shape = {64, 16, 8, 128};
    c.addrs = {0x7f0000100000, 0x7f0000200000, 0x7f0000300000, 0x7f0000400000};
    c.keys = {{3, 17, 0}};
    c.key_batches = {0};
    c.blocks_model_id = 0;
    c.fence = 0x7f0000005000;
    t.caches.push_back(c);
    t.released.push_back({{3, 16, 0}, "released: its lease of 100 ms expired"});
    Write(d, "table", Prefixed(2, EncodeTable(t)));
    EventMsg e;
    e.kind = llm_datadist::KvTransferEvent::Kind::kPulled;
    e.sender_cluster = 2;
    e.seq = 1;
    e.cache_id = 1;
    e.key = llm_datadist::CacheKey{3, 17, 0};
    e.batch_index = 0;
    e.first_layer = 0;
    e.last_layer = 1;
    e.user_tag = "req-17";
    for (uint64_t b = 0; b < 3000; b += 3) e.blocks.push_back(b);  // several parts
    std::vector<uint8_t> parts{3};
    for (const std::string& p : EncodeEvent(e)) {
      parts.push_back(static_cast<uint8_t>(p.size() & 0xFF));
      parts.push_back(static_cast<uint8_t>(p.size() >> 8));
      parts.insert(parts.end(), p.begin(), p.end());
    }
    Write(d, "events", parts);
  }
  // Serialized C API memory handles.
  {
    const fs::path d = root / "handle";
    HixlConfig cfg = nullptr;
    HixlEngine e = nullptr;
    hixlCreateConfig(&cfg);
    hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1");
    hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, 0);
    if (hixlCreateEngine(cfg, &e) != HIXL_SUCCESS) return 1;
    static char buf[8192];
    HixlMemHandle h = nullptr;
    if (hixlRegisterMemory(e, buf, sizeof(buf), HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE, &h) !=
        HIXL_SUCCESS) {
      return 1;
    }
    Write(d, "handle", Bytes(hixlMemHandleSerialize(h)));
    hixlDestroyEngine(e);
    hixlDestroyConfig(cfg);
  }
  std::printf("seeds written to %s\n", root.c_str());
  return 0;
}
