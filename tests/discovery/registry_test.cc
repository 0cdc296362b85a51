// Registry against a real etcd: engines find each other by name, Stop and
// crashes make entries vanish, etcd restarts and leases revoked behind a
// registry's back are recovered, names held by live engines are refused and
// those of dead ones taken over (one winner among racers), foreign values are
// skipped.
#include "discovery/registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "etcd_process.h"

extern char** environ;

namespace hixl::discovery {
namespace {

using Clock = std::chrono::steady_clock;
int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Polls pred every 10 ms for up to ms.
bool Eventually(const std::function<bool()>& pred, int ms) {
  auto t0 = Clock::now();
  while (MsSince(t0) < ms) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Records what a registry's listener saw.
struct Seen {
  std::mutex mu;
  std::map<std::string, bool> present;  // name -> last state
  void Attach(Registry& r) {
    r.SetListener([this](const std::string& name, const EngineEntry* e) {
      std::lock_guard<std::mutex> lock(mu);
      present[name] = e != nullptr;
    });
  }
  int State(const std::string& name) {  // -1 never seen, 0 gone, 1 present
    std::lock_guard<std::mutex> lock(mu);
    auto it = present.find(name);
    return it == present.end() ? -1 : it->second;
  }
};

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(etcd_.Start(why)) << why;
    ASSERT_TRUE(EtcdClient::Create(etcd_.endpoints(), &client_).ok());
  }
  RegistryConfig Config(const std::string& name, int port, int ttl_s = 4) {
    RegistryConfig c;
    c.endpoints = etcd_.endpoints();
    c.self = {name, "127.0.0.1:" + std::to_string(port), 1000u + port, "host-1",
              static_cast<int64_t>(getpid())};
    c.ttl_s = ttl_s;
    c.request_timeout_ms = 1000;
    return c;
  }
  bool KeyExists(const std::string& key, KeyValue* kv = nullptr) {
    bool found = false;
    KeyValue got;
    Status s = client_->Get(key, 1000, found, got);
    if (kv != nullptr) *kv = got;
    return s.ok() && found;
  }
  testing::EtcdProcess etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(RegistryTest, TwoRegistriesFindEachOther) {
  Seen seen_by_a;  // outlives the registries
  Registry a, b;
  ASSERT_TRUE(a.Start(Config("a", 5001)).ok());
  seen_by_a.Attach(a);
  auto t0 = Clock::now();
  ASSERT_TRUE(b.Start(Config("10.0.0.9:5002", 5002)).ok());
  const int64_t start_ms = MsSince(t0);
  EngineEntry e;
  Status s = b.Lookup("a", e);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(e.address, "127.0.0.1:5001");
  EXPECT_EQ(e.generation, 6001u);
  ASSERT_TRUE(a.Lookup("10.0.0.9:5002", e).ok());  // cache or direct read
  const int64_t lookup_ms = MsSince(t0);
  ASSERT_TRUE(Eventually([&] { return seen_by_a.State("10.0.0.9:5002") == 1; }, 3000));
  const int64_t listener_ms = MsSince(t0);
  std::printf("[timing] Start %lld ms; peer Lookup ok %lld ms after Start began; peer's "
              "listener saw it after %lld ms\n",
              static_cast<long long>(start_ms), static_cast<long long>(lookup_ms),
              static_cast<long long>(listener_ms));
  ASSERT_TRUE(Eventually([&] { return a.List().size() == 2 && b.List().size() == 2; }, 3000));
  EXPECT_EQ(a.List()[0].name, "10.0.0.9:5002");
  EXPECT_EQ(b.Lookup("nobody", e).code(), StatusCode::kFailed);
  EXPECT_EQ(b.Lookup("bad/name", e).code(), StatusCode::kParamInvalid);
}

TEST_F(RegistryTest, StopRemovesTheKeyAndPeersSeeItGone) {
  Seen seen;  // outlives the registries
  Registry a, b;
  ASSERT_TRUE(a.Start(Config("a", 5001)).ok());
  ASSERT_TRUE(b.Start(Config("b", 5002)).ok());
  seen.Attach(a);
  ASSERT_TRUE(Eventually([&] { return a.List().size() == 2; }, 3000));
  auto t0 = Clock::now();
  b.Stop();
  const int64_t stop_ms = MsSince(t0);
  EXPECT_LT(stop_ms, 1000);
  EXPECT_FALSE(KeyExists("hixl/engines/b"));
  ASSERT_TRUE(Eventually([&] { return seen.State("b") == 0; }, 3000));
  std::printf("[timing] Stop took %lld ms; the peer's listener saw it gone after %lld ms\n",
              static_cast<long long>(stop_ms), static_cast<long long>(MsSince(t0)));
  EngineEntry e;
  EXPECT_EQ(a.Lookup("b", e).code(), StatusCode::kFailed);
  b.Stop();  // idempotent
}

// A child process holds a registration and is SIGKILLed.
// A registry_child process (host "child-host") holding name at addr; killed
// and reaped by the caller through its pid.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  int in = -1;
  ~Child() { Kill(); }
  void Kill() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (out != nullptr) fclose(out);
    out = nullptr;
    if (in >= 0) close(in);
    in = -1;
  }
};

// Starts a child registered as name; false (child stopped) unless it said READY.
bool SpawnChild(const std::string& endpoints, const std::string& name, const std::string& addr,
                int ttl_s, Child& c, std::string& line_out) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::string ep = endpoints, ttl = std::to_string(ttl_s), bin = HIXL_TEST_REGISTRY_CHILD,
              prefix = "hixl/", n = name, a = addr;
  char* argv[] = {bin.data(), ep.data(), prefix.data(), n.data(), a.data(), ttl.data(), nullptr};
  const int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  c.in = in[1];
  c.out = fdopen(out[0], "r");
  if (rc != 0) {
    c.pid = -1;
    return false;
  }
  char line[256] = {0};
  const bool ready =
      fgets(line, sizeof(line), c.out) != nullptr && std::string(line).rfind("READY", 0) == 0;
  line_out = line;
  if (!ready) c.Kill();
  return ready;
}

TEST_F(RegistryTest, KilledProcessVanishesWithinTtl) {
  Seen seen;  // outlives the registries
  Registry a;
  ASSERT_TRUE(a.Start(Config("a", 5001)).ok());
  seen.Attach(a);
  const int ttl_s = 2;
  Child child;
  std::string line;
  ASSERT_TRUE(SpawnChild(etcd_.endpoints(), "child", "127.0.0.1:6000", ttl_s, child, line)) << line;
  ASSERT_TRUE(Eventually([&] { return seen.State("child") == 1; }, 3000));
  auto t0 = Clock::now();
  child.Kill();
  ASSERT_TRUE(Eventually([&] { return seen.State("child") == 0; }, (ttl_s + 3) * 1000));
  const int64_t gone_ms = MsSince(t0);
  std::printf("[timing] killed registry (ttl %d s) vanished from the peer's cache after %lld ms\n",
              ttl_s, static_cast<long long>(gone_ms));
  EXPECT_LE(gone_ms, ttl_s * 1000 + 1500);
  EXPECT_FALSE(KeyExists("hixl/engines/child"));
}

TEST_F(RegistryTest, SurvivesEtcdRestart) {
  Seen seen_by_a;  // outlives the registries
  Registry a, b;
  ASSERT_TRUE(a.Start(Config("a", 5001, 3)).ok());
  ASSERT_TRUE(b.Start(Config("b", 5002, 3)).ok());
  seen_by_a.Attach(a);
  etcd_.Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string why;
  ASSERT_TRUE(etcd_.Restart(why)) << why;
  auto t0 = Clock::now();
  // Both still registered, both watching again: a newcomer is seen by both.
  Registry c;
  Status cs = c.Start(Config("c", 5003, 3));
  ASSERT_TRUE(cs.ok()) << cs.ToString();
  ASSERT_TRUE(Eventually([&] { return seen_by_a.State("c") == 1; }, 5000));
  ASSERT_TRUE(Eventually([&] { return b.List().size() == 3; }, 5000));
  std::printf("[timing] after an etcd restart the registries saw a newcomer within %lld ms\n",
              static_cast<long long>(MsSince(t0)));
  EngineEntry e;
  EXPECT_TRUE(c.Lookup("a", e).ok());
  EXPECT_TRUE(c.Lookup("b", e).ok());
  // Down for longer than the TTL: the entries come back too.
  etcd_.Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  ASSERT_TRUE(etcd_.Restart(why)) << why;
  ASSERT_TRUE(Eventually([&] {
    return KeyExists("hixl/engines/a") && KeyExists("hixl/engines/b") &&
           KeyExists("hixl/engines/c");
  }, 8000));
  Registry d;
  ASSERT_TRUE(d.Start(Config("d", 5004, 3)).ok());
  ASSERT_TRUE(Eventually([&] { return a.List().size() == 4 && b.List().size() == 4; }, 5000));
}

TEST_F(RegistryTest, RepublishesWhenTheLeaseIsRevokedOrTheKeyDeleted) {
  Registry a, b;
  ASSERT_TRUE(a.Start(Config("a", 5001)).ok());
  ASSERT_TRUE(b.Start(Config("b", 5002)).ok());
  const int64_t lease = a.lease_id();
  ASSERT_NE(lease, 0);
  auto t0 = Clock::now();
  ASSERT_TRUE(client_->LeaseRevoke(lease, 1000).ok());
  KeyValue kv;
  ASSERT_TRUE(Eventually([&] { return KeyExists(a.key(), &kv) && kv.lease != lease; }, 5000));
  std::printf("[timing] re-published %lld ms after its lease was revoked\n",
              static_cast<long long>(MsSince(t0)));
  EXPECT_EQ(kv.lease, a.lease_id());
  ASSERT_TRUE(Eventually([&] {
    EngineEntry e;
    return b.Lookup("a", e).ok();
  }, 3000));
  // The key alone deleted (lease alive).
  t0 = Clock::now();
  ASSERT_TRUE(client_->Delete(a.key(), 1000).ok());
  ASSERT_TRUE(Eventually([&] { return KeyExists(a.key(), &kv); }, 5000));
  std::printf("[timing] re-published %lld ms after its key was deleted\n",
              static_cast<long long>(MsSince(t0)));
  // After Stop it stays gone.
  a.Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(KeyExists("hixl/engines/a"));
}

TEST_F(RegistryTest, TakenNameIsRefused) {
  Registry a;
  ASSERT_TRUE(a.Start(Config("same", 5001)).ok());
  Registry b;
  Status s = b.Start(Config("same", 5002));
  EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
  EXPECT_NE(s.message().find("127.0.0.1:5001"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("pid"), std::string::npos) << s.message();
  KeyValue kv;
  ASSERT_TRUE(KeyExists("hixl/engines/same", &kv));
  EXPECT_EQ(kv.lease, a.lease_id());
  b.Stop();  // nothing to stop; must not touch a's key
  EXPECT_TRUE(KeyExists("hixl/engines/same"));
  // Once a has gone the name is free.
  a.Stop();
  Registry c;
  EXPECT_TRUE(c.Start(Config("same", 5003)).ok());
}

// A holder on this host whose process is gone: its name is taken over at
// once, by one transaction; the old lease no longer owns the key.
TEST_F(RegistryTest, DeadHolderOnThisHostIsTakenOver) {
  Child child;
  std::string line;
  ASSERT_TRUE(SpawnChild(etcd_.endpoints(), "crashed", "127.0.0.1:6001", 30, child, line)) << line;
  KeyValue before;
  ASSERT_TRUE(KeyExists("hixl/engines/crashed", &before));
  // While it lives, the same host's pid test says alive.
  RegistryConfig cfg = Config("crashed", 6002);
  cfg.self.host_id = "child-host";
  {
    Registry r;
    Status s = r.Start(cfg);
    EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
    EXPECT_NE(s.message().find("exists"), std::string::npos) << s.message();
  }
  child.Kill();
  const auto t0 = Clock::now();
  Registry r;
  ASSERT_TRUE(r.Start(cfg).ok());
  std::printf(
      "[timing] took over a dead holder's name %lld ms after its SIGKILL (lease ttl 30 s)\n",
      static_cast<long long>(MsSince(t0)));
  KeyValue after;
  ASSERT_TRUE(KeyExists("hixl/engines/crashed", &after));
  EXPECT_EQ(after.lease, r.lease_id());
  EXPECT_NE(after.lease, before.lease);
  // The dead holder's lease, revoked or expired, no longer removes the key.
  ASSERT_TRUE(client_->LeaseRevoke(before.lease, 1000).ok());
  EXPECT_TRUE(KeyExists("hixl/engines/crashed"));
}

// Another host's holder: holder_gone decides, and sees the holder's entry.
TEST_F(RegistryTest, HolderGoneDecidesForOtherHosts) {
  EngineEntry far{"far", "10.9.9.9:7000", 99, "other-host", 1234};
  ASSERT_TRUE(client_->Put("hixl/engines/far", EncodeEntry(far), 0, 1000).ok());
  EngineEntry seen;
  RegistryConfig cfg = Config("far", 6003);
  cfg.holder_gone = [&](const EngineEntry& h, std::string& why) {
    seen = h;
    why = "the test says it answers";
    return false;
  };
  {
    Registry r;
    Status s = r.Start(cfg);
    EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
    EXPECT_NE(s.message().find("the test says it answers"), std::string::npos) << s.message();
    EXPECT_EQ(seen, far);
  }
  cfg.holder_gone = [](const EngineEntry&, std::string& why) {
    why = "the test says it is gone";
    return true;
  };
  Registry r;
  ASSERT_TRUE(r.Start(cfg).ok());
  KeyValue kv;
  ASSERT_TRUE(KeyExists("hixl/engines/far", &kv));
  EXPECT_EQ(kv.lease, r.lease_id());
  // A live registry of this process is not asked about: its pid exists, and
  // holder_gone says alive.
  RegistryConfig again = Config("far", 6004);
  again.holder_gone = [](const EngineEntry&, std::string& why) {
    why = "alive";
    return false;
  };
  Registry r2;
  EXPECT_EQ(r2.Start(again).code(), StatusCode::kAlreadyConnected);
}

// Registries racing for one dead holder's name: exactly one wins.
TEST_F(RegistryTest, RacingTakeOversOneWins) {
  for (int round = 0; round < 5; ++round) {
    const std::string name = "race-" + std::to_string(round);
    Child child;
    std::string line;
    ASSERT_TRUE(SpawnChild(etcd_.endpoints(), name, "127.0.0.1:6100", 30, child, line)) << line;
    child.Kill();
    constexpr int kRacers = 4;
    std::vector<std::unique_ptr<Registry>> regs;
    std::vector<Status> got(kRacers);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kRacers; ++i) {
      regs.push_back(std::make_unique<Registry>());
      threads.emplace_back([&, i] {
        RegistryConfig cfg = Config(name, 6200 + i);
        cfg.self.host_id = "child-host";
        ready.fetch_add(1);
        while (ready.load() < kRacers) std::this_thread::yield();
        got[i] = regs[i]->Start(cfg);
      });
    }
    for (auto& t : threads) t.join();
    int winners = 0;
    for (int i = 0; i < kRacers; ++i) {
      if (got[i].ok()) {
        ++winners;
        KeyValue kv;
        ASSERT_TRUE(KeyExists("hixl/engines/" + name, &kv));
        EXPECT_EQ(kv.lease, regs[i]->lease_id());
      } else {
        EXPECT_EQ(got[i].code(), StatusCode::kAlreadyConnected) << got[i].ToString();
      }
    }
    EXPECT_EQ(winners, 1) << "round " << round;
  }
}

TEST_F(RegistryTest, ForeignAndMalformedValuesAreSkipped) {
  auto put = [&](const std::string& k, const std::string& v) {
    ASSERT_TRUE(client_->Put("hixl/engines/" + k, v, 0, 1000).ok());
  };
  EngineEntry ok_entry{"ok", "127.0.0.1:7000", 5, "h", 9};
  put("ok", EncodeEntry(ok_entry));
  put("bad1", "not json");
  put("bad2", "{\"v\":2}");
  put("bad3", EncodeEntry(EngineEntry{"other", "127.0.0.1:7000", 5, "h", 9}));
  put("a/b", EncodeEntry(ok_entry));
  put("bad4", std::string(100000, '['));
  put("bad5", std::string("\0\xff", 2));
  Registry a;
  ASSERT_TRUE(a.Start(Config("a", 5001)).ok());
  auto names = [&] {
    std::vector<std::string> v;
    for (auto& e : a.List()) v.push_back(e.name);
    return v;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"a", "ok"}));
  // While watching: more garbage, and a valid entry turned invalid.
  put("bad6", "{\"v\":1,\"name\":\"bad6\"}");
  put("ok", "garbage");
  put("new", EncodeEntry(EngineEntry{"new", "127.0.0.1:7001", 6, "h", 9}));
  ASSERT_TRUE(Eventually([&] { return names() == std::vector<std::string>{"a", "new"}; }, 3000));
  EngineEntry e;
  EXPECT_EQ(a.Lookup("bad1", e).code(), StatusCode::kFailed);
  EXPECT_EQ(a.Lookup("ok", e).code(), StatusCode::kFailed);
}

TEST_F(RegistryTest, SurvivesCompaction) {
  Registry a;
  ASSERT_TRUE(a.Start(Config("a", 5001)).ok());
  int64_t rev = 0;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->Put("other/k", std::to_string(i), 0, 1000, &rev).ok());
  ASSERT_TRUE(client_->Compact(rev, 1000).ok());
  Registry b;
  ASSERT_TRUE(b.Start(Config("b", 5002)).ok());
  ASSERT_TRUE(Eventually([&] { return a.List().size() == 2; }, 3000));
}

TEST_F(RegistryTest, RefusesBadConfigAndUnreachableEtcd) {
  Registry r;
  RegistryConfig c = Config("a", 5001);
  c.ttl_s = 1;
  EXPECT_EQ(r.Start(c).code(), StatusCode::kParamInvalid);
  c = Config("a/b", 5001);
  EXPECT_EQ(r.Start(c).code(), StatusCode::kParamInvalid);
  c = Config("a", 5001);
  c.endpoints = "127.0.0.1:2379";
  EXPECT_EQ(r.Start(c).code(), StatusCode::kParamInvalid);
  c = Config("a", 5001);
  c.prefix = "";
  EXPECT_EQ(r.Start(c).code(), StatusCode::kParamInvalid);
  c = Config("a", 5001);
  c.endpoints = "etcd://127.0.0.1:" + std::to_string(testing::PickFreePort());
  auto t0 = Clock::now();
  Status s = r.Start(c);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(MsSince(t0), 1500);
  EXPECT_NE(s.message().find("unreachable"), std::string::npos) << s.ToString();
}

TEST_F(RegistryTest, StopIsPromptWhileEtcdIsDown) {
  Registry a;
  ASSERT_TRUE(a.Start(Config("a", 5001, 3)).ok());
  etcd_.Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // keeper and watcher retrying
  auto t0 = Clock::now();
  a.Stop();
  EXPECT_LT(MsSince(t0), 2500);  // about two request timeouts at most
}

}  // namespace
}  // namespace hixl::discovery
