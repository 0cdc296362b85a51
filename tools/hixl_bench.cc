// hixl-bench — bandwidth and latency of hixl transports (shm, tcp) between two
// processes on this host, each figure beside a memcpy baseline measured in the
// same run (interleaved A B A B, as BENCHMARKING.md asks).
//
// The initiator re-executes itself (/proc/self/exe --serve) as the target.
// The target registers a region (AllocMem, or malloc + RegisterMem), prints
//   READY <engine ip:port> <region addr, decimal> <region len>
// on stdout and then serves a tiny line protocol on stdin:
//   fill <seed> <len>   fill region[0,len) with the verify pattern -> "OK"
//   check <seed> <len>  compare region[0,len) with the pattern     -> "OK" | "BAD <offset>"
//   watch <n>           take n notifications (each message: the sender's
//                       steady-clock ns when it posted), reply
//                       "OK <p50_us> <p99_us>" of post-to-observed latency
//   quit (or EOF)       Finalize and exit 0
//
// Output: one JSON object per measurement on stdout; --table adds a human
// table on stderr. Exit status is non-zero on any hixl error or verify mismatch.
#include <arpa/inet.h>
#include <fcntl.h>
#include <hixl/hixl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;
constexpr int32_t kTransferTimeoutMs = 60000;
constexpr int32_t kConnectTimeoutMs = 5000;
constexpr int kReadyTimeoutMs = 30000;
constexpr int kReplyTimeoutMs = 60000;

struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Fail(const std::string& msg) { throw BenchError(msg); }

void Check(const hixl::Status& st, const std::string& what) {
  if (!st.ok()) Fail(what + " failed: " + st.ToString());
}

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ---------------------------------------------------------------- parsing ---

// "4K", "64k", "1M", "2G", "4096", "128MiB": binary units.
uint64_t ParseSize(const std::string& text) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos, 10);
  } catch (const std::exception&) {
    Fail("bad size '" + text + "'");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    mult = KiB;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    mult = MiB;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    mult = GiB;
  else
    Fail("bad size unit in '" + text + "'");
  if (v == 0) Fail("size must be > 0: '" + text + "'");
  return v * mult;
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  if (out.empty()) Fail("empty list '" + s + "'");
  return out;
}

std::vector<uint64_t> ParseSizeList(const std::string& s) {
  std::vector<uint64_t> out;
  for (const auto& item : SplitComma(s)) out.push_back(ParseSize(item));
  return out;
}

uint64_t ParseCount(const std::string& s, uint64_t lo, uint64_t hi) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos, 10);
  } catch (const std::exception&) {
    Fail("bad number '" + s + "'");
  }
  if (pos != s.size() || v < lo || v > hi)
    Fail("number '" + s + "' out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
         "]");
  return v;
}

std::string HumanSize(uint64_t n) {
  if (n >= GiB && n % GiB == 0) return std::to_string(n / GiB) + "G";
  if (n >= MiB && n % MiB == 0) return std::to_string(n / MiB) + "M";
  if (n >= KiB && n % KiB == 0) return std::to_string(n / KiB) + "K";
  return std::to_string(n);
}

// ---------------------------------------------------------------- pattern ---

// splitmix64: the byte at offset o of a pattern is byte o%8 of Mix(seed + o/8),
// so initiator and target can produce and check it independently.
inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void FillPattern(uint8_t* p, size_t len, uint64_t seed) {
  const size_t words = len / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = Mix(seed + i);
    std::memcpy(p + 8 * i, &w, 8);
  }
  if (len % 8) {
    const uint64_t w = Mix(seed + words);
    std::memcpy(p + 8 * words, &w, len % 8);
  }
}

// Offset of the first byte that differs from the pattern, or SIZE_MAX.
size_t FindPatternMismatch(const uint8_t* p, size_t len, uint64_t seed) {
  const size_t words = len / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = Mix(seed + i);
    if (std::memcmp(p + 8 * i, &w, 8) != 0) {
      for (size_t b = 0; b < 8; ++b)
        if (p[8 * i + b] != reinterpret_cast<const uint8_t*>(&w)[b]) return 8 * i + b;
    }
  }
  if (len % 8) {
    const uint64_t w = Mix(seed + words);
    for (size_t b = 0; b < len % 8; ++b)
      if (p[8 * words + b] != reinterpret_cast<const uint8_t*>(&w)[b]) return 8 * words + b;
  }
  return SIZE_MAX;
}

uint64_t PatternSeed(uint64_t block, uint64_t batch, uint64_t rep, int op) {
  return Mix(Mix(Mix(block) ^ batch) ^ (rep << 8) ^ static_cast<uint64_t>(op));
}

// --------------------------------------------------------- private buffer ---

// Anonymous private mapping, touched page by page so timing sees no page faults.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t len) : len_(len) {
    if (len == 0) return;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Fail("mmap(" + std::to_string(len) + ") failed: " + std::strerror(errno));
    madvise(p, len, MADV_HUGEPAGE);  // best effort, same treatment for every private buffer
    std::memset(p, 0x5a, len);
    ptr_ = static_cast<uint8_t*>(p);
  }
  ~Buffer() {
    if (ptr_) munmap(ptr_, len_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), len_(o.len_) {
    o.ptr_ = nullptr;
    o.len_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(len_, o.len_);
    return *this;
  }
  uint8_t* data() const { return ptr_; }
  size_t size() const { return len_; }

 private:
  uint8_t* ptr_ = nullptr;
  size_t len_ = 0;
};

// ------------------------------------------------------- memcpy baseline ---

struct CopyOp {
  uint8_t* dst;
  const uint8_t* src;
  size_t len;
};

// T-1 persistent helper threads plus the caller split the bytes of a list of
// copies into T roughly equal parts. Helpers sleep on a futex between jobs
// (like the engine's own copy threads), so thread creation is never timed.
class CopyPool {
 public:
  explicit CopyPool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) helpers_.emplace_back([this, i] { Worker(i); });
  }
  ~CopyPool() {
    stop_.store(true, std::memory_order_release);
    gen_.fetch_add(1, std::memory_order_acq_rel);
    gen_.notify_all();
    for (auto& t : helpers_) t.join();
  }
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  // Copies every op; returns how many threads took part. With min_part > 0 no
  // thread gets less than min_part bytes (the engine's own rule), so a small
  // copy runs on the calling thread alone.
  int Run(const std::vector<CopyOp>& ops, uint64_t total, uint64_t min_part) {
    ops_ = &ops;
    total_ = total;
    parts_ = threads_;
    if (min_part > 0)
      parts_ = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads_),
                                                   std::max<uint64_t>(1, total / min_part)));
    if (parts_ > 1) {
      pending_.store(threads_ - 1, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      gen_.notify_all();
    }
    DoPart(0);
    // Sleep (futex) rather than spin: on a busy 2-core host a spinning waiter
    // steals the core a helper, or the engine's copy threads, need.
    for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;)
      pending_.wait(left, std::memory_order_acquire);
    return parts_;
  }

 private:
  void Worker(int part) {
    uint32_t seen = 0;  // gen_ at construction: a job posted before this thread runs is not missed
    for (;;) {
      gen_.wait(seen, std::memory_order_acquire);  // returns once gen_ != seen
      seen = gen_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire)) return;
      if (part < parts_) DoPart(part);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  void DoPart(int part) {
    const uint64_t lo = total_ * static_cast<uint64_t>(part) / static_cast<uint64_t>(parts_);
    const uint64_t hi = total_ * static_cast<uint64_t>(part + 1) / static_cast<uint64_t>(parts_);
    uint64_t off = 0;
    for (const CopyOp& op : *ops_) {
      const uint64_t end = off + op.len;
      if (end > lo && off < hi) {
        const uint64_t s = std::max(lo, off), e = std::min(hi, end);
        std::memcpy(op.dst + (s - off), op.src + (s - off), e - s);
      }
      if (end >= hi) break;
      off = end;
    }
  }

  const int threads_;
  int parts_ = 1;  // threads taking part in the current job
  std::vector<std::thread> helpers_;
  std::atomic<uint32_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::vector<CopyOp>* ops_ = nullptr;
  uint64_t total_ = 0;
};

// ---------------------------------------------------------- child process ---

// The target process: our own binary re-executed with --serve, talking over
// its stdin/stdout pipes. The destructor always reaps it.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Stop(); }

  void Spawn(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
      Fail(std::string("pipe2 failed: ") + std::strerror(errno));
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) Fail(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {  // child: only async-signal-safe calls until exec
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      execv("/proc/self/exe", argv.data());
      const char msg[] = "hixl-bench: execv(/proc/self/exe) failed\n";
      ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
      (void)ignored;
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    pid_ = pid;
    to_child_ = in[1];
    from_child_ = out[0];
  }

  // One line from the child's stdout, without the newline.
  std::string ReadLine(int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        Fail("no reply from the target process within " + std::to_string(timeout_ms / 1000) + " s");
      pollfd pfd{from_child_, POLLIN, 0};
      const int r = poll(&pfd, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) Fail(std::string("poll failed: ") + std::strerror(errno));
      if (r == 0) continue;
      char chunk[4096];
      const ssize_t n = read(from_child_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) Fail("the target process exited unexpectedly (" + Reap() + ")");
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  void WriteLine(const std::string& line) {
    const std::string s = line + "\n";
    size_t done = 0;
    while (done < s.size()) {
      const ssize_t n = write(to_child_, s.data() + done, s.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) Fail("cannot talk to the target process (" + Reap() + ")");
      done += static_cast<size_t>(n);
    }
  }

  pid_t pid() const { return pid_; }

  std::string Request(const std::string& line) {
    WriteLine(line);
    return ReadLine(kReplyTimeoutMs);
  }

  // Asks the child to quit, waits up to 10 s, then SIGKILLs it. Returns a
  // description of how it ended.
  std::string Stop() {
    if (pid_ <= 0) return "not running";
    if (to_child_ >= 0) {
      const char quit[] = "quit\n";
      ssize_t ignored = write(to_child_, quit, sizeof quit - 1);
      (void)ignored;
      close(to_child_);
      to_child_ = -1;
    }
    return Reap();
  }

 private:
  std::string Reap() {
    if (pid_ <= 0) return "already reaped";
    int st = 0;
    pid_t r = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while ((r = waitpid(pid_, &st, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::string how;
    if (r == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      how = "did not exit in 10 s, killed";
    } else if (r < 0) {
      how = std::string("waitpid failed: ") + std::strerror(errno);
    } else if (WIFEXITED(st)) {
      how = "exit status " + std::to_string(WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
      how = std::string("killed by signal ") + strsignal(WTERMSIG(st));
    }
    pid_ = -1;
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
    to_child_ = from_child_ = -1;
    return how;
  }

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buf_;
};

// ---------------------------------------------------------------- options ---

struct Options {
  bool serve = false;
  std::string transport = "shm";  // shm | tcp
  uint64_t slice = 0;             // tcp: TcpSliceSize (0: engine default)
  bool do_write = true, do_read = true;
  std::vector<uint64_t> blocks = {4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB,
                                  4 * MiB, 16 * MiB, 64 * MiB, 128 * MiB};
  std::vector<uint64_t> batches = {1};
  std::vector<uint64_t> threads = {1, 2};
  std::vector<std::string> mems = {"alloc"};
  uint64_t iters = 0;  // 0: auto
  uint64_t reps = 5;
  bool verify = false;
  bool latency = false;
  bool sweep = false;     // with --latency: run the bandwidth sweep as well
  bool control = false;   // --control: Connect and RegisterMem timings instead
  bool notify = false;    // --notify: notification latency after a 4 KiB write
  bool failover = false;  // --failover: time from a peer's death or hang to FAILED
  bool table = false;
  uint64_t max_total = 256 * MiB;
  uint64_t region_size = 256 * MiB;
  uint64_t baseline_min_part = 1 * MiB;  // 0: always split the memcpy into T parts
};

void Usage() {
  std::fprintf(
      stderr,
      "usage: hixl-bench [options]\n"
      "  --op write|read|both        (default both)\n"
      "  --blocks 4K,64K,1M,...      block sizes (default 4K,16K,64K,256K,1M,4M,16M,64M,128M)\n"
      "  --batch 1,128,1024          descriptors per transfer (default 1)\n"
      "  --threads 1,2               CopyThreads (shm) or TcpLanes (tcp) values, one engine each\n"
      "                              (default 1,2)\n"
      "  --transport shm|tcp         link to force (default shm); tcp compares with a plain\n"
      "                              blocking socket pair (1 MiB send calls) and reports the\n"
      "                              staged path (copy, send, receive, copy) as before_gbps\n"
      "  --slice SIZE                tcp: TcpSliceSize (default: the engine's)\n"
      "  --mem alloc|malloc|both     target region from AllocMem or malloc+RegisterMem (default "
      "alloc)\n"
      "  --iters N                   timed transfers per rep (default: >= 256 MiB moved, min 5)\n"
      "  --reps R                    repetitions, median reported (default 5)\n"
      "  --verify                    check the bytes after each rep\n"
      "  --latency                   4 KiB WRITE latency, 10000 iterations (replaces the sweep\n"
      "                              unless --sweep is also given)\n"
      "  --control                   time Connect+Disconnect to the target and RegisterMem+\n"
      "                              DeregisterMem of 1 GiB (200 each) instead of transfers\n"
      "  --notify                    latency of a notification attached to a 4 KiB WRITE,\n"
      "                              post to seen by the target, beside the plain WRITE\n"
      "  --failover                  time from kill -9 / SIGSTOP of the target to FAILED\n"
      "  --table                     human table on stderr (JSON lines always on stdout)\n"
      "  --max-total SIZE            skip transfers larger than SIZE bytes (default 256M)\n"
      "  --region-size SIZE          target region size (default 256M)\n"
      "  --baseline-min-part SIZE    the memcpy baseline gives no thread less than SIZE,\n"
      "                              as the engine does (default 1M; 0: always T parts)\n");
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    bool has_inline = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return val;
      if (i + 1 >= argc) Fail("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--serve")
      o.serve = true;
    else if (a == "--transport") {
      o.transport = value();
      if (o.transport != "shm" && o.transport != "tcp") Fail("--transport must be shm or tcp");
    } else if (a == "--slice")
      o.slice = ParseSize(value());
    else if (a == "--op") {
      const std::string v = value();
      if (v == "write")
        o.do_write = true, o.do_read = false;
      else if (v == "read")
        o.do_write = false, o.do_read = true;
      else if (v == "both")
        o.do_write = o.do_read = true;
      else
        Fail("--op must be write, read or both");
    } else if (a == "--blocks")
      o.blocks = ParseSizeList(value());
    else if (a == "--batch") {
      o.batches.clear();
      for (const auto& s : SplitComma(value())) o.batches.push_back(ParseCount(s, 1, 1u << 20));
    } else if (a == "--threads") {
      o.threads.clear();
      for (const auto& s : SplitComma(value())) o.threads.push_back(ParseCount(s, 1, 64));
    } else if (a == "--mem") {
      const std::string v = value();
      if (v == "alloc" || v == "malloc")
        o.mems = {v};
      else if (v == "both")
        o.mems = {"alloc", "malloc"};
      else
        Fail("--mem must be alloc, malloc or both");
    } else if (a == "--iters")
      o.iters = ParseCount(value(), 1, 100000000);
    else if (a == "--reps")
      o.reps = ParseCount(value(), 1, 1000);
    else if (a == "--verify")
      o.verify = true;
    else if (a == "--latency")
      o.latency = true;
    else if (a == "--sweep")
      o.sweep = true;
    else if (a == "--control")
      o.control = true;
    else if (a == "--notify")
      o.notify = true;
    else if (a == "--failover")
      o.failover = true;
    else if (a == "--table")
      o.table = true;
    else if (a == "--max-total")
      o.max_total = ParseSize(value());
    else if (a == "--region-size")
      o.region_size = ParseSize(value());
    else if (a == "--baseline-min-part") {
      const std::string v = value();
      o.baseline_min_part = v == "0" ? 0 : ParseSize(v);
    } else if (a == "-h" || a == "--help") {
      Usage();
      std::exit(0);
    } else {
      Usage();
      Fail("unknown option '" + a + "'");
    }
  }
  return o;
}

// ----------------------------------------------------------------- target ---

// --serve: the target process. Only the READY line and replies go to stdout.
int Serve(const Options& o) {
  hixl::Hixl engine;
  Check(engine.Initialize("127.0.0.1:0", {}), "target Initialize(127.0.0.1:0)");
  const size_t len = o.region_size;
  const std::string mem = o.mems.front();
  uint8_t* region = nullptr;
  std::unique_ptr<uint8_t, decltype(&std::free)> owned(nullptr, &std::free);
  hixl::MemHandle handle = 0;
  if (mem == "alloc") {
    void* p = nullptr;
    Check(engine.AllocMem(len, hixl::MemType::MEM_HOST, &p), "target AllocMem");
    region = static_cast<uint8_t*>(p);
  } else {
    owned.reset(static_cast<uint8_t*>(std::malloc(len)));
    if (!owned) Fail("malloc(" + std::to_string(len) + ") failed");
    region = owned.get();
    std::memset(region, 0, len);  // touch before registering
    Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(region), len}, hixl::MemType::MEM_HOST,
                             handle),
          "target RegisterMem");
  }
  std::memset(region, 0xa5, len);  // fault every page in before timing
  std::printf("READY %s %" PRIuPTR " %zu\n", engine.LocalEngine().c_str(),
              reinterpret_cast<uintptr_t>(region), len);
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t seed = 0, n = 0;
    in >> cmd;
    if (cmd == "quit") break;
    if (cmd == "watch" && (in >> n) && n > 0) {
      std::vector<double> us;
      const auto deadline = Clock::now() + std::chrono::seconds(120);
      std::vector<hixl::NotifyDesc> got;
      while (us.size() < n && Clock::now() < deadline) {
        got.clear();
        Check(engine.GetNotifies(got), "target GetNotifies");
        const auto now =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                .count();
        for (const auto& d : got)
          us.push_back(static_cast<double>(now - std::stoll(d.notify_msg)) / 1e3);
      }
      if (us.size() < n) {
        std::printf("ERR got %zu of %" PRIu64 " notifications\n", us.size(), n);
      } else {
        std::sort(us.begin(), us.end());
        std::printf("OK %.2f %.2f\n", us[us.size() / 2],
                    us[std::min(us.size() - 1, us.size() * 99 / 100)]);
      }
      std::fflush(stdout);
      continue;
    }
    if ((cmd == "fill" || cmd == "check") && (in >> seed >> n) && n <= len) {
      if (cmd == "fill") {
        FillPattern(region, n, seed);
        std::printf("OK\n");
      } else {
        const size_t bad = FindPatternMismatch(region, n, seed);
        if (bad == SIZE_MAX)
          std::printf("OK\n");
        else
          std::printf("BAD %zu\n", bad);
      }
    } else {
      std::printf("ERR bad command '%s'\n", line.c_str());
    }
    std::fflush(stdout);
  }
  if (handle != 0) Check(engine.DeregisterMem(handle), "target DeregisterMem");
  engine.Finalize();  // releases AllocMem memory
  return 0;
}

// -------------------------------------------------------------- initiator ---

struct Target {
  std::string engine;
  uintptr_t addr = 0;
  size_t len = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t idx = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(idx, sorted.size() - 1)];
}

struct Measurement {
  std::string mode;  // "bandwidth" | "latency"
  std::string transport, mem, op;
  uint64_t block = 0, batch = 0, threads = 0, iters = 0;
  double gbps = 0, avg_us = 0, p50_us = 0, p99_us = 0;
  double base_gbps = 0, base_p50_us = 0;
  uint64_t base_threads = 1;
  std::string baseline = "memcpy";
  double before_gbps = 0;  // tcp: the staged socket path, same run
  int verified = -1;       // -1: not checked
};

void PrintJson(const Measurement& m) {
  std::printf(
      "{\"transport\":\"%s\",\"mem\":\"%s\",\"mode\":\"%s\",\"op\":\"%s\",\"block_size\":%" PRIu64
      ",\"batch_size\":%" PRIu64 ",\"threads\":%" PRIu64 ",\"iters\":%" PRIu64
      ",\"gbps\":%.4f,\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,\"baseline\":\"%s\""
      ",\"baseline_gbps\":%.4f,\"baseline_p50_us\":%.3f,\"baseline_threads\":%" PRIu64
      ",\"ratio\":%.4f",
      m.transport.c_str(), m.mem.c_str(), m.mode.c_str(), m.op.c_str(), m.block, m.batch, m.threads,
      m.iters, m.gbps, m.avg_us, m.p50_us, m.p99_us, m.baseline.c_str(), m.base_gbps, m.base_p50_us,
      m.base_threads, m.base_gbps > 0 ? m.gbps / m.base_gbps : 0.0);
  if (m.before_gbps > 0) {
    std::printf(",\"before\":\"staged_socket\",\"before_gbps\":%.4f,\"before_ratio\":%.4f",
                m.before_gbps, m.gbps / m.before_gbps);
  }
  std::printf(",\"verified\":%s}\n", m.verified < 0 ? "null" : (m.verified ? "true" : "false"));
  std::fflush(stdout);
}

void PrintTableHeader() {
  std::fprintf(stderr, "%-6s %-9s %-5s %6s %5s %3s %7s %9s %9s %9s %9s %9s %4s %7s %s\n", "mem",
               "mode", "op", "block", "batch", "thr", "iters", "GB/s", "avg_us", "p50_us", "p99_us",
               "baseline", "bthr", "ratio", "verified");
}

void PrintTableRow(const Measurement& m) {
  std::fprintf(stderr,
               "%-6s %-9s %-5s %6s %5" PRIu64 " %3" PRIu64 " %7" PRIu64
               " %9.3f %9.2f %9.2f %9.2f %9.3f %4" PRIu64 " %7.3f %s\n",
               m.mem.c_str(), m.mode.c_str(), m.op.c_str(), HumanSize(m.block).c_str(), m.batch,
               m.threads, m.iters, m.gbps, m.avg_us, m.p50_us, m.p99_us, m.base_gbps,
               m.base_threads, m.base_gbps > 0 ? m.gbps / m.base_gbps : 0.0,
               m.verified < 0 ? "-" : (m.verified ? "yes" : "NO"));
}

// The tcp references, measured in the same run: a plain blocking loopback TCP
// connection between two threads moving the same bytes with 1 MiB send()
// calls straight into the destination ("socket"), and the path hixl replaces
// ("staged": copy into a staging buffer, send, receive into a staging
// buffer, copy into place).
struct SocketBaseline {
  SocketBaseline() {
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(l, 1) != 0 || getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      Fail("socket baseline: cannot listen on loopback");
    tx = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      Fail("socket baseline: connect");
    rx = ::accept(l, nullptr, nullptr);
    ::close(l);
    if (rx < 0) Fail("socket baseline: accept");
    int one = 1;
    setsockopt(tx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    receiver = std::thread([this] { Receive(); });
  }
  ~SocketBaseline() {
    {
      std::lock_guard<std::mutex> lock(mu);
      quit = true;
    }
    cv.notify_all();
    ::shutdown(tx, SHUT_RDWR);
    receiver.join();
    ::close(tx);
    ::close(rx);
  }
  // Moves the bytes of copies (dst <- src) over the socket; returns when the
  // receiver holds them all.
  void Run(const std::vector<CopyOp>& copies, uint64_t total, bool staged) {
    if (staged && stage_tx.size() < total) {
      stage_tx.resize(total);
      stage_rx.resize(total);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      job = &copies;
      job_total = total;
      job_staged = staged;
      done = false;
      ++gen;
    }
    cv.notify_all();
    if (staged) {  // serialize: gather every block into one staging buffer
      uint64_t off = 0;
      for (const auto& c : copies) std::memcpy(stage_tx.data() + off, c.src, c.len), off += c.len;
      SendAll(stage_tx.data(), total);
    } else {
      for (const auto& c : copies) SendAll(c.src, c.len);
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done; });
  }

 private:
  void SendAll(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      ssize_t r = ::send(tx, p, std::min<uint64_t>(n, 1 * MiB), MSG_NOSIGNAL);
      if (r <= 0) Fail("socket baseline: send failed");
      p += r;
      n -= static_cast<uint64_t>(r);
    }
  }
  void RecvAll(uint8_t* p, uint64_t n) {
    while (n > 0) {
      ssize_t r = ::recv(rx, p, n, 0);
      if (r <= 0) Fail("socket baseline: recv failed");
      p += r;
      n -= static_cast<uint64_t>(r);
    }
  }
  void Receive() {
    uint64_t seen = 0;
    for (;;) {
      const std::vector<CopyOp>* copies;
      uint64_t total;
      bool staged;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return quit || gen != seen; });
        if (quit) return;
        seen = gen;
        copies = job;
        total = job_total;
        staged = job_staged;
      }
      if (staged) {  // receive into staging, then copy every block into place
        RecvAll(stage_rx.data(), total);
        uint64_t off = 0;
        for (const auto& c : *copies)
          std::memcpy(c.dst, stage_rx.data() + off, c.len), off += c.len;
      } else {
        for (const auto& c : *copies) RecvAll(c.dst, c.len);
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
      }
      cv.notify_all();
    }
  }

  int tx = -1, rx = -1;
  std::thread receiver;
  std::mutex mu;
  std::condition_variable cv;
  const std::vector<CopyOp>* job = nullptr;
  uint64_t job_total = 0, gen = 0;
  bool job_staged = false, done = false, quit = false;
  std::vector<uint8_t> stage_tx, stage_rx;
};

// Everything one (mem, threads) pass needs.
struct Context {
  const Options* opt;
  hixl::Hixl* engine;
  Child* child;
  Target target;
  Buffer* local;    // the transfer's local buffer
  Buffer* scratch;  // second private buffer: memcpy partner, verify read-back
  CopyPool* pool;
  std::string transport, mem;
  uint64_t threads;
  struct SocketBaseline* sock = nullptr;  // tcp: the wire's practical limit
};

void Transfer(Context& c, hixl::TransferOp op, const std::vector<hixl::TransferOpDesc>& descs) {
  const hixl::Status st = c.engine->TransferSync(c.target.engine, op, descs, kTransferTimeoutMs);
  if (!st.ok())
    Fail(std::string("TransferSync ") + (op == hixl::TransferOp::WRITE ? "WRITE" : "READ") +
         " of " + std::to_string(descs.size()) + " descriptor(s) failed: " + st.ToString());
}

std::vector<hixl::TransferOpDesc> MakeDescs(uintptr_t local, uintptr_t remote, uint64_t block,
                                            uint64_t batch) {
  std::vector<hixl::TransferOpDesc> d(batch);
  for (uint64_t i = 0; i < batch; ++i) d[i] = {local + i * block, remote + i * block, block};
  return d;
}

// Checks the bytes one transfer of this shape moves; throws on a mismatch.
void VerifyOnce(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t seed) {
  const uint64_t total = block * batch;
  const auto remote =
      MakeDescs(reinterpret_cast<uintptr_t>(c.local->data()), c.target.addr, block, batch);
  const auto back =
      MakeDescs(reinterpret_cast<uintptr_t>(c.scratch->data()), c.target.addr, block, batch);
  const std::string where = "block " + std::to_string(block) + " batch " + std::to_string(batch) +
                            " threads " + std::to_string(c.threads) + " mem " + c.mem;
  if (op == hixl::TransferOp::WRITE) {
    // WRITE the pattern, let the target check its own memory, READ it back.
    FillPattern(c.local->data(), total, seed);
    Transfer(c, hixl::TransferOp::WRITE, remote);
    const std::string reply =
        c.child->Request("check " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK")
      Fail("VERIFY FAILED (write, " + where +
           "): target region does not hold the written bytes: " + reply);
    std::memset(c.scratch->data(), 0, total);
    Transfer(c, hixl::TransferOp::READ, back);
    const size_t bad = FindPatternMismatch(c.scratch->data(), total, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (write, " + where + "): read-back differs at byte offset " +
           std::to_string(bad));
  } else {
    // The target fills its region; READ it into a zeroed buffer and compare.
    const std::string reply =
        c.child->Request("fill " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK") Fail("target could not fill its region: " + reply);
    std::memset(c.local->data(), 0, total);
    Transfer(c, hixl::TransferOp::READ, remote);
    const size_t bad = FindPatternMismatch(c.local->data(), total, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (read, " + where + "): local bytes differ at byte offset " +
           std::to_string(bad));
  }
}

// One (op, block, batch) point: warm-up, then reps of [hixl, memcpy] interleaved.
Measurement Measure(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t iters,
                    const std::string& mode) {
  const Options& o = *c.opt;
  const uint64_t total = block * batch;
  const auto descs =
      MakeDescs(reinterpret_cast<uintptr_t>(c.local->data()), c.target.addr, block, batch);
  std::vector<CopyOp> copies(batch);
  for (uint64_t i = 0; i < batch; ++i) {
    uint8_t* l = c.local->data() + i * block;
    uint8_t* s = c.scratch->data() + i * block;
    copies[i] = op == hixl::TransferOp::WRITE ? CopyOp{s, l, block} : CopyOp{l, s, block};
  }

  // The baseline for this transport: memcpy (shm) or a plain socket (tcp).
  auto baseline = [&]() -> int {
    if (c.sock != nullptr) {
      c.sock->Run(copies, total, /*staged=*/false);
      return 1;
    }
    return c.pool->Run(copies, total, o.baseline_min_part);
  };
  const uint64_t warmup = std::clamp<uint64_t>(iters / 20, 2, 200);
  for (uint64_t i = 0; i < warmup; ++i) {
    Transfer(c, op, descs);
    baseline();
    if (c.sock != nullptr) c.sock->Run(copies, total, /*staged=*/true);
  }

  std::vector<double> gbps, avg_us, lat_us, base_gbps, base_lat_us, before_gbps;
  lat_us.reserve(iters * o.reps);
  base_lat_us.reserve(iters * o.reps);
  const double bytes = static_cast<double>(total) * static_cast<double>(iters);
  bool verified = false;
  int base_threads = 1;
  for (uint64_t r = 0; r < o.reps; ++r) {
    // A: hixl
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < iters; ++i) {
      const auto a = Clock::now();
      Transfer(c, op, descs);
      lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
    double secs = Seconds(t0, Clock::now());
    gbps.push_back(bytes / secs / 1e9);
    avg_us.push_back(secs * 1e6 / static_cast<double>(iters));
    // B: memcpy baseline, same bytes, same layout, same thread count
    t0 = Clock::now();
    for (uint64_t i = 0; i < iters; ++i) {
      const auto a = Clock::now();
      base_threads = baseline();
      base_lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
    secs = Seconds(t0, Clock::now());
    base_gbps.push_back(bytes / secs / 1e9);
    if (c.sock != nullptr) {  // C: the staged "before" path
      t0 = Clock::now();
      for (uint64_t i = 0; i < iters; ++i) c.sock->Run(copies, total, /*staged=*/true);
      before_gbps.push_back(bytes / Seconds(t0, Clock::now()) / 1e9);
    }
    if (o.verify) {
      VerifyOnce(c, op, block, batch, PatternSeed(block, batch, r, static_cast<int>(op)));
      verified = true;
    }
  }
  std::sort(lat_us.begin(), lat_us.end());
  std::sort(base_lat_us.begin(), base_lat_us.end());

  Measurement m;
  m.mode = mode;
  m.transport = c.transport;
  m.mem = c.mem;
  m.op = op == hixl::TransferOp::WRITE ? "write" : "read";
  m.block = block;
  m.batch = batch;
  m.threads = c.threads;
  m.iters = iters;
  m.gbps = Median(gbps);
  m.avg_us = Median(avg_us);
  m.p50_us = Percentile(lat_us, 0.50);
  m.p99_us = Percentile(lat_us, 0.99);
  m.base_gbps = Median(base_gbps);
  m.base_p50_us = Percentile(base_lat_us, 0.50);
  m.base_threads = static_cast<uint64_t>(base_threads);
  if (c.sock != nullptr) {
    m.baseline = "socket";
    m.before_gbps = Median(before_gbps);
  }
  m.verified = o.verify ? (verified ? 1 : 0) : -1;
  return m;
}

std::string Lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

Target StartTarget(Child& child, const Options& o, const std::string& mem) {
  child.Spawn(
      {"hixl-bench", "--serve", "--mem", mem, "--region-size", std::to_string(o.region_size)});
  const std::string line = child.ReadLine(kReadyTimeoutMs);
  std::istringstream in(line);
  std::string word;
  Target t;
  if (!(in >> word >> t.engine >> t.addr >> t.len) || word != "READY")
    Fail("unexpected line from the target process: '" + line + "'");
  if (t.len < o.region_size) Fail("target region smaller than requested");
  return t;
}

// --control: the control-plane costs a user pays outside transfers.
int RunControl(const Options& o) {
  Child child;
  const Target target = StartTarget(child, o, o.mems.front());
  hixl::Hixl engine;
  Check(engine.Initialize("127.0.0.1",
                          {{hixl::options::kLinkType, o.transport == "tcp" ? "TCP" : "SHM"}}),
        "Initialize");
  constexpr int kN = 200;
  auto report = [](const char* what, std::vector<double>& us) {
    std::sort(us.begin(), us.end());
    std::printf(
        "{\"mode\":\"control\",\"op\":\"%s\",\"iters\":%zu,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
        what, us.size(), Percentile(us, 0.50), Percentile(us, 0.99));
    std::fprintf(stderr, "%-28s p50 %9.1f us   p99 %9.1f us\n", what, Percentile(us, 0.50),
                 Percentile(us, 0.99));
  };
  std::vector<double> connect_us;
  for (int i = 0; i < kN; ++i) {
    const auto a = Clock::now();
    Check(engine.Connect(target.engine, kConnectTimeoutMs), "Connect");
    connect_us.push_back(Seconds(a, Clock::now()) * 1e6);
    Check(engine.Disconnect(target.engine), "Disconnect");
  }
  report(o.transport == "tcp" ? "connect (tcp)" : "connect (shm)", connect_us);
  // 1 GiB of untouched anonymous memory, as a KV pool would be before use.
  const size_t gib = size_t{1} << 30;
  void* mem = mmap(nullptr, gib, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) Fail("mmap 1 GiB failed");
  std::vector<double> reg_us, dereg_us;
  for (int i = 0; i < kN; ++i) {
    hixl::MemHandle h = 0;
    auto a = Clock::now();
    Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(mem), gib}, hixl::MemType::MEM_HOST, h),
          "RegisterMem");
    reg_us.push_back(Seconds(a, Clock::now()) * 1e6);
    a = Clock::now();
    Check(engine.DeregisterMem(h), "DeregisterMem");
    dereg_us.push_back(Seconds(a, Clock::now()) * 1e6);
  }
  report("register_mem 1GiB", reg_us);
  report("deregister_mem 1GiB", dereg_us);
  munmap(mem, gib);
  engine.Finalize();
  child.Stop();
  return 0;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// --notify: a 4 KiB WRITE with a notification attached, timed from posting to
// the moment the target's GetNotifies returns it; beside it, in the same run,
// the plain 4 KiB TransferSync WRITE and the WRITE+notify TransferSync.
int RunNotify(const Options& o) {
  Child child;
  const Target target = StartTarget(child, o, o.mems.front());
  hixl::Hixl engine;
  Check(engine.Initialize("127.0.0.1",
                          {{hixl::options::kLinkType, o.transport == "tcp" ? "TCP" : "SHM"}}),
        "Initialize");
  Check(engine.Connect(target.engine, kConnectTimeoutMs), "Connect");
  const uint64_t n = o.iters ? o.iters : 5000;
  Buffer local(4 * KiB);
  const std::vector<hixl::TransferOpDesc> descs = {
      {reinterpret_cast<uintptr_t>(local.data()), target.addr, 4 * KiB}};
  for (int i = 0; i < 200; ++i)
    Check(engine.TransferSync(target.engine, hixl::TransferOp::WRITE, descs), "warm-up");
  child.WriteLine("watch " + std::to_string(n));
  std::vector<double> plain_us, sync_us;
  for (uint64_t i = 0; i < n; ++i) {
    auto a = Clock::now();
    Check(engine.TransferSync(target.engine, hixl::TransferOp::WRITE, descs), "TransferSync");
    plain_us.push_back(Seconds(a, Clock::now()) * 1e6);
    hixl::TransferArgs args;
    args.notify = hixl::NotifyDesc{"kv", std::to_string(NowNs()), ""};
    a = Clock::now();
    Check(engine.TransferSync(target.engine, hixl::TransferOp::WRITE, descs, args,
                              kTransferTimeoutMs),
          "TransferSync with notify");
    sync_us.push_back(Seconds(a, Clock::now()) * 1e6);
  }
  const std::string reply = child.ReadLine(kReplyTimeoutMs);
  std::istringstream in(reply);
  std::string ok;
  double seen_p50 = 0, seen_p99 = 0;
  if (!(in >> ok >> seen_p50 >> seen_p99) || ok != "OK") Fail("target: " + reply);
  std::sort(plain_us.begin(), plain_us.end());
  std::sort(sync_us.begin(), sync_us.end());
  std::printf("{\"mode\":\"notify\",\"transport\":\"%s\",\"iters\":%" PRIu64
              ",\"seen_p50_us\":%.2f,\"seen_p99_us\":%.2f,\"sync_notify_p50_us\":%.2f,"
              "\"sync_notify_p99_us\":%.2f,\"write_p50_us\":%.2f,\"write_p99_us\":%.2f}\n",
              o.transport.c_str(), n, seen_p50, seen_p99, Percentile(sync_us, 0.5),
              Percentile(sync_us, 0.99), Percentile(plain_us, 0.5), Percentile(plain_us, 0.99));
  if (o.table) {
    std::fprintf(stderr, "%s: notification seen after post  p50 %8.2f us  p99 %8.2f us\n",
                 o.transport.c_str(), seen_p50, seen_p99);
    std::fprintf(stderr, "%s: WRITE 4K + notify (sync)      p50 %8.2f us  p99 %8.2f us\n",
                 o.transport.c_str(), Percentile(sync_us, 0.5), Percentile(sync_us, 0.99));
    std::fprintf(stderr, "%s: WRITE 4K (sync, baseline)     p50 %8.2f us  p99 %8.2f us\n",
                 o.transport.c_str(), Percentile(plain_us, 0.5), Percentile(plain_us, 0.99));
  }
  engine.Finalize();
  child.Stop();
  return 0;
}

// --failover: how long after a target dies (kill -9) or hangs (SIGSTOP) an
// in-flight request ends FAILED. tcp: the target is stopped first so the
// request is surely in flight; shm copies do not wait on the target, so there
// the time until the link is dropped (GetConnectStatus NOT_CONNECTED) is shown.
int RunFailover(const Options& o) {
  const int reps = static_cast<int>(std::min<uint64_t>(o.reps, 20));
  const int hb_ms = 1000, misses = 3;  // the engine's defaults
  for (const char* how : {"kill", "hang"}) {
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      Child child;
      const Target target = StartTarget(child, o, o.mems.front());
      hixl::Hixl engine;
      Check(engine.Initialize("127.0.0.1",
                              {{hixl::options::kLinkType, o.transport == "tcp" ? "TCP" : "SHM"}}),
            "Initialize");
      Check(engine.Connect(target.engine, kConnectTimeoutMs), "Connect");
      const size_t len = std::min<size_t>(target.len, 64 * MiB);
      Buffer local(len);
      hixl::TransferReq req = 0;
      const bool tcp = o.transport == "tcp";
      const bool hang = std::string(how) == "hang";
      auto t0 = Clock::now();  // a hang starts at the SIGSTOP
      if (tcp || hang) kill(child.pid(), SIGSTOP);
      if (tcp) {
        Check(engine.TransferAsync(target.engine, hixl::TransferOp::WRITE,
                                   {{reinterpret_cast<uintptr_t>(local.data()), target.addr, len}},
                                   {}, req),
              "TransferAsync");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!hang) {
        t0 = Clock::now();
        kill(child.pid(), SIGKILL);
      }
      const auto limit = t0 + std::chrono::seconds(30);
      bool ended = false;
      while (!ended && Clock::now() < limit) {
        if (tcp) {
          hixl::TransferStatus st;
          Check(engine.GetTransferStatus(req, st), "GetTransferStatus");
          if (st == hixl::TransferStatus::COMPLETED)
            Fail("a transfer to a stopped target completed");
          ended = st != hixl::TransferStatus::WAITING;
        } else {
          hixl::ConnectStatus cs;
          Check(engine.GetConnectStatus(target.engine, cs), "GetConnectStatus");
          ended = cs == hixl::ConnectStatus::NOT_CONNECTED;
        }
        if (!ended) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (!ended) Fail(std::string("no failure seen 30 s after ") + how);
      ms.push_back(Seconds(t0, Clock::now()) * 1e3);
      engine.Finalize();
      kill(child.pid(), SIGKILL);
      kill(child.pid(), SIGCONT);
      child.Stop();
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "{\"mode\":\"failover\",\"transport\":\"%s\",\"event\":\"%s\",\"reps\":%d,"
        "\"p50_ms\":%.1f,\"max_ms\":%.1f,\"heartbeat_ms\":%d,\"misses\":%d}\n",
        o.transport.c_str(), how, reps, Percentile(ms, 0.5), ms.back(), hb_ms, misses);
    if (o.table)
      std::fprintf(stderr, "%s: %s -> %s  p50 %8.1f ms  max %8.1f ms (heartbeat %d ms x %d)\n",
                   o.transport.c_str(), how,
                   o.transport == "tcp" ? "request FAILED" : "link dropped", Percentile(ms, 0.5),
                   ms.back(), hb_ms, misses);
  }
  return 0;
}

int RunInitiator(const Options& o) {
  if (o.control) return RunControl(o);
  if (o.notify) return RunNotify(o);
  if (o.failover) return RunFailover(o);
  // The shapes to run, and the largest transfer among them.
  struct Shape {
    uint64_t block, batch;
  };
  std::vector<Shape> shapes;
  uint64_t skipped = 0, largest = 4 * KiB;
  const bool run_sweep = !o.latency || o.sweep;
  if (run_sweep) {
    for (uint64_t batch : o.batches)
      for (uint64_t block : o.blocks) {
        const uint64_t total = block * batch;
        if (total > o.max_total || total > o.region_size) {
          ++skipped;
          continue;
        }
        shapes.push_back({block, batch});
        largest = std::max(largest, total);
      }
  }
  if (o.region_size < 4 * KiB) Fail("--region-size must be at least 4K");
  if (skipped)
    std::fprintf(stderr,
                 "hixl-bench: skipped %" PRIu64
                 " block x batch combination(s) larger than --max-total or --region-size\n",
                 skipped);
  if (run_sweep && shapes.empty()) Fail("nothing to run: every combination was skipped");

  Buffer local(largest), scratch(largest);
  if (o.table) PrintTableHeader();

  for (const std::string& mem : o.mems) {
    Child child;
    const Target target = StartTarget(child, o, mem);
    for (uint64_t threads : o.threads) {
      // A fresh engine per CopyThreads value.
      auto engine = std::make_unique<hixl::Hixl>();
      std::map<std::string, std::string> opts;
      if (o.transport == "tcp") {
        opts[hixl::options::kLinkType] = "TCP";
        opts[hixl::options::kTcpLanes] = std::to_string(threads);
        if (o.slice != 0) opts[hixl::options::kTcpSliceSize] = std::to_string(o.slice);
      } else {
        opts[hixl::options::kLinkType] = "SHM";
        opts[hixl::options::kCopyThreads] = std::to_string(threads);
      }
      Check(engine->Initialize("127.0.0.1", opts),
            "Initialize(127.0.0.1, " + o.transport + ", threads/lanes=" + std::to_string(threads) +
                ")");
      Check(engine->Connect(target.engine, kConnectTimeoutMs), "Connect(" + target.engine + ")");
      hixl::LinkType lt = hixl::LinkType::AUTO;
      Check(engine->GetLinkType(target.engine, lt), "GetLinkType");
      const std::string transport = Lower(hixl::LinkTypeName(lt));
      if (transport != o.transport) Fail("link type is " + transport + ", not " + o.transport);

      CopyPool pool(static_cast<int>(threads));
      std::unique_ptr<SocketBaseline> sock;
      if (o.transport == "tcp") sock = std::make_unique<SocketBaseline>();
      Context c{&o,    engine.get(), &child, target,  &local,    &scratch,
                &pool, transport,    mem,    threads, sock.get()};
      std::vector<hixl::TransferOp> ops;
      if (o.do_write) ops.push_back(hixl::TransferOp::WRITE);
      if (o.do_read) ops.push_back(hixl::TransferOp::READ);
      for (const auto op : ops)
        for (const Shape& s : shapes) {
          const uint64_t total = s.block * s.batch;
          const uint64_t iters =
              o.iters ? o.iters : std::max<uint64_t>(5, (256 * MiB + total - 1) / total);
          const Measurement m = Measure(c, op, s.block, s.batch, iters, "bandwidth");
          PrintJson(m);
          if (o.table) PrintTableRow(m);
        }
      if (o.latency) {
        const Measurement m = Measure(c, hixl::TransferOp::WRITE, 4 * KiB, 1, 10000, "latency");
        PrintJson(m);
        if (o.table) PrintTableRow(m);
      }
      engine->Finalize();
    }
    const std::string how = child.Stop();
    if (how != "exit status 0")
      std::fprintf(stderr, "hixl-bench: warning: target process (mem %s) ended: %s\n", mem.c_str(),
                   how.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a dead target must give an error, not kill us
  try {
    const Options o = ParseArgs(argc, argv);
    if (o.serve) return Serve(o);
    return RunInitiator(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hixl-bench%s: error: %s\n",
                 argc > 1 && std::string(argv[1]) == "--serve" ? " (target)" : "", e.what());
    return 1;
  }
}
