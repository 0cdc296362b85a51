// tests/fault/fault_env.cc — namespaces, links, routes and kernel-level
// fault injection for the fault tests (see fault_env.h), and reads of a peer
// process's memory.
#include "fault/fault_env.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "peer_process.h"

namespace hixl_fault {
namespace {

using Clock = std::chrono::steady_clock;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& w : v) s += (s.empty() ? "" : " ") + w;
  return s;
}

std::string FirstExecutable(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

bool PidAlive(long pid) {
  return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH);
}

bool LooksDenied(const std::string& out) {
  return out.find("Operation not permitted") != std::string::npos ||
         out.find("Permission denied") != std::string::npos;
}

}  // namespace


Tools Tools::Find() {
  Tools t;
  t.ip = FirstExecutable({"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"});
  t.nft = FirstExecutable({"/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"});
  t.tc = FirstExecutable({"/usr/sbin/tc", "/sbin/tc", "/usr/bin/tc"});
  t.ss = FirstExecutable({"/usr/bin/ss", "/usr/sbin/ss", "/bin/ss", "/sbin/ss"});
  return t;
}

std::string Tools::Missing() const {
  if (ip.empty()) return "no `ip` binary (iproute2) found";
  if (nft.empty()) return "no `nft` binary (nftables) found";
  if (tc.empty()) return "no `tc` binary (iproute2) found";
  if (geteuid() != 0) {
    return "needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_PTRACE) for network namespaces; "
           "euid is " +
           std::to_string(geteuid());
  }
  return "";
}

std::string FaultNet::Prefix() { return "hixlf-" + std::to_string(getpid()) + "-"; }

std::string FaultNet::Dev(int k, char side) const {
  return "hf" + std::to_string(getpid()) + "v" + std::to_string(k) + side;
}

bool FaultNet::Ip(const std::vector<std::string>& args, std::string* err) {
  std::vector<std::string> argv = {t_.ip};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (RunCommand(argv, &out) != 0) {
    *err = Join(argv) + ": " + Trim(out);
    return false;
  }
  return true;
}

bool FaultNet::Exec(const std::string& ns, const std::vector<std::string>& argv, std::string* err,
                    std::string* out) {
  std::vector<std::string> full = {t_.ip, "netns", "exec", ns};
  full.insert(full.end(), argv.begin(), argv.end());
  std::string text;
  if (RunCommand(full, &text) != 0) {
    *err = Join(full) + ": " + Trim(text);
    return false;
  }
  if (out) *out = text;
  return true;
}

bool FaultNet::Nft(const std::string& ns, const std::string& script, std::string* err) {
  char path[] = "/tmp/hixl-fault-nft-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    *err = "mkstemp failed";
    return false;
  }
  bool ok = write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  close(fd);
  if (ok) ok = Exec(ns, {t_.nft, "-f", path}, err);
  if (!ok) *err += "\nscript:\n" + script;
  unlink(path);
  return ok;
}

bool FaultNet::Link(int k, const std::string& x, const std::string& y, std::string* err) {
  const std::string ex = Dev(k, 'a'), ey = Dev(k, 'b');
  const std::string net = "10.215." + std::to_string(k) + ".";
  if (!Ip({"link", "add", ex, "type", "veth", "peer", "name", ey}, err)) return false;
  root_links_.push_back(ex);  // until both ends are moved
  return Ip({"link", "set", ex, "netns", x}, err) && Ip({"link", "set", ey, "netns", y}, err) &&
         Ip({"-n", x, "addr", "add", net + "1/24", "dev", ex}, err) &&
         Ip({"-n", y, "addr", "add", net + "2/24", "dev", ey}, err) &&
         Ip({"-n", x, "link", "set", ex, "up"}, err) && Ip({"-n", y, "link", "set", ey, "up"}, err);
}

bool FaultNet::Routes(std::string* err) {
  return Ip({"-n", a_, "route", "replace", "default", "via", kAddrRa}, err) &&
         Ip({"-n", b_, "route", "replace", "10.215.1.0/24", "via", kAddrRb}, err) &&
         Ip({"-n", c_, "route", "replace", "10.215.2.0/24", "via", kAddrBc}, err);
}

bool FaultNet::Create(std::string* err, bool* denied) {
  *denied = false;
  for (const char* tag : {"a", "r", "b", "c"}) {
    const std::string name = Prefix() + tag;
    std::string out;
    if (RunCommand({t_.ip, "netns", "add", name}, &out) != 0) {
      *err = "ip netns add " + name + ": " + Trim(out);
      *denied = LooksDenied(out);
      return false;
    }
    namespaces_.push_back(name);
    if (!Ip({"-n", name, "link", "set", "lo", "up"}, err)) return false;
  }
  a_ = namespaces_[0];
  r_ = namespaces_[1];
  b_ = namespaces_[2];
  c_ = namespaces_[3];
  if (!Link(1, r_, a_, err) || !Link(2, r_, b_, err) || !Link(3, c_, b_, err)) return false;
  if (!Exec(r_, {"/bin/sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"}, err)) return false;
  return Routes(err);
}

std::string FaultNet::Cleanup() {
  std::string problems;
  std::string out;
  for (const auto& l : root_links_) {
    // Gone already when it was moved into a namespace: ignore errors.
    (void)RunCommand({t_.ip, "link", "del", l}, &out);
  }
  root_links_.clear();
  for (const auto& n : namespaces_) {
    if (RunCommand({t_.ip, "netns", "del", n}, &out) != 0) {
      problems += "ip netns del " + n + ": " + Trim(out) + "\n";
    }
  }
  namespaces_.clear();
  return problems;
}

void FaultNet::RemoveStale(const Tools& t) {
  std::string out;
  if (RunCommand({t.ip, "netns", "list"}, &out) == 0) {
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      std::string name = line.substr(0, line.find(' '));
      long pid = 0;
      char tag[64];
      if (std::sscanf(name.c_str(), "hixlf-%ld-%63s", &pid, tag) == 2 && !PidAlive(pid)) {
        std::string o;
        int rc = RunCommand({t.ip, "netns", "del", name}, &o);
        std::printf("[ info ] removed stale namespace %s (rc %d)\n", name.c_str(), rc);
      }
    }
  }
  if (RunCommand({t.ip, "-o", "link", "show"}, &out) == 0) {
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      size_t c = line.find(": ");
      if (c == std::string::npos) continue;
      std::string name = line.substr(c + 2);
      name = name.substr(0, name.find_first_of("@:"));
      long pid = 0;
      int k = 0;
      char side = 0;
      if (std::sscanf(name.c_str(), "hf%ldv%d%c", &pid, &k, &side) == 3 &&
          (side == 'a' || side == 'b') && !PidAlive(pid)) {
        std::string o;
        int rc = RunCommand({t.ip, "link", "del", name}, &o);
        std::printf("[ info ] removed stale link %s (rc %d)\n", name.c_str(), rc);
      }
    }
  }
}

bool FaultNet::RateLimit(const std::string& rate, std::string* err) {
  for (const std::string& dev : {RDevA(), RDevB()}) {
    bool ok = rate.empty() ? Exec(r_, {t_.tc, "qdisc", "del", "dev", dev, "root"}, err)
                           : Exec(r_,
                                  {t_.tc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                                   rate, "burst", "256kb", "latency", "100ms"},
                                  err);
    if (!ok) return false;
  }
  return true;
}

bool FaultNet::EnsureFilterTable(std::string* err) {
  if (filter_table_) return true;
  filter_table_ = Nft(r_,
                      "table ip hxf {\n"
                      "  chain faults { type filter hook forward priority 0; policy accept; }\n"
                      "}\n",
                      err);
  return filter_table_;
}

bool FaultNet::Loss(int percent, std::string* err) {
  if (!EnsureFilterTable(err)) return false;
  std::string s = "flush chain ip hxf faults\n";
  if (percent > 0)
    s += "add rule ip hxf faults numgen random mod 100 < " + std::to_string(percent) +
         " counter drop\n";
  return Nft(r_, s, err);
}

long FaultNet::ReceiveQueued(const std::string& ns) {
  if (t_.ss.empty()) return -1;
  std::string err, out;
  if (!Exec(ns, {t_.ss, "-tnH", "state", "established"}, &err, &out)) return -1;
  // "Recv-Q Send-Q Local:Port Peer:Port" per line
  std::istringstream in(out);
  std::string line;
  long sum = 0;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    long recvq = 0;
    if (l >> recvq) sum += recvq;
  }
  return sum;
}

long FaultNet::LossDropped() {
  std::string err, out;
  if (!Exec(r_, {t_.nft, "list", "chain", "ip", "hxf", "faults"}, &err, &out)) return -1;
  // "... numgen random mod 100 < 3 counter packets 123 bytes 4567 drop"
  size_t p = out.find("counter packets ");
  if (p == std::string::npos) return -1;
  return std::strtol(out.c_str() + p + 16, nullptr, 10);
}

bool FaultNet::Partition(bool on, std::string* err) {
  if (!EnsureFilterTable(err)) return false;
  return Nft(
      r_, std::string("flush chain ip hxf faults\n") + (on ? "add rule ip hxf faults drop\n" : ""),
      err);
}

bool FaultNet::LinkRB(bool up, std::string* err) {
  if (!Ip({"-n", r_, "link", "set", RDevB(), up ? "up" : "down"}, err)) return false;
  return !up || Routes(err);
}

bool FaultNet::RedirectToProxy(int port, std::string* err) {
  std::string s;
  if (nat_table_) s += "delete table ip hxfnat\n";
  if (port > 0) {
    const std::string p = std::to_string(port);
    s += "table ip hxfnat {\n"
         "  chain pre {\n"
         "    type nat hook prerouting priority dstnat; policy accept;\n"
         "    iifname \"" +
         RDevA() + "\" tcp dport != " + p + " redirect to :" + p +
         "\n"
         "  }\n"
         "}\n";
  }
  if (s.empty()) return true;
  if (!Nft(r_, s, err)) return false;
  nat_table_ = port > 0;
  return true;
}

bool ReadPeerMemory(pid_t pid, uintptr_t addr, void* dst, size_t len) {
  size_t done = 0;
  while (done < len) {
    iovec l{static_cast<char*>(dst) + done, len - done};
    iovec r{reinterpret_cast<void*>(addr + done), len - done};
    ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string PeerMemoryHash(pid_t pid, uintptr_t addr, size_t len) {
  std::vector<unsigned char> buf(len);
  if (!ReadPeerMemory(pid, addr, buf.data(), len)) return "";
  return hixl_test::HashHex(hixl_test::Fnv1a64(buf.data(), len));
}

long CountWrittenBlocks(pid_t pid, uintptr_t addr, size_t len, size_t stride) {
  constexpr size_t kBatch = 512;  // below IOV_MAX
  const size_t blocks = len / stride;
  std::vector<uint64_t> words(kBatch);
  std::vector<iovec> local(kBatch), remote(kBatch);
  long count = 0;
  for (size_t first = 0; first < blocks; first += kBatch) {
    const size_t n = std::min(kBatch, blocks - first);
    for (size_t i = 0; i < n; ++i) {
      local[i] = {&words[i], 8};
      remote[i] = {reinterpret_cast<void*>(addr + (first + i) * stride), 8};
    }
    ssize_t got = process_vm_readv(pid, local.data(), n, remote.data(), n, 0);
    if (got != static_cast<ssize_t>(n * 8)) return -1;
    for (size_t i = 0; i < n; ++i) count += words[i] != 0 ? 1 : 0;
  }
  return count;
}

}  // namespace hixl_fault
