// Encoding and validating decoding of what instances tell each other (see
// metadata.h).
#include "datadist/metadata.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "datadist/layout.h"
#include "datadist/status_util.h"

namespace llm_datadist::internal {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kRootMagic = 0x31545244444D4C4Cull;   // "LLMDDRT1"
constexpr uint64_t kTableMagic = 0x31425444444D4C4Cull;  // "LLMDDTB1"
constexpr size_t kTableHeader = 32;
constexpr uint8_t kEventFormat = 1;
constexpr size_t kMaxNotify = 1024;
constexpr size_t kMaxEventBlocks = 1u << 24;
constexpr size_t kMaxPending = 256;

void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t Get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

bool U64(const Json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}
bool I64(const Json& j, int64_t& out) {
  if (j.is_number_integer() && !j.is_number_unsigned()) {
    out = j.get<int64_t>();
    return true;
  }
  if (j.is_number_unsigned() && j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
    out = static_cast<int64_t>(j.get<uint64_t>());
    return true;
  }
  return false;
}
bool I32(const Json& j, int32_t& out) {
  int64_t v;
  if (!I64(j, v) || v < INT32_MIN || v > INT32_MAX) return false;
  out = static_cast<int32_t>(v);
  return true;
}
Json KeyJson(const CacheKey& k) { return Json::array({k.prompt_cluster_id, k.req_id, k.model_id}); }
bool KeyFrom(const Json& j, CacheKey& k) {
  return j.is_array() && j.size() >= 3 && U64(j[0], k.prompt_cluster_id) && U64(j[1], k.req_id) &&
         U64(j[2], k.model_id);
}

// Little-endian writer/reader for event messages.
struct Writer {
  std::string s;
  void u8(uint8_t v) { s.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { s.append(reinterpret_cast<const char*>(&v), 2); }
  void u32(uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
};
struct Reader {
  const uint8_t* p;
  size_t n;
  size_t off = 0;
  bool ok = true;
  bool take(void* out, size_t k) {
    if (!ok || n - off < k) return ok = false;
    std::memcpy(out, p + off, k);
    off += k;
    return true;
  }
  uint8_t u8() { uint8_t v = 0; take(&v, 1); return v; }
  uint16_t u16() { uint16_t v = 0; take(&v, 2); return v; }
  uint32_t u32() { uint32_t v = 0; take(&v, 4); return v; }
  uint64_t u64() { uint64_t v = 0; take(&v, 8); return v; }
};

void PutVarint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}
bool GetVarint(const std::string& s, size_t& off, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (off >= s.size()) return false;
    uint8_t b = static_cast<uint8_t>(s[off++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

uint64_t Fnv1a(const void* data, size_t len, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string EncodeInfo(const InstanceInfo& i) {
  return Json{{"llmdd", 1}, {"cluster", i.cluster_id}, {"role", i.role}, {"root", i.root_addr}}
      .dump();
}

Status DecodeInfo(const std::string& s, InstanceInfo& out) {
  Json j = Json::parse(s, nullptr, /*allow_exceptions=*/false);
  InstanceInfo i;
  uint64_t v = 0;
  if (!j.is_object() || !j.contains("llmdd") || !U64(j["llmdd"], v) || v != 1) {
    return ParamInvalid("the engine there is not an LLM-DataDist instance (or another version)");
  }
  if (!j.contains("cluster") || !U64(j["cluster"], i.cluster_id) || !j.contains("role") ||
      !I32(j["role"], i.role) || !j.contains("root") || !U64(j["root"], i.root_addr) ||
      i.root_addr == 0) {
    return ParamInvalid("malformed LLM-DataDist instance information");
  }
  out = i;
  return Status();
}

std::vector<uint8_t> EncodeTable(const Table& t) {
  Json caches = Json::array();
  for (const auto& c : t.caches) {
    Json keys = Json::array();
    for (size_t i = 0; i < c.keys.size(); ++i) {
      Json k = KeyJson(c.keys[i]);
      k.push_back(c.key_batches[i]);
      keys.push_back(std::move(k));
    }
    caches.push_back(Json::array({c.id, c.placement, c.num_tensors, c.data_type, c.shape, c.addrs,
                                  keys, c.blocks_model_id ? Json(*c.blocks_model_id) : Json(),
                                  c.fence}));
  }
  Json rel = Json::array();
  for (const auto& r : t.released) {
    Json k = KeyJson(r.key);
    k.push_back(r.why);
    rel.push_back(std::move(k));
  }
  std::vector<uint8_t> body = Json::to_msgpack(Json{{"c", t.cluster_id}, {"caches", caches}, {"rel", rel}});
  std::vector<uint8_t> out(kTableHeader + body.size());
  Put64(out.data(), kTableMagic);
  Put64(out.data() + 8, t.version);
  Put64(out.data() + 16, body.size());
  uint64_t h = Fnv1a(out.data() + 8, 8);
  h = Fnv1a(body.data(), body.size(), h);
  Put64(out.data() + 24, h);
  std::memcpy(out.data() + kTableHeader, body.data(), body.size());
  return out;
}

Status DecodeTable(const uint8_t* data, size_t len, Table& out) {
  if (len < kTableHeader || Get64(data) != kTableMagic) return ParamInvalid("not a cache table");
  uint64_t body_len = Get64(data + 16);
  if (body_len != len - kTableHeader) return ParamInvalid("cache table length mismatch");
  uint64_t h = Fnv1a(data + 8, 8);
  h = Fnv1a(data + kTableHeader, body_len, h);
  if (h != Get64(data + 24)) return ParamInvalid("cache table checksum mismatch");
  Json j = Json::from_msgpack(data + kTableHeader, data + len, /*strict=*/true,
                              /*allow_exceptions=*/false);
  auto bad = [](const std::string& what) { return ParamInvalid("malformed cache table: " + what); };
  if (!j.is_object()) return bad("not a map");
  Table t;
  t.version = Get64(data + 8);
  if (!j.contains("c") || !U64(j["c"], t.cluster_id)) return bad("cluster id");
  if (!j.contains("caches") || !j["caches"].is_array() || j["caches"].size() > kMaxCaches) {
    return bad("caches");
  }
  for (const auto& cj : j["caches"]) {
    if (!cj.is_array() || cj.size() < 9) return bad("cache entry");
    CacheEntry c;
    uint64_t n = 0;
    if (!I64(cj[0], c.id) || c.id <= 0 || !I32(cj[1], c.placement) || !U64(cj[2], n) ||
        n > kMaxTensors || !I32(cj[3], c.data_type)) {
      return bad("cache fields");
    }
    c.num_tensors = static_cast<uint32_t>(n);
    if (!cj[4].is_array() || cj[4].size() > kMaxDims) return bad("shape");
    for (const auto& d : cj[4]) {
      int64_t v;
      if (!I64(d, v)) return bad("shape");
      c.shape.push_back(v);
    }
    Layout l;
    if (Status s = MakeLayout(c.num_tensors, c.data_type, c.shape, l); !s.ok()) {
      return bad("cache " + std::to_string(c.id) + ": " + s.message());
    }
    if (!cj[5].is_array() || cj[5].size() != c.num_tensors) return bad("tensor addresses");
    for (const auto& a : cj[5]) {
      uint64_t v;
      if (!U64(a, v) || v == 0 || v > UINT64_MAX - l.tensor_bytes) return bad("tensor address");
      c.addrs.push_back(v);
    }
    if (!cj[6].is_array() || cj[6].size() > kMaxKeysPerCache) return bad("keys");
    for (const auto& kj : cj[6]) {
      CacheKey k;
      uint64_t b = 0;
      if (!KeyFrom(kj, k) || kj.size() < 4 || !U64(kj[3], b) || b >= l.entries) return bad("key");
      c.keys.push_back(k);
      c.key_batches.push_back(static_cast<uint32_t>(b));
    }
    if (!cj[7].is_null()) {
      uint64_t m;
      if (!U64(cj[7], m)) return bad("blocks model id");
      c.blocks_model_id = m;
    }
    if (!U64(cj[8], c.fence) || c.fence == 0 || c.fence > UINT64_MAX - kFenceBytes) {
      return bad("cache fence");
    }
    t.caches.push_back(std::move(c));
  }
  if (!j.contains("rel") || !j["rel"].is_array() || j["rel"].size() > kMaxReleased) {
    return bad("released keys");
  }
  for (const auto& rj : j["rel"]) {
    ReleasedKey r;
    if (!KeyFrom(rj, r.key) || rj.size() < 4 || !rj[3].is_string() ||
        rj[3].get_ref<const std::string&>().size() > 1024) {
      return bad("released key");
    }
    r.why = rj[3].get<std::string>();
    t.released.push_back(std::move(r));
  }
  out = std::move(t);
  return Status();
}

void EncodeRoot(const Root& r, uint8_t out[kRootSize]) {
  std::memset(out, 0, kRootSize);
  Put64(out, kRootMagic);
  Put64(out + 8, r.version);
  Put64(out + 16, r.table_addr);
  Put64(out + 24, r.table_len);
  Put64(out + 32, Fnv1a(out, 32));
}

bool DecodeRoot(const uint8_t in[kRootSize], Root& out) {
  if (Get64(in) != kRootMagic || Get64(in + 32) != Fnv1a(in, 32)) return false;
  Root r;
  r.version = Get64(in + 8);
  r.table_addr = Get64(in + 16);
  r.table_len = Get64(in + 24);
  if (r.table_addr == 0 || r.table_len < kTableHeader || r.table_len > kMaxTableBytes) return false;
  out = r;
  return true;
}

// Part layout: u8 format, u8 kind, u16 part, u16 parts, u64 sender, u64 seq;
// part 0 then: i64 cache, u8 has_key [u64 x3], i64 batch, i32 first, i32
// last, u16 tag length, tag; every part then: bytes of the block stream
// (u8 encoding; 0: varint pairs — zigzag delta of a run's start from the
// previous run's end, run length — in list order; 1: varint first block,
// varint span, then a bitmap of the span: the blocks in ascending order).
std::vector<std::string> EncodeEvent(const EventMsg& e) {
  // The block stream: runs (list order), or a bitmap when that is shorter.
  std::string stream(1, '\0');
  uint64_t prev_end = 0;
  for (auto [start, count] : Runs(e.blocks)) {
    int64_t delta = static_cast<int64_t>(start - prev_end);
    PutVarint(stream, (static_cast<uint64_t>(delta) << 1) ^ static_cast<uint64_t>(delta >> 63));
    PutVarint(stream, count);
    prev_end = start + count;
  }
  if (!e.blocks.empty()) {
    auto [lo, hi] = std::minmax_element(e.blocks.begin(), e.blocks.end());
    const uint64_t span = *hi - *lo + 1;
    if (span / 8 + 12 < stream.size()) {
      std::string bits(1, '\1');
      PutVarint(bits, *lo);
      PutVarint(bits, span);
      const size_t head = bits.size();
      bits.resize(head + (span + 7) / 8, '\0');
      for (uint64_t b : e.blocks) {
        const uint64_t i = b - *lo;
        bits[head + i / 8] = static_cast<char>(static_cast<uint8_t>(bits[head + i / 8]) | (1u << (i % 8)));
      }
      stream = std::move(bits);
    }
  }
  Writer head;
  head.u64(static_cast<uint64_t>(e.cache_id));
  head.u8(e.key ? 1 : 0);
  if (e.key) {
    head.u64(e.key->prompt_cluster_id);
    head.u64(e.key->req_id);
    head.u64(e.key->model_id);
  }
  head.u64(static_cast<uint64_t>(e.batch_index));
  head.u32(static_cast<uint32_t>(e.first_layer));
  head.u32(static_cast<uint32_t>(e.last_layer));
  std::string tag = e.user_tag.substr(0, kMaxUserTag);
  head.u16(static_cast<uint16_t>(tag.size()));
  head.s += tag;
  constexpr size_t kPartHeader = 22;
  const size_t first_room = kMaxNotify - kPartHeader - head.s.size();
  const size_t room = kMaxNotify - kPartHeader;
  size_t parts = 1;
  if (stream.size() > first_room) parts += (stream.size() - first_room + room - 1) / room;
  std::vector<std::string> out;
  size_t off = 0;
  for (size_t p = 0; p < parts; ++p) {
    Writer w;
    w.u8(kEventFormat);
    w.u8(static_cast<uint8_t>(e.kind));
    w.u16(static_cast<uint16_t>(p));
    w.u16(static_cast<uint16_t>(parts));
    w.u64(e.sender_cluster);
    w.u64(e.seq);
    if (p == 0) w.s += head.s;
    size_t take = std::min(stream.size() - off, p == 0 ? first_room : room);
    w.s.append(stream, off, take);
    off += take;
    out.push_back(std::move(w.s));
  }
  return out;
}

bool EventAssembler::Feed(const std::string& from, const std::string& msg, EventMsg& out,
                          std::string& why) {
  Reader r{reinterpret_cast<const uint8_t*>(msg.data()), msg.size()};
  uint8_t fmt = r.u8();
  uint8_t kind = r.u8();
  uint16_t part = r.u16();
  uint16_t parts = r.u16();
  uint64_t sender = r.u64();
  uint64_t seq = r.u64();
  if (!r.ok || fmt != kEventFormat || kind > 2 || parts == 0 || part >= parts) {
    why = "malformed event header";
    return false;
  }
  const std::string id = from + "/" + std::to_string(sender) + "/" + std::to_string(seq);
  if (part == 0) {
    Pending p;
    p.head.kind = static_cast<KvTransferEvent::Kind>(kind);
    p.head.sender_cluster = sender;
    p.head.seq = seq;
    p.head.cache_id = static_cast<int64_t>(r.u64());
    if (r.u8() == 1) {
      CacheKey k;
      k.prompt_cluster_id = r.u64();
      k.req_id = r.u64();
      k.model_id = r.u64();
      p.head.key = k;
    }
    p.head.batch_index = static_cast<int64_t>(r.u64());
    p.head.first_layer = static_cast<int32_t>(r.u32());
    p.head.last_layer = static_cast<int32_t>(r.u32());
    uint16_t tag_len = r.u16();
    if (!r.ok || tag_len > kMaxUserTag || r.n - r.off < tag_len) {
      why = "malformed event";
      return false;
    }
    p.head.user_tag.assign(msg, r.off, tag_len);
    r.off += tag_len;
    p.parts = parts;
    p.next = 1;
    p.stream.assign(msg, r.off, std::string::npos);
    if (parts == 1) return Finish(p, out, why);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->first == id) {
        pending_.erase(it);
        break;
      }
    }
    if (pending_.size() >= kMaxPending) pending_.erase(pending_.begin());
    pending_.emplace_back(id, std::move(p));
    return false;
  }
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->first != id) continue;
    Pending& p = it->second;
    if (part != p.next || parts != p.parts) {
      why = "event part out of order";
      pending_.erase(it);
      return false;
    }
    p.stream.append(msg, r.off, std::string::npos);
    if (++p.next < p.parts) return false;
    Pending done = std::move(p);
    pending_.erase(it);
    return Finish(done, out, why);
  }
  why = "event part without its beginning";
  return false;
}

bool EventAssembler::Finish(Pending& p, EventMsg& out, std::string& why) {
  EventMsg e = std::move(p.head);
  const std::string& st = p.stream;
  auto bad = [&why] {
    why = "malformed block list in event";
    return false;
  };
  if (st.empty()) return bad();
  size_t off = 1;
  if (st[0] == 1) {  // bitmap
    uint64_t lo, span;
    if (!GetVarint(st, off, lo) || !GetVarint(st, off, span) || span == 0 ||
        span > 8 * kMaxEventBlocks || lo > UINT64_MAX - span || st.size() - off != (span + 7) / 8) {
      return bad();
    }
    for (uint64_t i = 0; i < span; ++i) {
      if (static_cast<uint8_t>(st[off + i / 8]) & (1u << (i % 8))) e.blocks.push_back(lo + i);
    }
    out = std::move(e);
    return true;
  }
  if (st[0] != 0) return bad();
  uint64_t prev_end = 0;
  while (off < st.size()) {
    uint64_t zz, count;
    if (!GetVarint(st, off, zz) || !GetVarint(st, off, count) || count == 0 ||
        count > kMaxEventBlocks - e.blocks.size()) {
      return bad();
    }
    int64_t delta = static_cast<int64_t>(zz >> 1) ^ -static_cast<int64_t>(zz & 1);
    uint64_t start = prev_end + static_cast<uint64_t>(delta);
    if (start > UINT64_MAX - count) return bad();
    for (uint64_t b = 0; b < count; ++b) e.blocks.push_back(start + b);
    prev_end = start + count;
  }
  out = std::move(e);
  return true;
}

}  // namespace llm_datadist::internal
