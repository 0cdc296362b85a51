// tests/fault/fault_env.h — the network the fault tests run in, the tools
// that inject kernel-level faults into it, and reads of a peer's memory.
//
// Topology (one per test; names carry the test process's pid):
//
//   A 10.215.1.2 ---- 10.215.1.1 R 10.215.2.1 ---- 10.215.2.2 B 10.215.3.2 ---- 10.215.3.1 C
//   (initiator)        (router, ip_forward=1)       (target)                      (second
//   initiator)
//
// A reaches B only through R, so faults injected in R (tc, nftables, link
// state, the fault proxy) hit the A-B link and nothing else; C reaches B over
// its own link, so it shows whether B keeps serving others meanwhile. B's
// engine listens on 10.215.2.2 (C routes 10.215.2.0/24 through B's other
// address).
//
// Namespaces are hixlf-<pid>-{a,r,b,c}; veth pairs hf<pid>v<k>{a,b}, link k
// joining 10.215.k.1 (end a) and 10.215.k.2 (end b). FaultNet deletes them in
// its destructor (deleting a namespace also removes its veth ends, nftables
// tables and qdiscs); RemoveStale deletes what earlier test processes that
// no longer run left behind.
#ifndef HIXL_TESTS_FAULT_FAULT_ENV_H_
#define HIXL_TESTS_FAULT_FAULT_ENV_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "peer_process.h"

namespace hixl_fault {

using hixl_test::RunCommand;  // peer_process.h

// Full paths of the tools ("" when missing).
struct Tools {
  std::string ip, nft, tc;
  std::string ss;  // optional (socket statistics)
  static Tools Find();
  // Why the fault tests cannot run here ("" when they can).
  std::string Missing() const;
};

constexpr const char* kAddrA = "10.215.1.2";
constexpr const char* kAddrRa = "10.215.1.1";  // R, towards A
constexpr const char* kAddrRb = "10.215.2.1";  // R, towards B
constexpr const char* kAddrB = "10.215.2.2";   // B's engine address
constexpr const char* kAddrBc = "10.215.3.2";  // B, towards C
constexpr const char* kAddrC = "10.215.3.1";

class FaultNet {
 public:
  explicit FaultNet(Tools tools) : t_(std::move(tools)) {}
  ~FaultNet() { Cleanup(); }
  FaultNet(const FaultNet&) = delete;
  FaultNet& operator=(const FaultNet&) = delete;

  static std::string Prefix();
  // Builds the topology. False with *err on failure; *denied then says
  // whether it failed for lack of permission (the caller skips).
  bool Create(std::string* err, bool* denied);
  // Deletes everything Create made (idempotent). Returns what went wrong.
  std::string Cleanup();
  static void RemoveStale(const Tools& t);

  const std::string& a() const { return a_; }
  const std::string& r() const { return r_; }
  const std::string& b() const { return b_; }
  const std::string& c() const { return c_; }
  // R's veth ends: towards A and towards B.
  std::string RDevA() const { return Dev(1, 'a'); }
  std::string RDevB() const { return Dev(2, 'a'); }

  // `ip netns exec NS argv...`; false with *err (command and output).
  bool Exec(const std::string& ns, const std::vector<std::string>& argv, std::string* err,
            std::string* out = nullptr);
  // Runs an nft script (nft -f) inside ns.
  bool Nft(const std::string& ns, const std::string& script, std::string* err);

  // Kernel-level faults on the A-B path, all inside R.
  // tbf on both of R's veth ends (rate e.g. "80mbit"); empty: remove it.
  bool RateLimit(const std::string& rate, std::string* err);
  // Drops `percent` of the packets R forwards (nftables numgen); 0: none.
  bool Loss(int percent, std::string* err);
  // Bytes waiting in the receive queues of ns's established TCP sockets
  // (ss Recv-Q), -1 when that cannot be told.
  long ReceiveQueued(const std::string& ns);
  // Packets the Loss rule has dropped so far (-1 when it cannot tell).
  long LossDropped();
  // Silently drops every packet R forwards (on) or none (off).
  bool Partition(bool on, std::string* err);
  // R's link towards B down or up (then the routes are put back).
  bool LinkRB(bool up, std::string* err);
  // Sends every TCP connection A opens through R to the fault proxy on
  // `port` inside R (nat redirect); port 0 removes the rule.
  bool RedirectToProxy(int port, std::string* err);

 private:
  std::string Dev(int k, char side) const;
  bool Link(int k, const std::string& x, const std::string& y, std::string* err);
  bool Routes(std::string* err);
  bool Ip(const std::vector<std::string>& args, std::string* err);
  bool EnsureFilterTable(std::string* err);

  Tools t_;
  std::string a_, r_, b_, c_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> root_links_;
  bool filter_table_ = false;
  bool nat_table_ = false;
};

// ---- a peer's memory, read from this process (process_vm_readv; root) ----

// Copies len bytes at addr in process pid into dst; false on failure.
bool ReadPeerMemory(pid_t pid, uintptr_t addr, void* dst, size_t len);
// hixl_test::Fnv1a64 (hex) of [addr, addr+len) in process pid; "" on failure.
std::string PeerMemoryHash(pid_t pid, uintptr_t addr, size_t len);
// Of the blocks of `stride` bytes in [addr, addr+len), how many have a first
// 8-byte word that is not zero (a pattern word is zero with odds 2^-64), or
// -1 when the memory cannot be read: the progress of a transfer into zeroed
// memory.
long CountWrittenBlocks(pid_t pid, uintptr_t addr, size_t len, size_t stride);

}  // namespace hixl_fault

#endif  // HIXL_TESTS_FAULT_FAULT_ENV_H_
