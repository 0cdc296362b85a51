// tests/raw_client.h — a hixl peer spoken by hand, for tests that misbehave
// on purpose: control frames (MessagePack through nlohmann_json), the
// handshake (with or without authentication), and raw tcp data lanes.
//
// The authentication tags are computed here with OpenSSL directly from the
// documented construction (src/auth/auth.h), not with the library's code, so
// the tests check the protocol rather than echo the implementation.
// Everything is bounded by deadlines. Not thread-safe unless stated.
#ifndef HIXL_TESTS_RAW_CLIENT_H_
#define HIXL_TESTS_RAW_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "peer_process.h"

namespace hixl_test::raw {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

inline constexpr size_t kMiB = 1024 * 1024;

// Wire constants (little endian), as documented in tcp_transport.h/.cc and
// common/wire.h.
inline constexpr uint32_t kFrameMagic = 0x314C5848;  // "HXL1" control frame
inline constexpr uint32_t kLaneMagic = 0x324C5848;   // "HXL2" lane hello / reply
inline constexpr uint32_t kReqMagic = 0x514C5848;    // "HXLQ" request
inline constexpr uint32_t kRespMagic = 0x524C5848;   // "HXLR" response
inline constexpr uint32_t kLaneVersion = 2;
inline constexpr uint8_t kOpRead = 0, kOpWrite = 1;
inline constexpr size_t kLaneHelloSize = 64, kLaneReplySize = 8, kReqSize = 32, kRespSize = 24;
inline constexpr uint64_t kMaxSlice = 64 * kMiB;

inline long ElapsedMs(Clock::time_point since) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

void PutU8(Bytes& b, uint8_t v) { b.push_back(v); }
void PutU32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// {magic, version, token, generation, lane, flags, tag[32]}; the tag is only
// read on an authenticated link (zero here; see auth_test.cc for tagged ones).
inline Bytes LaneHello(uint64_t token, uint64_t generation, uint32_t magic = kLaneMagic,
                       uint32_t version = kLaneVersion, uint32_t lane = 0,
                       const uint8_t* tag = nullptr) {
  Bytes b;
  PutU32(b, magic);
  PutU32(b, version);
  PutU64(b, token);
  PutU64(b, generation);
  PutU32(b, lane);
  PutU32(b, 0);
  for (int i = 0; i < 32; ++i) b.push_back(tag ? tag[i] : 0);
  return b;
}

inline Bytes Request(uint8_t op, uint64_t seq, uint64_t addr, uint64_t len, uint32_t magic = kReqMagic) {
  Bytes b;
  PutU32(b, magic);
  PutU8(b, op);
  PutU8(b, 0);
  PutU8(b, 0);
  PutU8(b, 0);
  PutU64(b, seq);
  PutU64(b, addr);
  PutU64(b, len);
  return b;
}

inline Bytes Pattern(size_t len, uint64_t seed) {
  Bytes b(len);
  hixl_test::FillPattern(b.data(), len, seed);
  return b;
}

inline void Append(Bytes& to, const Bytes& from) { to.insert(to.end(), from.begin(), from.end()); }

// ---------------------------------------------------------------------------
// Socket helpers, all bounded.

inline int ConnectTcp(const std::string& ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1 ||
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Sends everything or gives up at the deadline (false). A peer that closed
// the connection also ends it (false, errno EPIPE/ECONNRESET).
inline bool SendAll(int fd, const void* data, size_t len, int timeout_ms = 3000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const auto* p = static_cast<const uint8_t*>(data);
  size_t off = 0;
  while (off < len) {
    ssize_t n = send(fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    long left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLOUT, 0};
    poll(&pfd, 1, static_cast<int>(std::min<long>(left, 50)));
  }
  return true;
}
inline bool SendAll(int fd, const Bytes& b, int timeout_ms = 3000) {
  return SendAll(fd, b.data(), b.size(), timeout_ms);
}

// Reads exactly len bytes; false on EOF, error or deadline.
inline bool RecvExact(int fd, void* data, size_t len, int timeout_ms = 3000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto* p = static_cast<uint8_t*>(data);
  size_t off = 0;
  while (off < len) {
    long left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t n = recv(fd, p + off, len - off, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the other side closes (recv 0 or an error such as ECONNRESET),
// keeping at most max_keep bytes. Returns false when the connection is still
// open at the deadline.
inline bool DrainUntilClosed(int fd, int timeout_ms, Bytes* got = nullptr, size_t max_keep = 512 * kMiB) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<uint8_t> buf(256 * 1024);
  for (;;) {
    long left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return false;
    if (r < 0) return true;
    ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return true;  // ECONNRESET and the like: closed
    }
    if (got != nullptr && got->size() < max_keep)
      got->insert(got->end(), buf.data(), buf.data() + n);
  }
}

struct Resp {
  uint32_t magic = 0;
  uint8_t op = 0;
  uint8_t status = 0;
  uint64_t seq = 0;
  uint64_t len = 0;
  size_t payload_off = 0;  // into the stream
};

// Splits a lane's response stream into responses. A READ response with status
// 0 carries len payload bytes. Returns false (and says why) when the stream is
// not a sequence of well-formed responses; a truncated tail is reported as
// *truncated.
inline bool ParseResponses(const Bytes& s, std::vector<Resp>& out, std::string& why, bool* truncated) {
  size_t off = 0;
  *truncated = false;
  while (off < s.size()) {
    if (s.size() - off < kRespSize) {
      *truncated = true;
      return true;
    }
    Resp r;
    r.magic = GetU32(&s[off]);
    r.op = s[off + 4];
    r.status = s[off + 5];
    r.seq = GetU64(&s[off + 8]);
    r.len = GetU64(&s[off + 16]);
    off += kRespSize;
    if (r.magic != kRespMagic) {
      why = "response magic " + std::to_string(r.magic);
      return false;
    }
    r.payload_off = off;
    if (r.op == kOpRead && r.status == 0) {
      if (s.size() - off < r.len) {
        *truncated = true;
        out.push_back(r);
        return true;
      }
      off += r.len;
    }
    out.push_back(r);
  }
  return true;
}

// ---------------------------------------------------------------------------
// Authentication (src/auth/auth.h): HMAC-SHA256(secret, label | 0 | parts).

using Tag = std::array<uint8_t, 32>;

inline Tag HmacTag(const std::string& key, const std::string& label, const Bytes& parts) {
  Bytes msg(label.begin(), label.end());
  msg.push_back(0);
  msg.insert(msg.end(), parts.begin(), parts.end());
  Tag t{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), t.data(),
       &len);
  return t;
}
inline Bytes Cat(const Bytes& a, const Bytes& b) {
  Bytes r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}
inline std::string ToHex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}
inline std::string ToHex(const Bytes& b) { return ToHex(b.data(), b.size()); }
inline std::string ToHex(const Tag& t) { return ToHex(t.data(), t.size()); }
inline bool FromHexBytes(const std::string& s, Bytes& out) {
  if (s.size() % 2 != 0) return false;
  out.clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    unsigned v = 0;
    if (std::sscanf(s.substr(i, 2).c_str(), "%2x", &v) != 1) return false;
    out.push_back(static_cast<uint8_t>(v));
  }
  return true;
}
inline Bytes RandomBytes(size_t n) {
  Bytes b(n);
  RAND_bytes(b.data(), static_cast<int>(n));
  return b;
}
inline Tag TargetProof(const std::string& secret, const Bytes& cn, const Bytes& sn) {
  return HmacTag(secret, "hixl-auth-v1 target", Cat(cn, sn));
}
inline Tag InitiatorProof(const std::string& secret, const Bytes& cn, const Bytes& sn) {
  return HmacTag(secret, "hixl-auth-v1 initiator", Cat(cn, sn));
}
inline Tag LinkKey(const std::string& secret, const Bytes& cn, const Bytes& sn) {
  return HmacTag(secret, "hixl-auth-v1 link", Cat(cn, sn));
}

// ---------------------------------------------------------------------------
// A control link opened by hand. While open, the target keeps our tcp token
// valid. A background thread reads what the target sends; when ack_rdel is
// set it answers every region removal ("rdel") at once with "rdel_ack", as
// an initiator that claims to have no transfer in flight would.

class RawControl {
 public:
  ~RawControl() { Close(); }

  // Only the TCP connection to the engine's control port (for tests that
  // then send frames of their own with Send / ReadFrame).
  bool ConnectOnly(const std::string& engine) {
    const size_t colon = engine.rfind(':');
    ip_ = engine.substr(0, colon);
    fd_ = ConnectTcp(ip_, hixl_test::PortOf(engine));
    return fd_ >= 0;
  }

  // The hello this client sends (auth: the nonce, hex; empty: none).
  static nlohmann::json Hello(const std::string& auth_nonce_hex = "") {
    nlohmann::json hello = {{"t", "hello"},
                            {"v", 1u},
                            {"engine", "127.0.0.1"},
                            {"gen", static_cast<uint64_t>(0x5EED0000ull + getpid())},
                            {"host", "hixl-raw-client"},
                            {"pid", static_cast<int64_t>(getpid())},
                            // This raw client sends no heartbeats: it asks for
                            // the longest interval (the peer is started with it
                            // too) so the peer never gives it up mid-test.
                            {"hb", 600000u},
                            // It moves data only over tcp lanes.
                            {"lt", 2u}};
    if (!auth_nonce_hex.empty()) hello["auth"] = auth_nonce_hex;
    return hello;
  }

  // hello -> [challenge -> auth ->] welcome. With a secret the client
  // authenticates (and checks the target's proof) and link_key is set. On
  // failure returns false with *err set.
  bool Open(const std::string& engine, bool ack_rdel, std::string* err,
            const std::string& secret = "") {
    ack_rdel_ = ack_rdel;
    if (!ConnectOnly(engine)) {
      *err = std::string("connect: ") + strerror(errno);
      return false;
    }
    const Bytes cn = RandomBytes(32);
    if (!SendFrame(Hello(secret.empty() ? "" : ToHex(cn)))) {
      *err = "sending hello failed";
      return false;
    }
    nlohmann::json w;
    if (!ReadFrame(w, 5000)) {
      *err = "no welcome frame";
      return false;
    }
    if (!secret.empty()) {
      Bytes sn, proof;
      if (!w.is_object() || w.value("t", "") != "challenge" || !w["sn"].is_string() ||
          !w["proof"].is_string() || !FromHexBytes(w["sn"].get<std::string>(), sn) ||
          !FromHexBytes(w["proof"].get<std::string>(), proof) || sn.size() != 32) {
        *err = "expected challenge, got " + w.dump();
        return false;
      }
      const Tag want = TargetProof(secret, cn, sn);
      if (proof != Bytes(want.begin(), want.end())) {
        *err = "the target's proof is wrong";
        return false;
      }
      if (!SendFrame({{"t", "auth"}, {"proof", ToHex(InitiatorProof(secret, cn, sn))}}) ||
          !ReadFrame(w, 5000)) {
        *err = "no answer to auth";
        return false;
      }
      link_key = LinkKey(secret, cn, sn);
      keyed = true;
    }
    if (!w.is_object() || w.value("t", "") != "welcome") {
      *err = "expected welcome, got " + w.dump();
      return false;
    }
    auto tp = w.find("tp");
    if (tp == w.end() || !tp->is_object() || !tp->contains("tcp")) {
      *err = "welcome offers no tcp transport: " + w.dump();
      return false;
    }
    const auto& tcp = (*tp)["tcp"];
    if (!tcp.is_object() || !tcp.contains("port") || !tcp.contains("token") ||
        !tcp["port"].is_number_unsigned() || !tcp["token"].is_number_unsigned() ||
        !w.contains("gen") || !w["gen"].is_number_unsigned()) {
      *err = "malformed tcp section: " + w.dump();
      return false;
    }
    welcome = w;
    data_port = static_cast<int>(tcp["port"].get<uint64_t>());
    token = tcp["token"].get<uint64_t>();
    generation = w["gen"].get<uint64_t>();
    reader_ = std::thread([this] { ReadLoop(); });
    return true;
  }

  void Close() {
    stop_.store(true);
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int rdel_seen() const { return rdel_seen_.load(); }
  // Sends any control message (as an initiator would, or would not).
  bool Send(const nlohmann::json& m) { return SendFrame(m); }
  // The code of the target's "nack" for seq, waiting up to timeout_ms; -1: none.
  int64_t WaitNack(uint64_t seq, int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      {
        std::lock_guard<std::mutex> lock(nack_mu_);
        if (auto it = nacks_.find(seq); it != nacks_.end()) return it->second;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }
  // True once the target closed the link, waiting up to timeout_ms.
  bool WaitClosed(int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!closed_.load() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return closed_.load();
  }
  const std::string& ip() const { return ip_; }

  int data_port = 0;
  uint64_t token = 0;
  uint64_t generation = 0;
  nlohmann::json welcome;  // as received
  bool keyed = false;      // the link authenticated; link_key binds its lanes
  Tag link_key{};

  bool SendFrame(const nlohmann::json& m) {
    Bytes body = nlohmann::json::to_msgpack(m);
    Bytes f;
    PutU32(f, kFrameMagic);
    PutU32(f, static_cast<uint32_t>(body.size()));
    Append(f, body);
    std::lock_guard<std::mutex> lock(send_mu_);
    return SendAll(fd_, f);
  }
  bool ReadFrame(nlohmann::json& out, int timeout_ms) {
    uint8_t hdr[8];
    if (!RecvExact(fd_, hdr, sizeof(hdr), timeout_ms)) return false;
    if (GetU32(hdr) != kFrameMagic) return false;
    const uint32_t len = GetU32(hdr + 4);
    if (len > (64u << 20)) return false;
    Bytes body(len);
    if (!RecvExact(fd_, body.data(), len, timeout_ms)) return false;
    out = nlohmann::json::from_msgpack(body, true, false);
    return !out.is_discarded();
  }

 private:
  void ReadLoop() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      nlohmann::json m;
      if (!ReadFrame(m, 2000)) {  // closed by the target (or garbage): stop reading
        closed_.store(true);
        return;
      }
      if (m.is_object() && m.value("t", "") == "nack" && m.contains("seq") &&
          m["seq"].is_number_unsigned() && m.contains("code") && m["code"].is_number_unsigned()) {
        std::lock_guard<std::mutex> lock(nack_mu_);
        nacks_[m["seq"].get<uint64_t>()] = static_cast<int64_t>(m["code"].get<uint64_t>());
      }
      if (m.is_object() && m.value("t", "") == "rdel") {
        rdel_seen_.fetch_add(1);
        if (ack_rdel_ && m.contains("seq") && m["seq"].is_number_unsigned()) {
          SendFrame({{"t", "rdel_ack"}, {"seq", m["seq"].get<uint64_t>()}});
        }
      }
    }
  }

  int fd_ = -1;
  std::string ip_;
  bool ack_rdel_ = false;
  std::mutex send_mu_;
  std::atomic<bool> stop_{false};
  std::atomic<int> rdel_seen_{0};
  std::atomic<bool> closed_{false};
  std::mutex nack_mu_;
  std::map<uint64_t, int64_t> nacks_;
  std::thread reader_;
};

// An fd closed on scope exit.
class Sock {
 public:
  explicit Sock(int fd = -1) : fd_(fd) {}
  ~Sock() { Reset(); }
  Sock(const Sock&) = delete;
  Sock& operator=(const Sock&) = delete;
  Sock(Sock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  int get() const { return fd_; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};


}  // namespace hixl_test::raw

#endif  // HIXL_TESTS_RAW_CLIENT_H_
