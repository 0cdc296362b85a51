// Control-message encoding: each message is a MessagePack map (through
// nlohmann::json) inside a frame {magic u32, body length u32} (little endian).
// Decoding never trusts the peer: frame headers are checked, bodies are
// parsed without exceptions, and typed getters reject missing fields, wrong
// types and out-of-range values.
// Thread safety: stateless functions; a FrameReader belongs to one connection.
#ifndef HIXL_COMMON_WIRE_H_
#define HIXL_COMMON_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hixl/status.h"

namespace hixl::wire {

using Msg = nlohmann::json;

inline constexpr uint32_t kFrameMagic = 0x314C5848;  // "HXL1"
inline constexpr size_t kFrameHeaderSize = 8;
inline constexpr uint32_t kMaxFrameBody = 64u << 20;

// Encodes msg (an object) as a complete frame.
std::vector<uint8_t> EncodeFrame(const Msg& msg);
// Checks a frame header; on success sets body_len.
Status DecodeFrameHeader(const uint8_t* hdr, uint32_t& body_len);
// Parses a frame body; the result must be a map with a string field "t".
Status DecodeBody(const uint8_t* body, size_t len, Msg& out);

// Accumulates bytes from a stream and yields whole messages.
class FrameReader {
 public:
  // Appends bytes read from the socket.
  void Append(const uint8_t* data, size_t n) { buf_.insert(buf_.end(), data, data + n); }
  // Returns OK with has_msg=false when more bytes are needed; an error when the
  // stream is corrupt (the connection must then be dropped).
  Status Next(Msg& out, bool& has_msg);

 private:
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
};

// Typed, validating field access. Each returns false if the field is absent
// or has another type (or, for strings, is longer than max_len).
bool GetU64(const Msg& m, const char* key, uint64_t& out);
bool GetU32(const Msg& m, const char* key, uint32_t& out);
bool GetI64(const Msg& m, const char* key, int64_t& out);
bool GetBool(const Msg& m, const char* key, bool& out);
bool GetStr(const Msg& m, const char* key, std::string& out, size_t max_len = 4096);
// The array field, or nullptr.
const Msg* GetArray(const Msg& m, const char* key, size_t max_items);

}  // namespace hixl::wire

#endif  // HIXL_COMMON_WIRE_H_
