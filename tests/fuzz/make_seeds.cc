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
#include "cs/cs_info.h"
#include "datadist/metadata.h"
#include "hixl/hixl.h"
#include "lane_regions.h"
#include "transport/tcp/tcp_wire.h"

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

// A tcp data-lane stream: a hello, then request headers back to back.
std::vector<uint8_t> Lane(const transport::tcp::LaneHello& h,
                          const std::vector<transport::tcp::ReqHdr>& reqs) {
  const auto hello = transport::tcp::EncodeLaneHello(h);
  std::vector<uint8_t> b(hello.begin(), hello.end());
  for (const auto& r : reqs) {
    const auto* p = reinterpret_cast<const uint8_t*>(&r);
    b.insert(b.end(), p, p + sizeof(r));
  }
  return b;
}
transport::tcp::ReqHdr Req(uint8_t op, uint64_t seq, uint64_t addr, uint64_t len,
                           uint32_t magic = transport::tcp::kReqMagic) {
  return transport::tcp::ReqHdr{magic, op, {0, 0, 0}, seq, addr, len};
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
    h.has_auth = true;
    for (size_t i = 0; i < h.cn.size(); ++i) h.cn[i] = static_cast<uint8_t>(i * 7 + 1);
    Write(d, "hello_auth", wire::EncodeFrame(control::EncodeHello(h)));
    control::Challenge ch;
    ch.sn = h.cn;
    ch.proof = auth::TargetProof("seed secret 0123456789", h.cn, ch.sn);
    Write(d, "challenge", wire::EncodeFrame(control::EncodeChallenge(ch)));
    Write(d, "auth", wire::EncodeFrame(control::EncodeAuth(ch.proof)));
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
    Write(d, "probe", wire::EncodeFrame(control::EncodeProbe()));
    control::Ident id;
    id.engine = "127.0.0.1:5000";
    id.generation = 9;
    Write(d, "ident", wire::EncodeFrame(control::EncodeIdent(id)));
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
  // HiXL CS server descriptions (the engine handshake's info string).
  {
    const fs::path d = root / "cs";
    cs::ServerInfo info;
    info.endpoints = {{"tcp", "10.0.0.1", "10.0.0.1:7400"}, {"shm", "127.0.0.1", "127.0.0.1:41000"}};
    Write(d, "empty", Bytes(cs::EncodeInfo(info)));
    info.mems = {{"kv0", 0x7f0000000000ull, 1ull << 30}, {"kv1", 0x7f0040000000ull, 4096}};
    Write(d, "two_mems", Bytes(cs::EncodeInfo(info)));
  }
  // tcp data lanes (regions: lane_regions.h).
  {
    using namespace transport::tcp;
    const fs::path d = root / "lane";
    const auto& rw = hixl_fuzz::kLaneRegions[0];  // READ_WRITE
    const auto& ro = hixl_fuzz::kLaneRegions[1];  // READ, right after rw
    const auto& wo = hixl_fuzz::kLaneRegions[2];  // WRITE
    const auto& top = hixl_fuzz::kLaneRegions[3];
    const LaneHello hello = MakeLaneHello(0x1234567890abcdef, 7);
    Write(d, "hello", Lane(hello, {}));
    Write(d, "read_write",
          Lane(hello,
               {Req(kOpRead, 1, rw.addr, 4096), Req(kOpWrite, 2, rw.addr + 4096, rw.len - 4096),
                Req(kOpRead, 3, ro.addr, ro.len), Req(kOpWrite, 4, wo.addr + 1, 4095),
                Req(kOpWrite, 5, wo.addr, kMaxSlice), Req(kOpRead, 6, top.addr + top.len - 1, 1)}));
    Write(d, "refused",
          Lane(hello, {Req(kOpWrite, 1, ro.addr, 8),              // denied
                       Req(kOpRead, 2, wo.addr, 8),               // denied
                       Req(kOpRead, 3, rw.addr + rw.len - 4, 8),  // spans rw|ro
                       Req(kOpRead, 4, wo.addr - 1, 2),           // before wo
                       Req(kOpRead, 5, rw.addr, 0),               // empty
                       Req(kOpWrite, 6, wo.addr, kMaxSlice + 1),  // too long, fits
                       Req(kOpRead, 7, 0, 8),                     // null
                       Req(kOpRead, 8, ~uint64_t{0} - 3, 8),      // wraps
                       Req(2, 9, rw.addr, 8),                     // bad op
                       Req(kOpRead, 10, rw.addr, 8, kRespMagic)}));
    LaneHello old = hello;
    old.version = kLaneVersion + 1;
    Write(d, "bad_version", Lane(old, {Req(kOpRead, 1, rw.addr, 8)}));
    LaneHello alien = hello;
    alien.magic = kReqMagic;
    Write(d, "bad_magic", Lane(alien, {}));
    auto part = Lane(hello, {Req(kOpRead, 1, rw.addr, 64)});
    part.resize(part.size() - 5);  // a header still arriving
    Write(d, "partial", part);
    Write(d, "short", std::vector<uint8_t>(part.begin(), part.begin() + 10));
  }
  std::printf("seeds written to %s\n", root.c_str());
  return 0;
}
