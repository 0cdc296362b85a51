// tests/capi/c_api_gtest.cc — every function of the C API (hixl/hixl_c.h),
// with good and bad input: NULL and stale handles, wrong sizes, truncated,
// tampered and dead-engine handle strings, requests used after destroy, and a
// real second process (the decode example) as the target.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

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
  for (int c : {0, 1, 2, 3, 4, 5, 6, 7, 8, 1000, 77, -1}) {
    const char* s = hixlGetErrorString(static_cast<HixlStatus>(c));
    ASSERT_NE(s, nullptr);
    EXPECT_GT(std::strlen(s), 0u);
  }
  EXPECT_STREQ(hixlGetErrorString(HIXL_SUCCESS), "SUCCESS");
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
  // RDMA/UCX: not in this build.
  EXPECT_ST(HIXL_UNSUPPORTED, CreateWith({{HIXL_OPTION_LINK_TYPE, "RDMA"}}, &e));
  EXPECT_ST(HIXL_UNSUPPORTED, CreateWith({{HIXL_OPTION_LINK_TYPE, "UCX"}}, &e));
  EXPECT_ST(HIXL_PARAM_INVALID, CreateWith({{"CopyThreads", "0"}}, &e));
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
  ASSERT_ST(HIXL_SUCCESS, hixlRegisterMemory(e, static_cast<char*>(p) + 4096, 8192,
                                             HIXL_MEM_PERM_WRITE, &part));
  EXPECT_EQ(hixlMemHandleGetSize(part), 8192u);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(other, p));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, static_cast<char*>(p) + 1));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, buf.data()));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, nullptr));
  EXPECT_ST(HIXL_SUCCESS, hixlFreeMemory(e, p));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlFreeMemory(e, p));  // twice
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
  for (const char* junk : {"", "hixl-mem1;", "garbage", "hixl-mem1;e=;a=;l=;p=;c=0000000000000000"}) {
    HixlMemHandle bad = nullptr;
    EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, junk, &bad)) << junk;
  }
  std::string longer = s + std::string(1000, 'a');
  EXPECT_ST(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(client, longer.c_str(), &out));
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
  ASSERT_ST(HIXL_SUCCESS, hixlWriteRemote(init_, small.data(), small.size(), theirs_, 5000, nullptr));
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
        if (hixlWriteRemote(init_, src_.data() + off, 1024, theirs_, off, nullptr) != HIXL_SUCCESS) {
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

// ------------------------------------------------------------ a real second process

class DecodeProcess {
 public:
  explicit DecodeProcess(size_t size) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::string sz = std::to_string(size);
      execl(HIXL_EXAMPLE_DECODE, HIXL_EXAMPLE_DECODE, "--slots", "1", "--size", sz.c_str(),
            static_cast<char*>(nullptr));
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

}  // namespace
