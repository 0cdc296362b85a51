// EtcdClient against a real etcd (and, for hostile answers, a fake HTTP
// server): endpoints parsing, base64, KV, leases, watches, unreachable etcd.
#include "discovery/etcd_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "etcd_process.h"

namespace hixl::discovery {
namespace {

using Clock = std::chrono::steady_clock;
int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

TEST(EtcdEndpoints, Parses) {
  std::vector<EtcdEndpoint> eps;
  ASSERT_TRUE(ParseEtcdEndpoints("etcd://127.0.0.1:2379", eps).ok());
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0].ToString(), "127.0.0.1:2379");
  ASSERT_TRUE(ParseEtcdEndpoints("etcd://a.example:1,[::1]:2,10.0.0.2:65535", eps).ok());
  ASSERT_EQ(eps.size(), 3u);
  EXPECT_EQ(eps[1].host, "::1");
  EXPECT_EQ(eps[1].ToString(), "[::1]:2");
  std::string sixteen = "etcd://h:1";
  for (int i = 1; i < 16; ++i) sixteen += ",h:" + std::to_string(i + 1);
  EXPECT_TRUE(ParseEtcdEndpoints(sixteen, eps).ok());
  EXPECT_EQ(eps.size(), 16u);
  for (const char* bad : {"", "127.0.0.1:2379", "http://127.0.0.1:2379", "etcd://", "etcd://h",
                          "etcd://h:", "etcd://h:0", "etcd://h:65536", "etcd://h:12a",
                          "etcd://h:1,", "etcd://,h:1", "etcd://h a:1", "etcd://[::1:5",
                          "etcd://[nothost]:5", "etcd://h:1/path", "etcd://-h:1"}) {
    Status s = ParseEtcdEndpoints(bad, eps);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << bad;
    EXPECT_NE(s.message().find("etcd endpoints"), std::string::npos) << s.message();
  }
  Status s = ParseEtcdEndpoints(sixteen + ",h:99", eps);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid);
  EXPECT_NE(s.message().find("more than 16"), std::string::npos) << s.message();
  std::unique_ptr<EtcdClient> c;
  EXPECT_EQ(EtcdClient::Create("etcd:/x:1", &c).code(), StatusCode::kParamInvalid);
  EXPECT_EQ(c, nullptr);
}

TEST(Base64, RoundTripsAndRefuses) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 70; ++n) {
    std::string in(n, '\0');
    for (char& c : in) c = static_cast<char>(rng());
    std::string enc = Base64Encode(in), dec;
    ASSERT_TRUE(Base64Decode(enc, dec)) << enc;
    EXPECT_EQ(dec, in);
  }
  EXPECT_EQ(Base64Encode("hixl/engines/a"), "aGl4bC9lbmdpbmVzL2E=");
  std::string out;
  for (const char* bad : {"a", "abc", "ab=c", "a===", "====", "Zh==", "Zm9=", "#abc", "Zg==Zg==",
                          "Zg=\n", "Z g="}) {
    EXPECT_FALSE(Base64Decode(bad, out)) << bad;
  }
  EXPECT_TRUE(Base64Decode("", out));
  EXPECT_EQ(PrefixRangeEnd("hixl/"), "hixl0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(etcd_.Start(why)) << why;
    ASSERT_TRUE(EtcdClient::Create(etcd_.endpoints(), &client_).ok());
  }
  testing::EtcdProcess etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, PutRangeDelete) {
  int64_t rev = 0;
  ASSERT_TRUE(client_->Put("p/a", "1", 0, 2000, &rev).ok());
  EXPECT_GT(rev, 0);
  std::string binary("\0\xff\x01v", 4);
  ASSERT_TRUE(client_->Put("p/b", binary, 0, 2000).ok());
  ASSERT_TRUE(client_->Put("p/c", "", 0, 2000).ok());
  ASSERT_TRUE(client_->Put("q/x", "other", 0, 2000).ok());
  RangeResult r;
  ASSERT_TRUE(client_->Range("p/", 2000, r).ok());
  ASSERT_EQ(r.kvs.size(), 3u);
  EXPECT_EQ(r.kvs[0].key, "p/a");
  EXPECT_EQ(r.kvs[1].value, binary);
  EXPECT_EQ(r.kvs[2].value, "");
  EXPECT_GT(r.kvs[0].create_revision, 0);
  EXPECT_GE(r.revision, r.kvs[2].mod_revision);
  bool found = false;
  KeyValue kv;
  ASSERT_TRUE(client_->Get("p/a", 2000, found, kv).ok());
  EXPECT_TRUE(found);
  EXPECT_EQ(kv.value, "1");
  int64_t deleted = 0;
  ASSERT_TRUE(client_->Delete("p/a", 2000, &deleted).ok());
  EXPECT_EQ(deleted, 1);
  ASSERT_TRUE(client_->Get("p/a", 2000, found, kv).ok());
  EXPECT_FALSE(found);
  ASSERT_TRUE(client_->Delete("p/a", 2000, &deleted).ok());
  EXPECT_EQ(deleted, 0);
  // Put-if-absent.
  bool created = false;
  ASSERT_TRUE(client_->PutIfAbsent("p/new", "v1", 0, 2000, created, kv).ok());
  EXPECT_TRUE(created);
  ASSERT_TRUE(client_->PutIfAbsent("p/new", "v2", 0, 2000, created, kv).ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(kv.value, "v1");
  EXPECT_EQ(client_->Put("", "x", 0, 2000).code(), StatusCode::kParamInvalid);
}

TEST_F(EtcdClientTest, LeaseGrantKeepAliveExpiryRevoke) {
  int64_t id = 0, ttl = 0;
  ASSERT_TRUE(client_->LeaseGrant(2, 2000, id, ttl).ok());
  EXPECT_NE(id, 0);
  EXPECT_EQ(ttl, 2);
  ASSERT_TRUE(client_->Put("l/a", "x", id, 2000).ok());
  int64_t left = 0;
  ASSERT_TRUE(client_->LeaseKeepAlive(id, 2000, left).ok());
  EXPECT_GT(left, 0);
  // Let it expire: the key goes with it and keepalive reports ttl 0.
  auto t0 = Clock::now();
  bool found = true;
  KeyValue kv;
  while (found && MsSince(t0) < 6000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(client_->Get("l/a", 2000, found, kv).ok());
  }
  EXPECT_FALSE(found) << "leased key still there after 6 s (ttl 2 s)";
  std::printf("[timing] leased key (ttl 2 s) vanished %lld ms after the last keepalive\n",
              static_cast<long long>(MsSince(t0)));
  ASSERT_TRUE(client_->LeaseKeepAlive(id, 2000, left).ok());
  EXPECT_EQ(left, 0);
  EXPECT_NE(client_->Put("l/b", "x", id, 2000).code(), StatusCode::kSuccess);
  // Revoke: the key goes at once; a second revoke is fine.
  ASSERT_TRUE(client_->LeaseGrant(30, 2000, id, ttl).ok());
  ASSERT_TRUE(client_->Put("l/c", "x", id, 2000).ok());
  ASSERT_TRUE(client_->LeaseRevoke(id, 2000).ok());
  ASSERT_TRUE(client_->Get("l/c", 2000, found, kv).ok());
  EXPECT_FALSE(found);
  EXPECT_TRUE(client_->LeaseRevoke(id, 2000).ok());
  EXPECT_EQ(client_->LeaseGrant(0, 2000, id, ttl).code(), StatusCode::kParamInvalid);
}

// Collects watch messages on a thread.
struct Watcher {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchMessage> msgs;
  Status result;
  bool done = false;
  WatchStop stop;
  std::thread t;

  void Run(EtcdClient& c, const std::string& prefix, int64_t rev) {
    t = std::thread([this, &c, prefix, rev] {
      Status s = c.Watch(prefix, PrefixRangeEnd(prefix), rev, 2000, stop, [&](const WatchMessage& m) {
        std::lock_guard<std::mutex> lock(mu);
        msgs.push_back(m);
        cv.notify_all();
        return true;
      });
      std::lock_guard<std::mutex> lock(mu);
      result = s;
      done = true;
      cv.notify_all();
    });
  }
  bool WaitFor(const std::function<bool()>& pred, int ms = 5000) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::milliseconds(ms), pred);
  }
  ~Watcher() {
    stop.Stop();
    if (t.joinable()) t.join();
  }
};

TEST_F(EtcdClientTest, WatchSeesPutAndDeleteAndStopsPromptly) {
  Watcher w;
  w.Run(*client_, "w/", 0);
  ASSERT_TRUE(w.WaitFor([&] { return !w.msgs.empty(); })) << "no 'created' message";
  EXPECT_TRUE(w.msgs[0].created);
  ASSERT_TRUE(client_->Put("w/a", "v", 0, 2000).ok());
  ASSERT_TRUE(client_->Put("x/ignored", "v", 0, 2000).ok());
  ASSERT_TRUE(client_->Delete("w/a", 2000).ok());
  std::vector<WatchEvent> evs;
  ASSERT_TRUE(w.WaitFor([&] {
    evs.clear();
    for (auto& m : w.msgs) evs.insert(evs.end(), m.events.begin(), m.events.end());
    return evs.size() >= 2;
  }));
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(evs[0].kv.key, "w/a");
  EXPECT_EQ(evs[0].kv.value, "v");
  EXPECT_EQ(evs[1].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(evs[1].kv.key, "w/a");
  EXPECT_GT(evs[1].kv.mod_revision, evs[0].kv.mod_revision);
  auto t0 = Clock::now();
  w.stop.Stop();
  ASSERT_TRUE(w.WaitFor([&] { return w.done; }, 2000));
  EXPECT_LT(MsSince(t0), 500);
  EXPECT_EQ(w.result.code(), StatusCode::kCancelled) << w.result.ToString();
}

TEST_F(EtcdClientTest, WatchReportsCompactionAndStreamEnd) {
  int64_t rev = 0;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client_->Put("c/k", std::to_string(i), 0, 2000, &rev).ok());
  ASSERT_TRUE(client_->Compact(rev, 2000).ok());
  {
    Watcher w;
    w.Run(*client_, "c/", 1);
    ASSERT_TRUE(w.WaitFor([&] { return w.done; }));
    EXPECT_EQ(w.result.code(), StatusCode::kFailed);
    EXPECT_NE(w.result.message().find("compacted"), std::string::npos) << w.result.ToString();
    bool saw = false;
    for (auto& m : w.msgs) saw |= m.canceled && m.compact_revision == rev;
    EXPECT_TRUE(saw);
  }
  // etcd going away ends the stream with an error.
  Watcher w;
  w.Run(*client_, "c/", 0);
  ASSERT_TRUE(w.WaitFor([&] { return !w.msgs.empty(); }));
  etcd_.Kill();
  ASSERT_TRUE(w.WaitFor([&] { return w.done; }));
  EXPECT_EQ(w.result.code(), StatusCode::kFailed) << w.result.ToString();
}

TEST(EtcdClientUnreachable, ClearErrorWithinTimeout) {
  const int dead = testing::PickFreePort();
  std::unique_ptr<EtcdClient> c;
  ASSERT_TRUE(EtcdClient::Create("etcd://127.0.0.1:" + std::to_string(dead), &c).ok());
  auto t0 = Clock::now();
  Status s = c->Put("k", "v", 0, 500);
  EXPECT_LT(MsSince(t0), 1000);
  EXPECT_EQ(s.code(), StatusCode::kFailed);
  EXPECT_NE(s.message().find("unreachable"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(std::to_string(dead)), std::string::npos) << s.ToString();
  // A listener that never answers: TIMEOUT after about the timeout.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_TRUE(EtcdClient::Create("etcd://127.0.0.1:" + std::to_string(ntohs(a.sin_port)), &c).ok());
  t0 = Clock::now();
  int64_t id = 0, ttl = 0;
  s = c->LeaseGrant(5, 400, id, ttl);
  const int64_t took = MsSince(t0);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_GE(took, 350);
  EXPECT_LT(took, 1500);
  WatchStop stop;
  t0 = Clock::now();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop.Stop();
  });
  s = c->Watch("k", "", 0, 5000, stop, [](const WatchMessage&) { return true; });
  stopper.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_LT(MsSince(t0), 1500);
  close(fd);
}

TEST_F(EtcdClientTest, FailsOverToTheNextEndpoint) {
  const int dead = testing::PickFreePort();
  std::unique_ptr<EtcdClient> c;
  ASSERT_TRUE(EtcdClient::Create("etcd://127.0.0.1:" + std::to_string(dead) + ",127.0.0.1:" +
                                     std::to_string(etcd_.client_port()),
                                 &c).ok());
  ASSERT_TRUE(c->Put("f/a", "v", 0, 2000).ok());
  RangeResult r;
  ASSERT_TRUE(c->Range("f/", 2000, r).ok());
  EXPECT_EQ(r.kvs.size(), 1u);
}

}  // namespace
}  // namespace hixl::discovery
