#include "common/wire.h"

#include <cstring>

namespace hixl::wire {
namespace {

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t LoadU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::vector<uint8_t> EncodeFrame(const Msg& msg) {
  std::vector<uint8_t> out(kFrameHeaderSize);
  Msg::to_msgpack(msg, out);  // appends after the header
  PutU32(out.data(), kFrameMagic);
  PutU32(out.data() + 4, static_cast<uint32_t>(out.size() - kFrameHeaderSize));
  return out;
}

Status DecodeFrameHeader(const uint8_t* hdr, uint32_t& body_len) {
  if (LoadU32(hdr) != kFrameMagic) {
    return Status::ParamInvalid("bad frame magic: not a hixl control stream");
  }
  uint32_t len = LoadU32(hdr + 4);
  if (len == 0 || len > kMaxFrameBody) {
    return Status::ParamInvalid("frame body length " + std::to_string(len) + " out of range");
  }
  body_len = len;
  return Status::Ok();
}

Status DecodeBody(const uint8_t* body, size_t len, Msg& out) {
  Msg m = Msg::from_msgpack(body, body + len, /*strict=*/true, /*allow_exceptions=*/false);
  if (m.is_discarded()) return Status::ParamInvalid("frame body is not valid MessagePack");
  if (!m.is_object()) return Status::ParamInvalid("frame body is not a map");
  auto it = m.find("t");
  if (it == m.end() || !it->is_string()) {
    return Status::ParamInvalid("frame body has no message type");
  }
  out = std::move(m);
  return Status::Ok();
}

Status FrameReader::Next(Msg& out, bool& has_msg) {
  has_msg = false;
  size_t avail = buf_.size() - pos_;
  if (avail < kFrameHeaderSize) return Status::Ok();
  uint32_t len = 0;
  if (Status s = DecodeFrameHeader(buf_.data() + pos_, len); !s.ok()) return s;
  if (avail < kFrameHeaderSize + len) return Status::Ok();
  Status s = DecodeBody(buf_.data() + pos_ + kFrameHeaderSize, len, out);
  pos_ += kFrameHeaderSize + len;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1u << 20)) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  if (!s.ok()) return s;
  has_msg = true;
  return Status::Ok();
}

bool GetU64(const Msg& m, const char* key, uint64_t& out) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_number_unsigned()) return false;
  out = it->get<uint64_t>();
  return true;
}

bool GetU32(const Msg& m, const char* key, uint32_t& out) {
  uint64_t v;
  if (!GetU64(m, key, v) || v > UINT32_MAX) return false;
  out = static_cast<uint32_t>(v);
  return true;
}

bool GetI64(const Msg& m, const char* key, int64_t& out) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_number_integer()) return false;
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    out = static_cast<int64_t>(v);
  } else {
    out = it->get<int64_t>();
  }
  return true;
}

bool GetBool(const Msg& m, const char* key, bool& out) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_boolean()) return false;
  out = it->get<bool>();
  return true;
}

bool GetStr(const Msg& m, const char* key, std::string& out, size_t max_len) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_string()) return false;
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max_len) return false;
  out = s;
  return true;
}

const Msg* GetArray(const Msg& m, const char* key, size_t max_items) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_array() || it->size() > max_items) return nullptr;
  return &*it;
}

}  // namespace hixl::wire
