// tests/peer_process.h — drive a hixl_test_peer child process from a test.
//
// The peer (tests/test_peer.cc) is a separate executable holding its own
// hixl::Hixl engine. It reads one command per line on stdin and answers one
// line per command on stdout: "OK ..." or "ERR <status string>". On start it
// prints "READY <LocalEngine()>". See test_peer.cc for the command list.
//
// This header also holds the data helpers both sides share (the fill pattern
// and the hash), so a test can compute locally what the peer reports.
//
// PeerProcess never leaves a process behind: its destructor closes the peer's
// stdin (the peer exits on EOF), waits a bounded time, then SIGKILLs it. The
// child also gets PR_SET_PDEATHSIG=SIGKILL, so it dies with the test process.
#ifndef HIXL_TESTS_PEER_PROCESS_H_
#define HIXL_TESTS_PEER_PROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "hixl/hixl.h"

namespace hixl_test {

// ---------------------------------------------------------------------------
// Shared data helpers (used by the peer and by the tests).

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Deterministic content: byte i of the buffer depends only on (seed, i). The
// buffer is produced as little-endian 64-bit words w_k = SplitMix64(seed*K + k)
// so filling 128 MiB takes a few tens of milliseconds.
inline uint64_t PatternWord(uint64_t seed, uint64_t k) {
  return SplitMix64(seed * 0xD1B54A32D192ED03ull + k);
}
inline void FillPattern(void* dst, size_t len, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(dst);
  size_t words = len / 8;
  for (size_t k = 0; k < words; ++k) {
    uint64_t w = PatternWord(seed, k);
    std::memcpy(p + k * 8, &w, 8);
  }
  if (len % 8 != 0) {
    uint64_t w = PatternWord(seed, words);
    std::memcpy(p + words * 8, &w, len % 8);
  }
}

// FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) applied to
// the little-endian 64-bit words of the buffer, then to its trailing bytes one
// by one. Every step (xor, multiply by an odd prime) is a bijection, so any
// single changed word changes the result; word-wise keeps 128 MiB fast even in
// sanitizer builds.
inline uint64_t Fnv1a64(const void* data, size_t len) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t words = len / 8;
  for (size_t k = 0; k < words; ++k) {
    uint64_t w;
    std::memcpy(&w, p + k * 8, 8);
    h ^= w;
    h *= kPrime;
  }
  for (size_t i = words * 8; i < len; ++i) {
    h ^= p[i];
    h *= kPrime;
  }
  return h;
}

inline std::string HashHex(uint64_t h) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[static_cast<size_t>(i)] = kDigits[h & 0xf];
  return s;
}

// ---------------------------------------------------------------------------
// The child process.

// How to start a peer beyond its engine options.
struct PeerLaunch {
  std::vector<std::string> options;      // "Key=Value", passed as `--opt Key=Value`
  std::vector<std::string> exec_prefix;  // argv run in front of the peer, e.g.
                                         // {"/usr/sbin/ip", "netns", "exec", "NS"}; it
                                         // must exec the peer (same pid), not fork it
  std::string listen;                    // `--listen ADDR`; empty: the peer's default
};

class PeerProcess {
 public:
  // extra_options: "Key=Value" strings, passed as `--opt Key=Value`.
  explicit PeerProcess(std::vector<std::string> extra_options = {});
  explicit PeerProcess(PeerLaunch launch);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // Spawns the peer and waits (bounded) for "READY <engine>". Adds a gtest
  // failure and returns false when that does not happen.
  bool Start();
  // The peer's engine address ("127.0.0.1:port") from the READY line.
  const std::string& engine() const { return engine_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Sends one command line and returns the reply line (without newline).
  // On timeout or a dead peer it adds a gtest failure and returns
  // "ERR <what happened>". timeout_ms -1: 30 s for commands whose work grows
  // with the region size (alloc, reg, fill, hash, ...), 10 s for the others.
  std::string Send(const std::string& cmd, int timeout_ms = -1);

  // Convenience wrappers: each adds a gtest failure when the reply is not OK.
  // Return value 0 (or empty) then.
  uintptr_t Alloc(const std::string& name, size_t size);
  uintptr_t Reg(const std::string& name, size_t size, const std::string& perms = "rw");
  std::string Hash(const std::string& name, size_t offset, size_t len);
  bool Ok(const std::string& cmd, int timeout_ms = -1);  // reply starts with "OK"

  // SIGKILL now and reap (bounded).
  void Kill();
  // Closes stdin, waits up to wait_ms for a clean exit, then SIGKILLs.
  // Returns the exit status as from waitpid (or -1 when it had to be killed).
  int CloseAndWait(int wait_ms = 5000);

 private:
  bool ReadLine(std::string& line, int timeout_ms);

  PeerLaunch launch_;
  pid_t pid_ = -1;
  int to_child_ = -1;    // peer's stdin
  int from_child_ = -1;  // peer's stdout
  std::string buffered_;
  std::string engine_;
};

// The initiator LinkType option values every transport-conformance test runs
// with (a target always offers every transport it has).
#ifdef HIXL_TEST_UCX
inline std::vector<std::string> AllLinkTypes() { return {"SHM", "TCP", "UCX"}; }
#else
inline std::vector<std::string> AllLinkTypes() { return {"SHM", "TCP"}; }
#endif
// The LinkType GetLinkType must report for a LinkType option value.
inline hixl::LinkType LinkTypeOf(const std::string& option) {
  if (option == "SHM" || option == "HCCS") return hixl::LinkType::SHM;
  if (option == "TCP") return hixl::LinkType::TCP;
  if (option == "UCX" || option == "RDMA") return hixl::LinkType::UCX;
  return hixl::LinkType::AUTO;
}

// True when a reply line is "OK" or starts with "OK ".
bool IsOk(const std::string& reply);
// The text after "OK " (empty for a bare "OK").
std::string OkValue(const std::string& reply);

// ---------------------------------------------------------------------------
// Test-side helpers.

// ThreadSanitizer makes the first touch of large memory very slow (shadow
// pages): tests divide their biggest sizes by this.
#if defined(__SANITIZE_THREAD__)
inline constexpr size_t kSanitizerDivisor = 4;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr size_t kSanitizerDivisor = 4;
#else
inline constexpr size_t kSanitizerDivisor = 1;
#endif
#else
inline constexpr size_t kSanitizerDivisor = 1;
#endif

// The transports the load tests (tests/load) run over: all of them, except
// UCX in sanitizer builds — there 16 UCX engines on 2 cores take longer than
// the suite's per-test limit; the conformance suites still cover UCX under
// the sanitizers.
inline std::vector<std::string> LoadLinkTypes() {
  std::vector<std::string> v = AllLinkTypes();
  if (kSanitizerDivisor > 1) std::erase(v, std::string("UCX"));
  return v;
}

// Why a test whose own process is the target of UCX transfers is skipped in
// this build, or empty. Under ThreadSanitizer UCX's emulated put copies into
// the test's memory on the progress thread, ordered by messages TSan cannot
// see; the suppressions (tests/tsan_ucx.supp) match only when TSan can restore
// the copy's stack, which its bounded history does not always allow.
inline std::string SkipUcxTargetHere(const std::string& link) {
#if defined(__SANITIZE_THREAD__)
  if (link == "UCX") {
    return "UCX target in the test process under ThreadSanitizer (see SkipUcxTargetHere); the "
           "release and ASan builds run it";
  }
#endif
  (void)link;
  return "";
}

// Page-aligned heap buffer, every byte set to `fill` (so all pages exist).
class Buffer {
 public:
  explicit Buffer(size_t size, int fill = 0);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  unsigned char* data() { return data_; }
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  uintptr_t addr(size_t offset = 0) const { return reinterpret_cast<uintptr_t>(data_) + offset; }
  std::string HashHex(size_t offset, size_t len) const {
    return hixl_test::HashHex(Fnv1a64(data_ + offset, len));
  }
  std::string HashHex() const { return HashHex(0, size_); }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// Polls GetTransferStatus every millisecond until the request leaves WAITING
// or timeout_ms passes. Returns the last status seen (WAITING on timeout, and
// also when GetTransferStatus itself failed: *call_status then says why).
hixl::TransferStatus WaitForEnd(hixl::Hixl& engine, hixl::TransferReq req, int timeout_ms,
                                hixl::Status* call_status = nullptr,
                                hixl::Status* reason = nullptr);

// Runs argv (argv[0] a full path) with stdout and stderr captured into *out;
// returns the exit code, or -1 when it could not run or was killed after
// timeout_ms. The child dies with the test (PR_SET_PDEATHSIG).
int RunCommand(const std::vector<std::string>& argv, std::string* out = nullptr,
               int timeout_ms = 10000);

// A 127.0.0.1 port nothing listens on (bound, then closed again).
int UnusedTcpPort();
// Port number of an "ip:port" engine string (0 when there is none).
int PortOf(const std::string& engine);

const char* TransferStatusName(hixl::TransferStatus s);

}  // namespace hixl_test

namespace hixl {
// Readable gtest output for the library's enums.
inline void PrintTo(StatusCode c, std::ostream* os) { *os << StatusCodeName(c); }
inline void PrintTo(TransferStatus s, std::ostream* os) { *os << hixl_test::TransferStatusName(s); }
inline void PrintTo(LinkType t, std::ostream* os) {
  const char* n = LinkTypeName(t);
  *os << (n ? n : "(null)") << "(" << static_cast<uint32_t>(t) << ")";
}
}  // namespace hixl

// Status assertions that print the full Status text on failure.
#define HIXL_EXPECT_OK(expr)                                             \
  do {                                                                   \
    ::hixl::Status hixl_s_ = (expr);                                     \
    EXPECT_TRUE(hixl_s_.ok()) << #expr << " -> " << hixl_s_.ToString(); \
  } while (0)
#define HIXL_ASSERT_OK(expr)                                             \
  do {                                                                   \
    ::hixl::Status hixl_s_ = (expr);                                     \
    ASSERT_TRUE(hixl_s_.ok()) << #expr << " -> " << hixl_s_.ToString(); \
  } while (0)
#define HIXL_EXPECT_CODE(code_, expr)                                               \
  do {                                                                              \
    ::hixl::Status hixl_s_ = (expr);                                                \
    EXPECT_EQ(hixl_s_.code(), (code_)) << #expr << " -> " << hixl_s_.ToString();    \
  } while (0)
#define HIXL_EXPECT_NOT_OK(expr)                                                    \
  do {                                                                              \
    ::hixl::Status hixl_s_ = (expr);                                                \
    EXPECT_FALSE(hixl_s_.ok()) << #expr << " unexpectedly succeeded";              \
  } while (0)

#endif  // HIXL_TESTS_PEER_PROCESS_H_
