#include "bench/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "device/driver_client.h"

namespace hixl_bench {

// ---------------------------------------------------------- child process ---

void Child::Spawn(const std::vector<std::string>& args, int pass_fd) {
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
    if (pass_fd == 3)
      fcntl(3, F_SETFD, 0);  // dup2 onto itself would keep FD_CLOEXEC
    else if (pass_fd >= 0)
      dup2(pass_fd, 3);
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

std::string Child::ReadLine(int timeout_ms) {
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
      Fail("no reply from " + name_ + " within " + std::to_string(timeout_ms / 1000) + " s");
    pollfd pfd{from_child_, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Fail(std::string("poll failed: ") + std::strerror(errno));
    if (r == 0) continue;
    char chunk[4096];
    const ssize_t n = read(from_child_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fail(name_ + " exited unexpectedly (" + Reap() + ")");
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

void Child::WriteLine(const std::string& line) {
  const std::string s = line + "\n";
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(to_child_, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fail("cannot talk to " + name_ + " (" + Reap() + ")");
    done += static_cast<size_t>(n);
  }
}

void Child::RequestQuit() {
  if (pid_ <= 0 || to_child_ < 0) return;
  const char quit[] = "quit\n";
  ssize_t ignored = write(to_child_, quit, sizeof quit - 1);
  (void)ignored;
  close(to_child_);
  to_child_ = -1;
}

std::string Child::Stop() {
  if (pid_ <= 0) return "not running";
  RequestQuit();
  return Reap();
}

std::string Child::Reap() {
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

// ----------------------------------------------------------------- target ---

Target StartTarget(Child& child, const Options& o, const std::string& mem) {
  std::vector<std::string> args = {
      "hixl-bench",  "--serve",   "--mem",         mem,
      "--transport", o.transport, "--region-size", std::to_string(o.region_size)};
  for (const auto& [k, v] : o.engine_opts) {
    args.push_back("--engine-opt");
    args.push_back(k + "=" + v);
  }
  child.Spawn(args);
  const std::string line = child.ReadLine(kReadyTimeoutMs);
  std::istringstream in(line);
  std::string word;
  Target t;
  if (!(in >> word >> t.engine >> t.addr >> t.len) || word != "READY")
    Fail("unexpected line from the target process: '" + line + "'");
  if (t.len < o.region_size) Fail("target region smaller than requested");
  return t;
}

namespace {

// The target's region of one --mem kind, registered (or allocated) with engine.
class Region {
 public:
  Region(hixl::Hixl& engine, const std::string& mem, size_t len) : engine_(engine), len_(len) {
    if (mem == "alloc" || mem == "cuda") {  // engine memory: a memfd, or device memory
      void* p = nullptr;
      device_ = mem == "cuda";
      Check(engine.AllocMem(len, device_ ? hixl::MemType::MEM_DEVICE : hixl::MemType::MEM_HOST, &p),
            "target AllocMem (" + mem + ")");
      data_ = static_cast<uint8_t*>(p);
      return;
    }
    if (mem == "cuda-vmm") {  // the application's cuMemCreate memory, shareable as an fd
      auto& cuda = hixl::device::DriverClient::Get();
      const uintptr_t p = cuda.ok() ? cuda.AllocVmm(len, true, &vmm_size_) : 0;
      if (p == 0) Fail("the target's cuMemCreate memory (--mem cuda-vmm) could not be made");
      device_ = true;
      data_ = reinterpret_cast<uint8_t*>(p);
      Check(engine.RegisterMem({p, len}, hixl::MemType::MEM_DEVICE, handle_,
                               hixl::MEM_PERM_READ_WRITE),
            "target RegisterMem (cuda-vmm)");
      return;
    }
    uint32_t flags = hixl::REGISTER_DEFAULT;
    if (mem == "malloc") {  // private heap memory: peers reach it by cross-memory attach
      malloced_ = static_cast<uint8_t*>(std::malloc(len));
      if (!malloced_) Fail("malloc(" + std::to_string(len) + ") failed");
      data_ = malloced_;
    } else if (mem == "memfd") {
      // The application's own sealed memfd: the engine sees a shared mapping
      // of a file that cannot shrink, which local peers may map as it is.
      memfd_ = memfd_create("hixl-bench-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (memfd_ < 0) Fail(std::string("memfd_create failed: ") + std::strerror(errno));
      if (ftruncate(memfd_, static_cast<off_t>(len)) != 0)
        Fail(std::string("ftruncate of the memfd failed: ") + std::strerror(errno));
      Map(MAP_SHARED, memfd_);
      if (fcntl(memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        Fail(std::string("F_ADD_SEALS failed: ") + std::strerror(errno));
    } else if (mem == "inplace") {
      // Private anonymous pages (what malloc gives a large buffer), which
      // RegisterMem moves in place into an engine memfd peers can map.
      Map(MAP_PRIVATE | MAP_ANONYMOUS, -1);
      flags = hixl::REGISTER_SHARE_BY_MAPPING;
    } else {
      Fail("unknown --mem '" + mem + "'");
    }
    std::memset(data_, 0, len);  // touch before registering
    Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(data_), len}, hixl::MemType::MEM_HOST,
                             handle_, hixl::MEM_PERM_READ_WRITE, flags),
          "target RegisterMem (" + mem + ")");
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() { Release(/*check=*/false); }
  uint8_t* data() const { return data_; }
  // CUDA device memory (--mem cuda): reached only through the driver.
  bool device() const { return device_; }

  // The verify pattern into [off, off+n), or a comparison with it
  // (SIZE_MAX: equal), through a host buffer for device memory.
  bool Fill(uint64_t off, uint64_t n, uint64_t seed) {
    if (!device_) {
      FillPattern(data_ + off, n, seed);
      return true;
    }
    std::vector<uint8_t> host(n);
    FillPattern(host.data(), n, seed);
    return hixl::device::DriverClient::Get().Copy(data_ + off, host.data(), n);
  }
  size_t Mismatch(uint64_t off, uint64_t n, uint64_t seed) {
    if (!device_) return FindPatternMismatch(data_ + off, n, seed);
    std::vector<uint8_t> host(n);
    if (!hixl::device::DriverClient::Get().Copy(host.data(), data_ + off, n)) return 0;
    return FindPatternMismatch(host.data(), n, seed);
  }

  // Deregisters (moving inplace pages back), then frees the memory; with
  // check, a failed DeregisterMem throws.
  void Release(bool check = true) {
    if (handle_ != 0) {
      const hixl::Status st = engine_.DeregisterMem(handle_);
      handle_ = 0;
      if (check) Check(st, "target DeregisterMem");
    }
    if (mapped_) munmap(data_, len_);
    if (vmm_size_ != 0) {
      hixl::device::DriverClient::Get().FreeVmm(reinterpret_cast<uintptr_t>(data_), vmm_size_);
      vmm_size_ = 0;
    }
    if (memfd_ >= 0) close(memfd_);
    std::free(malloced_);
    mapped_ = false;
    memfd_ = -1;
    malloced_ = data_ = nullptr;
  }

 private:
  void Map(int flags, int fd) {
    void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) Fail(std::string("mmap of the region failed: ") + std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
    mapped_ = true;
  }

  hixl::Hixl& engine_;
  const size_t len_;
  uint8_t* data_ = nullptr;
  uint8_t* malloced_ = nullptr;
  bool mapped_ = false;
  size_t vmm_size_ = 0;  // cuda-vmm: the mapped size, for FreeVmm
  bool device_ = false;
  int memfd_ = -1;
  hixl::MemHandle handle_ = 0;
};

// Answers a watch: "OK <p50 us> <p99 us>" of the notifications seen, or an
// error when fewer than n came.
void ReportSeen(std::vector<double>& us, uint64_t n) {
  if (us.size() < n) {
    std::printf("ERR got %zu of %" PRIu64 " notifications\n", us.size(), n);
  } else {
    std::sort(us.begin(), us.end());
    std::printf("OK %.2f %.2f\n", us[us.size() / 2],
                us[std::min(us.size() - 1, us.size() * 99 / 100)]);
  }
  std::fflush(stdout);
}

}  // namespace

int Serve(const Options& o) {
  hixl::Hixl engine;
  // The target's LinkType as the initiator's, as in a deployment: under UCX
  // it decides where AllocMem takes memory from (UcxAllocMem).
  Check(engine.Initialize("127.0.0.1:0", WithEngineOpts(o, {{hixl::options::kLinkType,
                                                             LinkTypeOption(o.transport)}})),
        "target Initialize(127.0.0.1:0)");
  const size_t len = o.region_size;
  const auto owned = std::make_unique<Region>(engine, o.mems.front(), len);
  uint8_t* region = owned->data();
  if (!owned->device()) std::memset(region, 0xa5, len);  // fault every page in before timing
  std::printf("READY %s %" PRIuPTR " %zu\n", engine.LocalEngine().c_str(),
              reinterpret_cast<uintptr_t>(region), len);
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t seed = 0, n = 0, off = 0;
    in >> cmd;
    if (cmd == "quit") break;
    if (cmd == "watchpoll" && (in >> n) && n > 0) {
      // The application polls GetNotifies in a loop (as an inference
      // engine's scheduler step would), for 120 s at most.
      std::vector<double> us;
      us.reserve(n);
      std::vector<hixl::NotifyDesc> got;
      std::printf("READY\n");
      std::fflush(stdout);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (us.size() < n && std::chrono::steady_clock::now() < until) {
        got.clear();
        Check(engine.GetNotifies(got), "target GetNotifies");
        const int64_t now = NowNs();
        for (const auto& d : got)
          us.push_back(static_cast<double>(now - std::stoll(d.notify_msg)) / 1e3);
      }
      ReportSeen(us, n);
      continue;
    }
    if (cmd == "watch" && (in >> n) && n > 0) {
      // The application waits for notifications in the callback (as one
      // that has other work would); a thread spinning on GetNotifies would
      // compete with the engine's own threads for the two cores.
      struct Seen {
        std::mutex mu;
        std::condition_variable cv;
        std::vector<double> us;
      };
      auto seen = std::make_shared<Seen>();  // a late callback may outlive this block
      seen->us.reserve(n);
      Check(engine.SetNotifyCallback([seen, n](const hixl::NotifyDesc& d) {
        const int64_t now = NowNs();
        std::lock_guard<std::mutex> lock(seen->mu);
        seen->us.push_back(static_cast<double>(now - std::stoll(d.notify_msg)) / 1e3);
        if (seen->us.size() >= n) seen->cv.notify_all();
      }),
            "target SetNotifyCallback");
      std::printf("READY\n");
      std::fflush(stdout);
      std::vector<double> us;
      {
        std::unique_lock<std::mutex> lock(seen->mu);
        seen->cv.wait_for(lock, std::chrono::seconds(120), [&] { return seen->us.size() >= n; });
        us = seen->us;
      }
      Check(engine.SetNotifyCallback(nullptr), "target SetNotifyCallback(null)");
      ReportSeen(us, n);
      continue;
    }
    if ((cmd == "fill" || cmd == "check") && (in >> seed >> n) && n <= len) {
      if (!(in >> off)) off = 0;  // the offset is optional
      if (off > len - n) {
        std::printf("ERR range [%" PRIu64 ", +%" PRIu64 ") outside the region\n", off, n);
      } else if (cmd == "fill") {
        std::printf(owned->Fill(off, n, seed) ? "OK\n" : "ERR the driver's copy failed\n");
      } else {
        const size_t bad = owned->Mismatch(off, n, seed);
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
  owned->Release();   // DeregisterMem, then the memory goes
  engine.Finalize();  // releases AllocMem memory
  return 0;
}

}  // namespace hixl_bench
