#include "bench/modes.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common.h"
#include "bench/process.h"

namespace hixl_bench {

namespace {

// Whether the page at p is part of a shared mapping (after an inplace
// RegisterMem it must be: the engine moved it into its memfd).
bool SharedAt(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string range, perms;
    if (!(ss >> range >> perms) || range.find('-') == std::string::npos) continue;
    const uint64_t lo = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
    const uint64_t hi = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
    if (a >= lo && a < hi) return perms.size() >= 4 && perms[3] == 's';
  }
  return false;
}

// --control with --mem memfd/inplace: RegisterMem + DeregisterMem of len bytes
// of touched memory of that kind. memfd: the application's sealed memfd
// (registered as it is, 200 times); inplace: anonymous pages registered with
// REGISTER_SHARE_BY_MAPPING, which moves them into an engine memfd and back
// (--iters times, default 20), so its cost is reported per GiB too; "moved"
// says whether the pages were shared while registered. With --verify the
// pages must keep their bytes through both moves.
void TimeShareRegistration(const Options& o, hixl::Hixl& engine, const std::string& kind,
                           size_t len) {
  const bool inplace = kind == "inplace";
  int fd = -1;
  void* mem = MAP_FAILED;
  if (inplace) {
    mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    fd = memfd_create("hixl-bench-control", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(len)) != 0)
      Fail(std::string("memfd of 1 GiB: ") + std::strerror(errno));
    mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem != MAP_FAILED && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
      Fail(std::string("F_ADD_SEALS failed: ") + std::strerror(errno));
  }
  if (mem == MAP_FAILED) Fail("mmap 1 GiB (" + kind + ") failed: " + std::strerror(errno));
  uint8_t* p = static_cast<uint8_t*>(mem);
  const uint64_t seed = Mix(len) ^ (inplace ? 1 : 2);
  FillPattern(p, len, seed);  // touched, as a KV pool in use is
  const uint32_t flags = inplace ? hixl::REGISTER_SHARE_BY_MAPPING : hixl::REGISTER_DEFAULT;
  const uint64_t n = inplace ? (o.iters ? o.iters : 20) : 200;
  auto check = [&](const char* when) {
    if (!o.verify) return;
    const size_t bad = FindPatternMismatch(p, len, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (register_mem " + kind + "): bytes changed " + when + " at offset " +
           std::to_string(bad));
  };
  std::vector<double> reg_us, dereg_us;
  bool moved = true;
  for (uint64_t i = 0; i < n; ++i) {
    hixl::MemHandle h = 0;
    auto a = Clock::now();
    Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(p), len}, hixl::MemType::MEM_HOST, h,
                             hixl::MEM_PERM_READ_WRITE, flags),
          "RegisterMem (" + kind + ")");
    reg_us.push_back(Seconds(a, Clock::now()) * 1e6);
    if (i == 0) check("by RegisterMem");
    if (inplace) moved = moved && SharedAt(p) && SharedAt(p + len - 1);
    a = Clock::now();
    Check(engine.DeregisterMem(h), "DeregisterMem (" + kind + ")");
    dereg_us.push_back(Seconds(a, Clock::now()) * 1e6);
  }
  check("by RegisterMem + DeregisterMem");
  munmap(mem, len);
  if (fd >= 0) close(fd);
  const double gib = static_cast<double>(len) / static_cast<double>(GiB);
  for (auto* row : {&reg_us, &dereg_us}) {
    std::sort(row->begin(), row->end());
    const char* what = row == &reg_us ? "register_mem" : "deregister_mem";
    const double p50 = Percentile(*row, 0.50), p99 = Percentile(*row, 0.99);
    std::printf(
        "{\"mode\":\"control\",\"op\":\"%s %s 1GiB\",\"mem\":\"%s\",\"bytes\":%zu,"
        "\"iters\":%zu,\"p50_us\":%.1f,\"p99_us\":%.1f,\"ms_per_gib\":%.3f,"
        "\"moved\":%s,\"verified\":%s}\n",
        what, kind.c_str(), kind.c_str(), len, row->size(), p50, p99, p50 / 1e3 / gib,
        inplace ? (moved ? "true" : "false") : "null", o.verify ? "true" : "null");
    std::fprintf(stderr, "%-28s p50 %9.1f us   p99 %9.1f us   %8.3f ms/GiB%s\n",
                 (std::string(what) + " " + kind + " 1GiB").c_str(), p50, p99, p50 / 1e3 / gib,
                 inplace && !moved ? "   (pages NOT moved into shared memory)" : "");
  }
}

}  // namespace

// --control: the control-plane costs a user pays outside transfers.
int RunControl(const Options& o) {
  Child child;
  const Target target = StartTarget(child, o, o.mems.front());
  hixl::Hixl engine;
  Check(engine.Initialize("127.0.0.1",
                          WithEngineOpts(o, {{hixl::options::kLinkType, LinkTypeOption(o.transport)}})),
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
  report(("connect (" + o.transport + ")").c_str(), connect_us);
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
  for (const std::string& kind : o.mems)
    if (kind == "memfd" || kind == "inplace") TimeShareRegistration(o, engine, kind, gib);
  engine.Finalize();
  child.Stop();
  return 0;
}

// --notify: a 4 KiB WRITE with a notification attached, timed from posting to
// the moment the target's GetNotifies returns it; beside it, in the same run,
// the plain 4 KiB TransferSync WRITE and the WRITE+notify TransferSync.
int RunNotify(const Options& o) {
  Child child;
  const Target target = StartTarget(child, o, o.mems.front());
  hixl::Hixl engine;
  Check(engine.Initialize("127.0.0.1",
                          WithEngineOpts(o, {{hixl::options::kLinkType, LinkTypeOption(o.transport)}})),
        "Initialize");
  Check(engine.Connect(target.engine, kConnectTimeoutMs), "Connect");
  const uint64_t n = o.iters ? o.iters : 5000;
  Buffer local(4 * KiB);
  const std::vector<hixl::TransferOpDesc> descs = {
      {reinterpret_cast<uintptr_t>(local.data()), target.addr, 4 * KiB}};
  for (int i = 0; i < 200; ++i)
    Check(engine.TransferSync(target.engine, hixl::TransferOp::WRITE, descs), "warm-up");
  child.WriteLine((o.notify_poll ? "watchpoll " : "watch ") + std::to_string(n));
  // The target's callback is in place before the first notification.
  if (const std::string ready = child.ReadLine(kReplyTimeoutMs); ready != "READY")
    Fail("target: " + ready);
  std::vector<double> plain_us, sync_us;
  for (uint64_t i = 0; i < n; ++i) {
    if (o.notify_gap_us > 0) {
      const auto until = Clock::now() + std::chrono::microseconds(o.notify_gap_us);
      while (Clock::now() < until) {
      }
    }
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
  std::string engine_opts;  // the initiator's --engine-opt settings, "K=V K=V"
  for (const auto& [k, v] : o.engine_opts)
    engine_opts += (engine_opts.empty() ? "" : " ") + k + "=" + v;
  std::printf("{\"mode\":\"notify\",\"transport\":\"%s\",\"iters\":%" PRIu64
              ",\"engine_opts\":\"%s\",\"target\":\"%s\",\"gap_us\":%" PRIu64
              ",\"seen_p50_us\":%.2f,\"seen_p99_us\":%.2f,\"sync_notify_p50_us\":%.2f,"
              "\"sync_notify_p99_us\":%.2f,\"write_p50_us\":%.2f,\"write_p99_us\":%.2f}\n",
              o.transport.c_str(), n, JsonEscape(engine_opts).c_str(),
              o.notify_poll ? "poll" : "callback", o.notify_gap_us, seen_p50, seen_p99,
              Percentile(sync_us, 0.5), Percentile(sync_us, 0.99), Percentile(plain_us, 0.5),
              Percentile(plain_us, 0.99));
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
                              WithEngineOpts(o, {{hixl::options::kLinkType, LinkTypeOption(o.transport)}})),
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

// --kv: the LLM-DataDist KV benchmark is its own binary, hixl-kv-bench, built
// beside this one; run it in our place with the options it shares with us.
int RunKv(const Options& o) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) Fail(std::string("readlink(/proc/self/exe) failed: ") + std::strerror(errno));
  self[n] = '\0';
  std::string dir(self);
  dir.erase(dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/'));
  const std::string path = (dir.empty() ? std::string(".") : dir) + "/hixl-kv-bench";
  std::vector<std::string> args = {path};
  if (o.transport_given) args.insert(args.end(), {"--transport", o.transport});
  if (o.reps_given) args.insert(args.end(), {"--reps", std::to_string(o.reps)});
  if (o.verify) args.push_back("--verify");
  if (o.table) args.push_back("--table");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execv(path.c_str(), argv.data());
  Fail("cannot run " + path + ": " + std::strerror(errno) +
       " (build it: cmake --build <dir> --target hixl-kv-bench)");
}

}  // namespace hixl_bench
