// tests/capi/c_api_gtest.cc — every function of the C API (hixl/hixl_c.h),
// with good and bad input: NULL and stale handles, wrong sizes, truncated,
// tampered and dead-engine handle strings, requests used after destroy,
// notifications (queue limits, partial hixlGetNotifies, transfers that carry
// one), cancellation, handles of an engine restarted on the same port, and a
// real second process (the decode example) as the target.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hixl/hixl.h"
#include "kv_cache.h"

namespace {

#define EXPECT_ST(expected, call) \
  EXPECT_EQ((expected), (call)) << #call << ": " << hixlGetLastErrorMessage()
#define ASSERT_ST(expected, call) \
  ASSERT_EQ((expected), (call)) << #call << ": " << hixlGetLastErrorMessage()

HixlEngine MakeEngine(bool listen, const char* link = nullptr) {
  HixlConfig cfg = nullptr;
  EXPECT_ST(HIXL_SUCCESS, hixlCreateConfig(&cfg));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1"));
  if (listen) {
    EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, 0));
  }
  if (link != nullptr) {
    EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_LINK_TYPE, link));
  }
  HixlEngine e = nullptr;
  EXPECT_ST(HIXL_SUCCESS, hixlCreateEngine(cfg, &e));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyConfig(cfg));
  return e;
}

// An engine with extra options (key, value) on top of LOCAL_IP 127.0.0.1;
// port < 0: client-only.
HixlEngine MakeEngineWith(int port, std::vector<std::pair<std::string, std::string>> kv,
                          HixlStatus* status = nullptr) {
  HixlConfig cfg = nullptr;
  EXPECT_ST(HIXL_SUCCESS, hixlCreateConfig(&cfg));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1"));
  if (port >= 0) {
    EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, port));
  }
  for (auto& [k, v] : kv)
    EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(cfg, k.c_str(), v.c_str())) << k;
  HixlEngine e = nullptr;
  HixlStatus s = hixlCreateEngine(cfg, &e);
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_ST(HIXL_SUCCESS, s);
  }
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyConfig(cfg));
  return e;
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The g= field of a fresh handle of engine e.
uint64_t GenerationOf(HixlEngine e) {
  static char probe[64];
  HixlMemHandle h = nullptr;
  if (hixlRegisterMemory(e, probe, sizeof probe, HIXL_MEM_PERM_READ, &h) != HIXL_SUCCESS) return 0;
  const char* str = hixlMemHandleSerialize(h);
  std::string s = str != nullptr ? str : "";
  hixlUnregisterMemory(e, h);
  size_t g = s.find(";g=");
  if (g == std::string::npos) return 0;
  return std::strtoull(s.c_str() + g + 3, nullptr, 10);
}

std::vector<HixlNotify> TakeNotifies(HixlEngine e, size_t capacity) {
  std::vector<HixlNotify> out(capacity);
  size_t n = 99999;
  EXPECT_ST(HIXL_SUCCESS, hixlGetNotifies(e, out.data(), out.size(), &n));
  EXPECT_LE(n, capacity);
  out.resize(std::min(n, capacity));
  return out;
}

// Polls until at least one notification arrived (or 10 s passed).
std::vector<HixlNotify> WaitNotifies(HixlEngine e, size_t capacity = 16) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto got = TakeNotifies(e, capacity);
    if (!got.empty() || std::chrono::steady_clock::now() >= deadline) return got;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string Name(const HixlNotify& n) { return std::string(n.name, n.name_len); }
std::string Msg(const HixlNotify& n) { return std::string(n.msg, n.msg_len); }

// A target engine with a registered buffer and an initiator holding the
// deserialized handle.
class Pair : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    target_ = MakeEngine(true);
    init_ = MakeEngine(false, GetParam());
    ASSERT_NE(target_, nullptr);
    ASSERT_NE(init_, nullptr);
    buf_.assign(kSize, 0);
    ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(target_, buf_.data(), kSize,
                                               HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE, &mine_));
    const char* s = hixlMemHandleSerialize(mine_);
    ASSERT_NE(s, nullptr);
    str_ = s;
    ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, s, &theirs_));
    src_.resize(kSize);
    for (size_t i = 0; i < kSize; ++i) src_[i] = static_cast<unsigned char>(i * 131 + 7);
  }
  void TearDown() override {
    if (init_) {
      EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(init_));
    }
    if (target_) {
      EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(target_));
    }
  }
  static constexpr size_t kSize = 1 << 20;
  HixlEngine target_ = nullptr, init_ = nullptr;
  HixlMemHandle mine_ = nullptr, theirs_ = nullptr;
  std::string str_;
  std::vector<unsigned char> buf_, src_;
};

INSTANTIATE_TEST_SUITE_P(Links, Pair, ::testing::Values("AUTO", "SHM", "TCP"));

TEST(CApiStatus, ErrorStrings) {
  for (int c : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1000, 77, -1}) {
    const char* s = hixlGetErrorString(static_cast<HixlStatus>(c));
    ASSERT_NE(s, nullptr);
    EXPECT_GT(std::strlen(s), 0u);
  }
  EXPECT_STREQ(hixlGetErrorString(HIXL_SUCCESS), "SUCCESS");
  EXPECT_EQ(std::string(hixlGetErrorString(HIXL_CANCELLED)).rfind("CANCELLED", 0), 0u);
  EXPECT_EQ(HIXL_CANCELLED, static_cast<int>(hixl::StatusCode::kCancelled));
  EXPECT_NE(std::string(hixlGetErrorString(static_cast<HixlStatus>(77))).find("UNKNOWN"),
            std::string::npos);
  EXPECT_NE(hixlGetLastErrorMessage(), nullptr);
}

TEST(CApiConfig, KeysAndValues) {
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCreateConfig(nullptr));
  HixlConfig c = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlCreateConfig(&c));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, "127.0.0.1"));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, "::1"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, "localhost"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, "1.2.3.4:5"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, ""));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_LOCAL_PORT, 0));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, HIXL_OPTION_LOCAL_PORT, "18000"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, HIXL_OPTION_LOCAL_PORT, -1));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, HIXL_OPTION_LOCAL_PORT, 65536));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_PORT, "12ab"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_PORT, " 12"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, HIXL_OPTION_REMOTE_PORT, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, HIXL_OPTION_LOCAL_IP, 5));
  for (const char* v : {"AUTO", "SHM", "TCP", "HCCS", "UCX", "RDMA"}) {
    EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, HIXL_OPTION_LINK_TYPE, v));
  }
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LINK_TYPE, "FOO"));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, HIXL_OPTION_ENABLE_USE_FABRIC_MEM, "1"));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_ENABLE_USE_FABRIC_MEM, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_ENABLE_USE_FABRIC_MEM, "yes"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, "NoSuchKey", "1"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, "NoSuchKey", 1));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, nullptr, "1"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(nullptr, HIXL_OPTION_LOCAL_IP, "1.1.1.1"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(nullptr, HIXL_OPTION_LOCAL_PORT, 1));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_TRANSFER_TIMEOUT_MS, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, HIXL_OPTION_CONNECT_TIMEOUT_MS, 0));
  // GLOBAL_RESOURCE_CONFIG: a JSON object of engine options.
  const char* grc = HIXL_OPTION_GLOBAL_RESOURCE_CONFIG;
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, grc, "{\"CopyThreads\":\"2\",\"TcpLanes\":2}"));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, grc, "{}"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, grc, "{\"Bogus\":\"1\"}"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, grc, "{\"CopyThreads\":{\"a\":1}}"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, grc, "[1,2]"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, grc, "{\"CopyThreads\":"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, grc, ""));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetInt(c, grc, 1));
  // C++ option keys are accepted directly.
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, "CopyThreads", "3"));
  // Every key of hixl::options, directly and inside GLOBAL_RESOURCE_CONFIG.
  const std::map<std::string, std::string> every = {
      {hixl::options::kLinkType, "AUTO"},
      {hixl::options::kCopyThreads, "2"},
      {hixl::options::kEnableUseFabricMem, "1"},
      {hixl::options::kDeregisterTimeoutMs, "5000"},
      {hixl::options::kHandshakeTimeoutMs, "5000"},
      {hixl::options::kTcpLanes, "2"},
      {hixl::options::kTcpSliceSize, "1048576"},
      {hixl::options::kTcpIoThreads, "2"},
      {hixl::options::kHeartbeatIntervalMs, "500"},
      {hixl::options::kHeartbeatMisses, "4"},
      {hixl::options::kAutoConnect, "1"},
      {hixl::options::kConnectTimeoutMs, "2000"},
      {hixl::options::kMaxPeers, "8"},
      {hixl::options::kPeersLowWater, "4"},
      {hixl::options::kNotifyQueueDepth, "16"},
  };
  std::string json = "{";
  for (const auto& [k, v] : every) {
    EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, k.c_str(), v.c_str())) << k;
    json += (json.size() > 1 ? ",\"" : "\"") + k + "\":\"" + v + "\"";
  }
  json += "}";
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, grc, json.c_str())) << json;
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, grc, "{\"AutoConnect\":true,\"MaxPeers\":4}"));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_NOTIFY_QUEUE_DEPTH, 8));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_HEARTBEAT_INTERVAL_MS, 100));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_HEARTBEAT_MISSES, 3));
  EXPECT_ST(HIXL_SUCCESS, hixlConfigSetInt(c, HIXL_OPTION_MAX_PEERS, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_NOTIFY_QUEUE_DEPTH, ""));
  // ConnectTimeoutMs inside the JSON is range-checked like the direct key.
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, grc, "{\"ConnectTimeoutMs\":0}"));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyConfig(c));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyConfig(c));  // twice
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConfigSetString(c, HIXL_OPTION_LOCAL_IP, "1.1.1.1"));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyConfig(nullptr));
}

HixlStatus CreateWith(std::vector<std::pair<const char*, const char*>> kv, HixlEngine* out) {
  HixlConfig c = nullptr;
  EXPECT_ST(HIXL_SUCCESS, hixlCreateConfig(&c));
  for (auto& [k, v] : kv) EXPECT_ST(HIXL_SUCCESS, hixlConfigSetString(c, k, v));
  HixlStatus s = hixlCreateEngine(c, out);
  hixlDestroyConfig(c);
  return s;
}

TEST(CApiEngine, CreateAndDestroy) {
  HixlEngine e = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCreateEngine(nullptr, &e));
  HixlConfig c = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlCreateConfig(&c));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCreateEngine(c, nullptr));
  hixlDestroyConfig(c);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCreateEngine(c, &e));  // destroyed config
  EXPECT_EQ(e, nullptr);
#ifdef HIXL_TEST_UCX
  // RDMA/UCX: this build has the UCX transport.
  for (const char* lt : {"RDMA", "UCX"}) {
    ASSERT_ST(HIXL_SUCCESS, CreateWith({{HIXL_OPTION_LINK_TYPE, lt}}, &e));
    EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
    e = nullptr;
  }
#else
  // RDMA/UCX: not in this build.
  EXPECT_ST(HIXL_UNSUPPORTED, CreateWith({{HIXL_OPTION_LINK_TYPE, "RDMA"}}, &e));
  EXPECT_ST(HIXL_UNSUPPORTED, CreateWith({{HIXL_OPTION_LINK_TYPE, "UCX"}}, &e));
#endif
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{"CopyThreads", "0"}}, &e));
  // The engine checks the values of the new options.
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{HIXL_OPTION_NOTIFY_QUEUE_DEPTH, "0"}}, &e));
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{HIXL_OPTION_HEARTBEAT_INTERVAL_MS, "5"}}, &e));
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{HIXL_OPTION_HEARTBEAT_MISSES, "0"}}, &e));
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{"AutoConnect", "yes"}}, &e));
  EXPECT_ST(HIXL_PARAM_INVALID,
            CreateWith({{HIXL_OPTION_PEERS_LOW_WATER, "2"}}, &e));  // no MaxPeers
  EXPECT_ST(HIXL_PARAM_INVALID,
            CreateWith({{HIXL_OPTION_MAX_PEERS, "4"}, {HIXL_OPTION_PEERS_LOW_WATER, "4"}}, &e));
  EXPECT_EQ(e, nullptr);
  ASSERT_ST(HIXL_SUCCESS, CreateWith({{HIXL_OPTION_LOCAL_IP, "127.0.0.1"},
                                      {HIXL_OPTION_HEARTBEAT_INTERVAL_MS, "200"},
                                      {HIXL_OPTION_HEARTBEAT_MISSES, "5"},
                                      {HIXL_OPTION_MAX_PEERS, "4"},
                                      {HIXL_OPTION_NOTIFY_QUEUE_DEPTH, "64"},
                                      {"AutoConnect", "1"},
                                      {HIXL_OPTION_CONNECT_TIMEOUT_MS, "1500"}},
                                     &e));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
  e = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{HIXL_OPTION_REMOTE_IP, "127.0.0.1"}}, &e));
  EXPECT_EQ(e, nullptr);
  // The seed's config: HCCS + fabric memory, a default remote nobody serves.
  ASSERT_ST(HIXL_SUCCESS, CreateWith({{HIXL_OPTION_LOCAL_IP, "127.0.0.1"},
                                      {HIXL_OPTION_LOCAL_PORT, "0"},
                                      {HIXL_OPTION_REMOTE_IP, "127.0.0.1"},
                                      {HIXL_OPTION_REMOTE_PORT, "1"},
                                      {HIXL_OPTION_LINK_TYPE, "HCCS"},
                                      {HIXL_OPTION_ENABLE_USE_FABRIC_MEM, "1"}},
                                     &e));
  const char* local = hixlGetLocalEngine(e);
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(std::string(local).rfind("127.0.0.1:", 0), 0u) << local;
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyEngine(e));  // twice
  EXPECT_EQ(hixlGetLocalEngine(e), nullptr);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyEngine(nullptr));
  // A pointer that was never a handle is never dereferenced.
  int junk = 0;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyEngine(reinterpret_cast<HixlEngine>(&junk)));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConnect(reinterpret_cast<HixlEngine>(&junk), "1.1.1.1:1", 10));
  // Client-only engine: "ip".
  HixlEngine client = MakeEngine(false);
  EXPECT_STREQ(hixlGetLocalEngine(client), "127.0.0.1");
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(client));
}

TEST(CApiEngine, ConnectDisconnect) {
  HixlEngine a = MakeEngine(true), b = MakeEngine(false);
  std::string addr = hixlGetLocalEngine(a);
  EXPECT_ST(HIXL_SUCCESS, hixlConnect(b, addr.c_str(), 2000));
  EXPECT_ST(HIXL_ALREADY_CONNECTED, hixlConnect(b, addr.c_str(), 2000));
  EXPECT_ST(HIXL_SUCCESS, hixlDisconnect(b, addr.c_str(), 2000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConnect(b, nullptr, 10));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDisconnect(b, nullptr, 10));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlConnect(nullptr, addr.c_str(), 10));
  EXPECT_NE(HIXL_SUCCESS, hixlConnect(b, "garbage", 10));
  hixlDestroyEngine(b);
  hixlDestroyEngine(a);
}

// Whether addr lies in one of the engine's memfds for moved application
// memory ("memfd:hixl-user" in this process's maps).
bool InEngineMemfd(const void* addr) {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[512];
  bool found = false;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2 || a < lo || a >= hi) continue;
    found = std::strstr(line, "memfd:hixl-user") != nullptr;
    break;
  }
  std::fclose(f);
  return found;
}

// hixlRegisterMemoryFlags with HIXL_REGISTER_SHARE_BY_MAPPING: malloc memory
// is moved into an engine memfd in place (contents kept), a peer writes into
// it, and unregistering moves the pages back with the written bytes.
TEST(CApiMemory, ShareByMappingMovesPagesInPlaceAndBack) {
  HixlEngine target = MakeEngine(true), init = MakeEngine(false, "SHM");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(init, nullptr);
  constexpr size_t kSize = 256 * 1024;
  auto* buf = static_cast<unsigned char*>(std::aligned_alloc(4096, kSize));
  ASSERT_NE(buf, nullptr);
  for (size_t i = 0; i < kSize; ++i) buf[i] = static_cast<unsigned char>(i * 7 + 1);
  HixlMemHandle h = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemoryFlags(target, buf, kSize, 3, 0x2u, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemoryFlags(target, buf, kSize, 3, ~0u, &h));
  EXPECT_EQ(h, nullptr);
  EXPECT_FALSE(InEngineMemfd(buf));
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemoryFlags(target, buf, kSize, HIXL_MEM_PERM_WRITE,
                                                  HIXL_REGISTER_SHARE_BY_MAPPING, &h));
  EXPECT_TRUE(InEngineMemfd(buf));
  EXPECT_TRUE(InEngineMemfd(buf + kSize - 1));
  EXPECT_EQ(buf[12345], static_cast<unsigned char>(12345 * 7 + 1)) << "contents kept by the move";
  HixlMemHandle theirs = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init, hixlMemHandleSerialize(h), &theirs));
  std::vector<unsigned char> src(kSize);
  for (size_t i = 0; i < kSize; ++i) src[i] = static_cast<unsigned char>(i * 13 + 5);
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init, src.data(), kSize, theirs, 0, nullptr));
  EXPECT_EQ(0, std::memcmp(buf, src.data(), kSize));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(init, theirs));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(target, h));
  EXPECT_FALSE(InEngineMemfd(buf)) << "the pages went back to private memory";
  EXPECT_EQ(0, std::memcmp(buf, src.data(), kSize)) << "with the bytes the peer wrote";
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(init));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(target));
  std::free(buf);
}

TEST(CApiMemory, RegisterUnregisterAllocFree) {
  HixlEngine e = MakeEngine(true), other = MakeEngine(true);
  std::vector<char> buf(65536);
  HixlMemHandle h = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(nullptr, buf.data(), 4096, 3, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(e, nullptr, 4096, 3, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(e, buf.data(), 0, 3, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(e, buf.data(), 4096, 0, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(e, buf.data(), 4096, 4, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(e, buf.data(), 4096, 3, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(e, buf.data(), SIZE_MAX, 3, &h));
  EXPECT_EQ(h, nullptr);
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(e, buf.data(), buf.size(), HIXL_MEM_PERM_READ, &h));
  EXPECT_EQ(hixlMemHandleGetSize(h), buf.size());
  // The same region twice: two handles, released independently.
  HixlMemHandle h2 = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(e, buf.data(), buf.size(), HIXL_MEM_PERM_READ, &h2));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlUnregisterMemory(other, h));  // wrong engine
  EXPECT_ST(HIXL_PARAM_INVALID, hixlUnregisterMemory(e, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlUnregisterMemory(nullptr, h));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(e, h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlUnregisterMemory(e, h));  // twice
  EXPECT_EQ(hixlMemHandleSerialize(h), nullptr);
  EXPECT_EQ(hixlMemHandleGetSize(h), 0u);
  EXPECT_NE(hixlMemHandleSerialize(h2), nullptr);
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(e, h2));

  void* p = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlAllocMemory(e, 0, &p));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlAllocMemory(e, 4096, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlAllocMemory(nullptr, 4096, &p));
  ASSERT_ST(HIXL_SUCCESS, hixlAllocMemory(e, 1 << 20, &p));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, 1 << 20);
  HixlMemHandle part = nullptr;
  ASSERT_ST(HIXL_SUCCESS,
            hixlRegisterMemory(e, static_cast<char*>(p) + 4096, 8192, HIXL_MEM_PERM_WRITE, &part));
  EXPECT_EQ(hixlMemHandleGetSize(part), 8192u);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(other, p));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, static_cast<char*>(p) + 1));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, buf.data()));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlFreeMemory(e, p));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, p));           // twice
  EXPECT_ST(HIXL_PARAM_INVALID, hixlUnregisterMemory(e, part));  // died with the memory
  // Leftovers are released by hixlDestroyEngine.
  ASSERT_ST(HIXL_SUCCESS, hixlAllocMemory(e, 4096, &p));
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(e, buf.data(), 4096, 3, &h));
  hixlDestroyEngine(other);
  hixlDestroyEngine(e);
  EXPECT_EQ(hixlMemHandleSerialize(h), nullptr);
}

TEST(CApiMemory, SerializeDeserializeBadStrings) {
  HixlEngine e = MakeEngine(true), client = MakeEngine(false);
  std::vector<char> buf(4096);
  HixlMemHandle h = nullptr, c = nullptr, out = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(e, buf.data(), buf.size(), 3, &h));
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(client, buf.data(), buf.size(), 3, &c));
  EXPECT_EQ(hixlMemHandleSerialize(c), nullptr);  // client-only: unreachable
  EXPECT_EQ(hixlMemHandleSerialize(nullptr), nullptr);
  const std::string s = hixlMemHandleSerialize(h);
  EXPECT_NE(s.find(hixlGetLocalEngine(e)), std::string::npos) << s;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(client, s.c_str(), &out));
  EXPECT_EQ(hixlMemHandleGetSize(out), buf.size());
  EXPECT_EQ(std::string(hixlMemHandleSerialize(out)), s);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(nullptr, s.c_str(), &out));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, nullptr, &out));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, s.c_str(), nullptr));
  // Every truncation and every single-character change is rejected.
  for (size_t n = 0; n < s.size(); ++n) {
    HixlMemHandle bad = nullptr;
    EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, s.substr(0, n).c_str(), &bad))
        << " truncated to " << n;
    EXPECT_EQ(bad, nullptr);
  }
  for (size_t i = 0; i < s.size(); ++i) {
    for (char ch : {'0', '9', 'f', ';', 'x'}) {
      if (s[i] == ch) continue;
      std::string t = s;
      t[i] = ch;
      HixlMemHandle bad = nullptr;
      EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, t.c_str(), &bad))
          << " changed " << i << " to " << ch << ": " << t;
    }
  }
  EXPECT_EQ(s.rfind("hixl-mem2;", 0), 0u) << s;
  EXPECT_NE(s.find(";g=" + std::to_string(GenerationOf(e)) + ";"), std::string::npos) << s;
  for (const char* junk :
       {"", "hixl-mem1;", "hixl-mem2;", "garbage", "hixl-mem1;e=;a=;l=;p=;c=0000000000000000",
        "hixl-mem2;e=;g=;a=;l=;p=;c=0000000000000000"}) {
    HixlMemHandle bad = nullptr;
    EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, junk, &bad)) << junk;
  }
  std::string longer = s + std::string(1000, 'a');
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, longer.c_str(), &out));
  // The previous format (no generation), with a valid checksum: refused, and
  // the message says why.
  std::string body = s.substr(0, s.rfind(";c="));
  body.replace(0, 9, "hixl-mem1");
  const size_t g = body.find(";g=");
  body.erase(g, body.find(';', g + 1) - g);
  char sum[32];
  std::snprintf(sum, sizeof sum, ";c=%016" PRIx64, Fnv1a(body));
  HixlMemHandle old = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, (body + sum).c_str(), &old))
      << body;
  EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("hixl-mem1"), std::string::npos);
  // The same string re-tagged hixl-mem2 with a fresh checksum: the generation
  // field is missing, so it is malformed.
  body.replace(0, 9, "hixl-mem2");
  std::snprintf(sum, sizeof sum, ";c=%016" PRIx64, Fnv1a(body));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, (body + sum).c_str(), &old));
  // The engine a handle names.
  EXPECT_STREQ(hixlMemHandleGetEngine(h), hixlGetLocalEngine(e));
  EXPECT_STREQ(hixlMemHandleGetEngine(out), hixlGetLocalEngine(e));
  EXPECT_EQ(hixlMemHandleGetEngine(c), nullptr);  // client-only
  EXPECT_EQ(hixlMemHandleGetEngine(nullptr), nullptr);
  hixlDestroyEngine(client);
  hixlDestroyEngine(e);
}

TEST_P(Pair, WriteReadSyncAndAsync) {
  HixlRequest r = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init_, src_.data(), kSize, theirs_, 0, &r));
  ASSERT_NE(r, nullptr);
  EXPECT_ST(HIXL_SUCCESS, hixlPollRequest(init_, r));
  EXPECT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, r, HIXL_WAIT_FOREVER));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  EXPECT_EQ(0, std::memcmp(buf_.data(), src_.data(), kSize));
  // A partial write at an offset, without a request.
  std::vector<unsigned char> small(1000, 0xab);
  ASSERT_ST(HIXL_SUCCESS,
            hixlWriteRemote(init_, small.data(), small.size(), theirs_, 5000, nullptr));
  EXPECT_EQ(buf_[5000], 0xab);
  EXPECT_EQ(buf_[5999], 0xab);
  EXPECT_EQ(buf_[6000], src_[6000]);
  // Read back, async.
  std::vector<unsigned char> back(kSize);
  ASSERT_ST(HIXL_SUCCESS, hixlReadRemoteAsync(init_, back.data(), kSize, theirs_, 0, &r));
  EXPECT_NE(r->request_id, 0u);
  EXPECT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, r, 20000));
  EXPECT_ST(HIXL_SUCCESS, hixlPollRequest(init_, r));  // ended: same answer
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  EXPECT_EQ(0, std::memcmp(back.data(), buf_.data(), kSize));
  ASSERT_ST(HIXL_SUCCESS, hixlReadRemote(init_, back.data(), 16, theirs_, kSize - 16, nullptr));
  EXPECT_EQ(0, std::memcmp(back.data(), buf_.data() + kSize - 16, 16));
  // Write async, many in flight.
  std::vector<HixlRequest> reqs(16);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(init_, src_.data() + i * 4096, 4096, theirs_,
                                                 i * 4096, &reqs[i]));
  }
  for (auto* q : reqs) {
    EXPECT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, q, 20000));
    EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(q));
  }
  EXPECT_EQ(0, std::memcmp(buf_.data(), src_.data(), 16 * 4096));
}

TEST_P(Pair, BoundsSizesAndPermissions) {
  auto w = [&](const void* p, size_t n, HixlMemHandle h, uint64_t off) {
    return hixlWriteRemote(init_, p, n, h, off, nullptr);
  };
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), kSize + 1, theirs_, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), 2, theirs_, kSize - 1));
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), 1, theirs_, kSize));
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), 16, theirs_, UINT64_MAX));
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), SIZE_MAX, theirs_, 1));
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), 0, theirs_, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, w(nullptr, 16, theirs_, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, w(src_.data(), 16, nullptr, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemote(nullptr, src_.data(), 16, theirs_, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlReadRemote(init_, nullptr, 16, theirs_, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlReadRemoteAsync(init_, buf_.data(), 16, theirs_, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemoteAsync(init_, src_.data(), 16, theirs_, 0, nullptr));
  // A handle owned by another engine.
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemote(init_, src_.data(), 16, mine_, 0, nullptr));
  EXPECT_TRUE(std::all_of(buf_.begin(), buf_.end(), [](unsigned char c) { return c == 0; }));
  // READ-only and WRITE-only regions.
  std::vector<unsigned char> ro(4096, 1), wo(4096, 2), tmp(4096);
  HixlMemHandle hro = nullptr, hwo = nullptr, rro = nullptr, rwo = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(target_, ro.data(), 4096, HIXL_MEM_PERM_READ, &hro));
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(target_, wo.data(), 4096, HIXL_MEM_PERM_WRITE, &hwo));
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, hixlMemHandleSerialize(hro), &rro));
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, hixlMemHandleSerialize(hwo), &rwo));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemote(init_, src_.data(), 16, rro, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlReadRemote(init_, tmp.data(), 16, rwo, 0, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlReadRemote(init_, tmp.data(), 4096, rro, 0, nullptr));
  EXPECT_EQ(tmp, ro);
  EXPECT_ST(HIXL_SUCCESS, hixlWriteRemote(init_, src_.data(), 4096, rwo, 0, nullptr));
  EXPECT_EQ(0, std::memcmp(wo.data(), src_.data(), 4096));
  EXPECT_EQ(ro, std::vector<unsigned char>(4096, 1));
  // A handle the target has since unregistered: the target refuses.
  ASSERT_ST(HIXL_SUCCESS, hixlUnregisterMemory(target_, hwo));
  EXPECT_NE(HIXL_SUCCESS, hixlWriteRemote(init_, src_.data(), 16, rwo, 0, nullptr));
  EXPECT_EQ(wo[0], src_[0]);
}

TEST_P(Pair, Batch) {
  constexpr size_t kN = 1000;
  std::vector<HixlTransferDesc> d(kN);
  for (size_t i = 0; i < kN; ++i) {
    d[i] = {src_.data() + i * 512, theirs_, (kN - 1 - i) * 1024, 512};
  }
  HixlRequest r = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatch(init_, HIXL_OP_WRITE, d.data(), kN, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(0, std::memcmp(buf_.data() + (kN - 1 - i) * 1024, src_.data() + i * 512, 512)) << i;
  }
  std::vector<unsigned char> back(kN * 512);
  for (size_t i = 0; i < kN; ++i) d[i].local = back.data() + i * 512;
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchAsync(init_, HIXL_OP_READ, d.data(), kN, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, r, 20000));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  EXPECT_EQ(0, std::memcmp(back.data(), src_.data(), kN * 512));
  // One bad descriptor fails the batch; nothing moves.
  std::fill(buf_.begin(), buf_.end(), 0);
  d[kN / 2].remote_offset = kSize;
  for (size_t i = 0; i < kN; ++i) d[i].local = src_.data();
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatch(init_, HIXL_OP_WRITE, d.data(), kN, nullptr));
  EXPECT_TRUE(std::all_of(buf_.begin(), buf_.end(), [](unsigned char c) { return c == 0; }));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatch(init_, HIXL_OP_WRITE, nullptr, 1, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatch(init_, HIXL_OP_WRITE, d.data(), 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlTransferBatch(init_, static_cast<HixlTransferOp>(7), d.data(), 1, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatchAsync(init_, HIXL_OP_WRITE, d.data(), 1, nullptr));
  // Two different remote engines in one batch.
  HixlEngine third = MakeEngine(true);
  std::vector<char> other(4096);
  HixlMemHandle oh = nullptr, ooh = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(third, other.data(), 4096, 3, &oh));
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, hixlMemHandleSerialize(oh), &ooh));
  HixlTransferDesc two[2] = {{src_.data(), theirs_, 0, 16}, {src_.data(), ooh, 0, 16}};
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatch(init_, HIXL_OP_WRITE, two, 2, nullptr));
  hixlDestroyEngine(third);
}

TEST_P(Pair, RequestsAfterDestroyAndForeignEngines) {
  HixlRequest r = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlPollRequest(init_, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWaitRequest(init_, nullptr, 10));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyRequest(nullptr));
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(init_, src_.data(), kSize, theirs_, 0, &r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlPollRequest(target_, r));  // another engine's request
  EXPECT_ST(HIXL_PARAM_INVALID, hixlPollRequest(nullptr, r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWaitRequest(init_, r, -5));
  HixlStatus s = hixlWaitRequest(init_, r, 0);
  EXPECT_TRUE(s == HIXL_SUCCESS || s == HIXL_IN_PROGRESS) << hixlGetErrorString(s);
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));  // waits for the end
  EXPECT_EQ(0, std::memcmp(buf_.data(), src_.data(), kSize));
  // Polled, waited or destroyed after destroy: errors, not crashes.
  EXPECT_ST(HIXL_PARAM_INVALID, hixlPollRequest(init_, r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWaitRequest(init_, r, HIXL_WAIT_FOREVER));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlDestroyRequest(r));
  // A request outlives its engine and then reports the engine as invalid.
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(init_, src_.data(), 4096, theirs_, 0, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(init_));
  HixlEngine dead = init_;
  init_ = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlPollRequest(dead, r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemote(dead, src_.data(), 16, theirs_, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlUnregisterMemory(dead, theirs_));
  EXPECT_EQ(r->request_id != 0, true);
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
}

TEST_P(Pair, DeadTargetEngine) {
  // The target goes away: the string still parses, transfers fail cleanly.
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init_, src_.data(), 64, theirs_, 0, nullptr));
  ASSERT_ST(HIXL_SUCCESS, hixlDestroyEngine(target_));
  target_ = nullptr;
  // The initiator learns of the close from its control link (asynchronously;
  // the memory itself is still alive in this process): bounded.
  HixlStatus s = HIXL_SUCCESS;
  for (int i = 0; i < 500 && s == HIXL_SUCCESS; ++i) {
    s = hixlWriteRemote(init_, src_.data(), 64, theirs_, 0, nullptr);
    if (s == HIXL_SUCCESS) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(HIXL_SUCCESS, s);
  HixlMemHandle again = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, str_.c_str(), &again));
  EXPECT_NE(HIXL_SUCCESS, hixlWriteRemote(init_, src_.data(), 64, again, 0, nullptr));
  HixlRequest r = nullptr;
  s = hixlWriteRemoteAsync(init_, src_.data(), 64, again, 0, &r);
  if (s == HIXL_SUCCESS) {
    EXPECT_NE(HIXL_SUCCESS, hixlWaitRequest(init_, r, 20000));
    hixlDestroyRequest(r);
  }
}

TEST_P(Pair, ConcurrentWriters) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        size_t off = static_cast<size_t>(t) * (kSize / 4) + static_cast<size_t>(i) * 1024;
        if (hixlWriteRemote(init_, src_.data() + off, 1024, theirs_, off, nullptr) !=
            HIXL_SUCCESS) {
          failures++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < 4; ++t) {
    size_t off = static_cast<size_t>(t) * (kSize / 4);
    EXPECT_EQ(0, std::memcmp(buf_.data() + off, src_.data() + off, 50 * 1024));
  }
}

// ------------------------------------------------------------ notifications

TEST(CApiNotify, RoundTripAndLimits) {
  HixlEngine rx = MakeEngine(true), tx = MakeEngine(false), tx2 = MakeEngine(true);
  const std::string to = hixlGetLocalEngine(rx);
  // Any bytes, NUL included.
  const char bin[] = {'a', '\0', 'b', '\xff', '\n'};
  ASSERT_ST(HIXL_SUCCESS, hixlSendNotify(tx, to.c_str(), "kv/ready", bin, sizeof bin, 2000));
  auto got = TakeNotifies(rx, 4);  // queued when hixlSendNotify returned
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Name(got[0]), "kv/ready");
  EXPECT_EQ(got[0].name_len, 8u);
  EXPECT_EQ(got[0].name[8], '\0');
  EXPECT_EQ(Msg(got[0]), std::string(bin, sizeof bin));
  EXPECT_EQ(got[0].msg[sizeof bin], '\0');
  EXPECT_STREQ(got[0].from, "127.0.0.1");  // a client-only sender
  EXPECT_TRUE(TakeNotifies(rx, 4).empty());
  // From a listening sender: its address.
  ASSERT_ST(HIXL_SUCCESS, hixlSendNotify(tx2, to.c_str(), "x", nullptr, 0, 2000));
  got = TakeNotifies(rx, 4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_STREQ(got[0].from, hixlGetLocalEngine(tx2));
  EXPECT_EQ(got[0].msg_len, 0u);
  EXPECT_EQ(got[0].msg[0], '\0');
  // The longest name and message; empty name.
  const std::string name(HIXL_MAX_NOTIFY_LEN, 'n'), msg(HIXL_MAX_NOTIFY_LEN, 'm');
  ASSERT_ST(HIXL_SUCCESS,
            hixlSendNotify(tx, to.c_str(), name.c_str(), msg.data(), msg.size(), 2000));
  ASSERT_ST(HIXL_SUCCESS, hixlSendNotify(tx, to.c_str(), "", "m", 1, 2000));
  got = TakeNotifies(rx, 4);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(Name(got[0]), name);
  EXPECT_EQ(Msg(got[0]), msg);
  EXPECT_EQ(got[0].name[HIXL_MAX_NOTIFY_LEN], '\0');
  EXPECT_EQ(got[0].msg[HIXL_MAX_NOTIFY_LEN], '\0');
  EXPECT_EQ(got[1].name_len, 0u);
  // Bad input.
  const std::string too_long(HIXL_MAX_NOTIFY_LEN + 1, 'x');
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(nullptr, to.c_str(), "n", "m", 1, 1000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, nullptr, "n", "m", 1, 1000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, to.c_str(), nullptr, "m", 1, 1000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, to.c_str(), too_long.c_str(), "m", 1, 1000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, to.c_str(), "n", nullptr, 1, 1000));
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlSendNotify(tx, to.c_str(), "n", too_long.data(), too_long.size(), 1000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, to.c_str(), "n", "m", 1, 0));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, to.c_str(), "n", "m", 1, -5));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, "garbage", "n", "m", 1, 1000));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlSendNotify(tx, "127.0.0.1", "n", "m", 1, 1000));  // no port
  HixlNotify one;
  size_t n = 0;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlGetNotifies(nullptr, &one, 1, &n));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlGetNotifies(rx, nullptr, 1, &n));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlGetNotifies(rx, &one, 0, &n));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlGetNotifies(rx, &one, 1, nullptr));
  int junk = 0;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlGetNotifies(reinterpret_cast<HixlEngine>(&junk), &one, 1, &n));
  // Nothing of the refused calls arrived.
  EXPECT_TRUE(TakeNotifies(rx, 4).empty());
  // Nobody listening there.
  HixlEngine gone = MakeEngine(true);
  const std::string gone_addr = hixlGetLocalEngine(gone);
  hixlDestroyEngine(gone);
  EXPECT_NE(HIXL_SUCCESS, hixlSendNotify(tx, gone_addr.c_str(), "n", "m", 1, 1000));
  hixlDestroyEngine(tx2);
  hixlDestroyEngine(tx);
  hixlDestroyEngine(rx);
}

TEST(CApiNotify, QueueFullAndPartialTakes) {
  HixlEngine rx = MakeEngineWith(0, {{HIXL_OPTION_NOTIFY_QUEUE_DEPTH, "4"}});
  // (Listening senders: client-only ones on one IP share a name, and so a queue.)
  HixlEngine tx = MakeEngine(true), other = MakeEngine(true);
  const std::string to = hixlGetLocalEngine(rx);
  auto send = [&](HixlEngine from, int i) {
    char name[16], msg[16];
    std::snprintf(name, sizeof name, "n%d", i);
    const int len = std::snprintf(msg, sizeof msg, "m%d", i);
    return hixlSendNotify(from, to.c_str(), name, msg, static_cast<size_t>(len), 2000);
  };
  for (int i = 0; i < 4; ++i) ASSERT_ST(HIXL_SUCCESS, send(tx, i));
  EXPECT_ST(HIXL_RESOURCE_EXHAUSTED, send(tx, 99));  // nothing queued
  EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("full"), std::string::npos)
      << hixlGetLastErrorMessage();
  EXPECT_ST(HIXL_SUCCESS, send(other, 100));  // the limit is per sender
  // Three now; the other two stay queued, in order.
  auto got = TakeNotifies(rx, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(Name(got[0]), "n0");
  EXPECT_EQ(Msg(got[0]), "m0");
  EXPECT_EQ(Name(got[1]), "n1");
  EXPECT_EQ(Name(got[2]), "n2");
  // The sender may queue again; older ones come out first.
  for (int i = 4; i < 6; ++i) ASSERT_ST(HIXL_SUCCESS, send(tx, i));
  got = TakeNotifies(rx, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Name(got[0]), "n3");
  got = TakeNotifies(rx, 10);
  std::vector<std::string> names;
  for (auto& g : got) names.push_back(Name(g));
  EXPECT_EQ(names, (std::vector<std::string>{"n100", "n4", "n5"}));
  EXPECT_TRUE(TakeNotifies(rx, 10).empty());
  hixlDestroyEngine(other);
  hixlDestroyEngine(tx);
  hixlDestroyEngine(rx);
}

TEST(CApiNotify, ConcurrentTakersSeeEachOnce) {
  HixlEngine rx = MakeEngine(true), tx = MakeEngine(false);
  const std::string to = hixlGetLocalEngine(rx);
  constexpr int kN = 300;
  std::atomic<bool> sent{false};
  std::mutex mu;
  std::multiset<std::string> seen;
  std::vector<std::thread> takers;
  for (int t = 0; t < 4; ++t) {
    takers.emplace_back([&, t] {
      std::vector<HixlNotify> buf(static_cast<size_t>(t) + 1);
      for (;;) {
        const bool done = sent.load();
        size_t n = 0;
        if (hixlGetNotifies(rx, buf.data(), buf.size(), &n) != HIXL_SUCCESS) return;
        {
          std::lock_guard<std::mutex> l(mu);
          for (size_t i = 0; i < n; ++i) seen.insert(Name(buf[i]));
        }
        if (done && n == 0) return;
        if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  for (int i = 0; i < kN; ++i) {
    ASSERT_ST(HIXL_SUCCESS,
              hixlSendNotify(tx, to.c_str(), std::to_string(i).c_str(), nullptr, 0, 2000));
  }
  sent = true;
  for (auto& t : takers) t.join();
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) EXPECT_EQ(seen.count(std::to_string(i)), 1u) << i;
  hixlDestroyEngine(tx);
  hixlDestroyEngine(rx);
}

TEST_P(Pair, TransferWithNotify) {
  // The handle names its engine: notifications can go straight to it.
  ASSERT_STREQ(hixlMemHandleGetEngine(theirs_), hixlGetLocalEngine(target_));
  ASSERT_ST(HIXL_SUCCESS,
            hixlSendNotify(init_, hixlMemHandleGetEngine(theirs_), "hello", "hi", 2, 2000));
  auto got = TakeNotifies(target_, 4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Name(got[0]), "hello");

  // Blocking: when it returns, the notification is queued and the data in place.
  HixlTransferDesc d{src_.data(), theirs_, 0, kSize};
  HixlTransferOptions opt{};
  opt.notify_name = "kv/done";
  opt.notify_msg = "layer=3";
  opt.notify_msg_len = 7;
  HixlRequest r = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &opt, 0, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlPollRequest(init_, r));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  got = TakeNotifies(target_, 4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Name(got[0]), "kv/done");
  EXPECT_EQ(Msg(got[0]), "layer=3");
  EXPECT_EQ(0, std::memcmp(buf_.data(), src_.data(), kSize));

  // Async: a thread on the target side checks the bytes the moment the
  // notification shows up.
  std::fill(buf_.begin(), buf_.end(), 0);
  std::vector<unsigned char> src2(kSize);
  for (size_t i = 0; i < kSize; ++i) src2[i] = static_cast<unsigned char>(i * 7 + 1);
  std::atomic<int> seen_ok{-1};
  std::thread watcher([&] {
    auto n = WaitNotifies(target_);
    if (n.size() == 1 && Name(n[0]) == "async/done") {
      seen_ok = std::memcmp(buf_.data(), src2.data(), kSize) == 0 ? 1 : 0;
    }
  });
  HixlTransferDesc d2{src2.data(), theirs_, 0, kSize};
  opt.notify_name = "async/done";
  opt.notify_msg = nullptr;
  opt.notify_msg_len = 0;
  opt.timeout_ms = 20000;
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d2, 1, &opt, 1, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, r, 30000));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  watcher.join();
  EXPECT_EQ(seen_ok.load(), 1) << "notification seen before the data was in place (or not at all)";

  // A READ may carry one too; options NULL is a plain transfer.
  std::vector<unsigned char> back(4096);
  HixlTransferDesc rd{back.data(), theirs_, 0, back.size()};
  opt = HixlTransferOptions{};
  opt.notify_name = "read/done";
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(init_, HIXL_OP_READ, &rd, 1, &opt, 0, nullptr));
  EXPECT_EQ(0, std::memcmp(back.data(), src2.data(), back.size()));
  got = TakeNotifies(target_, 4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Name(got[0]), "read/done");
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(init_, HIXL_OP_READ, &rd, 1, nullptr, 0, nullptr));
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(init_, HIXL_OP_READ, &rd, 1, nullptr, 1, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, r, 20000));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  EXPECT_TRUE(TakeNotifies(target_, 4).empty());

  // Bad options: nothing moves, nothing is delivered.
  std::fill(buf_.begin(), buf_.end(), 0);
  const std::string too_long(HIXL_MAX_NOTIFY_LEN + 1, 'x');
  HixlTransferOptions bad{};
  bad.timeout_ms = -1;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &bad, 0, nullptr));
  bad = HixlTransferOptions{};
  bad.notify_name = too_long.c_str();
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &bad, 0, nullptr));
  bad.notify_name = "n";
  bad.notify_msg = nullptr;
  bad.notify_msg_len = 3;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &bad, 0, nullptr));
  bad.notify_msg = too_long.data();
  bad.notify_msg_len = too_long.size();
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &bad, 0, nullptr));
  bad = HixlTransferOptions{};
  bad.notify_msg = "orphan";
  bad.notify_msg_len = 6;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &bad, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, nullptr, 1, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlTransferBatchEx(nullptr, HIXL_OP_WRITE, &d, 1, nullptr, 0, nullptr));
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlTransferBatchEx(init_, HIXL_OP_WRITE, nullptr, 1, nullptr, 0, nullptr));
  EXPECT_TRUE(std::all_of(buf_.begin(), buf_.end(), [](unsigned char c) { return c == 0; }));
  EXPECT_TRUE(TakeNotifies(target_, 4).empty());
}

TEST_P(Pair, TransferWithNotifyToAFullQueue) {
  HixlEngine rx = MakeEngineWith(0, {{HIXL_OPTION_NOTIFY_QUEUE_DEPTH, "1"}});
  std::vector<unsigned char> mem(4096);
  HixlMemHandle h = nullptr, rh = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(rx, mem.data(), mem.size(), 3, &h));
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, hixlMemHandleSerialize(h), &rh));
  HixlTransferDesc d{src_.data(), rh, 0, mem.size()};
  HixlTransferOptions opt{};
  opt.notify_name = "first";
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &opt, 0, nullptr));
  opt.notify_name = "second";
  // The data is written, but the notification is refused: the transfer says so.
  EXPECT_ST(HIXL_RESOURCE_EXHAUSTED,
            hixlTransferBatchEx(init_, HIXL_OP_WRITE, &d, 1, &opt, 0, nullptr));
  auto got = TakeNotifies(rx, 4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Name(got[0]), "first");
  hixlDestroyEngine(rx);
}

// ------------------------------------------------------------ cancellation

TEST_P(Pair, CancelEndedAndBadRequests) {
  HixlRequest r = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(init_, src_.data(), 4096, theirs_, 0, &r));
  ASSERT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, r, 20000));
  EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(init_, r));  // ended: unchanged
  EXPECT_ST(HIXL_SUCCESS, hixlPollRequest(init_, r));
  EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(init_, r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCancelRequest(target_, r));  // another engine's
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCancelRequest(nullptr, r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCancelRequest(init_, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlCancelRequest(init_, r));  // destroyed
  // A blocking transfer's request has ended by definition.
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init_, src_.data(), 4096, theirs_, 0, &r));
  EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(init_, r));
  EXPECT_ST(HIXL_SUCCESS, hixlPollRequest(init_, r));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  // Cancelled at once: it either finished first or is CANCELLED; either way
  // it has stopped when hixlCancelRequest returns and keeps its answer.
  for (int i = 0; i < 20; ++i) {
    ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(init_, src_.data(), kSize, theirs_, 0, &r));
    EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(init_, r));
    HixlStatus s = hixlPollRequest(init_, r);
    EXPECT_TRUE(s == HIXL_SUCCESS || s == HIXL_CANCELLED) << hixlGetErrorString(s);
    if (s == HIXL_CANCELLED) {
      EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("CANCELLED"), std::string::npos);
    }
    EXPECT_EQ(s, hixlWaitRequest(init_, r, 0));
    EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(init_, r));
    EXPECT_EQ(s, hixlPollRequest(init_, r));
    EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  }
}

// ------------------------------------------------------------ generations

// A free port on 127.0.0.1 (an engine on port 0 picks one, then goes away).
int FreePort() {
  HixlEngine e = MakeEngine(true);
  std::string a = hixlGetLocalEngine(e);
  hixlDestroyEngine(e);
  return std::atoi(a.substr(a.rfind(':') + 1).c_str());
}

HixlEngine EngineOnPort(int port, const char* link = nullptr) {
  std::vector<std::pair<std::string, std::string>> kv;
  if (link != nullptr) kv.emplace_back(HIXL_OPTION_LINK_TYPE, link);
  HixlEngine e = nullptr;
  for (int i = 0; i < 100 && e == nullptr; ++i) {  // the old listener may linger briefly
    HixlStatus s = HIXL_SUCCESS;
    e = MakeEngineWith(port, kv, &s);
    if (e == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return e;
}

class Restart : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Links, Restart, ::testing::Values("AUTO", "TCP"));

TEST_P(Restart, StaleHandleOfARestartedEngineIsRefused) {
  const int port = FreePort();
  std::vector<unsigned char> old_mem(65536, 0), new_mem(65536, 0), src(65536, 0x5c);
  HixlEngine first = EngineOnPort(port);
  ASSERT_NE(first, nullptr);
  HixlEngine init = MakeEngine(false, GetParam());
  HixlMemHandle h = nullptr, stale = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(first, old_mem.data(), old_mem.size(), 3, &h));
  const std::string old_str = hixlMemHandleSerialize(h);
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init, old_str.c_str(), &stale));
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init, src.data(), 4096, stale, 0, nullptr));
  EXPECT_EQ(old_mem[0], 0x5c);

  // The owner goes away; a new engine takes the same port.
  const uint64_t old_generation = GenerationOf(first);
  ASSERT_ST(HIXL_SUCCESS, hixlDestroyEngine(first));
  HixlEngine second = EngineOnPort(port);
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(std::string(hixlGetLocalEngine(second)), "127.0.0.1:" + std::to_string(port));
  EXPECT_NE(GenerationOf(second), old_generation);
  HixlMemHandle h2 = nullptr, fresh = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(second, new_mem.data(), new_mem.size(), 3, &h2));
  const std::string new_str = hixlMemHandleSerialize(h2);
  EXPECT_NE(new_str, old_str);

  // The stale handle is refused, clearly, once the initiator has noticed the
  // old link closed (asynchronous: bounded wait) and reconnected.
  HixlStatus s = HIXL_SUCCESS;
  std::string why;
  for (int i = 0; i < 500 && s == HIXL_SUCCESS; ++i) {
    s = hixlWriteRemote(init, src.data(), 4096, stale, 0, nullptr);
    why = hixlGetLastErrorMessage();
    if (s == HIXL_SUCCESS) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_ST(HIXL_PARAM_INVALID, s) << why;
  EXPECT_NE(why.find("restarted"), std::string::npos) << why;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemote(init, src.data(), 4096, stale, 0, nullptr));
  HixlRequest r = nullptr;
  EXPECT_ST(HIXL_PARAM_INVALID, hixlReadRemoteAsync(init, src.data(), 4096, stale, 0, &r));
  // A re-deserialized copy of the old string is just as stale.
  HixlMemHandle stale2 = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init, old_str.c_str(), &stale2));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlWriteRemote(init, src.data(), 16, stale2, 0, nullptr));
  EXPECT_TRUE(std::all_of(new_mem.begin(), new_mem.end(), [](unsigned char c) { return c == 0; }));

  // A fresh handle of the new engine works, over the link just made.
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init, new_str.c_str(), &fresh));
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init, src.data(), 4096, fresh, 0, nullptr));
  EXPECT_EQ(new_mem[0], 0x5c);
  EXPECT_EQ(new_mem[4095], 0x5c);
  EXPECT_EQ(new_mem[4096], 0);
  // Old and new in one batch: refused before anything moves.
  HixlTransferDesc two[2] = {{src.data(), fresh, 8192, 16}, {src.data(), stale, 0, 16}};
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatch(init, HIXL_OP_WRITE, two, 2, nullptr));
  EXPECT_EQ(new_mem[8192], 0);
  hixlDestroyEngine(init);
  hixlDestroyEngine(second);
}

// ------------------------------------------------------------ a real second process

class DecodeProcess {
 public:
  explicit DecodeProcess(size_t size, int port = 0) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::string sz = std::to_string(size), p = std::to_string(port);
      execl(HIXL_EXAMPLE_DECODE, HIXL_EXAMPLE_DECODE, "--slots", "1", "--size", sz.c_str(),
            "--port", p.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~DecodeProcess() {
    if (to_ >= 0) close(to_);
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (from_ >= 0) close(from_);
  }
  // One line, or "" after 30 s or EOF.
  std::string Line() {
    for (;;) {
      size_t nl = buffered_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return l;
      }
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, 30000) <= 0) return "";
      char b[4096];
      ssize_t n = read(from_, b, sizeof b);
      if (n <= 0) return "";
      buffered_.append(b, static_cast<size_t>(n));
    }
  }
  void Say(const std::string& s) { (void)!write(to_, s.data(), s.size()); }
  void CloseInput() {
    close(to_);
    to_ = -1;
  }
  int Wait() {
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }
  void Kill() {
    kill(pid_, SIGKILL);
    Wait();
  }
  void Signal(int sig) { kill(pid_, sig); }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffered_;
};

TEST(CApiTwoProcesses, WriteIntoDecodeProcessThenItDies) {
  constexpr size_t kBytes = 4 << 20;
  DecodeProcess decode(kBytes);
  std::string engine_line = decode.Line();
  ASSERT_EQ(engine_line.rfind("ENGINE ", 0), 0u) << engine_line;
  std::string handle_line = decode.Line();
  ASSERT_EQ(handle_line.rfind("HANDLE 0 ", 0), 0u) << handle_line;
  std::string handle = handle_line.substr(9);

  HixlEngine e = MakeEngine(false);
  HixlMemHandle h = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(e, handle.c_str(), &h));
  EXPECT_EQ(hixlMemHandleGetSize(h), kBytes);
  KVCache kv(0, kBytes);
  HixlRequest r = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(e, kv.data(), kv.size(), h, 0, &r));
  ASSERT_ST(HIXL_SUCCESS, hixlWaitRequest(e, r, 30000));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  // Read a piece back from the other process.
  std::vector<unsigned char> head(sizeof(KVCacheHeader));
  // WRITE-only region: reading is refused locally.
  EXPECT_ST(HIXL_PARAM_INVALID, hixlReadRemote(e, head.data(), head.size(), h, 0, nullptr));
  decode.Say("DONE 0\n");
  decode.CloseInput();
  EXPECT_EQ(decode.Line(), "VERIFIED 1");
  int st = decode.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;

  // The string of a dead engine: parses, but no transfer succeeds.
  EXPECT_NE(HIXL_SUCCESS, hixlWriteRemote(e, kv.data(), 4096, h, 0, nullptr));
  HixlMemHandle h2 = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(e, handle.c_str(), &h2));
  EXPECT_NE(HIXL_SUCCESS, hixlWriteRemote(e, kv.data(), 4096, h2, 0, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
}

TEST(CApiTwoProcesses, TargetKilledMidway) {
  DecodeProcess decode(1 << 20);
  ASSERT_EQ(decode.Line().rfind("ENGINE ", 0), 0u);
  std::string handle_line = decode.Line();
  ASSERT_EQ(handle_line.rfind("HANDLE 0 ", 0), 0u) << handle_line;
  HixlEngine e = MakeEngine(false, "TCP");
  HixlMemHandle h = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(e, handle_line.substr(9).c_str(), &h));
  std::vector<unsigned char> data(1 << 20, 0x11);
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(e, data.data(), data.size(), h, 0, nullptr));
  decode.Kill();
  HixlStatus s = hixlWriteRemote(e, data.data(), data.size(), h, 0, nullptr);
  EXPECT_NE(HIXL_SUCCESS, s);
  EXPECT_GT(std::strlen(hixlGetLastErrorMessage()), 0u);
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
}

// A target that cannot make progress (SIGSTOP; tcp, so the target's side
// must answer): the async WRITE stays in flight until cancelled.
TEST(CApiTwoProcesses, CancelWhileTargetStopped) {
  // More than the sockets buffer: part of it is not on the wire yet.
  constexpr size_t kBytes = 64 << 20;
  DecodeProcess decode(kBytes);
  ASSERT_EQ(decode.Line().rfind("ENGINE ", 0), 0u);
  std::string handle_line = decode.Line();
  ASSERT_EQ(handle_line.rfind("HANDLE 0 ", 0), 0u) << handle_line;
  HixlEngine e = MakeEngine(false, "TCP");
  HixlMemHandle h = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(e, handle_line.substr(9).c_str(), &h));
  std::vector<unsigned char> data(kBytes, 0x22);
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(e, data.data(), 4096, h, 0, nullptr));  // link is up
  decode.Signal(SIGSTOP);
  HixlRequest r = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemoteAsync(e, data.data(), kBytes, h, 0, &r));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_ST(HIXL_IN_PROGRESS, hixlPollRequest(e, r));
  // Pieces already on the wire are let land: the target must run again for
  // the cancel to return (well before the heartbeat declares it dead).
  std::thread cont([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    decode.Signal(SIGCONT);
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(e, r));
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  cont.join();
  std::cout << "[ measured ] hixlCancelRequest returned after " << ms << " ms" << std::endl;
  EXPECT_ST(HIXL_CANCELLED, hixlPollRequest(e, r));
  EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("cancel"), std::string::npos)
      << hixlGetLastErrorMessage();
  EXPECT_ST(HIXL_CANCELLED, hixlWaitRequest(e, r, HIXL_WAIT_FOREVER));
  EXPECT_ST(HIXL_SUCCESS, hixlCancelRequest(e, r));  // ended: unchanged
  EXPECT_ST(HIXL_CANCELLED, hixlPollRequest(e, r));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  // An async deadline (hixlTransferBatchEx): HIXL_TIMEOUT once it passed.
  decode.Signal(SIGSTOP);
  std::thread cont2([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    decode.Signal(SIGCONT);
  });
  HixlTransferDesc d{data.data(), h, 0, kBytes};
  HixlTransferOptions opt{};
  opt.timeout_ms = 100;
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatchEx(e, HIXL_OP_WRITE, &d, 1, &opt, 1, &r));
  EXPECT_ST(HIXL_TIMEOUT, hixlWaitRequest(e, r, 20000));
  cont2.join();
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyRequest(r));
  // The link still works afterwards.
  EXPECT_ST(HIXL_SUCCESS, hixlWriteRemote(e, data.data(), 4096, h, 0, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
}

// The owner process is killed and a new one starts on the same port: handles
// of the old one are refused after the reconnect; the new one's work.
TEST(CApiTwoProcesses, OwnerRestartedOnTheSamePort) {
  const int port = FreePort();
  HixlEngine e = MakeEngine(false);
  std::string old_str;
  HixlMemHandle stale = nullptr;
  std::vector<unsigned char> data(1 << 20, 0x33);
  {
    DecodeProcess first(1 << 20, port);
    ASSERT_EQ(first.Line(), "ENGINE 127.0.0.1:" + std::to_string(port));
    std::string line = first.Line();
    ASSERT_EQ(line.rfind("HANDLE 0 ", 0), 0u) << line;
    old_str = line.substr(9);
    ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(e, old_str.c_str(), &stale));
    ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(e, data.data(), data.size(), stale, 0, nullptr));
    first.Kill();
  }
  std::unique_ptr<DecodeProcess> second;
  std::string line;
  for (int i = 0; i < 50; ++i) {  // the port may take a moment to be free
    second = std::make_unique<DecodeProcess>(1 << 20, port);
    line = second->Line();
    if (line.rfind("ENGINE ", 0) == 0) break;
    second.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(second) << line;
  line = second->Line();
  ASSERT_EQ(line.rfind("HANDLE 0 ", 0), 0u) << line;
  const std::string new_str = line.substr(9);
  EXPECT_NE(new_str, old_str);
  HixlStatus s = hixlWriteRemote(e, data.data(), 4096, stale, 0, nullptr);
  EXPECT_ST(HIXL_PARAM_INVALID, s);
  EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("restarted"), std::string::npos)
      << hixlGetLastErrorMessage();
  HixlMemHandle fresh = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(e, new_str.c_str(), &fresh));
  EXPECT_ST(HIXL_SUCCESS, hixlWriteRemote(e, data.data(), data.size(), fresh, 0, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(e));
}

}  // namespace
