// An engine restarted under its name takes the name over from a dead holder
// at once, against a real etcd and real processes (hixl_test_peer): a
// restart right after kill -9 is found by name at once; a live holder (also
// one that is stopped, or listed from another host) is still refused;
// engines racing for one dead name: exactly one wins; an entry whose pid was
// reused is judged by its address.
//
// Every wait is bounded; every process is stopped by its owner.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/host.h"
#include "discovery/entry.h"
#include "discovery/etcd_client.h"
#include "discovery_test_util.h"
#include "etcd_process.h"
#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::EngineRecord;
using hixl::Hixl;
using hixl::Status;
using hixl::StatusCode;
using hixl_test::Contains;
using hixl_test::Eventually;
using hixl_test::Listed;
using hixl_test::PeerProcess;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

class NameTakeOverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(etcd_.Start(why)) << why;
    ASSERT_TRUE(hixl::discovery::EtcdClient::Create(etcd_.endpoints(), &etcd_client_).ok());
  }
  void TearDown() override {
    for (auto& e : engines_) e->Finalize();
    engines_.clear();
    peers_.clear();
  }
  std::map<std::string, std::string> Opts(const std::string& name) const {
    std::map<std::string, std::string> o = {{"MetadataServer", etcd_.endpoints()},
                                            {"HeartbeatIntervalMs", "200"},
                                            {"HandshakeTimeoutMs", "1000"}};
    if (!name.empty()) o["EngineName"] = name;
    return o;
  }
  // A peer process published as name (the default TTL, 10 s: a lease expiry
  // cannot explain anything these tests see).
  PeerProcess* StartPeer(const std::string& name) {
    peers_.push_back(std::make_unique<PeerProcess>(
        std::vector<std::string>{"MetadataServer=" + etcd_.endpoints(), "EngineName=" + name}));
    return peers_.back()->Start() ? peers_.back().get() : nullptr;
  }
  // An engine of this process; Initialize's status in *s.
  Hixl* NewEngine(const std::string& name, Status* s, const std::string& local = "127.0.0.1:0") {
    engines_.push_back(std::make_unique<Hixl>());
    *s = engines_.back()->Initialize(local, Opts(name));
    return engines_.back().get();
  }
  uint64_t PeerGen(PeerProcess& p) {
    std::string r = p.Send("gen");
    EXPECT_TRUE(hixl_test::IsOk(r)) << r;
    return std::strtoull(hixl_test::OkValue(r).c_str(), nullptr, 10);
  }
  void PutEntry(const std::string& name, const std::string& address, uint64_t gen,
                const std::string& host = "far-host", int64_t pid = 4242) {
    hixl::discovery::EngineEntry e{name, address, gen, host, pid};
    Status s = etcd_client_->Put("hixl/engines/" + name, hixl::discovery::EncodeEntry(e), 0, 3000);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  uint64_t EntryGen(const std::string& name) {
    bool found = false;
    hixl::discovery::KeyValue kv;
    hixl::discovery::EngineEntry e;
    if (!etcd_client_->Get("hixl/engines/" + name, 3000, found, kv).ok() || !found) return 0;
    return hixl::discovery::DecodeEntry(name, kv.value, e).ok() ? e.generation : 0;
  }

  hixl::testing::EtcdProcess etcd_;
  std::unique_ptr<hixl::discovery::EtcdClient> etcd_client_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;
  std::vector<std::unique_ptr<Hixl>> engines_;
};

// kill -9, and within 100 ms an engine starts under the same name: it takes
// the name over, and clients find it by name at once.
TEST_F(NameTakeOverTest, RestartRightAfterKillIsFoundAtOnce) {
  Status s;
  Hixl* client = NewEngine("", &s, "127.0.0.1");
  HIXL_ASSERT_OK(s);
  PeerProcess* old_peer = StartPeer("worker-0");
  ASSERT_NE(old_peer, nullptr);
  const uint64_t old_gen = PeerGen(*old_peer);
  HIXL_ASSERT_OK(client->Connect("worker-0", 3000));

  old_peer->Kill();  // SIGKILL and reap
  const auto killed = Clock::now();
  Hixl* restarted = NewEngine("worker-0", &s);
  const double start_ms = MsSince(killed);
  HIXL_ASSERT_OK(s);
  std::printf(
      "[ measured ] kill_to_restarted_ms=%.1f  (SIGKILL -> Initialize under the same name "
      "returned OK; the old lease has 10 s left)\n",
      start_ms);
  ASSERT_NE(restarted->Generation(), old_gen);
  EXPECT_EQ(EntryGen("worker-0"), restarted->Generation());

  // A client that had the old entry sees the new one from the watch.
  EngineRecord r;
  const auto t0 = Clock::now();
  ASSERT_TRUE(Eventually(
      [&] { return Listed(*client, "worker-0", &r) && r.generation == restarted->Generation(); },
      3000));
  std::printf(
      "[ measured ] takeover_seen_ms=%.1f  (Initialize OK -> a watching client lists the "
      "new generation)\n",
      MsSince(t0));
  EXPECT_EQ(r.address, restarted->LocalEngine());
  // The client's link to the killed engine is gone (its socket closed).
  hixl::ConnectStatus cs = hixl::ConnectStatus::FAILED;
  ASSERT_TRUE(Eventually(
      [&] {
        return client->GetConnectStatus("worker-0", cs).ok() &&
               cs == hixl::ConnectStatus::NOT_CONNECTED;
      },
      3000));
  HIXL_ASSERT_OK(client->Connect("worker-0", 3000));
  uint64_t g = 0;
  HIXL_ASSERT_OK(client->GetPeerGeneration("worker-0", g));
  EXPECT_EQ(g, restarted->Generation());
  // A new client finds it by name at once.
  Hixl* fresh = NewEngine("", &s, "127.0.0.1");
  HIXL_ASSERT_OK(s);
  HIXL_EXPECT_OK(fresh->Connect("worker-0", 3000));
}

// A live holder keeps its name: running, stopped (SIGSTOP: it cannot answer,
// which proves nothing), and when its entry says it is on another host.
TEST_F(NameTakeOverTest, LiveHolderIsStillRefused) {
  PeerProcess* holder = StartPeer("busy-0");
  ASSERT_NE(holder, nullptr);
  const uint64_t gen = PeerGen(*holder);
  Status s;
  NewEngine("busy-0", &s);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), holder->engine())) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "answers at")) << s.ToString();
  EXPECT_EQ(EntryGen("busy-0"), gen);

  ASSERT_EQ(kill(holder->pid(), SIGSTOP), 0);
  const auto t0 = Clock::now();
  NewEngine("busy-0", &s);
  const double took = MsSince(t0);
  ASSERT_EQ(kill(holder->pid(), SIGCONT), 0);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "no answer")) << s.ToString();
  std::printf(
      "[ measured ] stopped_holder_refused_ms=%.1f  (probe bounded by "
      "HandshakeTimeoutMs=1000)\n",
      took);
  EXPECT_EQ(EntryGen("busy-0"), gen);

  // An entry whose pid exists but is not the engine's (here this test's):
  // its address answers with the entry's generation, so it is alive.
  PutEntry("busy-1", holder->engine(), gen, hixl::host::HostIdentity(), getpid());
  NewEngine("busy-1", &s);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "answers at")) << s.ToString();
  EXPECT_EQ(EntryGen("busy-1"), gen);
  // The holder still works by its name.
  Hixl* client = NewEngine("", &s, "127.0.0.1");
  HIXL_ASSERT_OK(s);
  HIXL_EXPECT_OK(client->Connect("busy-0", 3000));
}

// Several engines start at once under the name of a killed one: one etcd
// transaction conditioned on the dead entry lets exactly one of them in.
TEST_F(NameTakeOverTest, RacingRestartsOneWins) {
  constexpr int kRacers = 3;
  for (int round = 0; round < 3; ++round) {
    const std::string name = "contested-" + std::to_string(round);
    PeerProcess* old_peer = StartPeer(name);
    ASSERT_NE(old_peer, nullptr);
    old_peer->Kill();
    std::vector<std::unique_ptr<Hixl>> racers(kRacers);
    std::vector<Status> got(kRacers);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kRacers; ++i) {
      racers[i] = std::make_unique<Hixl>();
      threads.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kRacers) std::this_thread::yield();
        got[i] = racers[i]->Initialize("127.0.0.1:0", Opts(name));
      });
    }
    for (auto& t : threads) t.join();
    int winners = 0, winner = -1;
    for (int i = 0; i < kRacers; ++i) {
      if (got[i].ok()) {
        ++winners;
        winner = i;
      } else {
        EXPECT_EQ(got[i].code(), StatusCode::kAlreadyConnected) << got[i].ToString();
      }
    }
    ASSERT_EQ(winners, 1) << "round " << round;
    EXPECT_EQ(EntryGen(name), racers[winner]->Generation());
    for (auto& r : racers) r->Finalize();
  }
}

// An entry whose pid exists on this host (reused by another process, here
// this test's own) proves nothing by itself: its address is probed, and it
// is gone when nothing listens there, another engine answers, or something
// that is not an engine does. An entry of another host at a loopback address
// cannot be probed from here: refused.
TEST_F(NameTakeOverTest, AddressDecidesWhenThePidCannot) {
  const std::string self_host = hixl::host::HostIdentity();
  const int64_t live_pid = getpid();
  // Nothing listens at the address.
  const std::string dead = "127.0.0.1:" + std::to_string(hixl_test::UnusedTcpPort());
  PutEntry("reused-dead", dead, 77, self_host, live_pid);
  Status s;
  Hixl* a = NewEngine("reused-dead", &s);
  HIXL_ASSERT_OK(s);
  EXPECT_EQ(EntryGen("reused-dead"), a->Generation());

  // Another engine answers at the address (the port was reused).
  PeerProcess* other = StartPeer("other-0");
  ASSERT_NE(other, nullptr);
  PutEntry("reused-port", other->engine(), PeerGen(*other) + 1, self_host, live_pid);
  Hixl* b = NewEngine("reused-port", &s);
  HIXL_ASSERT_OK(s);
  EXPECT_EQ(EntryGen("reused-port"), b->Generation());

  // Something that is not a hixl engine answers.
  int srv = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(srv, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(::bind(srv, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(srv, 4), 0);
  ASSERT_EQ(::getsockname(srv, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  std::thread http([srv] {
    int c = ::accept(srv, nullptr, nullptr);
    if (c < 0) return;
    char got[64];
    (void)!::read(c, got, sizeof(got));  // the probe, before answering: no reset
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    (void)!::write(c, reply, sizeof(reply) - 1);
    ::close(c);
  });
  PutEntry("reused-http", "127.0.0.1:" + std::to_string(ntohs(sa.sin_port)), 78, self_host,
           live_pid);
  Hixl* c = NewEngine("reused-http", &s);
  http.join();
  ::close(srv);
  HIXL_ASSERT_OK(s);
  EXPECT_EQ(EntryGen("reused-http"), c->Generation());

  // Another host's loopback address: not ours to probe.
  PutEntry("far-loopback", dead, 79);
  NewEngine("far-loopback", &s);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "not reachable from this host")) << s.ToString();
  EXPECT_EQ(EntryGen("far-loopback"), 79u);
}

}  // namespace
