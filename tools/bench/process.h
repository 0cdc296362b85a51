// hixl-bench: the other processes — the target (this binary re-executed with
// --serve) and, for --many, the initiators (--many-worker) — spoken to over
// line protocols on their stdin/stdout pipes.
//
// The target registers a region of one --mem kind (AllocMem; malloc, its own
// sealed memfd, or anonymous pages + RegisterMem, the last with
// REGISTER_SHARE_BY_MAPPING), prints
//   READY <engine ip:port> <region addr, decimal> <region len>
// on stdout and then serves a tiny line protocol on stdin:
//   fill <seed> <len> [off]   fill region[off,off+len) with the verify pattern -> "OK"
//   check <seed> <len> [off]  compare region[off,off+len) with the pattern
//                             -> "OK" | "BAD <offset>"
//   watch <n>                 take n notifications (each message: the sender's
//                             steady-clock ns when it posted), reply
//                             "OK <p50_us> <p99_us>" of post-to-observed latency
//   quit (or EOF)             Finalize and exit 0
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "bench/options.h"

namespace hixl_bench {

// A child process: our own binary re-executed, talking over its stdin/stdout
// pipes. The destructor always reaps it (quit, then SIGKILL by pid after 10 s);
// PR_SET_PDEATHSIG kills it if we die first.
class Child {
 public:
  explicit Child(std::string name = "the target process") : name_(std::move(name)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Stop(); }

  // pass_fd >= 0: the child gets it as its fd 3.
  void Spawn(const std::vector<std::string>& args, int pass_fd = -1);
  // One line from the child's stdout, without the newline.
  std::string ReadLine(int timeout_ms);
  void WriteLine(const std::string& line);
  pid_t pid() const { return pid_; }
  std::string Request(const std::string& line) {
    WriteLine(line);
    return ReadLine(kReplyTimeoutMs);
  }
  // Sends "quit" and closes the child's stdin, without waiting.
  void RequestQuit();
  // Asks the child to quit, waits up to 10 s, then SIGKILLs it. Returns a
  // description of how it ended.
  std::string Stop();

 private:
  std::string Reap();

  std::string name_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buf_;
};

// What the target's READY line says.
struct Target {
  std::string engine;
  uintptr_t addr = 0;
  size_t len = 0;
};

// Starts the target (--serve) with region o.region_size of kind mem.
Target StartTarget(Child& child, const Options& o, const std::string& mem);

// --serve: the target process. Only the READY line and replies go to stdout.
int Serve(const Options& o);

}  // namespace hixl_bench
