// Engine-level etcd discovery across real processes: hixl_test_peer engines
// publish themselves under EngineName in a real etcd (each test starts its
// own, tests/discovery/etcd_process.h), and a client-only engine in the test
// process finds, lists, connects to and moves bytes to them by name. Crashed,
// finalized and restarted peers, stale / foreign / hand-written entries,
// unreachable etcd, duplicate names, an etcd restart under running engines
// and prefix isolation.
//
// Every wait is bounded; every process is stopped by its owner (PeerProcess,
// EtcdProcess) even when an assertion fails.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "discovery/entry.h"
#include "discovery/etcd_client.h"
#include "discovery_test_util.h"
#include "etcd_process.h"
#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::ConnectStatus;
using hixl::EngineRecord;
using hixl::Hixl;
using hixl::Status;
using hixl::StatusCode;
using hixl_test::Contains;
using hixl_test::Eventually;
using hixl_test::Listed;
using hixl_test::PeerProcess;
using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Milliseconds since t with microsecond resolution (for the measured figures).
double FracMsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void Measured(const std::string& what, double ms, const std::string& note = "") {
  std::printf("[ measured ] %s=%.1f%s%s\n", what.c_str(), ms, note.empty() ? "" : "  ",
              note.c_str());
  std::fflush(stdout);
}

std::vector<std::string> Names(const Hixl& engine) {
  std::vector<EngineRecord> list;
  std::vector<std::string> names;
  if (!engine.ListEngines(list).ok()) return {"<ListEngines failed>"};
  for (const auto& r : list) names.push_back(r.name);
  return names;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return "[" + out + "]";
}

uint64_t ParseU64(const std::string& s) {
  return s.empty() ? 0 : std::strtoull(s.c_str(), nullptr, 10);
}

class EngineDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(etcd_.Start(why)) << why;
    ASSERT_TRUE(hixl::discovery::EtcdClient::Create(etcd_.endpoints(), &etcd_client_).ok());
  }
  void TearDown() override {
    // Engines first (they talk to etcd while finalizing), then the peers,
    // then etcd (the fixture member's destructor).
    for (auto& e : engines_) e->Finalize();
    engines_.clear();
    peers_.clear();
  }

  // Options of a peer engine registered as name.
  std::vector<std::string> PeerOpts(const std::string& name, int ttl_s = 0,
                                    const std::string& prefix = "") {
    std::vector<std::string> o = {"MetadataServer=" + etcd_.endpoints(), "EngineName=" + name};
    if (ttl_s > 0) o.push_back("MetadataTtlS=" + std::to_string(ttl_s));
    if (!prefix.empty()) o.push_back("MetadataPrefix=" + prefix);
    return o;
  }
  // Starts a peer published as name (nullptr, after a gtest failure, if it did not start).
  PeerProcess* StartPeer(const std::string& name, int ttl_s = 0, const std::string& prefix = "") {
    peers_.push_back(std::make_unique<PeerProcess>(PeerOpts(name, ttl_s, prefix)));
    if (!peers_.back()->Start()) return nullptr;
    return peers_.back().get();
  }
  // A client-only engine in this process on the test etcd (nullptr on failure).
  Hixl* NewClient(std::map<std::string, std::string> extra = {},
                  const std::string& local = "127.0.0.1") {
    engines_.push_back(std::make_unique<Hixl>());
    std::map<std::string, std::string> o = {{"MetadataServer", etcd_.endpoints()},
                                            {"HeartbeatIntervalMs", "200"}};
    for (auto& [k, v] : extra) o[k] = v;
    Status s = engines_.back()->Initialize(local, o);
    EXPECT_TRUE(s.ok()) << "client Initialize: " << s.ToString();
    return s.ok() ? engines_.back().get() : nullptr;
  }
  void PutRaw(const std::string& key, const std::string& value) {
    Status s = etcd_client_->Put(key, value, 0, 3000);
    ASSERT_TRUE(s.ok()) << "put " << key << ": " << s.ToString();
  }
  static hixl::discovery::EngineEntry Entry(const std::string& name, const std::string& address,
                                            uint64_t generation) {
    hixl::discovery::EngineEntry e;
    e.name = name;
    e.address = address;
    e.generation = generation;
    e.host_id = "test-host";
    e.pid = 1;
    return e;
  }
  static uint64_t PeerGen(PeerProcess& p) {
    std::string r = p.Send("gen");
    EXPECT_TRUE(hixl_test::IsOk(r)) << r;
    return ParseU64(hixl_test::OkValue(r));
  }

  hixl::testing::EtcdProcess etcd_;
  std::unique_ptr<hixl::discovery::EtcdClient> etcd_client_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;
  std::vector<std::unique_ptr<Hixl>> engines_;
};

constexpr size_t kRegion = 1 << 20;

// A region the peer registered after our Connect reaches us asynchronously
// (hixl.h): retry a small READ for at most 2 s until it is usable.
void WaitUsable(Hixl& client, const std::string& remote, uintptr_t raddr) {
  hixl_test::Buffer probe(64);
  Status s;
  const auto t0 = Clock::now();
  do {
    s = client.TransferSync(remote, hixl::TransferOp::READ, {{probe.addr(), raddr, 64}}, 1000);
    if (s.ok()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (MsSince(t0) < 2000);
  ADD_FAILURE() << "region at " << raddr << " of " << remote
                << " not usable after 2 s: " << s.ToString();
}

// Reads the peer's region `buf` into a local buffer through remote name and
// writes another pattern back, checking both with the peer's hash.
void ReadWriteByName(Hixl& client, PeerProcess& peer, const std::string& remote, uintptr_t raddr,
                     uint64_t seed) {
  WaitUsable(client, remote, raddr);
  ASSERT_TRUE(peer.Ok("fillpat buf " + std::to_string(seed)));
  hixl_test::Buffer local(kRegion);
  HIXL_ASSERT_OK(
      client.TransferSync(remote, hixl::TransferOp::READ, {{local.addr(), raddr, kRegion}}, 5000));
  EXPECT_EQ(local.HashHex(), peer.Hash("buf", 0, kRegion)) << "READ by name";
  hixl_test::FillPattern(local.data(), kRegion, seed + 1000);
  HIXL_ASSERT_OK(
      client.TransferSync(remote, hixl::TransferOp::WRITE, {{local.addr(), raddr, kRegion}}, 5000));
  EXPECT_EQ(peer.Hash("buf", 0, kRegion), local.HashHex()) << "WRITE by name";
}

// 1. Two named peers; a client-only engine finds, lists, connects to and moves
// bytes to them by name; a peer connects to the other by name too.
TEST_F(EngineDiscoveryTest, PeersFoundAndUsedByName) {
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  // A client-only engine publishes nothing.
  std::vector<EngineRecord> list;
  HIXL_ASSERT_OK(client->ListEngines(list));
  EXPECT_TRUE(list.empty()) << Join(Names(*client));

  const auto prefill_spawn = Clock::now();
  PeerProcess* prefill = StartPeer("prefill-0");
  ASSERT_NE(prefill, nullptr);
  const auto prefill_ready = Clock::now();
  Measured("peer_start_ms", FracMsSince(prefill_spawn), "(spawn -> READY, includes publishing)");
  // Found through the client's watch.
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "prefill-0"); }, 5000))
      << Join(Names(*client));
  Measured("discover_ms", FracMsSince(prefill_ready),
           "(READY -> listed by a running client's watch)");
  HIXL_ASSERT_OK(client->Connect("prefill-0", 3000));
  Measured("discover_connect_ms", FracMsSince(prefill_ready), "(READY -> Connect by name done)");

  // Connect straight after READY, before the watch can have told the client:
  // the lookup falls back to a direct read.
  PeerProcess* decode = StartPeer("decode-0");
  ASSERT_NE(decode, nullptr);
  const auto decode_ready = Clock::now();
  HIXL_ASSERT_OK(client->Connect("decode-0", 3000));
  Measured("discover_ms", FracMsSince(decode_ready), "(READY -> immediate Connect by name done)");

  const uint64_t prefill_gen = PeerGen(*prefill);
  const uint64_t decode_gen = PeerGen(*decode);
  EXPECT_NE(prefill_gen, 0u);
  EXPECT_NE(prefill_gen, decode_gen);

  ASSERT_TRUE(Eventually([&] { return Listed(*client, "decode-0"); }, 5000));
  HIXL_ASSERT_OK(client->ListEngines(list));
  ASSERT_EQ(list.size(), 2u) << Join(Names(*client));
  std::map<std::string, EngineRecord> by_name;
  for (const auto& r : list) by_name[r.name] = r;
  ASSERT_EQ(by_name.count("prefill-0"), 1u);
  ASSERT_EQ(by_name.count("decode-0"), 1u);
  EXPECT_EQ(by_name["prefill-0"].address, prefill->engine());
  EXPECT_EQ(by_name["decode-0"].address, decode->engine());
  EXPECT_EQ(by_name["prefill-0"].generation, prefill_gen);
  EXPECT_EQ(by_name["decode-0"].generation, decode_gen);

  // The engine reached is the one listed.
  uint64_t g = 0;
  HIXL_ASSERT_OK(client->GetPeerGeneration("prefill-0", g));
  EXPECT_EQ(g, prefill_gen);
  HIXL_ASSERT_OK(client->GetPeerGeneration("decode-0", g));
  EXPECT_EQ(g, decode_gen);
  ConnectStatus cs = ConnectStatus::FAILED;
  HIXL_ASSERT_OK(client->GetConnectStatus("prefill-0", cs));
  EXPECT_EQ(cs, ConnectStatus::CONNECTED);
  hixl::LinkType lt = hixl::LinkType::AUTO;
  HIXL_ASSERT_OK(client->GetLinkType("prefill-0", lt));
  EXPECT_NE(lt, hixl::LinkType::AUTO);
  HIXL_ASSERT_OK(client->GetLinkType("decode-0", lt));
  EXPECT_NE(lt, hixl::LinkType::AUTO);
  // A second Connect by name finds the link.
  HIXL_EXPECT_CODE(StatusCode::kAlreadyConnected, client->Connect("prefill-0", 1000));

  // Bytes by name, both directions, both peers.
  const uintptr_t paddr = prefill->Reg("buf", kRegion);
  const uintptr_t daddr = decode->Reg("buf", kRegion);
  ASSERT_NE(paddr, 0u);
  ASSERT_NE(daddr, 0u);
  ReadWriteByName(*client, *prefill, "prefill-0", paddr, 11);
  ReadWriteByName(*client, *decode, "decode-0", daddr, 22);
  // TransferArgs::remote_generation with the listed generation is accepted.
  {
    hixl_test::Buffer local(4096, 0x5A);
    hixl::TransferArgs args;
    args.remote_generation = by_name["prefill-0"].generation;
    HIXL_EXPECT_OK(client->TransferSync("prefill-0", hixl::TransferOp::WRITE,
                                        {{local.addr(), paddr, 4096}}, args, 3000));
  }

  // Peer to peer by name: decode-0 writes into prefill-0.
  ASSERT_TRUE(decode->Ok("connect prefill-0 3000"));
  EXPECT_EQ(decode->Send("peergen prefill-0"), "OK " + std::to_string(prefill_gen));
  ASSERT_TRUE(decode->Ok("fillpat buf 33"));
  ASSERT_TRUE(
      decode->Ok("write buf 0 prefill-0 " + std::to_string(paddr) + " " + std::to_string(kRegion)));
  EXPECT_EQ(prefill->Hash("buf", 0, kRegion), decode->Hash("buf", 0, kRegion));
  std::string lt_reply = decode->Send("linktype prefill-0");
  EXPECT_TRUE(hixl_test::IsOk(lt_reply)) << lt_reply;

  // ConnectAsync / GetConnectStatus / Disconnect by name.
  HIXL_ASSERT_OK(client->Disconnect("decode-0", 1000));
  HIXL_ASSERT_OK(client->GetConnectStatus("decode-0", cs));
  EXPECT_EQ(cs, ConnectStatus::NOT_CONNECTED);
  HIXL_ASSERT_OK(client->ConnectAsync("decode-0", 3000));
  EXPECT_TRUE(Eventually(
      [&] {
        return client->GetConnectStatus("decode-0", cs).ok() && cs == ConnectStatus::CONNECTED;
      },
      5000))
      << "ConnectAsync by name did not connect";
  HIXL_ASSERT_OK(client->GetPeerGeneration("decode-0", g));
  EXPECT_EQ(g, decode_gen);

  // On-demand connect by name (AutoConnect): a transfer to an unconnected name.
  Hixl* autoc = NewClient({{"AutoConnect", "1"}, {"ConnectTimeoutMs", "3000"}});
  ASSERT_NE(autoc, nullptr);
  ASSERT_TRUE(decode->Ok("fillpat buf 55"));
  hixl_test::Buffer got(kRegion);
  HIXL_ASSERT_OK(autoc->TransferSync("decode-0", hixl::TransferOp::READ,
                                     {{got.addr(), daddr, kRegion}}, 5000));
  EXPECT_EQ(got.HashHex(), decode->Hash("buf", 0, kRegion));
  HIXL_ASSERT_OK(autoc->GetPeerGeneration("decode-0", g));
  EXPECT_EQ(g, decode_gen);
  // Notifications by name.
  HIXL_ASSERT_OK(autoc->SendNotify("decode-0", hixl::NotifyDesc{"hello", "by-name", ""}, 3000));
  std::string n = decode->Send("getnotifies");
  EXPECT_EQ(n, "OK 1 hello=by-name");
}

// A listening engine with MetadataServer lists itself, under its bound address
// when it has no EngineName.
TEST_F(EngineDiscoveryTest, ListeningEngineListsItselfByAddress) {
  Hixl* server = NewClient({}, "127.0.0.1:0");
  ASSERT_NE(server, nullptr);
  const std::string self = server->LocalEngine();
  EngineRecord r;
  ASSERT_TRUE(Eventually([&] { return Listed(*server, self, &r); }, 5000)) << Join(Names(*server));
  EXPECT_EQ(r.address, self);
  EXPECT_EQ(r.generation, server->Generation());
  // A peer reaches it by that name (an ip:port name, parsed as an address).
  PeerProcess* p = StartPeer("finder");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->Ok("connect " + self + " 3000"));
}

// 2. A SIGKILLed peer disappears within its TTL; Connect by its name then
// fails promptly with a clear error.
TEST_F(EngineDiscoveryTest, KilledPeerVanishesWithinTtl) {
  constexpr int kTtlS = 2;
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* victim = StartPeer("victim", kTtlS);
  PeerProcess* bystander = StartPeer("bystander", kTtlS);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(bystander, nullptr);
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "victim") && Listed(*client, "bystander"); }, 5000))
      << Join(Names(*client));
  HIXL_ASSERT_OK(client->Connect("victim", 3000));
  // Let at least one keepalive happen so the lease is "mid-life" as in production.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));

  victim->Kill();
  const auto killed = Clock::now();
  // Before the lease expires the name still resolves, to a dead address:
  // Connect fails (connection refused) instead of hanging.
  {
    ConnectStatus cs = ConnectStatus::FAILED;
    EXPECT_TRUE(Eventually(
        [&] {
          return client->GetConnectStatus("victim", cs).ok() && cs == ConnectStatus::NOT_CONNECTED;
        },
        3000))
        << "link to the killed peer not dropped";
    const auto t0 = Clock::now();
    Status s = client->Connect("victim", 1000);
    EXPECT_FALSE(s.ok());
    EXPECT_LT(MsSince(t0), 2500) << s.ToString();
  }
  const bool gone = Eventually([&] { return !Listed(*client, "victim"); }, (kTtlS + 6) * 1000);
  const int64_t vanish_ms = MsSince(killed);
  ASSERT_TRUE(gone) << "still listed " << vanish_ms << " ms after SIGKILL";
  Measured("vanish_ms", vanish_ms, "(SIGKILL -> gone from ListEngines, MetadataTtlS=2)");
  EXPECT_LE(vanish_ms, (kTtlS + 2) * 1000);
  EXPECT_TRUE(Listed(*client, "bystander")) << "the other peer vanished too";

  const auto t0 = Clock::now();
  Status s = client->Connect("victim", 1000);
  const int64_t took = MsSince(t0);
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "victim")) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "not registered")) << s.ToString();
  EXPECT_LT(took, 4000) << s.ToString();
  // A fresh client agrees.
  Hixl* fresh = NewClient();
  ASSERT_NE(fresh, nullptr);
  EXPECT_FALSE(Listed(*fresh, "victim"));
  EXPECT_TRUE(Listed(*fresh, "bystander"));
  HIXL_EXPECT_CODE(StatusCode::kFailed, fresh->Connect("victim", 1000));
}

// 3. A peer that finalizes (quit) or exits on stdin EOF is gone at once.
TEST_F(EngineDiscoveryTest, FinalizedPeerGoneAtOnce) {
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* quitter = StartPeer("quitter");  // default TTL (10 s): expiry cannot explain it
  PeerProcess* closer = StartPeer("closer");
  ASSERT_NE(quitter, nullptr);
  ASSERT_NE(closer, nullptr);
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "quitter") && Listed(*client, "closer"); }, 5000))
      << Join(Names(*client));
  HIXL_ASSERT_OK(client->Connect("quitter", 3000));

  auto t0 = Clock::now();
  ASSERT_EQ(quitter->Send("quit"), "OK");
  bool gone = Eventually([&] { return !Listed(*client, "quitter"); }, 3000);
  int64_t ms = MsSince(t0);
  ASSERT_TRUE(gone) << "still listed " << ms << " ms after Finalize";
  Measured("finalize_gone_ms", ms, "(quit -> gone from ListEngines)");
  EXPECT_LT(ms, 1000);
  quitter->CloseAndWait(5000);

  t0 = Clock::now();
  closer->CloseAndWait(5000);  // stdin EOF: the peer finalizes and exits
  gone = Eventually([&] { return !Listed(*client, "closer"); }, 3000);
  ms = MsSince(t0);
  ASSERT_TRUE(gone) << "still listed " << ms << " ms after exit";
  Measured("exit_gone_ms", ms, "(stdin EOF exit -> gone from ListEngines)");
  EXPECT_LT(ms, 1000);
  // The key is really gone from etcd, not only from the cache.
  bool found = true;
  hixl::discovery::KeyValue kv;
  HIXL_ASSERT_OK(etcd_client_->Get("hixl/engines/closer", 3000, found, kv));
  EXPECT_FALSE(found);
  Status s = client->Connect("quitter", 1000);
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
}

// 4. A peer restarted under the same name after its entry expired is found
// again with a new generation.
TEST_F(EngineDiscoveryTest, RestartedPeerFoundWithNewGeneration) {
  constexpr int kTtlS = 2;
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* old_peer = StartPeer("worker-0", kTtlS);
  ASSERT_NE(old_peer, nullptr);
  HIXL_ASSERT_OK(client->Connect("worker-0", 3000));
  const uint64_t gen1 = PeerGen(*old_peer);
  uint64_t g = 0;
  HIXL_ASSERT_OK(client->GetPeerGeneration("worker-0", g));
  EXPECT_EQ(g, gen1);

  old_peer->Kill();
  const auto killed = Clock::now();
  // (A restart at once takes the name over: name_takeover_test.cc. This one
  // restarts after the old entry expired.)
  // The old link is lost.
  ConnectStatus cs = ConnectStatus::FAILED;
  EXPECT_TRUE(Eventually(
      [&] {
        return client->GetConnectStatus("worker-0", cs).ok() && cs == ConnectStatus::NOT_CONNECTED;
      },
      3000))
      << "old link not lost";
  ASSERT_TRUE(Eventually([&] { return !Listed(*client, "worker-0"); }, (kTtlS + 6) * 1000));

  PeerProcess* new_peer = StartPeer("worker-0", kTtlS);
  ASSERT_NE(new_peer, nullptr);
  const auto ready = Clock::now();
  const uint64_t gen2 = PeerGen(*new_peer);
  EngineRecord r;
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "worker-0", &r) && r.generation == gen2; }, 5000))
      << "restarted peer not listed with its new generation";
  Measured("restart_found_again_ms", FracMsSince(ready),
           "(new READY -> listed with new generation)");
  Measured("restart_kill_to_found_ms", FracMsSince(killed),
           "(SIGKILL of old -> new listed, TTL 2 s)");
  EXPECT_NE(gen2, gen1);
  EXPECT_EQ(r.address, new_peer->engine());

  // The old generation is refused, the new one works.
  HIXL_ASSERT_OK(client->Connect("worker-0", 3000));
  HIXL_ASSERT_OK(client->GetPeerGeneration("worker-0", g));
  EXPECT_EQ(g, gen2);
  const uintptr_t addr = new_peer->Reg("buf", kRegion);
  ASSERT_NE(addr, 0u);
  WaitUsable(*client, "worker-0", addr);
  hixl_test::Buffer local(4096, 0x11);
  hixl::TransferArgs args;
  args.remote_generation = gen1;
  HIXL_EXPECT_NOT_OK(client->TransferSync("worker-0", hixl::TransferOp::WRITE,
                                          {{local.addr(), addr, 4096}}, args, 3000));
  args.remote_generation = gen2;
  HIXL_EXPECT_OK(client->TransferSync("worker-0", hixl::TransferOp::WRITE,
                                      {{local.addr(), addr, 4096}}, args, 3000));
  ReadWriteByName(*client, *new_peer, "worker-0", addr, 44);
}

// 4b. A peer killed while its entry still lives, and another engine started
// at the same address: Connect by the old name reaches the wrong engine and
// refuses it (generation check). Once the old entry expired and the real
// engine came back at that address, Connect works with the new generation.
TEST_F(EngineDiscoveryTest, AddressTakenOverByAnotherEngine) {
  constexpr int kTtlS = 2;
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  const std::string addr = "127.0.0.1:" + std::to_string(hixl_test::UnusedTcpPort());
  auto launch = [&](const std::string& name) {
    hixl_test::PeerLaunch l;
    l.options = PeerOpts(name, kTtlS);
    l.listen = addr;
    peers_.push_back(std::make_unique<PeerProcess>(l));
    return peers_.back()->Start() ? peers_.back().get() : nullptr;
  };
  PeerProcess* orig = launch("fixed-0");
  ASSERT_NE(orig, nullptr);
  ASSERT_EQ(orig->engine(), addr);
  const uint64_t gen1 = PeerGen(*orig);
  HIXL_ASSERT_OK(client->Connect("fixed-0", 3000));
  orig->Kill();
  ConnectStatus cs = ConnectStatus::FAILED;
  ASSERT_TRUE(Eventually(
      [&] {
        return client->GetConnectStatus("fixed-0", cs).ok() && cs == ConnectStatus::NOT_CONNECTED;
      },
      3000));

  PeerProcess* intruder = launch("intruder");
  ASSERT_NE(intruder, nullptr);
  EngineRecord r;
  if (Listed(*client, "fixed-0", &r)) {  // the old entry has not expired yet (expected)
    EXPECT_EQ(r.generation, gen1);
    Status s = client->Connect("fixed-0", 2000);
    EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "stale")) << s.ToString();
    HIXL_ASSERT_OK(client->GetConnectStatus("fixed-0", cs));
    EXPECT_EQ(cs, ConnectStatus::NOT_CONNECTED);
  } else {
    ADD_FAILURE() << "old entry expired before the intruder started (slow machine?)";
  }
  // The intruder by its own name is fine.
  HIXL_EXPECT_OK(client->Connect("intruder", 3000));
  ASSERT_TRUE(Eventually([&] { return !Listed(*client, "fixed-0"); }, (kTtlS + 6) * 1000));
  ASSERT_EQ(intruder->Send("quit"), "OK");
  intruder->CloseAndWait(5000);
  PeerProcess* back = launch("fixed-0");
  ASSERT_NE(back, nullptr);
  const uint64_t gen2 = PeerGen(*back);
  EXPECT_NE(gen2, gen1);
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "fixed-0", &r) && r.generation == gen2; }, 5000));
  HIXL_ASSERT_OK(client->Connect("fixed-0", 3000));
  uint64_t g = 0;
  HIXL_ASSERT_OK(client->GetPeerGeneration("fixed-0", g));
  EXPECT_EQ(g, gen2);
}

// 4c. An engine's key deleted, or its lease revoked, behind its back: the
// engine publishes itself again.
TEST_F(EngineDiscoveryTest, DeletedKeyAndRevokedLeaseRepublished) {
  constexpr int kTtlS = 3;
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* p = StartPeer("phoenix", kTtlS);
  ASSERT_NE(p, nullptr);
  const uint64_t gen = PeerGen(*p);
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "phoenix"); }, 5000));

  // The delete (and the revoke below) is synchronous in etcd: the key found
  // again afterwards was written by the engine's keeper.
  bool found = false;
  hixl::discovery::KeyValue kv;
  HIXL_ASSERT_OK(etcd_client_->Get("hixl/engines/phoenix", 3000, found, kv));
  ASSERT_TRUE(found);
  const int64_t lease1 = kv.lease;
  ASSERT_NE(lease1, 0);
  int64_t deleted = 0;
  HIXL_ASSERT_OK(etcd_client_->Delete("hixl/engines/phoenix", 3000, &deleted));
  ASSERT_EQ(deleted, 1);
  auto t0 = Clock::now();
  auto back_in_etcd = [&] {
    return etcd_client_->Get("hixl/engines/phoenix", 1000, found, kv).ok() && found;
  };
  ASSERT_TRUE(Eventually(back_in_etcd, (kTtlS + 5) * 1000))
      << "not republished after its key was deleted";
  Measured("republish_after_delete_ms", FracMsSince(t0), "(MetadataTtlS=3)");
  EngineRecord r;
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "phoenix", &r); }, 5000));
  EXPECT_EQ(r.generation, gen);

  HIXL_ASSERT_OK(etcd_client_->Get("hixl/engines/phoenix", 3000, found, kv));
  ASSERT_TRUE(found);
  ASSERT_NE(kv.lease, 0);
  const int64_t lease2 = kv.lease;
  HIXL_ASSERT_OK(etcd_client_->LeaseRevoke(lease2, 3000));
  t0 = Clock::now();
  ASSERT_TRUE(Eventually(back_in_etcd, (kTtlS + 5) * 1000))
      << "not republished after its lease was revoked";
  Measured("republish_after_revoke_ms", FracMsSince(t0), "(MetadataTtlS=3)");
  EXPECT_NE(kv.lease, lease2) << "republished under the revoked lease";
  EXPECT_NE(kv.lease, 0);
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "phoenix", &r); }, 5000));
  EXPECT_EQ(r.generation, gen);
  HIXL_EXPECT_OK(client->Connect("phoenix", 3000));
  // The new lease is kept alive: still there after more than a TTL.
  std::this_thread::sleep_for(std::chrono::milliseconds((kTtlS + 1) * 1000));
  EXPECT_TRUE(Listed(*client, "phoenix"));
  HIXL_ASSERT_OK(etcd_client_->Get("hixl/engines/phoenix", 3000, found, kv));
  EXPECT_TRUE(found);
}

// 4d. An in-process engine finalized and initialized again under the same
// name (its lease was revoked, so the name is free at once).
TEST_F(EngineDiscoveryTest, SameObjectReinitializedUnderSameName) {
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  Hixl e;
  // Without discovery an engine object can be initialized again after Finalize.
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  e.Finalize();
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  e.Finalize();
  const std::map<std::string, std::string> o = {{"MetadataServer", etcd_.endpoints()},
                                                {"EngineName", "again"}};
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  const uint64_t gen1 = e.Generation();
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "again"); }, 5000));
  HIXL_ASSERT_OK(client->Connect("again", 3000));
  e.Finalize();
  ASSERT_TRUE(Eventually([&] { return !Listed(*client, "again"); }, 1000));
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  EngineRecord r;
  ASSERT_TRUE(Eventually(
      [&] { return Listed(*client, "again", &r) && r.generation == e.Generation(); }, 5000));
  EXPECT_NE(e.Generation(), gen1);
  ConnectStatus cs = ConnectStatus::FAILED;
  ASSERT_TRUE(Eventually(
      [&] {
        return client->GetConnectStatus("again", cs).ok() && cs == ConnectStatus::NOT_CONNECTED;
      },
      3000));
  HIXL_ASSERT_OK(client->Connect("again", 3000));
  uint64_t g = 0;
  HIXL_ASSERT_OK(client->GetPeerGeneration("again", g));
  EXPECT_EQ(g, e.Generation());
  client->Finalize();
  e.Finalize();
}

// 5a. A hand-written entry naming a live peer's address with a wrong
// generation: Connect refuses to link to the engine that answers.
TEST_F(EngineDiscoveryTest, StaleEntryWrongGenerationRefused) {
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* real = StartPeer("real-0");
  ASSERT_NE(real, nullptr);
  const uint64_t real_gen = PeerGen(*real);
  PutRaw("hixl/engines/ghost",
         hixl::discovery::EncodeEntry(Entry("ghost", real->engine(), real_gen + 12345)));
  EngineRecord r;
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "ghost", &r); }, 5000))
      << Join(Names(*client));
  EXPECT_EQ(r.generation, real_gen + 12345);
  EXPECT_EQ(r.address, real->engine());

  const auto t0 = Clock::now();
  Status s = client->Connect("ghost", 2000);
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "generation")) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "stale")) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), std::to_string(real_gen))) << s.ToString();
  ConnectStatus cs = ConnectStatus::FAILED;
  HIXL_ASSERT_OK(client->GetConnectStatus("ghost", cs));
  EXPECT_EQ(cs, ConnectStatus::NOT_CONNECTED);
  uint64_t g = 0;
  HIXL_EXPECT_NOT_OK(client->GetPeerGeneration("ghost", g));
  hixl_test::Buffer local(4096);
  HIXL_EXPECT_NOT_OK(
      client->TransferSync("ghost", hixl::TransferOp::READ, {{local.addr(), 0x1000, 16}}, 1000));
  // ConnectAsync to the ghost fails the same way.
  HIXL_ASSERT_OK(client->ConnectAsync("ghost", 2000));
  Status why;
  EXPECT_TRUE(Eventually(
      [&] {
        return client->GetConnectStatus("ghost", cs, &why).ok() && cs != ConnectStatus::CONNECTING;
      },
      4000));
  EXPECT_EQ(cs, ConnectStatus::FAILED) << why.ToString();
  EXPECT_TRUE(Contains(why.message(), "generation")) << why.ToString();
  // The real name still works (the refused handshake left nothing behind).
  HIXL_ASSERT_OK(client->Connect("real-0", 3000));
  HIXL_ASSERT_OK(client->GetPeerGeneration("real-0", g));
  EXPECT_EQ(g, real_gen);
  // A fixed entry (right generation) connects.
  PutRaw("hixl/engines/ghost",
         hixl::discovery::EncodeEntry(Entry("ghost", real->engine(), real_gen)));
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "ghost", &r) && r.generation == real_gen; }, 5000));
  HIXL_EXPECT_OK(client->Connect("ghost", 3000));
}

// 5b. Malformed and foreign values under the prefix are skipped, never listed,
// never crash — through the watch and through a fresh engine's first listing.
TEST_F(EngineDiscoveryTest, MalformedEntriesSkipped) {
  Hixl* watcher = NewClient();
  ASSERT_NE(watcher, nullptr);
  PeerProcess* real = StartPeer("real-0");
  ASSERT_NE(real, nullptr);
  auto mismatch = Entry("someone-else", real->engine(), 99);  // name differs from the key
  auto zero_gen = Entry("zerogen", real->engine(), 1);
  std::string zero_gen_v = hixl::discovery::EncodeEntry(zero_gen);
  const size_t at = zero_gen_v.find("\"generation\":1");
  ASSERT_NE(at, std::string::npos) << zero_gen_v;
  zero_gen_v.replace(at, 14, "\"generation\":0");
  const std::map<std::string, std::string> bad = {
      {"hixl/engines/junk", "{not json"},
      {"hixl/engines/empty", ""},
      {"hixl/engines/v2",
       "{\"v\":2,\"name\":\"v2\",\"address\":\"127.0.0.1:1\",\"generation\":5,"
       "\"host_id\":\"h\",\"pid\":1}"},
      {"hixl/engines/array", "[1,2,3]"},
      {"hixl/engines/mismatch", hixl::discovery::EncodeEntry(mismatch)},
      {"hixl/engines/zerogen", zero_gen_v},
      {"hixl/engines/noport",
       "{\"v\":1,\"name\":\"noport\",\"address\":\"127.0.0.1\",\"generation\":5,"
       "\"host_id\":\"h\",\"pid\":1}"},
      {"hixl/engines/bad name!",
       hixl::discovery::EncodeEntry(Entry("bad name!", real->engine(), 7))},
      {"hixl/engines/", "x"},
      {"hixl/engines/deep/er", hixl::discovery::EncodeEntry(Entry("deep", real->engine(), 8))},
      {"hixl/other-thing", "whatever"},
      {"hixl/engines/huge", std::string(100000, 'x')},
  };
  for (const auto& [k, v] : bad) PutRaw(k, v);
  // A valid entry written last: once it is seen every earlier event was handled.
  PutRaw("hixl/engines/sentinel",
         hixl::discovery::EncodeEntry(Entry("sentinel", "127.0.0.1:1", 42)));
  ASSERT_TRUE(Eventually([&] { return Listed(*watcher, "sentinel"); }, 5000))
      << Join(Names(*watcher));
  Hixl* fresh = NewClient();  // lists them at start
  ASSERT_NE(fresh, nullptr);
  for (Hixl* e : {watcher, fresh}) {
    std::vector<EngineRecord> list;
    HIXL_ASSERT_OK(e->ListEngines(list));
    std::vector<std::string> names;
    for (const auto& r : list) names.push_back(r.name);
    EXPECT_EQ(list.size(), 2u) << Join(names);  // real-0 and sentinel
    EXPECT_TRUE(Listed(*e, "real-0")) << Join(names);
    EXPECT_TRUE(Listed(*e, "sentinel")) << Join(names);
    for (const char* n : {"junk", "empty", "v2", "array", "mismatch", "someone-else", "zerogen",
                          "noport", "deep", "huge"}) {
      EXPECT_FALSE(Listed(*e, n)) << n << " listed: " << Join(names);
      Status s = e->Connect(n, 1000);
      EXPECT_FALSE(s.ok()) << n;
      EXPECT_NE(s.code(), StatusCode::kAlreadyConnected) << n << ": " << s.ToString();
    }
  }
  // The real peer is unaffected, and a valid entry replacing a bad one appears.
  HIXL_EXPECT_OK(watcher->Connect("real-0", 3000));
  PutRaw("hixl/engines/junk",
         hixl::discovery::EncodeEntry(Entry("junk", real->engine(), PeerGen(*real))));
  EXPECT_TRUE(Eventually([&] { return Listed(*watcher, "junk"); }, 5000));
  HIXL_EXPECT_OK(watcher->Connect("junk", 3000));
  // And a valid entry overwritten by junk disappears.
  PutRaw("hixl/engines/sentinel", "garbage");
  EXPECT_TRUE(Eventually([&] { return !Listed(*watcher, "sentinel"); }, 5000));
}

// 5c. A name whose entry points at a closed port (or an unroutable address):
// Connect fails within its timeout.
TEST_F(EngineDiscoveryTest, EntryWithDeadAddressFailsInTime) {
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  const int closed = hixl_test::UnusedTcpPort();
  PutRaw("hixl/engines/deadaddr", hixl::discovery::EncodeEntry(Entry(
                                      "deadaddr", "127.0.0.1:" + std::to_string(closed), 777)));
  PutRaw("hixl/engines/blackhole",
         hixl::discovery::EncodeEntry(Entry("blackhole", "192.0.2.1:9", 778)));
  ASSERT_TRUE(Eventually(
      [&] { return Listed(*client, "deadaddr") && Listed(*client, "blackhole"); }, 5000));
  for (const char* n : {"deadaddr", "blackhole"}) {
    const auto t0 = Clock::now();
    Status s = client->Connect(n, 1000);
    const int64_t took = MsSince(t0);
    EXPECT_FALSE(s.ok()) << n;
    EXPECT_TRUE(s.code() == StatusCode::kFailed || s.code() == StatusCode::kTimeout)
        << s.ToString();
    EXPECT_TRUE(Contains(s.message(), n)) << s.ToString();
    EXPECT_LT(took, 2500) << n << ": " << s.ToString();
    std::printf("  %s: %lld ms: %s\n", n, static_cast<long long>(took), s.ToString().c_str());
    ConnectStatus cs = ConnectStatus::FAILED;
    HIXL_EXPECT_OK(client->GetConnectStatus(n, cs));
    EXPECT_EQ(cs, ConnectStatus::NOT_CONNECTED) << n;
  }
  // On-demand connect by name (AutoConnect) is bounded as well.
  Hixl* autoc = NewClient({{"AutoConnect", "1"}, {"ConnectTimeoutMs", "800"}});
  ASSERT_NE(autoc, nullptr);
  hixl_test::Buffer local(4096);
  const auto t0 = Clock::now();
  HIXL_EXPECT_NOT_OK(
      autoc->TransferSync("blackhole", hixl::TransferOp::READ, {{local.addr(), 0x1000, 16}}, 3000));
  EXPECT_LT(MsSince(t0), 3500);
}

// 6. Configuration and lookup errors.
TEST_F(EngineDiscoveryTest, ErrorsAreClear) {
  // MetadataServer at a closed port.
  {
    const std::string dead = "etcd://127.0.0.1:" + std::to_string(hixl_test::UnusedTcpPort());
    for (const char* local : {"127.0.0.1:0", "127.0.0.1"}) {
      Hixl e;
      const auto t0 = Clock::now();
      Status s = e.Initialize(local, {{"MetadataServer", dead}, {"EngineName", "lonely"}});
      const int64_t took = MsSince(t0);
      std::printf("  Initialize(%s) with etcd down: %lld ms: %s\n", local,
                  static_cast<long long>(took), s.ToString().c_str());
      EXPECT_FALSE(s.ok());
      EXPECT_TRUE(Contains(s.message(), "MetadataServer")) << s.ToString();
      EXPECT_TRUE(Contains(s.message(), dead.substr(7))) << s.ToString();
      EXPECT_LT(took, 8000);
      EXPECT_EQ(e.LocalEngine(), "");
      // Nothing runs; the object can be initialized again properly.
      HIXL_EXPECT_OK(e.Initialize(
          "127.0.0.1:0", {{"MetadataServer", etcd_.endpoints()},
                          {"EngineName", std::string("retry-") + (local[9] ? "l" : "c")}}));
      e.Finalize();
    }
  }
  // Two engines with the same name.
  PeerProcess* holder = StartPeer("dup");
  ASSERT_NE(holder, nullptr);
  {
    Hixl second;
    Status s = second.Initialize("127.0.0.1:0",
                                 {{"MetadataServer", etcd_.endpoints()}, {"EngineName", "dup"}});
    EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "dup")) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), holder->engine()) ||
                Contains(s.message(), std::to_string(holder->pid())))
        << "does not name the holder (" << holder->engine() << ", pid " << holder->pid()
        << "): " << s.ToString();
    // The holder's entry is untouched.
    Hixl* client = NewClient();
    ASSERT_NE(client, nullptr);
    EngineRecord r;
    ASSERT_TRUE(Listed(*client, "dup", &r));
    EXPECT_EQ(r.address, holder->engine());
    EXPECT_EQ(r.generation, PeerGen(*holder));
    HIXL_EXPECT_OK(client->Connect("dup", 3000));
    // The same name under another prefix is another engine.
    HIXL_EXPECT_OK(second.Initialize("127.0.0.1:0", {{"MetadataServer", etcd_.endpoints()},
                                                     {"EngineName", "dup"},
                                                     {"MetadataPrefix", "elsewhere/"}}));
    second.Finalize();
    EXPECT_TRUE(Listed(*client, "dup"));

    // Unknown names.
    const auto t0 = Clock::now();
    s = client->Connect("nosuch", 1000);
    EXPECT_LT(MsSince(t0), 4000);
    EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "nosuch")) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "not registered")) << s.ToString();
    HIXL_EXPECT_NOT_OK(client->ConnectAsync("nosuch", 1000));
    hixl_test::Buffer local(64);
    HIXL_EXPECT_NOT_OK(
        client->TransferSync("nosuch", hixl::TransferOp::READ, {{local.addr(), 0x1000, 16}}, 1000));
    hixl::LinkType lt;
    HIXL_EXPECT_NOT_OK(client->GetLinkType("nosuch", lt));
    // A name that is not a valid engine name.
    s = client->Connect("bad name!", 1000);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  }
  // Discovery options without MetadataServer, and bad values.
  {
    Hixl e;
    HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                     e.Initialize("127.0.0.1:0", {{"EngineName", "prefill-0"}}));
    HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                     e.Initialize("127.0.0.1:0", {{"MetadataPrefix", "x/"}}));
    HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                     e.Initialize("127.0.0.1:0", {{"MetadataTtlS", "5"}}));
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"MetadataTtlS", "1"},
             {"MetadataTtlS", "3601"},
             {"EngineName", "bad name"},
             {"EngineName", ""},
             {"EngineName", std::string(129, 'a')},
             {"MetadataServer", "http://127.0.0.1:2379"},
             {"MetadataServer", "etcd://127.0.0.1"}}) {
      std::map<std::string, std::string> o = {{"MetadataServer", etcd_.endpoints()}};
      o[k] = v;
      Status s = e.Initialize("127.0.0.1:0", o);
      EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << k << "=" << v << " -> " << s.ToString();
      if (s.ok()) e.Finalize();
    }
    // Without MetadataServer names are refused and ListEngines is unsupported.
    HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
    std::vector<EngineRecord> list;
    HIXL_EXPECT_CODE(StatusCode::kUnsupported, e.ListEngines(list));
    // (The message is the ip:port parse error, "'prefill-0': host must be an
    // IPv4 or IPv6 address"; it does not say that names need MetadataServer.)
    Status s = e.Connect("prefill-0", 1000);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "prefill-0")) << s.ToString();
    e.Finalize();
  }
}

// 7. etcd restarted under running engines: old peers are listed again, a peer
// started after the restart is found by name.
TEST_F(EngineDiscoveryTest, EtcdRestartUnderRunningEngines) {
  constexpr int kTtlS = 2;
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* a = StartPeer("old-a", kTtlS);
  PeerProcess* b = StartPeer("old-b", kTtlS);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "old-a") && Listed(*client, "old-b"); }, 5000));
  HIXL_ASSERT_OK(client->Connect("old-a", 3000));
  const uint64_t gen_a = PeerGen(*a);
  const uint64_t gen_b = PeerGen(*b);

  // Down for longer than the TTL.
  etcd_.Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds((kTtlS + 1) * 1000));
  // The existing link does not depend on etcd.
  uint64_t during = 0;
  HIXL_EXPECT_OK(client->GetPeerGeneration("old-a", during));
  EXPECT_EQ(during, gen_a);
  std::string why;
  ASSERT_TRUE(etcd_.Restart(why)) << why;
  const auto restarted = Clock::now();

  PeerProcess* c = StartPeer("new-c", kTtlS);
  ASSERT_NE(c, nullptr);
  const uint64_t gen_c = PeerGen(*c);
  EngineRecord ra, rb, rc;
  const bool all = Eventually(
      [&] {
        return Listed(*client, "old-a", &ra) && Listed(*client, "old-b", &rb) &&
               Listed(*client, "new-c", &rc);
      },
      20000);
  const int64_t ms = MsSince(restarted);
  ASSERT_TRUE(all) << "after etcd restart the client lists " << Join(Names(*client));
  Measured("etcd_restart_relisted_ms", ms, "(etcd healthy again -> old and new peers listed)");
  EXPECT_EQ(ra.generation, gen_a);
  EXPECT_EQ(rb.generation, gen_b);
  EXPECT_EQ(rc.generation, gen_c);
  EXPECT_EQ(rc.address, c->engine());
  // The keys are really back in etcd (not only a stale cache).
  for (const char* n : {"old-a", "old-b", "new-c"}) {
    bool found = false;
    hixl::discovery::KeyValue kv;
    EXPECT_TRUE(Eventually(
        [&] {
          return etcd_client_->Get(std::string("hixl/engines/") + n, 1000, found, kv).ok() && found;
        },
        10000))
        << n << " not in etcd";
  }
  // They stay: leases are renewed against the restarted etcd (wait > TTL).
  std::this_thread::sleep_for(std::chrono::milliseconds((kTtlS + 1) * 1000));
  EXPECT_TRUE(Listed(*client, "old-a"));
  EXPECT_TRUE(Listed(*client, "old-b"));
  EXPECT_TRUE(Listed(*client, "new-c"));
  HIXL_EXPECT_OK(client->Connect("new-c", 3000));
  HIXL_EXPECT_OK(client->Connect("old-b", 3000));
  // A fresh client and a peer see the same.
  Hixl* fresh = NewClient();
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(Listed(*fresh, "old-a") && Listed(*fresh, "old-b") && Listed(*fresh, "new-c"))
      << Join(Names(*fresh));
  EXPECT_TRUE(c->Ok("connect old-a 3000"));
  EXPECT_TRUE(a->Ok("connect new-c 3000"));
  // A crash after the restart still expires.
  b->Kill();
  EXPECT_TRUE(Eventually([&] { return !Listed(*client, "old-b"); }, (kTtlS + 4) * 1000));
}

// 7b. A graceful etcd stop/restart (Restart) while a client watches.
TEST_F(EngineDiscoveryTest, EtcdGracefulRestart) {
  Hixl* client = NewClient();
  ASSERT_NE(client, nullptr);
  PeerProcess* a = StartPeer("old-a", 2);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(Eventually([&] { return Listed(*client, "old-a"); }, 5000));
  std::string why;
  ASSERT_TRUE(etcd_.Restart(why)) << why;
  const auto restarted = Clock::now();
  PeerProcess* c = StartPeer("new-c", 2);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(
      Eventually([&] { return Listed(*client, "old-a") && Listed(*client, "new-c"); }, 20000))
      << Join(Names(*client));
  Measured("etcd_graceful_restart_relisted_ms", FracMsSince(restarted));
  HIXL_EXPECT_OK(client->Connect("new-c", 3000));
  HIXL_EXPECT_OK(client->Connect("old-a", 3000));
}

// 8. MetadataPrefix isolates engines: the same name under two prefixes is two
// engines, and each side sees only its own.
TEST_F(EngineDiscoveryTest, PrefixIsolates) {
  Hixl* mine = NewClient();
  Hixl* theirs = NewClient({{"MetadataPrefix", "other/"}});
  ASSERT_NE(mine, nullptr);
  ASSERT_NE(theirs, nullptr);
  PeerProcess* a = StartPeer("prefill-0");
  PeerProcess* b = StartPeer("prefill-0", 0, "other/");
  PeerProcess* only_other = StartPeer("decode-9", 0, "other/");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(only_other, nullptr);
  const uint64_t gen_a = PeerGen(*a), gen_b = PeerGen(*b);
  EngineRecord r;
  ASSERT_TRUE(Eventually([&] { return Listed(*mine, "prefill-0"); }, 5000));
  ASSERT_TRUE(Eventually(
      [&] { return Listed(*theirs, "prefill-0") && Listed(*theirs, "decode-9"); }, 5000));
  ASSERT_TRUE(Listed(*mine, "prefill-0", &r));
  EXPECT_EQ(r.address, a->engine());
  EXPECT_EQ(r.generation, gen_a);
  ASSERT_TRUE(Listed(*theirs, "prefill-0", &r));
  EXPECT_EQ(r.address, b->engine());
  EXPECT_EQ(r.generation, gen_b);
  std::vector<EngineRecord> list;
  HIXL_ASSERT_OK(mine->ListEngines(list));
  EXPECT_EQ(list.size(), 1u) << Join(Names(*mine));
  HIXL_ASSERT_OK(theirs->ListEngines(list));
  EXPECT_EQ(list.size(), 2u) << Join(Names(*theirs));
  EXPECT_FALSE(Listed(*mine, "decode-9"));

  HIXL_ASSERT_OK(mine->Connect("prefill-0", 3000));
  HIXL_ASSERT_OK(theirs->Connect("prefill-0", 3000));
  uint64_t g = 0;
  HIXL_ASSERT_OK(mine->GetPeerGeneration("prefill-0", g));
  EXPECT_EQ(g, gen_a);
  HIXL_ASSERT_OK(theirs->GetPeerGeneration("prefill-0", g));
  EXPECT_EQ(g, gen_b);
  Status s = mine->Connect("decode-9", 1000);
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  // Peers resolve within their own prefix too.
  EXPECT_TRUE(only_other->Ok("connect prefill-0 3000"));
  EXPECT_EQ(only_other->Send("peergen prefill-0"), "OK " + std::to_string(gen_b));
  // A prefix that is a string prefix of another ("other" vs "other/") sees nothing.
  Hixl* near = NewClient({{"MetadataPrefix", "other"}});
  ASSERT_NE(near, nullptr);
  HIXL_ASSERT_OK(near->ListEngines(list));
  EXPECT_TRUE(list.empty()) << Join(Names(*near));
}

}  // namespace
