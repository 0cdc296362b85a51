// EtcdClient against a fake etcd that answers garbage: every answer is
// validated, each bad one gives a clear FAILED, none crashes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "discovery/etcd_client.h"

namespace hixl::discovery {
namespace {

// Answers every HTTP request on a loopback port with the same raw response.
class FakeEtcd {
 public:
  FakeEtcd() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    t_ = std::thread([this] { Serve(); });
  }
  ~FakeEtcd() {
    stop_ = true;
    t_.join();
    close(fd_);
  }
  std::string endpoints() const { return "etcd://127.0.0.1:" + std::to_string(port_); }
  void Answer(int code, const std::string& body, bool stream = false) {
    std::string r = "HTTP/1.1 " + std::to_string(code) + " X\r\nContent-Type: application/json\r\n";
    if (!stream) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    r += "Connection: close\r\n\r\n" + body;
    std::lock_guard<std::mutex> lock(mu_);
    response_ = r;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::string req;
      char buf[4096];
      size_t need = std::string::npos;
      while (true) {
        pollfd q{c, POLLIN, 0};
        if (poll(&q, 1, 1000) <= 0) break;
        ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
        size_t hdr = req.find("\r\n\r\n");
        if (hdr != std::string::npos && need == std::string::npos) {
          size_t cl = req.find("Content-Length: ");
          need = hdr + 4 + (cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16)));
        }
        if (need != std::string::npos && req.size() >= need) break;
      }
      std::string r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        r = response_;
      }
      size_t off = 0;
      while (off < r.size()) {
        ssize_t n = send(c, r.data() + off, r.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      close(c);
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string response_;
  std::thread t_;
};

// Every answer comes at once; the deadline only bounds a hang. It is long
// because a 17 MiB answer parsed under ThreadSanitizer on two busy cores can
// take over a second, and a TIMEOUT there is not the FAILED the test checks.
constexpr int kDeadlineMs = 30000;

void ExpectFailed(const Status& s, const std::string& part) {
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString();
}

TEST(EtcdHostile, EveryBadAnswerIsAClearError) {
  FakeEtcd fake;
  std::unique_ptr<EtcdClient> c;
  ASSERT_TRUE(EtcdClient::Create(fake.endpoints(), &c).ok());
  RangeResult r;
  int64_t id = 0, ttl = 0;
  fake.Answer(200, "not json");
  ExpectFailed(c->Put("k", "v", 0, kDeadlineMs), "not valid JSON");
  fake.Answer(200, std::string(100000, '[') + std::string(100000, ']'));
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "nested deeper");
  fake.Answer(200, "[1]");
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "not an object");
  fake.Answer(200, R"({"header":{"revision":"abc"}})");
  ExpectFailed(c->Put("k", "v", 0, kDeadlineMs), "not an int64");
  fake.Answer(200, R"({"header":{"revision":"99999999999999999999"}})");
  ExpectFailed(c->Put("k", "v", 0, kDeadlineMs), "not an int64");
  fake.Answer(200, R"({"kvs":[{"key":"!!"}]})");
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "base64");
  fake.Answer(200, R"({"kvs":{"key":"cC9h"}})");
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "not an array");
  fake.Answer(200, R"({"kvs":[{"key":"eC9h","value":"dg=="}]})");  // "x/a": outside "p/"
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "outside the prefix");
  fake.Answer(200, R"({"kvs":[{"key":"cC9h","mod_revision":-4}]})");
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "negative");
  fake.Answer(200, R"({"kvs":[{"key":7}]})");
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "not a string");
  fake.Answer(500, R"({"error":"boom","message":"boom","code":13})");
  ExpectFailed(c->Put("k", "v", 0, kDeadlineMs), "HTTP 500: boom");
  fake.Answer(404, "<html>");
  ExpectFailed(c->Put("k", "v", 0, kDeadlineMs), "HTTP 404");
  fake.Answer(200, "{\"x\":\"" + std::string(17u << 20, 'a') + "\"}");
  ExpectFailed(c->Range("p/", kDeadlineMs, r), "larger than");
  fake.Answer(200, R"({"ID":"1","TTL":"x"})");
  ExpectFailed(c->LeaseGrant(5, kDeadlineMs, id, ttl), "not an int64");
  fake.Answer(200, R"({"ID":"0","TTL":"5"})");
  ExpectFailed(c->LeaseGrant(5, kDeadlineMs, id, ttl), "no lease ID");
  fake.Answer(200, R"({"result":{"ID":"2","TTL":"5"}})");
  ExpectFailed(c->LeaseKeepAlive(1, kDeadlineMs, ttl), "another lease");
  fake.Answer(200, R"({"result":"x"})");
  ExpectFailed(c->LeaseKeepAlive(1, kDeadlineMs, ttl), "not an object");
  fake.Answer(200, R"({"error":{"grpc_code":5,"message":"lease gone"}})");
  ExpectFailed(c->LeaseKeepAlive(1, kDeadlineMs, ttl), "lease gone");
  fake.Answer(200, R"({"succeeded":"yes"})");
  bool created = false;
  KeyValue kv;
  ExpectFailed(c->PutIfAbsent("k", "v", 0, kDeadlineMs, created, kv), "not a boolean");
  fake.Answer(200, R"({"responses":[]})");
  ExpectFailed(c->PutIfAbsent("k", "v", 0, kDeadlineMs, created, kv), "no range response");
  bool found = false;
  fake.Answer(200, R"({"kvs":[{"key":"b3RoZXI="}]})");
  ExpectFailed(c->Get("k", kDeadlineMs, found, kv), "another key");
}

TEST(EtcdHostile, BadWatchStreamsEndTheWatch) {
  FakeEtcd fake;
  std::unique_ptr<EtcdClient> c;
  ASSERT_TRUE(EtcdClient::Create(fake.endpoints(), &c).ok());
  WatchStop stop;
  int calls = 0;
  auto cb = [&](const WatchMessage&) { return ++calls < 100; };
  const std::string created = R"({"result":{"header":{"revision":"3"},"created":true}})";
  struct Case {
    std::string body, part;
  } cases[] = {
      {created + "\n garbage", "unexpected byte"},
      {created + R"({"result":{"events":[{"type":"BOOM","kv":{"key":"aw=="}}]}})", "unknown event"},
      {created + R"({"result":{"events":[{"kv":{"key":"!"}}]}})", "base64"},
      {created + R"({"result":{"events":[{}]}})", "without kv"},
      {created + R"({"result":{"events":"x"}})", "not an array"},
      {created + R"({"error":{"message":"bad"}})", "error: bad"},
      {created + std::string(100, '{'), "too deep"},
      {created + R"({"result":{"canceled":true,"compact_revision":"9"}})", "compacted"},
      {created, "stream ended"},
  };
  for (const Case& k : cases) {
    fake.Answer(200, k.body, /*stream=*/true);
    calls = 0;
    Status s = c->Watch("k", "", 0, kDeadlineMs, stop, cb);
    ExpectFailed(s, k.part);
    EXPECT_GE(calls, 1) << k.part;
  }
  fake.Answer(400, R"({"error":"bad request","message":"bad request","code":3})", true);
  ExpectFailed(c->Watch("k", "", 0, kDeadlineMs, stop, cb), "HTTP 400: bad request");
}

}  // namespace
}  // namespace hixl::discovery
