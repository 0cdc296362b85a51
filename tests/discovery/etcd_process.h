// Test helper: a real single-member etcd on loopback with its own free ports
// and a temporary data directory (removed at destruction), started with
// fast raft timers and no fsync. Stop/Kill end it by pid; Restart starts it
// again on the same data directory and ports. The destructor kills it.
// Thread safety: one thread drives an EtcdProcess.
#ifndef HIXL_TESTS_DISCOVERY_ETCD_PROCESS_H_
#define HIXL_TESTS_DISCOVERY_ETCD_PROCESS_H_

#include <sys/types.h>

#include <string>

namespace hixl::testing {

class EtcdProcess {
 public:
  EtcdProcess() = default;
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Creates the data directory, picks ports, starts etcd and waits (up to
  // timeout_ms) until GET /health answers {"health":"true"}. On failure
  // returns false and why (with the tail of etcd's log).
  bool Start(std::string& why, int timeout_ms = 15000);
  // SIGTERM, then SIGKILL after 5 s; waits for the process.
  void Stop();
  // SIGKILL at once; waits for the process.
  void Kill();
  // Same data directory and ports.
  bool Restart(std::string& why, int timeout_ms = 15000);

  bool running() const { return pid_ > 0; }
  int client_port() const { return client_port_; }
  std::string endpoints() const;  // "etcd://127.0.0.1:<client port>"
  std::string LogTail() const;

 private:
  bool Spawn(std::string& why, int timeout_ms);
  void EndProcess(bool gentle);

  std::string dir_;  // temporary; holds data/ and etcd.log
  pid_t pid_ = -1;
  int client_port_ = 0;
  int peer_port_ = 0;
};

// A free loopback TCP port (bound to port 0, then closed).
int PickFreePort();

}  // namespace hixl::testing

#endif  // HIXL_TESTS_DISCOVERY_ETCD_PROCESS_H_
