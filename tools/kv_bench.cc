// hixl-kv-bench: LLM-DataDist pulls and pushes of paged KV caches between two
// processes, each beside the engine's own batched transfer of the same bytes
// (the same descriptors, through a plain hixl::Hixl pair) in the same run.
//
//   hixl-kv-bench [--transport shm|tcp] [--mem host|cuda] [--reps R] [--verify] [--table]
//
// Cases: a model-shaped cache (32 layers x K,V; a block is 16 tokens x 8 KV
// heads x 128 dims x 2 bytes = 32 KiB per tensor) with 1, 64 and 256 blocks,
// and a 10^5-block pull of a one-layer cache with 1 KiB blocks; random and
// contiguous block tables; pull (READ) and push (WRITE). Runs interleave
// ours and the baseline (A B A B ...); medians are reported. For the 10^5
// case it also reports the time to build the descriptors (merge runs).
// --mem cuda: both sides' caches are CUDA device memory (CachePlacement::
// kDevice; the driver HIXL_CUDA_DRIVER names, default libcuda.so.1), and the
// baseline moves the same device memory through the engine.
// Output: one JSON line per case on stdout; --table adds a table on stderr.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "datadist/layout.h"
#include "device/driver_client.h"
#include "hixl/hixl.h"
#include "llm_datadist/llm_datadist.h"

namespace {

using namespace llm_datadist;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  uint32_t tensors;
  int64_t blocks;
  int64_t block_elems;  // fp16 elements per block per tensor
};
constexpr Shape kModel{"model", 64, 256, 16 * 8 * 128};
constexpr Shape kMany{"many", 2, 100000, 512};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
void Die(const std::string& what) {
  std::fprintf(stderr, "hixl-kv-bench: %s\n", what.c_str());
  std::exit(1);
}
void Check(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}
void CheckH(const hixl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

struct Side {
  std::vector<void*> tensors;
  std::vector<uint64_t> addrs;
  int64_t cache_id = 0;
};

hixl::device::DriverClient& Cuda() {
  auto& c = hixl::device::DriverClient::Get();
  if (!c.ok()) Die("--mem cuda: " + c.error());
  return c;
}

// Bytes [off, off + n) of a cache tensor, wherever it lies.
void ReadTensor(bool device, const void* tensor, size_t off, size_t n, void* out) {
  const auto* p = static_cast<const uint8_t*>(tensor) + off;
  if (!device) {
    std::memcpy(out, p, n);
  } else if (!Cuda().Copy(out, p, n)) {
    Die("--mem cuda: reading device memory failed");
  }
}

Side MakeCache(LlmDataDist& dd, hixl::Hixl& raw, const Shape& s, uint8_t seed, bool device) {
  Side side;
  const size_t bytes = static_cast<size_t>(s.blocks) * s.block_elems * 2;
  std::vector<uint8_t> fill;
  for (uint32_t t = 0; t < s.tensors; ++t) {
    void* p = nullptr;
    if (device) {
      p = reinterpret_cast<void*>(Cuda().Alloc(bytes));
      fill.assign(bytes, 0);
    } else {
      p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    }
    if (p == nullptr) Die("out of memory");
    auto* b = device ? fill.data() : static_cast<uint8_t*>(p);
    for (size_t i = 0; i < bytes; i += 64) b[i] = static_cast<uint8_t>(seed + t + i / 4096);
    if (device && !Cuda().Copy(p, fill.data(), bytes))
      Die("--mem cuda: filling device memory failed");
    side.tensors.push_back(p);
    side.addrs.push_back(reinterpret_cast<uint64_t>(p));
    hixl::MemHandle h;
    CheckH(raw.RegisterMem({reinterpret_cast<uintptr_t>(p), bytes},
                           device ? hixl::MemType::MEM_DEVICE : hixl::MemType::MEM_HOST, h),
           "baseline RegisterMem");
  }
  CacheDesc d;
  d.placement = device ? CachePlacement::kDevice : CachePlacement::kHost;
  d.num_tensors = s.tensors;
  d.data_type = DT_FLOAT16;
  d.shape = {s.blocks, s.block_elems};
  Check(dd.RegisterKvCache(d, side.addrs, {}, side.cache_id), "RegisterKvCache");
  return side;
}

// The owner process: registers both caches, prints its addresses, then waits
// for its stdin to close.
[[noreturn]] void Owner(int out_fd, const std::string& link, bool device) {
  std::map<std::string, std::string> eo{{"LinkType", link}};
  LlmDataDist dd(1, LlmRole::kPrompt);
  Check(dd.Initialize({{options::kListenIpInfo, "127.0.0.1:0"},
                       {options::kGlobalResourceConfig, "{\"LinkType\":\"" + link + "\"}"}}),
        "owner Initialize");
  hixl::Hixl raw;
  CheckH(raw.Initialize("127.0.0.1:0", eo), "owner engine");
  std::string msg = dd.LocalAddress() + " " + raw.LocalEngine();
  for (const Shape* s : {&kModel, &kMany}) {
    Side side = MakeCache(dd, raw, *s, 7, device);
    msg += " " + std::to_string(side.cache_id);
    for (uint64_t a : side.addrs) msg += " " + std::to_string(a);
  }
  msg += "\n";
  if (write(out_fd, msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) Die("pipe");
  char c;
  while (read(0, &c, 1) > 0) {
  }
  dd.Finalize();
  raw.Finalize();
  std::_Exit(0);
}

struct Options {
  std::string link = "SHM";
  bool device = false;  // --mem cuda
  int reps = 5;
  bool verify = false;
  bool table = false;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--transport" && i + 1 < argc) {
      std::string t = argv[++i];
      if (t == "shm") o.link = "SHM";
      else if (t == "tcp") o.link = "TCP";
      else Die("--transport: shm or tcp");
    } else if (a == "--mem" && i + 1 < argc) {
      std::string m = argv[++i];
      if (m == "host")
        o.device = false;
      else if (m == "cuda")
        o.device = true;
      else
        Die("--mem: host or cuda");
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--verify") {
      o.verify = true;
    } else if (a == "--table") {
      o.table = true;
    } else {
      std::fprintf(stderr,
                   "usage: hixl-kv-bench [--transport shm|tcp] [--mem host|cuda] [--reps R] "
                   "[--verify] [--table]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) Die("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(to_child[0], 0);
    close(to_child[1]);
    close(from_child[0]);
    Owner(from_child[1], o.link, o.device);
  }
  close(to_child[0]);
  close(from_child[1]);
  std::string line;
  char buf[65536];
  while (line.find('\n') == std::string::npos) {
    ssize_t n = read(from_child[0], buf, sizeof(buf));
    if (n <= 0) Die("the owner process failed to start");
    line.append(buf, static_cast<size_t>(n));
  }
  std::vector<std::string> f;
  for (size_t p = 0; p < line.size();) {
    size_t q = line.find_first_of(" \n", p);
    f.push_back(line.substr(p, q - p));
    p = q + 1;
  }
  const std::string dd_addr = f[0], raw_addr = f[1];
  size_t k = 2;
  std::vector<Side> remote(2);
  for (int c = 0; c < 2; ++c) {
    const Shape& s = c == 0 ? kModel : kMany;
    remote[c].cache_id = std::stoll(f[k++]);
    for (uint32_t t = 0; t < s.tensors; ++t) remote[c].addrs.push_back(std::stoull(f[k++]));
  }

  LlmDataDist dd(2, LlmRole::kDecoder);
  Check(dd.Initialize({{options::kGlobalResourceConfig, "{\"LinkType\":\"" + o.link + "\"}"},
                       {options::kSyncKvCacheWaitTime, "60000"}}),
        "Initialize");
  hixl::Hixl raw;
  CheckH(raw.Initialize("127.0.0.1", {{"LinkType", o.link}}), "engine");
  CheckH(raw.Connect(raw_addr, 5000), "baseline Connect");
  ClusterInfo ci;
  ci.remote_cluster_id = 1;
  auto colon = dd_addr.rfind(':');
  ci.remote_ip_infos.push_back(
      {dd_addr.substr(0, colon), static_cast<uint16_t>(std::stoi(dd_addr.substr(colon + 1)))});
  std::vector<Status> rets;
  Check(dd.LinkLlmClusters({ci}, rets, 5000), "LinkLlmClusters");
  std::vector<Side> local;
  for (const Shape* s : {&kModel, &kMany}) local.push_back(MakeCache(dd, raw, *s, 99, o.device));

  if (o.table) {
    std::fprintf(stderr, "%-5s %-6s %-5s %7s %-6s %9s %9s %9s %7s %9s\n", "link", "cache", "op",
                 "blocks", "table", "MB", "ours_GB/s", "base_GB/s", "ratio", "build_ms");
  }
  std::mt19937_64 rng(12345);
  struct Case {
    int cache;
    int64_t blocks;
    bool random;
  };
  std::vector<Case> cases = {{0, 1, false},  {0, 64, false},    {0, 64, true},   {0, 256, false},
                             {0, 256, true}, {1, 100000, false}, {1, 100000, true}};
  for (const Case& c : cases) {
    const Shape& s = c.cache == 0 ? kModel : kMany;
    for (hixl::TransferOp op : {hixl::TransferOp::READ, hixl::TransferOp::WRITE}) {
      std::vector<uint64_t> src(s.blocks), dst(s.blocks);
      std::iota(src.begin(), src.end(), 0);
      std::iota(dst.begin(), dst.end(), 0);
      if (c.random) {
        std::shuffle(src.begin(), src.end(), rng);
        std::shuffle(dst.begin(), dst.end(), rng);
      }
      src.resize(c.blocks);
      dst.resize(c.blocks);
      const bool pull = op == hixl::TransferOp::READ;
      // The same descriptors, for the baseline (and the build time).
      internal::Layout lay;
      (void)internal::MakeLayout(s.tensors, DT_FLOAT16, {s.blocks, s.block_elems}, lay);
      internal::TensorSpan all{0, s.tensors, 0, static_cast<int32_t>(s.tensors / 2 - 1)};
      std::vector<double> build_ms;
      std::vector<hixl::TransferOpDesc> descs;
      for (int r = 0; r < 3; ++r) {
        descs.clear();
        auto t0 = Clock::now();
        Status bs = internal::BuildBlockDescs(local[c.cache].addrs, lay, all, pull ? dst : src,
                                              remote[c.cache].addrs, lay, all, pull ? src : dst,
                                              pull, descs);
        build_ms.push_back(Ms(t0, Clock::now()));
        Check(bs, "BuildBlockDescs");
      }
      Cache mine;
      mine.cache_id = local[c.cache].cache_id;
      CacheIndex theirs{1, remote[c.cache].cache_id, 0};
      std::vector<double> ours, base;
      auto time_ours = [&] {
        auto t0 = Clock::now();
        Check(pull ? dd.PullKvBlocks(theirs, mine, src, dst) : dd.PushKvBlocks(mine, theirs, src, dst),
              pull ? "PullKvBlocks" : "PushKvBlocks");
        return Ms(t0, Clock::now());
      };
      auto time_base = [&] {
        auto t0 = Clock::now();
        CheckH(raw.TransferSync(raw_addr, op, descs, 60000), "baseline TransferSync");
        return Ms(t0, Clock::now());
      };
      for (int r = 0; r < o.reps + 1; ++r) {  // the first round warms up
        // Which goes first alternates, so that neither always finds the
        // threads of both processes just woken by the other (or the owner
        // still taking in the event of the previous pull or push).
        double a, b;
        if (r % 2 == 0) {
          a = time_ours();
          b = time_base();
        } else {
          b = time_base();
          a = time_ours();
        }
        if (r > 0) {
          ours.push_back(a);
          base.push_back(b);
        }
      }
      if (o.verify && pull) {
        // Pull once more and compare what arrived with what the owner holds
        // (read back through the baseline engine).
        Check(dd.PullKvBlocks(theirs, mine, src, dst), "verify pull");
        const size_t bb = static_cast<size_t>(s.block_elems) * 2;
        std::vector<uint8_t> back(bb), mine_now(bb);
        for (int64_t i = 0; i < std::min<int64_t>(c.blocks, 64); ++i) {
          uint32_t t = static_cast<uint32_t>(i % s.tensors);
          CheckH(raw.TransferSync(raw_addr, hixl::TransferOp::READ,
                                  {{reinterpret_cast<uintptr_t>(back.data()),
                                    remote[c.cache].addrs[t] + src[i] * bb, bb}},
                                  5000),
                 "verify read");
          ReadTensor(o.device, local[c.cache].tensors[t], dst[i] * bb, bb, mine_now.data());
          if (std::memcmp(back.data(), mine_now.data(), bb) != 0) {
            Die("verify: block " + std::to_string(i) + " differs");
          }
        }
      }
      const double bytes = static_cast<double>(c.blocks) * s.block_elems * 2 * s.tensors;
      const double ours_ms = Median(ours), base_ms = Median(base);
      const double ours_gbps = bytes / (ours_ms * 1e6), base_gbps = bytes / (base_ms * 1e6);
      std::printf(
          "{\"bench\":\"kv\",\"transport\":\"%s\",\"mem\":\"%s\",\"cache\":\"%s\",\"op\":\"%s\","
          "\"blocks\":%lld,"
          "\"table\":\"%s\",\"tensors\":%u,\"block_size\":%lld,\"batch_size\":%zu,\"bytes\":%.0f,"
          "\"iters\":%d,\"ms\":%.3f,\"gbps\":%.3f,\"baseline\":\"engine_batched\","
          "\"baseline_ms\":%.3f,\"baseline_gbps\":%.3f,\"ratio\":%.3f,\"build_ms\":%.3f,"
          "\"verified\":%s}\n",
          o.link == "SHM" ? "shm" : "tcp", o.device ? "cuda" : "host", s.name,
          pull ? "pull" : "push", static_cast<long long>(c.blocks),
          c.random ? "random" : "contiguous", s.tensors, static_cast<long long>(s.block_elems * 2),
          descs.size(), bytes, o.reps, ours_ms, ours_gbps, base_ms, base_gbps, base_ms / ours_ms,
          Median(build_ms),
          o.verify && pull ? "true" : "null");  // pushes are not read back
      std::fflush(stdout);
      if (o.table) {
        std::fprintf(stderr, "%-5s %-6s %-5s %7lld %-6s %9.1f %9.3f %9.3f %7.3f %9.3f\n",
                     o.link == "SHM" ? "shm" : "tcp", s.name, pull ? "pull" : "push",
                     static_cast<long long>(c.blocks), c.random ? "random" : "contig", bytes / 1e6,
                     ours_gbps, base_gbps, base_ms / ours_ms, Median(build_ms));
      }
    }
  }
  dd.Finalize();
  raw.Finalize();
  close(to_child[1]);
  int st = 0;
  waitpid(pid, &st, 0);
  return 0;
}
