// shm_transfer_demo — move a 128 MiB "KV cache" from a prefill process into a
// decode process on the same host with hixl one-sided WRITEs.
//
//   prefill (this process)                    decode (this binary, run with --decode)
//   ----------------------                    ---------------------------------------
//                                             Initialize("127.0.0.1:0"), AllocMem(128 MiB)
//   reads "READY <engine> <addr>"   <-------  prints its engine address and buffer address
//   Initialize, Connect(engine)
//   TransferSync(WRITE, descriptors) ------>  (no decode code runs: the bytes just arrive)
//   "checksum"                      ------->  checksums its buffer, replies "SUM <hex>"
//   "layers 8"                      ------->  waits for 8 notifications
//   8 x TransferAsync(WRITE one layer,        each arrives only after its layer's bytes:
//     notify "layer-i" = its checksum) --->   decode checksums that layer as it arrives,
//                                             replies "LAYERS OK" (or what was wrong)
//   "quit"                          ------->  Finalize, exit 0
//
// The pipe between the two processes is only the demo's control channel; the
// data itself moves through hixl. Exit status: 0 on success, 1 on any failure.
#include <hixl/hixl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBytes = 128ull << 20;  // the whole "KV cache"
constexpr size_t kBlock = 64ull << 10;   // one "page" of it when sent block-wise
constexpr int kRuns = 5;                 // timed runs (median reported)
constexpr int kLayers = 8;               // layer-wise pipeline: one notification per layer

// Prints the message (and the hixl status, if any) and exits. The decode child
// dies with us (PR_SET_PDEATHSIG below), so no cleanup is needed here.
[[noreturn]] void Die(const std::string& what, const hixl::Status& st = {}) {
  std::fprintf(stderr, "shm_transfer_demo: %s%s%s\n", what.c_str(), st.ok() ? "" : ": ",
               st.ok() ? "" : st.ToString().c_str());
  std::exit(1);
}

void Check(const hixl::Status& st, const std::string& what) {
  if (!st.ok()) Die(what + " failed", st);
}

// An order-sensitive 64-bit checksum (FNV-1a over 8-byte words).
uint64_t Checksum(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  return h;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ------------------------------------------------------------------ decode --
// Owns the receive buffer. After printing READY it only answers requests on
// stdin; the prefill process writes into its memory without its help.
int RunDecode() {
  hixl::Hixl decode;
  // "ip:0": listen on a free port so the prefill engine can connect.
  Check(decode.Initialize("127.0.0.1:0"), "decode Initialize");

  // AllocMem returns shareable memory, registered READ|WRITE, which a peer on
  // this host maps directly: its WRITEs become plain memory copies.
  void* buf = nullptr;
  Check(decode.AllocMem(kBytes, hixl::MemType::MEM_HOST, &buf), "decode AllocMem");
  auto* bytes = static_cast<uint8_t*>(buf);
  std::memset(bytes, 0, kBytes);

  // Tell the prefill process where to write.
  std::printf("READY %s %" PRIuPTR "\n", decode.LocalEngine().c_str(),
              reinterpret_cast<uintptr_t>(buf));
  std::fflush(stdout);

  char line[64];
  while (std::fgets(line, sizeof line, stdin)) {
    if (std::strncmp(line, "checksum", 8) == 0) {
      std::printf("SUM %016" PRIx64 "\n", Checksum(bytes, kBytes));
    } else if (std::strncmp(line, "clear", 5) == 0) {
      std::memset(bytes, 0, kBytes);  // so the next check sees only new bytes
      std::printf("OK\n");
    } else if (std::strncmp(line, "layers", 6) == 0) {
      // A decode step would start on layer i as soon as "layer-i" arrives: the
      // engine queues the notification only after the layer's bytes are here.
      const int n = std::atoi(line + 6);
      const size_t layer = kBytes / static_cast<size_t>(n);
      int seen = 0;
      std::string bad;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      std::vector<hixl::NotifyDesc> got;
      while (seen < n && bad.empty() && std::chrono::steady_clock::now() < deadline) {
        got.clear();
        Check(decode.GetNotifies(got), "decode GetNotifies");
        for (const auto& d : got) {
          const int i = std::atoi(d.name.c_str() + std::strlen("layer-"));
          char sum[32];
          std::snprintf(sum, sizeof sum, "%016" PRIx64,
                        Checksum(bytes + static_cast<size_t>(i) * layer, layer));
          if (d.notify_msg != sum) bad = d.name + " arrived before its bytes";
          ++seen;
        }
        if (got.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (bad.empty() && seen < n) bad = "only " + std::to_string(seen) + " notifications arrived";
      std::printf("%s\n", bad.empty() ? "LAYERS OK" : ("LAYERS BAD " + bad).c_str());
    } else {
      break;  // "quit"
    }
    std::fflush(stdout);
  }
  decode.Finalize();  // also frees the AllocMem buffer
  return 0;
}

// ----------------------------------------------------------------- prefill --
struct DecodeProcess {
  pid_t pid = -1;
  FILE* to = nullptr;    // its stdin
  FILE* from = nullptr;  // its stdout

  // Sends one request line and returns the one-line reply.
  std::string Ask(const char* request) {
    std::fprintf(to, "%s\n", request);
    std::fflush(to);
    char reply[128];
    if (!std::fgets(reply, sizeof reply, from)) Die("the decode process died");
    reply[std::strcspn(reply, "\n")] = '\0';
    return reply;
  }
};

// Starts this same binary with --decode, its stdin/stdout on two pipes.
DecodeProcess SpawnDecode() {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) Die("pipe failed");
  DecodeProcess d;
  d.pid = fork();
  if (d.pid < 0) Die("fork failed");
  if (d.pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the prefill process
    execl("/proc/self/exe", "hixl-shm-demo", "--decode", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  d.to = fdopen(in[1], "w");
  d.from = fdopen(out[0], "r");
  return d;
}

int RunPrefill() {
  signal(SIGPIPE, SIG_IGN);  // a dead child shows up as a failed read, not a signal

  // 1. Start the decode process and learn its engine address and buffer address.
  DecodeProcess decode = SpawnDecode();
  char engine[128] = {0};
  uintptr_t remote = 0;
  char ready[256];
  if (!std::fgets(ready, sizeof ready, decode.from) ||
      std::sscanf(ready, "READY %127s %" SCNuPTR, engine, &remote) != 2)
    Die("the decode process did not start");

  // 2. A client-only engine ("ip", no port) that connects to the decode engine.
  //    One copy thread, so the comparison with a single memcpy is like for like
  //    (hixl-bench sweeps CopyThreads).
  hixl::Hixl prefill;
  Check(prefill.Initialize("127.0.0.1", {{hixl::options::kCopyThreads, "1"}}),
        "prefill Initialize");
  Check(prefill.Connect(engine, 5000), std::string("Connect(") + engine + ")");
  hixl::LinkType link = hixl::LinkType::AUTO;
  Check(prefill.GetLinkType(engine, link), "GetLinkType");

  // 3. The "KV cache": 128 MiB of known bytes. Local buffers are plain memory;
  //    only the remote side has to be registered.
  std::vector<uint8_t> kv(kBytes);
  for (size_t i = 0; i < kBytes; i += 8) {
    const uint64_t w = (i / 8) * 0x9E3779B97F4A7C15ull ^ 0x5EEDC0DEull;
    std::memcpy(&kv[i], &w, 8);
  }
  const uint64_t expected = Checksum(kv.data(), kBytes);
  const auto local = reinterpret_cast<uintptr_t>(kv.data());

  // Two ways to describe the same transfer: one 128 MiB descriptor, and 2048
  // descriptors of 64 KiB (how a paged KV cache is usually laid out).
  std::vector<hixl::TransferOpDesc> whole = {{local, remote, kBytes}};
  std::vector<hixl::TransferOpDesc> pages;
  for (size_t off = 0; off < kBytes; off += kBlock)
    pages.push_back({local + off, remote + off, kBlock});

  // 4. WRITE each way into a cleared buffer and let the decode side checksum it.
  char want[64];
  std::snprintf(want, sizeof want, "SUM %016" PRIx64, expected);
  for (const auto* descs : {&whole, &pages}) {
    if (decode.Ask("clear") != "OK") Die("decode could not clear its buffer");
    Check(prefill.TransferSync(engine, hixl::TransferOp::WRITE, *descs, 60000),
          "TransferSync WRITE");
    const std::string got = decode.Ask("checksum");
    if (got != want)
      Die("DATA MISMATCH after " + std::to_string(descs->size()) +
          "-descriptor WRITE: decode has " + got + ", expected " + want);
  }

  // 5. Layer-wise: each layer goes as its own async WRITE carrying a
  //    notification with the layer's checksum; decode checks every layer the
  //    moment its notification arrives (prefill/decode overlap per layer).
  {
    if (decode.Ask("clear") != "OK") Die("decode could not clear its buffer");
    std::fprintf(decode.to, "layers %d\n", kLayers);
    std::fflush(decode.to);
    const size_t layer = kBytes / kLayers;
    std::vector<hixl::TransferReq> reqs;
    for (int i = 0; i < kLayers; ++i) {
      const size_t off = static_cast<size_t>(i) * layer;
      char sum[32];
      std::snprintf(sum, sizeof sum, "%016" PRIx64, Checksum(kv.data() + off, layer));
      hixl::TransferArgs args;
      args.notify = hixl::NotifyDesc{"layer-" + std::to_string(i), sum, ""};
      hixl::TransferReq req = 0;
      Check(prefill.TransferAsync(engine, hixl::TransferOp::WRITE,
                                  {{local + off, remote + off, layer}}, args, req),
            "TransferAsync WRITE layer " + std::to_string(i));
      reqs.push_back(req);
    }
    for (hixl::TransferReq req : reqs) {
      hixl::TransferStatus st = hixl::TransferStatus::WAITING;
      hixl::Status why;
      while (st == hixl::TransferStatus::WAITING) {
        Check(prefill.GetTransferStatus(req, st, why), "GetTransferStatus");
        if (st == hixl::TransferStatus::WAITING)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (st != hixl::TransferStatus::COMPLETED) Die("a layer WRITE did not complete", why);
    }
    char reply[128];
    if (!std::fgets(reply, sizeof reply, decode.from)) Die("the decode process died");
    reply[std::strcspn(reply, "\n")] = '\0';
    if (std::string(reply) != "LAYERS OK") Die(std::string("layer-wise check failed: ") + reply);
  }

  // 6. Bandwidth: hixl WRITE vs memcpy of the same 128 MiB between two local
  //    buffers, interleaved (A B A B ...) so machine noise hits both alike.
  std::vector<uint8_t> copy(kBytes);  // zero-filled: its pages are already touched
  auto seconds = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto hixl_write = [&] {
    Check(prefill.TransferSync(engine, hixl::TransferOp::WRITE, whole, 60000),
          "TransferSync WRITE");
  };
  auto plain_memcpy = [&] { std::memcpy(copy.data(), kv.data(), kBytes); };
  for (int i = 0; i < 2; ++i) seconds(hixl_write), seconds(plain_memcpy);  // warm-up
  std::vector<double> t_hixl, t_memcpy;
  for (int i = 0; i < kRuns; ++i) {
    t_hixl.push_back(seconds(hixl_write));
    t_memcpy.push_back(seconds(plain_memcpy));
  }
  const double gbps_hixl = kBytes / Median(t_hixl) / 1e9;
  const double gbps_memcpy = kBytes / Median(t_memcpy) / 1e9;

  // The timed WRITEs must have left the right bytes too.
  if (decode.Ask("checksum") != want) Die("DATA MISMATCH after the timed WRITEs");

  // 7. Tear down: disconnect, let the decode process exit, reap it.
  prefill.Finalize();
  std::fprintf(decode.to, "quit\n");
  std::fclose(decode.to);
  int status = 0;
  waitpid(decode.pid, &status, 0);
  std::fclose(decode.from);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("the decode process failed");

  std::printf("hixl shm transfer demo: prefill -> decode, %zu MiB KV cache\n", kBytes >> 20);
  std::printf("  link type             : %s\n", hixl::LinkTypeName(link));
  std::printf("  bytes per transfer    : %zu\n", kBytes);
  std::printf("  checked layouts       : 1 x 128 MiB, %zu x 64 KiB descriptors\n", pages.size());
  std::printf(
      "  layer-wise, notified  : %d async WRITEs, each layer checked when its notification "
      "arrived\n",
      kLayers);
  std::printf("  hixl WRITE            : %6.2f GB/s  (median of %d, %.2f ms)\n", gbps_hixl, kRuns,
              Median(t_hixl) * 1e3);
  std::printf("  memcpy, same process  : %6.2f GB/s  (median of %d, %.2f ms)\n", gbps_memcpy, kRuns,
              Median(t_memcpy) * 1e3);
  std::printf("  ratio hixl / memcpy   : %6.2f\n", gbps_hixl / gbps_memcpy);
  std::printf("  data verified: OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--decode") == 0) return RunDecode();
  return RunPrefill();
}
