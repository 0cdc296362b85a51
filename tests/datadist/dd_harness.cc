// tests/datadist/dd_harness.cc — the test side of the LLM-DataDist behaviour
// tests (see dd_harness.h).
#include "dd_harness.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

namespace dd_test {

using Clock = std::chrono::steady_clock;

std::string ResourceConfig(const std::string& link, int heartbeat_ms) {
  std::string j = "{";
  if (!link.empty()) j += "\"LinkType\":\"" + link + "\"";
  if (heartbeat_ms > 0) {
    if (j.size() > 1) j += ",";
    j += "\"HeartbeatIntervalMs\":\"" + std::to_string(heartbeat_ms) + "\"";
  }
  return j + "}";
}

std::map<std::string, std::string> InstanceOptions(const std::string& link,
                                                   const std::string& listen, int heartbeat_ms,
                                                   int wait_ms) {
  std::map<std::string, std::string> o;
  o[llm_datadist::options::kGlobalResourceConfig] = ResourceConfig(link, heartbeat_ms);
  if (!listen.empty()) o[llm_datadist::options::kListenIpInfo] = listen;
  o[llm_datadist::options::kSyncKvCacheWaitTime] =
      std::to_string(wait_ms > 0 ? wait_ms : kHarnessWaitMs);
  return o;
}

Res ParseReply(const std::string& line) {
  Res r;
  r.raw = line;
  if (line == "OK" || line.rfind("OK ", 0) == 0) {
    r.ok = true;
    r.value = line.size() > 3 ? line.substr(3) : "";
    return r;
  }
  std::istringstream in(line);
  std::string err;
  in >> err >> r.code;
  std::getline(in, r.msg);
  if (!r.msg.empty() && r.msg[0] == ' ') r.msg.erase(0, 1);
  if (r.code.empty()) r.code = "(no code)";
  return r;
}

std::ostream& operator<<(std::ostream& os, const Res& r) { return os << r.raw; }

std::ostream& operator<<(std::ostream& os, const Event& e) {
  return os << "{" << e.kind << " peer=" << e.peer << " cache=" << e.cache << " key=" << e.key
            << " blocks=" << FormatList(e.blocks) << " batch=" << e.batch
            << " layers=" << e.layers << " tag=" << e.tag << "}";
}

DdPeer::DdPeer(PeerSpec spec) : spec_(std::move(spec)) {
  hixl_test::PeerLaunch l;
  l.options.push_back("peer.cluster=" + std::to_string(spec_.cluster));
  l.options.push_back("peer.role=" + spec_.role);
  l.options.push_back(std::string(llm_datadist::options::kGlobalResourceConfig) + "=" +
                      ResourceConfig(spec_.link, spec_.heartbeat_ms));
  l.options.push_back(std::string(llm_datadist::options::kSyncKvCacheWaitTime) + "=" +
                      std::to_string(spec_.wait_ms > 0 ? spec_.wait_ms : kHarnessWaitMs));
  for (const auto& e : spec_.extra) l.options.push_back(e);
  l.listen = spec_.listen ? "127.0.0.1:0" : "none";
  proc_ = std::make_unique<hixl_test::PeerProcess>(std::move(l));
}

bool DdPeer::Start() { return proc_->Start(); }

Res DdPeer::Cmd(const std::string& line, int timeout_ms) {
  return ParseReply(proc_->Send(line, timeout_ms));
}

CacheRef DdPeer::Cache(const std::string& name, uint32_t num_tensors, const std::string& dtype,
                       const std::vector<int64_t>& shape, const std::string& opts) {
  const std::string cmd = "cache " + name + " " + std::to_string(num_tensors) + " " + dtype +
                          " " + FormatShape(shape) + (opts.empty() ? "" : " " + opts);
  Res r = Cmd(cmd);
  CacheRef c;
  if (!r.ok) {
    ADD_FAILURE() << "peer " << spec_.cluster << ": " << cmd << " -> " << r.raw;
    return c;
  }
  std::istringstream in(r.value);
  std::string addrs;
  in >> c.id >> addrs;
  if (!ParseList(addrs, c.addrs)) ADD_FAILURE() << "bad cache reply " << r.raw;
  return c;
}

void DdPeer::Fill(const std::string& name, uint64_t seed) {
  Res r = Cmd("fill " + name + " " + std::to_string(seed));
  EXPECT_TRUE(r.ok) << "fill " << name << " -> " << r.raw;
}

void DdPeer::Fill(const std::string& name, uint64_t seed, size_t t0, size_t t1) {
  Res r = Cmd("fill " + name + " " + std::to_string(seed) + " " + std::to_string(t0) + " " +
              std::to_string(t1));
  EXPECT_TRUE(r.ok) << "fill " << name << " -> " << r.raw;
}

std::vector<std::string> DdPeer::HashTensors(const std::string& name) {
  Res r = Cmd("hasht " + name);
  std::vector<std::string> out;
  if (!r.ok) {
    ADD_FAILURE() << "hasht " << name << " -> " << r.raw;
    return out;
  }
  std::stringstream ss(r.value);
  std::string h;
  while (std::getline(ss, h, ',')) out.push_back(h);
  return out;
}

std::string DdPeer::HashBlocks(const std::string& name, size_t t0, size_t t1,
                               const std::vector<uint64_t>& blocks) {
  Res r = Cmd("hashb " + name + " " + std::to_string(t0) + " " + std::to_string(t1) + " " +
              FormatList(blocks));
  if (!r.ok) ADD_FAILURE() << "hashb " << name << " -> " << r.raw;
  return r.ok ? r.value : "(hashb failed: " + r.raw + ")";
}

std::string DdPeer::HashEntry(const std::string& name, size_t t0, size_t t1, size_t entry,
                              int64_t size) {
  Res r = Cmd("hashe " + name + " " + std::to_string(t0) + " " + std::to_string(t1) + " " +
              std::to_string(entry) + " " + std::to_string(size));
  if (!r.ok) ADD_FAILURE() << "hashe " << name << " -> " << r.raw;
  return r.ok ? r.value : "(hashe failed: " + r.raw + ")";
}

std::string DdPeer::HashRange(const std::string& name, size_t t0, size_t t1, size_t off,
                              size_t len) {
  Res r = Cmd("hashr " + name + " " + std::to_string(t0) + " " + std::to_string(t1) + " " +
              std::to_string(off) + " " + std::to_string(len));
  if (!r.ok) ADD_FAILURE() << "hashr " << name << " -> " << r.raw;
  return r.ok ? r.value : "(hashr failed: " + r.raw + ")";
}

Res DdPeer::Link(const DdPeer& to, int timeout_ms) { return Link(to.cluster(), to.addr(), timeout_ms); }

Res DdPeer::Link(uint64_t cluster, const std::string& addr, int timeout_ms) {
  return Cmd("link " + std::to_string(cluster) + " " + addr + " " + std::to_string(timeout_ms),
             timeout_ms + 10000);
}

Res DdPeer::Unlink(const DdPeer& to, bool force) {
  return Cmd("unlink " + std::to_string(to.cluster()) + " " + to.addr() + " 3000" +
             (force ? " force" : ""));
}

Res DdPeer::Xfer(const std::string& op, const std::string& name, const std::string& args,
                 int timeout_ms) {
  return Cmd("xfer " + op + " " + name + " " + args, timeout_ms);
}

std::vector<Event> DdPeer::Events(size_t min_count, int wait_ms) {
  Res r = Cmd("events " + std::to_string(min_count) + " " + std::to_string(wait_ms),
              wait_ms + 10000);
  std::vector<Event> out;
  if (!r.ok) {
    ADD_FAILURE() << "events -> " << r.raw;
    return out;
  }
  size_t pos = r.value.find(" | ");
  while (pos != std::string::npos) {
    const size_t next = r.value.find(" | ", pos + 3);
    const std::string item =
        r.value.substr(pos + 3, next == std::string::npos ? std::string::npos : next - pos - 3);
    pos = next;
    Event e;
    std::istringstream in(item);
    std::string tok;
    while (in >> tok) {
      const size_t eq = tok.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
      if (k == "kind") e.kind = v;
      else if (k == "peer") e.peer = std::stoull(v);
      else if (k == "cache") e.cache = std::stoll(v);
      else if (k == "key") e.key = v;
      else if (k == "blocks") ParseList(v, e.blocks);
      else if (k == "batch") e.batch = std::stoll(v);
      else if (k == "layers") e.layers = v;
      else if (k == "tag") e.tag = v;
    }
    out.push_back(e);
  }
  return out;
}

std::vector<Event> EventsOf(const std::vector<Event>& evs, const std::string& kind, int64_t cache) {
  std::vector<Event> out;
  for (const auto& e : evs) {
    if (e.kind == kind && e.cache == cache) out.push_back(e);
  }
  return out;
}

bool SameBlocks(const std::vector<uint64_t>& event_blocks, const std::vector<uint64_t>& moved) {
  if (event_blocks == moved) return true;
  std::vector<uint64_t> sorted = moved;
  std::sort(sorted.begin(), sorted.end());
  return event_blocks == sorted;
}

std::vector<uint64_t> RandomBlocks(uint64_t seed, size_t count, uint64_t n) {
  std::vector<uint64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(std::min<size_t>(count, n));
  return all;
}

std::vector<uint64_t> Complement(const std::vector<uint64_t>& used, uint64_t n) {
  std::vector<bool> in(n, false);
  for (uint64_t u : used) {
    if (u < n) in[u] = true;
  }
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < n; ++i) {
    if (!in[i]) out.push_back(i);
  }
  return out;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t count) {
  std::vector<uint64_t> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<uint64_t> Concat(std::vector<uint64_t> a, const std::vector<uint64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

long long ElapsedMs(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

char ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(f, s);
  const size_t paren = s.rfind(')');
  if (paren == std::string::npos || paren + 2 >= s.size()) return '?';
  return s[paren + 2];
}

DdPeer* DdTest::Spawn(uint64_t cluster, const std::string& role, PeerSpec spec) {
  spec.cluster = cluster;
  spec.role = role;
  spec.link = link_;
  auto p = std::make_unique<DdPeer>(std::move(spec));
  if (!p->Start()) return nullptr;
  peers_.push_back(std::move(p));
  return peers_.back().get();
}

void DdTest::Stop(DdPeer& p) {
  ASSERT_TRUE(p.running());
  stopped_.insert(p.pid());
  ASSERT_EQ(kill(p.pid(), SIGSTOP), 0) << strerror(errno);
  const auto t0 = Clock::now();
  while (ProcState(p.pid()) != 'T' && ElapsedMs(t0) < 5000) SleepMs(1);
  ASSERT_EQ(ProcState(p.pid()), 'T') << "peer " << p.pid() << " did not stop";
}

void DdTest::Cont(DdPeer& p) {
  if (p.running()) kill(p.pid(), SIGCONT);
  stopped_.erase(p.pid());
}

void DdTest::TearDown() {
  for (auto& p : peers_) {
    if (p->running() && stopped_.count(p->pid())) kill(p->pid(), SIGCONT);
  }
  // Newest first: initiators (spawned after their targets) go first.
  while (!peers_.empty()) peers_.pop_back();
}

std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

}  // namespace dd_test
