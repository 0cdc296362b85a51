// tests/multihost_test.cc — engines on different "hosts": hixl_test_peer
// processes in separate network namespaces joined by veth pairs.
//
// Each test creates its own namespaces hixl-<pid>-<x> and veth links
// hx<pid>v<k>{a,b} with addresses 10.213.<k>.1/24 and 10.213.<k>.2/24 (they
// exist only inside these namespaces), brings up lo and the veth ends, and
// starts peers with `ip netns exec NS hixl_test_peer --listen 10.213.k.y:0`.
// Different network namespaces mean different hosts to hixl (its host
// identity includes the network namespace), so LinkType AUTO picks tcp and a
// forced SHM link must be refused.
//
// Cleanup: an RAII guard deletes what a test created, also when it fails;
// SetUpTestSuite removes leftovers of earlier runs whose process is gone;
// TearDown checks that nothing of this process is left. Without the rights
// to create namespaces (not root, no `ip` binary, EPERM) the tests skip and
// say why.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl_test::PeerLaunch;
using hixl_test::PeerProcess;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = 1024 * 1024;


std::string FindIp() {
  for (const char* c : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(c, X_OK) == 0) return c;
  }
  return "";
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool PidAlive(long pid) { return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH); }

// Namespaces and links one test creates; the destructor deletes them.
class NetnsGuard {
 public:
  explicit NetnsGuard(std::string ip) : ip_(std::move(ip)) {}
  ~NetnsGuard() { Cleanup(); }
  NetnsGuard(const NetnsGuard&) = delete;
  NetnsGuard& operator=(const NetnsGuard&) = delete;

  static std::string Prefix() { return "hixl-" + std::to_string(getpid()) + "-"; }

  // Creates namespace hixl-<pid>-<tag> with lo up; returns its name ("" on
  // failure, *err says why).
  std::string AddNs(const std::string& tag, std::string* err) {
    const std::string name = Prefix() + tag;
    std::string out;
    if (hixl_test::RunCommand({ip_, "netns", "add", name}, &out) != 0) {
      *err = "ip netns add " + name + ": " + Trim(out);
      return "";
    }
    namespaces_.push_back(name);
    if (hixl_test::RunCommand({ip_, "-n", name, "link", "set", "lo", "up"}, &out) != 0) {
      *err = "ip -n " + name + " link set lo up: " + Trim(out);
      return "";
    }
    return name;
  }

  // A veth pair between namespaces a and b: link k gets 10.213.k.1/24 in a
  // and 10.213.k.2/24 in b. Returns false with *err on failure.
  bool Link(int k, const std::string& a, const std::string& b, std::string* err) {
    const std::string base = "hx" + std::to_string(getpid()) + "v" + std::to_string(k);
    const std::string ea = base + "a", eb = base + "b";
    const std::string net = "10.213." + std::to_string(k) + ".";
    std::string out;
    if (hixl_test::RunCommand({ip_, "link", "add", ea, "type", "veth", "peer", "name", eb}, &out) != 0) {
      *err = "ip link add " + ea + " type veth: " + Trim(out);
      return false;
    }
    root_links_.push_back(ea);  // until both ends are moved
    const std::vector<std::vector<std::string>> steps = {
        {ip_, "link", "set", ea, "netns", a},
        {ip_, "link", "set", eb, "netns", b},
        {ip_, "-n", a, "addr", "add", net + "1/24", "dev", ea},
        {ip_, "-n", b, "addr", "add", net + "2/24", "dev", eb},
        {ip_, "-n", a, "link", "set", ea, "up"},
        {ip_, "-n", b, "link", "set", eb, "up"},
    };
    for (const auto& s : steps) {
      if (hixl_test::RunCommand(s, &out) != 0) {
        std::string cmd;
        for (const auto& w : s) cmd += w + " ";
        *err = cmd + ": " + Trim(out);
        return false;
      }
    }
    return true;
  }

  // `ip -n ns route add ...`
  bool Route(const std::string& ns, const std::vector<std::string>& route, std::string* err) {
    std::vector<std::string> argv = {ip_, "-n", ns, "route", "add"};
    argv.insert(argv.end(), route.begin(), route.end());
    std::string out;
    if (hixl_test::RunCommand(argv, &out) != 0) {
      *err = "ip route add in " + ns + ": " + Trim(out);
      return false;
    }
    return true;
  }

  void Cleanup() {
    std::string out;
    for (const auto& l : root_links_) {
      // Gone already when it was moved into a namespace: ignore errors.
      (void)hixl_test::RunCommand({ip_, "link", "del", l}, &out);
    }
    root_links_.clear();
    for (const auto& n : namespaces_) {
      if (hixl_test::RunCommand({ip_, "netns", "del", n}, &out) != 0) {
        ADD_FAILURE() << "ip netns del " << n << ": " << Trim(out);
      }
    }
    namespaces_.clear();
  }

  // Deletes namespaces and root-namespace veth ends left by earlier test
  // processes that no longer run.
  static void RemoveStale(const std::string& ip) {
    std::string out;
    if (hixl_test::RunCommand({ip, "netns", "list"}, &out) == 0) {
      std::istringstream in(out);
      std::string line;
      while (std::getline(in, line)) {
        std::string name = line.substr(0, line.find(' '));
        long pid = 0;
        char tag[64];
        if (std::sscanf(name.c_str(), "hixl-%ld-%63s", &pid, tag) == 2 && !PidAlive(pid)) {
          std::string o;
          int rc = hixl_test::RunCommand({ip, "netns", "del", name}, &o);
          std::printf("[ info ] removed stale namespace %s (rc %d)\n", name.c_str(), rc);
        }
      }
    }
    if (hixl_test::RunCommand({ip, "-o", "link", "show"}, &out) == 0) {
      std::istringstream in(out);
      std::string line;
      while (std::getline(in, line)) {
        // "12: hx123v1a@hx123v1b: <...>"
        size_t c = line.find(": ");
        if (c == std::string::npos) continue;
        std::string name = line.substr(c + 2);
        name = name.substr(0, name.find_first_of("@:"));
        long pid = 0;
        int k = 0;
        char side = 0;
        if (std::sscanf(name.c_str(), "hx%ldv%d%c", &pid, &k, &side) == 3 &&
            (side == 'a' || side == 'b') && !PidAlive(pid)) {
          std::string o;
          int rc = hixl_test::RunCommand({ip, "link", "del", name}, &o);
          std::printf("[ info ] removed stale link %s (rc %d)\n", name.c_str(), rc);
        }
      }
    }
  }

  const std::string& ip() const { return ip_; }

 private:
  std::string ip_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> root_links_;
};

class MultiHostTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ip_ = FindIp();
    if (ip_.empty()) {
      skip_ = "no `ip` binary (iproute2) found";
      return;
    }
    if (geteuid() != 0) {
      skip_ = "needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to create network namespaces; euid is " +
              std::to_string(geteuid());
      return;
    }
    NetnsGuard::RemoveStale(ip_);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    guard_ = std::make_unique<NetnsGuard>(ip_);
  }

  void TearDown() override {
    // Peers first (they live inside the namespaces), then the namespaces.
    peers_.clear();
    if (guard_) {
      guard_->Cleanup();
      guard_.reset();
      std::string out;
      if (hixl_test::RunCommand({ip_, "netns", "list"}, &out) == 0) {
        EXPECT_EQ(out.find(NetnsGuard::Prefix()), std::string::npos)
            << "namespaces of this test are left behind:\n" << out;
      }
    }
  }

  // Creates the namespaces; skips the test when that is not permitted.
  std::vector<std::string> MakeNamespaces(const std::vector<std::string>& tags) {
    std::vector<std::string> names;
    for (const auto& t : tags) {
      std::string err;
      std::string n = guard_->AddNs(t, &err);
      if (n.empty()) {
        skip_ns_ = "cannot create network namespaces here: " + err;
        return {};
      }
      names.push_back(n);
    }
    return names;
  }

  // A peer inside namespace ns, listening on addr.
  PeerProcess* StartPeer(const std::string& ns, const std::string& addr,
                         std::vector<std::string> opts = {}) {
    PeerLaunch l;
    l.options = std::move(opts);
    l.exec_prefix = {ip_, "netns", "exec", ns};
    l.listen = addr;
    peers_.push_back(std::make_unique<PeerProcess>(l));
    if (!peers_.back()->Start()) return nullptr;
    return peers_.back().get();
  }

  static std::string ip_;
  static std::string skip_;
  std::string skip_ns_;
  std::unique_ptr<NetnsGuard> guard_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;  // destroyed before the namespaces
};

std::string MultiHostTest::ip_;
std::string MultiHostTest::skip_;

#define MAKE_NAMESPACES_OR_SKIP(var, ...)                    \
  std::vector<std::string> var = MakeNamespaces(__VA_ARGS__); \
  if (var.empty()) GTEST_SKIP() << skip_ns_

std::string Num(uintptr_t v) { return std::to_string(v); }

// Two namespaces: AUTO picks tcp (different hosts); A writes and reads B's
// memory (AllocMem and plain registered), B does the same to A.
TEST_F(MultiHostTest, TwoNamespacesAutoPicksTcpAndMovesBytes) {
  MAKE_NAMESPACES_OR_SKIP(ns, {"a", "b"});
  std::string err;
  ASSERT_TRUE(guard_->Link(1, ns[0], ns[1], &err)) << err;
  PeerProcess* a = StartPeer(ns[0], "10.213.1.1:0");
  ASSERT_NE(a, nullptr);
  PeerProcess* b = StartPeer(ns[1], "10.213.1.2:0");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->engine().rfind("10.213.1.1:", 0), 0u) << a->engine();
  ASSERT_EQ(b->engine().rfind("10.213.1.2:", 0), 0u) << b->engine();

  const size_t n = 8 * kMiB + 3;
  const std::string ns_ = std::to_string(n);
  uintptr_t b_alloc = b->Alloc("dst", n);
  uintptr_t b_reg = b->Reg("dstr", n, "rw");
  uintptr_t a_reg = a->Reg("areg", n, "rw");
  ASSERT_TRUE(b_alloc && b_reg && a_reg);
  ASSERT_TRUE(a->Ok("buf src " + ns_));
  ASSERT_TRUE(a->Ok("buf in " + ns_));
  ASSERT_TRUE(a->Ok("fillpat src 301"));
  const std::string src_hash = a->Hash("src", 0, n);

  ASSERT_TRUE(a->Ok("connect " + b->engine() + " 5000"));
  EXPECT_EQ(a->Send("linktype " + b->engine()), "OK TCP")
      << "AUTO between two network namespaces must pick tcp";
  for (const auto& [name, addr] :
       std::vector<std::pair<std::string, uintptr_t>>{{"dst", b_alloc}, {"dstr", b_reg}}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(a->Ok("write src 0 " + b->engine() + " " + Num(addr) + " " + ns_));
    EXPECT_EQ(b->Hash(name, 0, n), src_hash);
    ASSERT_TRUE(b->Ok("fillpat " + name + " 302"));
    ASSERT_TRUE(a->Ok("fill in 0"));
    EXPECT_TRUE(a->Ok("read in 0 " + b->engine() + " " + Num(addr) + " " + ns_));
    EXPECT_EQ(a->Hash("in", 0, n), b->Hash(name, 0, n));
    EXPECT_NE(a->Hash("in", 0, n), src_hash);
  }
  EXPECT_EQ(b->Send("canary dstr"), "OK intact");

  // The other direction: B connects to A and writes into A's memory.
  ASSERT_TRUE(b->Ok("connect " + a->engine() + " 5000"));
  EXPECT_EQ(b->Send("linktype " + a->engine()), "OK TCP");
  ASSERT_TRUE(b->Ok("fillpat dst 303"));
  EXPECT_TRUE(b->Ok("write dst 0 " + a->engine() + " " + Num(a_reg) + " " + ns_));
  EXPECT_EQ(a->Hash("areg", 0, n), b->Hash("dst", 0, n));
  EXPECT_EQ(a->Send("canary areg"), "OK intact");

  // Permissions hold across hosts too: a read-only region refuses a WRITE.
  uintptr_t b_ro = b->Reg("ro", 4096, "r");
  ASSERT_NE(b_ro, 0u);
  ASSERT_TRUE(b->Ok("fill ro 0x33"));
  const std::string ro_hash = b->Hash("ro", 0, 4096);
  // Registered after the connect: the region reaches A asynchronously, so
  // its refusal may come either from A's table or from B; never success.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string r = a->Send("write src 0 " + b->engine() + " " + Num(b_ro) + " 4096");
  EXPECT_EQ(r.rfind("ERR", 0), 0u) << r;
  EXPECT_EQ(b->Hash("ro", 0, 4096), ro_hash);
}

#ifdef HIXL_TEST_UCX
// LinkType=UCX between two namespaces: UCX's error handling is PEER there
// (different hosts), so it runs on tcp; bytes move both ways, a read-only
// region refuses a WRITE (checked by the initiator's table), and killing the
// target fails the next transfer within the heartbeat bound.
TEST_F(MultiHostTest, TwoNamespacesOverUcx) {
  MAKE_NAMESPACES_OR_SKIP(ns, {"a", "b"});
  std::string err;
  ASSERT_TRUE(guard_->Link(1, ns[0], ns[1], &err)) << err;
  PeerProcess* a = StartPeer(ns[0], "10.213.1.1:0", {"LinkType=UCX"});
  ASSERT_NE(a, nullptr);
  PeerProcess* b = StartPeer(ns[1], "10.213.1.2:0", {"LinkType=UCX"});
  ASSERT_NE(b, nullptr);
  const size_t n = 8 * kMiB + 3;
  const std::string ns_ = std::to_string(n);
  uintptr_t b_reg = b->Reg("dstr", n, "rw");
  uintptr_t b_alloc = b->Alloc("dst", n);
  ASSERT_TRUE(b_reg && b_alloc);
  ASSERT_TRUE(a->Ok("buf src " + ns_));
  ASSERT_TRUE(a->Ok("buf in " + ns_));
  ASSERT_TRUE(a->Ok("fillpat src 311"));
  const std::string src_hash = a->Hash("src", 0, n);
  ASSERT_TRUE(a->Ok("connect " + b->engine() + " 10000"));
  EXPECT_EQ(a->Send("linktype " + b->engine()), "OK UCX");
  for (const auto& [name, addr] :
       std::vector<std::pair<std::string, uintptr_t>>{{"dst", b_alloc}, {"dstr", b_reg}}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(a->Ok("write src 0 " + b->engine() + " " + Num(addr) + " " + ns_));
    EXPECT_EQ(b->Hash(name, 0, n), src_hash);
    ASSERT_TRUE(b->Ok("fillpat " + name + " 312"));
    EXPECT_TRUE(a->Ok("read in 0 " + b->engine() + " " + Num(addr) + " " + ns_));
    EXPECT_EQ(a->Hash("in", 0, n), b->Hash(name, 0, n));
  }
  EXPECT_EQ(b->Send("canary dstr"), "OK intact");
  uintptr_t b_ro = b->Reg("ro", 4096, "r");
  ASSERT_NE(b_ro, 0u);
  ASSERT_TRUE(b->Ok("fill ro 0x33"));
  const std::string ro_hash = b->Hash("ro", 0, 4096);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string r = a->Send("write src 0 " + b->engine() + " " + Num(b_ro) + " 4096");
  EXPECT_EQ(r.rfind("ERR", 0), 0u) << r;
  EXPECT_EQ(b->Hash("ro", 0, 4096), ro_hash);

  // The target dies: the next transfer fails (bounded), and nothing hangs.
  b->Kill();
  const auto t0 = std::chrono::steady_clock::now();
  r = a->Send("write src 0 " + b->engine() + " " + Num(b_reg) + " " + ns_);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.rfind("ERR", 0), 0u) << r;
  EXPECT_LT(ms, 20000) << "a transfer to a killed UCX peer must end";
  std::cout << "[ measured ] ucx write to a killed peer ended after " << ms << " ms: " << r
            << std::endl;
}
#endif

// A forced SHM initiator cannot reach a peer in another namespace: Connect
// fails with UNSUPPORTED and says shm needs one host; forced TCP works.
TEST_F(MultiHostTest, ForcedShmAcrossNamespacesIsUnsupported) {
  MAKE_NAMESPACES_OR_SKIP(ns, {"a", "b"});
  std::string err;
  ASSERT_TRUE(guard_->Link(1, ns[0], ns[1], &err)) << err;
  PeerProcess* shm = StartPeer(ns[0], "10.213.1.1:0", {"LinkType=SHM"});
  ASSERT_NE(shm, nullptr);
  PeerProcess* b = StartPeer(ns[1], "10.213.1.2:0");
  ASSERT_NE(b, nullptr);
  uintptr_t dst = b->Reg("dst", 4096, "rw");
  ASSERT_NE(dst, 0u);

  const auto t0 = Clock::now();
  std::string r = shm->Send("connect " + b->engine() + " 3000");
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(), 5000);
  EXPECT_EQ(r.rfind("ERR UNSUPPORTED", 0), 0u) << r;
  EXPECT_NE(r.find("one host"), std::string::npos) << "the message should say shm needs one host: " << r;
  // No link was made.
  r = shm->Send("linktype " + b->engine());
  EXPECT_EQ(r.rfind("ERR NOT_CONNECTED", 0), 0u) << r;
  ASSERT_TRUE(shm->Ok("buf src 4096"));
  r = shm->Send("write src 0 " + b->engine() + " " + Num(dst) + " 4096");
  EXPECT_EQ(r.rfind("ERR NOT_CONNECTED", 0), 0u) << r;

  // Forced TCP from the same namespace works.
  PeerProcess* tcp = StartPeer(ns[0], "10.213.1.1:0", {"LinkType=TCP"});
  ASSERT_NE(tcp, nullptr);
  ASSERT_TRUE(tcp->Ok("connect " + b->engine() + " 5000"));
  EXPECT_EQ(tcp->Send("linktype " + b->engine()), "OK TCP");
  ASSERT_TRUE(tcp->Ok("buf src 4096"));
  ASSERT_TRUE(tcp->Ok("fillpat src 7"));
  EXPECT_TRUE(tcp->Ok("write src 0 " + b->engine() + " " + Num(dst) + " 4096"));
  EXPECT_EQ(b->Hash("dst", 0, 4096), tcp->Hash("src", 0, 4096));
}

// Three namespaces in a star around A (links a-b and a-c; C routes to A's
// other address through A): A moves bytes to B and C, and C to A, all over
// tcp and at the same time.
TEST_F(MultiHostTest, ThreeNamespacesStar) {
  MAKE_NAMESPACES_OR_SKIP(ns, {"a", "b", "c"});
  std::string err;
  ASSERT_TRUE(guard_->Link(1, ns[0], ns[1], &err)) << err;
  ASSERT_TRUE(guard_->Link(2, ns[0], ns[2], &err)) << err;
  ASSERT_TRUE(guard_->Route(ns[2], {"10.213.1.0/24", "via", "10.213.2.1"}, &err)) << err;
  PeerProcess* a = StartPeer(ns[0], "10.213.1.1:0");
  PeerProcess* b = StartPeer(ns[1], "10.213.1.2:0");
  PeerProcess* c = StartPeer(ns[2], "10.213.2.2:0");
  ASSERT_TRUE(a && b && c);

  const size_t n = 4 * kMiB + 1;
  const std::string ns_ = std::to_string(n);
  uintptr_t b_dst = b->Alloc("dst", n);
  uintptr_t c_dst = c->Reg("dst", n, "rw");
  uintptr_t a_dst = a->Reg("dst", n, "rw");
  ASSERT_TRUE(b_dst && c_dst && a_dst);
  ASSERT_TRUE(a->Ok("buf src " + ns_));
  ASSERT_TRUE(a->Ok("fillpat src 11"));
  ASSERT_TRUE(c->Ok("buf src " + ns_));
  ASSERT_TRUE(c->Ok("fillpat src 12"));
  ASSERT_TRUE(a->Ok("connect " + b->engine() + " 5000"));
  ASSERT_TRUE(a->Ok("connect " + c->engine() + " 5000"));
  ASSERT_TRUE(c->Ok("connect " + a->engine() + " 5000"));
  EXPECT_EQ(a->Send("linktype " + b->engine()), "OK TCP");
  EXPECT_EQ(a->Send("linktype " + c->engine()), "OK TCP");
  EXPECT_EQ(c->Send("linktype " + a->engine()), "OK TCP");

  // A -> C and C -> A concurrently (each peer runs its own command), then A -> B.
  std::string r_ac, r_ca;
  std::thread t1([&] { r_ac = a->Send("write src 0 " + c->engine() + " " + Num(c_dst) + " " + ns_); });
  std::thread t2([&] { r_ca = c->Send("write src 0 " + a->engine() + " " + Num(a_dst) + " " + ns_); });
  t1.join();
  t2.join();
  EXPECT_EQ(r_ac, "OK");
  EXPECT_EQ(r_ca, "OK");
  EXPECT_TRUE(a->Ok("write src 0 " + b->engine() + " " + Num(b_dst) + " " + ns_));
  const std::string a_src = a->Hash("src", 0, n), c_src = c->Hash("src", 0, n);
  EXPECT_EQ(c->Hash("dst", 0, n), a_src);
  EXPECT_EQ(b->Hash("dst", 0, n), a_src);
  EXPECT_EQ(a->Hash("dst", 0, n), c_src);
  // And back: A reads C's memory.
  ASSERT_TRUE(a->Ok("buf in " + ns_));
  EXPECT_TRUE(a->Ok("read in 0 " + c->engine() + " " + Num(c_dst) + " " + ns_));
  EXPECT_EQ(a->Hash("in", 0, n), a_src);
  for (PeerProcess* p : {a, c}) EXPECT_EQ(p->Send("canary dst"), "OK intact");
}

// A peer on another host dies (kill -9): transfers to it fail, bounded.
TEST_F(MultiHostTest, KilledRemotePeerFailsTransfersBounded) {
  MAKE_NAMESPACES_OR_SKIP(ns, {"a", "b"});
  std::string err;
  ASSERT_TRUE(guard_->Link(1, ns[0], ns[1], &err)) << err;
  PeerProcess* a = StartPeer(ns[0], "10.213.1.1:0");
  PeerProcess* b = StartPeer(ns[1], "10.213.1.2:0");
  ASSERT_TRUE(a && b);
  const size_t n = 1 * kMiB;
  uintptr_t dst = b->Reg("dst", n, "rw");
  ASSERT_NE(dst, 0u);
  ASSERT_TRUE(a->Ok("buf src " + std::to_string(n)));
  ASSERT_TRUE(a->Ok("connect " + b->engine() + " 5000"));
  EXPECT_TRUE(a->Ok("write src 0 " + b->engine() + " " + Num(dst) + " " + std::to_string(n)));
  const std::string eng = b->engine();
  b->Kill();
  const auto t0 = Clock::now();
  std::string r = a->Send("write src 0 " + eng + " " + Num(dst) + " " + std::to_string(n) + " 2000");
  EXPECT_EQ(r.rfind("ERR", 0), 0u) << r;
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(), 4000);
  EXPECT_TRUE(a->Ok("ping"));
}

}  // namespace
