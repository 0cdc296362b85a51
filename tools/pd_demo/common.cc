// hixl-pd-demo: options, line I/O and the per-process paged KV store.
#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "device/driver_client.h"

namespace pd {

int DemoOptions::MaxPromptLen() const {
  return prompt_lens.empty() ? 0 : *std::max_element(prompt_lens.begin(), prompt_lens.end());
}

int DemoOptions::PoolBlocks() const {
  if (pool_blocks > 0) return pool_blocks;
  return BlocksFor(MaxPromptLen() + gen_tokens) * std::max(inflight, 1) + 4;
}

std::vector<std::string> DemoOptions::WorkerArgs() const {
  const ModelConfig& m = model;
  return {"--layers",     std::to_string(m.layers),    "--heads",      std::to_string(m.heads),
          "--kv-heads",   std::to_string(m.kv_heads),  "--head-dim",   std::to_string(m.head_dim),
          "--mlp-dim",    std::to_string(m.mlp_dim),   "--vocab",      std::to_string(m.vocab),
          "--block-size", std::to_string(m.block_size), "--seed",      std::to_string(m.seed),
          "--pool-blocks", std::to_string(PoolBlocks()), "--link",     link,
          "--mode",       mode,                        "--gen-tokens", std::to_string(gen_tokens),
          "--prefill-ip", prefill_ip,                  "--decode-ip",  decode_ip,
          "--device",     device};
}

std::string Usage() {
  return "usage: hixl-pd-demo [options]\n"
         "  Prefill/decode disaggregation of a small deterministic transformer: a reference\n"
         "  run in one process, a disaggregated run (prefill and decode processes, KV cache\n"
         "  moved by LLM-DataDist), and the 'before' path (staged, serialized, sent over a\n"
         "  socket); the disaggregated tokens must equal the reference's exactly.\n"
         "model:   --layers N (8) --heads N (8) --kv-heads N (4) --head-dim N (32)\n"
         "         --mlp-dim N (512) --vocab N (1024) --block-size N (16) --seed S (1234)\n"
         "run:     --requests N (8) --prompt-lens A,B,... (96..512) --gen-tokens N (16)\n"
         "         --inflight N (3) --pool-blocks N (auto)\n"
         "link:    --link shm|tcp (shm) --mode push|pull (push)\n"
         "         --device host|cuda (host: the KV caches in host memory; cuda: in CUDA device\n"
         "         memory of the driver HIXL_CUDA_DRIVER names, default libcuda.so.1, the model\n"
         "         computing on the CPU and copying each layer's blocks to and from the device)\n"
         "         --prefill-ip IP --decode-ip IP --prefill-netns NS --decode-netns NS\n"
         "output:  --no-before  --json FILE  --timeline FILE  --quiet\n"
         "test:    --corrupt   (flips one byte of one received block: the run must fail)\n";
}

namespace {

bool ToInt(const char* s, int lo, int hi, int& out) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

}  // namespace

std::string ParseOptions(int argc, char** argv, int first, DemoOptions& o) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&](const char*& v) {
      if (i + 1 >= argc) return false;
      v = argv[++i];
      return true;
    };
    const char* v = nullptr;
    auto num = [&](int lo, int hi, int& out) -> std::string {
      if (!next(v) || !ToInt(v, lo, hi, out)) {
        return a + " needs a number in " + std::to_string(lo) + ".." + std::to_string(hi);
      }
      return "";
    };
    std::string err;
    if (a == "--layers") err = num(1, 256, o.model.layers);
    else if (a == "--heads") err = num(1, 256, o.model.heads);
    else if (a == "--kv-heads") err = num(1, 256, o.model.kv_heads);
    else if (a == "--head-dim") err = num(2, 1024, o.model.head_dim);
    else if (a == "--mlp-dim") err = num(1, 65536, o.model.mlp_dim);
    else if (a == "--vocab") err = num(2, 1 << 20, o.model.vocab);
    else if (a == "--block-size") err = num(1, 1024, o.model.block_size);
    else if (a == "--requests") err = num(1, 100000, o.requests);
    else if (a == "--gen-tokens") err = num(1, 4096, o.gen_tokens);
    else if (a == "--inflight") err = num(1, 1024, o.inflight);
    else if (a == "--pool-blocks") err = num(1, 1 << 22, o.pool_blocks);
    else if (a == "--seed") {
      if (!next(v)) return "--seed needs a value";
      o.model.seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--prompt-lens") {
      if (!next(v)) return "--prompt-lens needs a list";
      o.prompt_lens.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        int n = 0;
        if (!ToInt(item.c_str(), 1, 1 << 20, n)) return "--prompt-lens: bad length " + item;
        o.prompt_lens.push_back(n);
      }
      if (o.prompt_lens.empty()) return "--prompt-lens is empty";
    } else if (a == "--link") {
      if (!next(v) || (std::string(v) != "shm" && std::string(v) != "tcp")) {
        return "--link is shm or tcp";
      }
      o.link = v;
    } else if (a == "--mode") {
      if (!next(v) || (std::string(v) != "push" && std::string(v) != "pull")) {
        return "--mode is push or pull";
      }
      o.mode = v;
    } else if (a == "--device") {
      if (!next(v) || (std::string(v) != "host" && std::string(v) != "cuda")) {
        return "--device is host or cuda";
      }
      o.device = v;
    } else if (a == "--prefill-ip") {
      if (!next(v)) return "--prefill-ip needs an address";
      o.prefill_ip = v;
    } else if (a == "--decode-ip") {
      if (!next(v)) return "--decode-ip needs an address";
      o.decode_ip = v;
    } else if (a == "--prefill-netns") {
      if (!next(v)) return "--prefill-netns needs a name";
      o.prefill_netns = v;
    } else if (a == "--decode-netns") {
      if (!next(v)) return "--decode-netns needs a name";
      o.decode_netns = v;
    } else if (a == "--json") {
      if (!next(v)) return "--json needs a file";
      o.json = v;
    } else if (a == "--timeline") {
      if (!next(v)) return "--timeline needs a file";
      o.timeline = v;
    } else if (a == "--no-before") {
      o.run_before = false;
    } else if (a == "--corrupt") {
      o.corrupt = true;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else {
      return "unknown option " + a;
    }
    if (!err.empty()) return err;
  }
  if (std::string e = o.model.Check(); !e.empty()) return "model: " + e;
  return "";
}

bool ReadLine(int fd, std::string& buffer, std::string& line) {
  for (;;) {
    auto nl = buffer.find('\n');
    if (nl != std::string::npos) {
      line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return true;
    }
    char chunk[65536];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

void WriteLine(int fd, const std::string& line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

std::string JoinInts(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

std::vector<int32_t> ParseInts(const std::vector<std::string>& f, size_t from, size_t n) {
  std::vector<int32_t> v;
  for (size_t i = from; i < from + n && i < f.size(); ++i) v.push_back(std::stoi(f[i]));
  return v;
}

namespace {
hixl::device::DriverClient& Cuda() { return hixl::device::DriverClient::Get(); }
}  // namespace

KvStore::KvStore(llm_datadist::LlmDataDist& dd, const ModelConfig& m, int pool_blocks,
                 bool device)
    : dd_(dd), m_(m), pool_blocks_(pool_blocks), device_(device) {
  const size_t bytes = m.block_bytes() * static_cast<size_t>(pool_blocks);
  if (device_ && !Cuda().ok()) {
    status_ = llm_datadist::Status(llm_datadist::LLM_FEATURE_NOT_ENABLED,
                                   "--device cuda: " + Cuda().error());
    return;
  }
  std::vector<uint64_t> addrs;
  for (int t = 0; t < 2 * m.layers; ++t) {
    void* p = nullptr;
    float* view = nullptr;
    if (device_) {
      // The application's own device allocation, as an inference engine's
      // KV tensors are; zeroed through the driver.
      p = reinterpret_cast<void*>(Cuda().Alloc(bytes));
      if (p == nullptr) {
        status_ = llm_datadist::Status(llm_datadist::LLM_OUT_OF_MEMORY,
                                       "--device cuda: cuMemAlloc of " + std::to_string(bytes) +
                                           " bytes failed");
        return;
      }
      mem_.push_back(p);
      host_.emplace_back(bytes / sizeof(float), 0.0f);
      if (!Cuda().Copy(p, host_.back().data(), bytes)) {
        status_ = llm_datadist::Status(llm_datadist::LLM_FAILED,
                                       "--device cuda: zeroing device memory failed");
        return;
      }
      view = host_.back().data();
    } else {
      status_ = dd.AllocHostMemory(bytes, &p);
      if (!status_.ok()) return;
      std::memset(p, 0, bytes);
      mem_.push_back(p);
      view = static_cast<float*>(p);
    }
    addrs.push_back(reinterpret_cast<uint64_t>(p));
    (t % 2 == 0 ? view_.k : view_.v).push_back(view);
  }
  view_.num_blocks = pool_blocks;
  llm_datadist::CacheDesc desc;
  desc.placement =
      device_ ? llm_datadist::CachePlacement::kDevice : llm_datadist::CachePlacement::kHost;
  desc.num_tensors = static_cast<uint32_t>(2 * m.layers);
  desc.data_type = llm_datadist::DT_FLOAT;
  desc.shape = {pool_blocks, m.block_size, m.kv_heads, m.head_dim};
  llm_datadist::RegisterCfg cfg;
  cfg.blocks_model_id = 0;
  status_ = dd.RegisterKvCache(desc, addrs, cfg, cache_id_);
  for (int b = 0; b < pool_blocks; ++b) free_.push_back(b);
}

KvStore::~KvStore() {
  if (cache_id_ != 0) (void)dd_.UnregisterKvCache(cache_id_);
  for (void* p : mem_) {
    if (device_) {
      (void)Cuda().Free(reinterpret_cast<uintptr_t>(p));
    } else {
      (void)dd_.FreeHostMemory(p);
    }
  }
}

std::string KvStore::Upload(int layer, const std::vector<int32_t>& blocks) {
  return Copy(layer, blocks, true);
}
std::string KvStore::Download(const std::vector<int32_t>& blocks) {
  return Copy(-1, blocks, false);
}

// One driver copy per run of consecutive blocks of each tensor.
std::string KvStore::Copy(int layer, const std::vector<int32_t>& blocks, bool to_device) {
  if (!device_) return "";
  const size_t bb = m_.block_bytes();
  const int first = layer < 0 ? 0 : 2 * layer;
  const int last = layer < 0 ? 2 * m_.layers : 2 * layer + 2;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
    const size_t off = static_cast<size_t>(blocks[i]) * bb, n = (j - i) * bb;
    if (blocks[i] < 0 || blocks[j - 1] >= pool_blocks_) return "block outside the pool";
    for (int t = first; t < last; ++t) {
      auto* dev = static_cast<uint8_t*>(mem_[t]) + off;
      auto* host = reinterpret_cast<uint8_t*>(host_[t].data()) + off;
      if (!(to_device ? Cuda().Copy(dev, host, n) : Cuda().Copy(host, dev, n))) {
        return std::string("--device cuda: copying KV blocks ") +
               (to_device ? "to" : "from") + " the device failed";
      }
    }
    i = j;
  }
  return "";
}

llm_datadist::Cache KvStore::cache() const {
  llm_datadist::Cache c;
  c.cache_id = cache_id_;
  return c;
}

std::vector<int32_t> KvStore::Alloc(int n, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (n > pool_blocks_) return {};
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                    [&] { return static_cast<int>(free_.size()) >= n; })) {
    return {};
  }
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(free_.front());
    free_.pop_front();
  }
  return out;
}

void KvStore::Free(const std::vector<int32_t>& blocks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t b : blocks) free_.push_back(b);
  }
  cv_.notify_all();
}

int KvStore::free_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

uint64_t KvStore::Hash(const std::vector<int32_t>& blocks, int tokens) const {
  return HashKv(view_, m_, blocks, tokens);
}

uint64_t HashKv(const KvView& kv, const ModelConfig& m, const std::vector<int32_t>& blocks,
                int tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  const size_t slot = static_cast<size_t>(m.kv_heads) * m.head_dim * sizeof(float);
  for (int l = 0; l < m.layers; ++l) {
    for (const float* base : {kv.k[l], kv.v[l]}) {
      for (int p = 0; p < tokens; ++p) {
        const auto* bytes = reinterpret_cast<const uint8_t*>(base) +
                            static_cast<size_t>(blocks[p / m.block_size]) * m.block_bytes() +
                            static_cast<size_t>(p % m.block_size) * slot;
        for (size_t i = 0; i + 8 <= slot; i += 8) {  // slot is a multiple of 8 bytes
          uint64_t w;
          std::memcpy(&w, bytes + i, 8);
          h ^= w;
          h *= 0x100000001b3ull;
        }
      }
    }
  }
  return h;
}

llm_datadist::Status InitWorkerInstance(llm_datadist::LlmDataDist& dd, const DemoOptions& o,
                                        const std::string& listen_ip) {
  namespace opt = llm_datadist::options;
  const std::string link = o.link == "tcp" ? "TCP" : "SHM";
  return dd.Initialize({{opt::kListenIpInfo, listen_ip + ":0"},
                        {opt::kGlobalResourceConfig, "{\"LinkType\":\"" + link + "\"}"},
                        {opt::kSyncKvCacheWaitTime, "30000"}});
}

std::string LinkLine(llm_datadist::LlmDataDist& dd, uint64_t cluster, const std::string& ip,
                     const std::string& port) {
  llm_datadist::ClusterInfo ci;
  ci.remote_cluster_id = cluster;
  ci.remote_ip_infos.push_back({ip, static_cast<uint16_t>(std::stoi(port))});
  std::vector<llm_datadist::Status> rets;
  llm_datadist::Status s = dd.LinkLlmClusters({ci}, rets, 5000);
  return s.ok() ? "linked" : "error -1 link: " + s.ToString();
}

void ServeCommands(const std::function<void(const std::vector<std::string>&)>& handle) {
  std::string buf, line;
  while (ReadLine(0, buf, line)) {
    auto f = Split(line);
    if (f.empty()) continue;
    try {
      handle(f);
    } catch (const std::exception& e) {
      WriteLine(1, "error -1 bad command '" + line + "': " + e.what());
    }
  }
}

}  // namespace pd
