// tests/fault/fault_proxy.h — an in-process TCP fault proxy for the fault
// tests (tests/fault/*_test.cc).
//
// Where it sits: the fault tests route an initiator namespace A through a
// router namespace R to a target namespace B. In R an nftables nat rule
// (`iifname <A side> tcp dport != P redirect to :P`) hands every TCP
// connection A opens towards B to this proxy, listening on port P inside R.
// The proxy reads the connection's original destination with
// getsockopt(SOL_IP, SO_ORIGINAL_DST) and connects onward to it from R. So
// every connection of a hixl tcp link passes through it without any change
// to the library: the control connection to the target's engine port, and
// the data lanes to the data port the target announces in its handshake.
//
// Classes: a connection whose original destination port is the control port
// (SetControlPort: the target's engine port) is kControl, every other one is
// kData. Faults are set per class.
//
// Threads: one thread runs a poll() loop that does all socket work. It enters
// the router's network namespace with setns(CLONE_NEWNET) before it creates
// a socket (the network namespace is per thread, so the rest of the test
// process stays where it is; sockets keep their namespace for life). The
// public methods may be called from any thread: they take the proxy's mutex
// and wake the loop through an eventfd.
//
// Faults:
//   SetDelay   every chunk read is forwarded `ms` later (per direction)
//   SetRate    each direction of each connection forwards at most this many
//              bytes per second (token bucket)
//   SetStall   the class's connections are not served at all: nothing is
//              read, written, or closed (like a silent black hole; the
//              kernels' buffers fill and the senders block)
//   Arm        one shot, on the first connection of a class whose stream in
//              direction `dir` reaches byte `offset` (counted from the
//              connection's first byte; a stream already past it when the
//              shot is armed fires at its current position):
//                kCorrupt  byte `offset` is forwarded XOR `mask`
//                kCut      exactly `offset` bytes are forwarded, then both
//                          sockets are closed (FIN; the kernel sends RST
//                          where unread bytes remain)
//                kReset    exactly `offset` bytes are forwarded, then both
//                          sockets are closed with SO_LINGER 0 (RST both ways)
//                kStall    exactly `offset` bytes are forwarded, then the
//                          class stalls (as SetStall(cls, true))
// Without faults the proxy is transparent: FIN and RST pass through (an
// error on one side resets the other).
#ifndef HIXL_TESTS_FAULT_FAULT_PROXY_H_
#define HIXL_TESTS_FAULT_FAULT_PROXY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hixl_fault {

enum class ConnClass { kControl, kData, kAny };
enum class Dir { kUp, kDown };  // kUp: client (initiator) -> server (target)
enum class Action { kCorrupt, kCut, kReset, kStall };

const char* ClassName(ConnClass c);

struct ConnStats {
  uint64_t id = 0;
  ConnClass cls = ConnClass::kData;
  std::string client;  // "ip:port"
  std::string server;  // original destination
  uint64_t up = 0;     // bytes forwarded client -> server
  uint64_t down = 0;   // bytes forwarded server -> client
  bool open = false;
};

class FaultProxy {
 public:
  FaultProxy();
  ~FaultProxy();  // Stop()
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // Listens on 0.0.0.0:port (0: any free port) inside network namespace
  // `netns` (a name under /var/run/netns; empty: the caller's namespace) and
  // starts the loop. False with *err when that fails.
  bool Start(const std::string& netns, int port, std::string* err);
  // Ends the loop and closes every socket (idempotent).
  void Stop();
  int port() const { return port_; }

  void SetControlPort(int port);
  void SetDelay(ConnClass c, int ms);
  void SetRate(ConnClass c, uint64_t bytes_per_sec);  // 0: unlimited
  void SetStall(ConnClass c, bool on);
  // Arms the one-shot fault (replacing one armed before that has not fired).
  void Arm(ConnClass c, Dir d, uint64_t offset, Action a, uint8_t mask = 0xff);
  // Whether the armed shot fired, and on which connection.
  bool Fired(uint64_t* conn_id = nullptr) const;
  bool WaitFired(int timeout_ms) const;

  std::vector<ConnStats> Connections() const;
  // Bytes forwarded in direction d over connections of class c (all ever seen).
  uint64_t Bytes(ConnClass c, Dir d) const;
  bool WaitBytes(ConnClass c, Dir d, uint64_t n, int timeout_ms) const;
  // Connections of class c accepted so far.
  size_t Count(ConnClass c) const;
  // One line per connection, for failure messages.
  std::string Describe() const;

 private:
  struct State;
  void Loop();
  std::unique_ptr<State> st_;
  int port_ = 0;
};

}  // namespace hixl_fault

#endif  // HIXL_TESTS_FAULT_FAULT_PROXY_H_
