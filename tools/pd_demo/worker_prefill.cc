// hixl-pd-demo's prefill worker: computes prompts layer by layer into its
// paged KV cache and moves the KV to the decode worker.
//
// Commands (stdin) -> answers (stdout):
//   link IP PORT CACHE       -> "linked" (push mode: we write into decode's cache CACHE)
//   push R P B...            -> later "pushed R FIRST CSTART CEND HASH (LSTART LEND TPOST TDONE)*L"
//       prefill request R (P prompt tokens) while each computed layer is pushed into
//       decode blocks B... (TransferCacheAsync: layer l moves once its gate opened)
//   prefill R P              -> "ready R FIRST CSTART CEND HASH N B..." (pull mode; the
//       blocks are held until decode's pull of them is reported by an event)
//   before IP PORT           -> "beforelinked" (a plain TCP socket to decode)
//   stage R P                -> "sent R FIRST CSTART CEND HASH SSTART SEND" (the before path:
//       gather into a host buffer, serialize, send)
//   EOF                      -> exit
// Errors: "error R MESSAGE" (R is -1 when no request applies).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include "common.h"

namespace pd {
namespace {

using namespace llm_datadist;

struct Layered {
  int64_t start = 0, end = 0;
};

// Opens the gate of layer l once the compute loop has finished it.
class Gates {
 public:
  explicit Gates(int layers) : done_(layers, false) {}
  void Open(int l) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[l] = true;
    }
    cv_.notify_all();
  }
  bool Wait(uint32_t l, int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_[l]; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> done_;
};

class PrefillWorker {
 public:
  explicit PrefillWorker(const DemoOptions& o)
      : o_(o), model_(o.model), dd_(1, LlmRole::kPrompt) {}

  int Run() {
    Status s = InitWorkerInstance(dd_, o_, o_.prefill_ip);
    if (!s.ok()) return Fail("Initialize: " + s.ToString());
    store_ = std::make_unique<KvStore>(dd_, o_.model, o_.PoolBlocks(), o_.device == "cuda");
    if (!store_->status().ok()) return Fail("KV cache: " + store_->status().ToString());
    (void)dd_.SetKvTransferCallback([this](const KvTransferEvent& ev) { OnEvent(ev); });
    WriteLine(1, "READY " + dd_.LocalAddress());
    ServeCommands([this](const std::vector<std::string>& f) { Handle(f); });
    for (auto& t : reapers_) t.join();
    if (sock_ >= 0) close(sock_);
    (void)dd_.SetKvTransferCallback(nullptr);
    store_.reset();
    dd_.Finalize();
    return 0;
  }

 private:
  int Fail(const std::string& why) {
    WriteLine(1, "error -1 " + why);
    return 1;
  }

  void Handle(const std::vector<std::string>& f) {
    const std::string& cmd = f[0];
    if (cmd == "link") {
      dst_cache_ = std::stoll(f[3]);
      WriteLine(1, LinkLine(dd_, 2, f[1], f[2]));
    } else if (cmd == "push") {
      Push(std::stoi(f[1]), std::stoi(f[2]), ParseInts(f, 3, f.size() - 3));
    } else if (cmd == "prefill") {
      PrefillForPull(std::stoi(f[1]), std::stoi(f[2]));
    } else if (cmd == "before") {
      ConnectBefore(f[1], std::stoi(f[2]));
    } else if (cmd == "stage") {
      Stage(std::stoi(f[1]), std::stoi(f[2]));
    } else {
      WriteLine(1, "error -1 unknown command " + cmd);
    }
  }

  // Embed + every layer (calling after_layer(l) when layer l is done, and
  // with device caches once its blocks are on the device) + sample. Throws
  // when a copy to the device fails.
  int32_t Compute(int r, int p, const std::vector<int32_t>& table, std::vector<Layered>& times,
                  const std::function<void(int)>& after_layer) {
    const std::vector<int32_t> prompt = MakePrompt(o_.model.seed, r, p, o_.model.vocab);
    std::vector<float> hidden(static_cast<size_t>(p) * o_.model.hidden());
    model_.Embed(prompt.data(), p, hidden.data());
    times.assign(o_.model.layers, {});
    for (int l = 0; l < o_.model.layers; ++l) {
      times[l].start = NowNs();
      model_.PrefillLayer(l, hidden.data(), p, store_->view(), table);
      if (std::string e = store_->Upload(l, table); !e.empty()) {
        throw std::runtime_error("request " + std::to_string(r) + ": " + e);
      }
      times[l].end = NowNs();
      if (after_layer) after_layer(l);
    }
    return model_.Sample(hidden.data() + static_cast<size_t>(p - 1) * o_.model.hidden());
  }

  void Push(int r, int p, const std::vector<int32_t>& dst_blocks) {
    const int n = o_.BlocksFor(p);
    if (static_cast<int>(dst_blocks.size()) != n) {
      WriteLine(1, "error " + std::to_string(r) + " push: wrong number of destination blocks");
      return;
    }
    std::vector<int32_t> table = store_->Alloc(n, 30000);
    if (table.empty()) {
      WriteLine(1, "error " + std::to_string(r) + " push: no free KV blocks");
      return;
    }
    auto gates = std::make_shared<Gates>(o_.model.layers);
    LayerTransferConfig cfg;
    cfg.dst_cluster_id = 2;
    cfg.dst_cache_id = dst_cache_;
    cfg.user_tag = std::to_string(r);
    std::shared_ptr<KvTransferTask> task;
    Status s = dd_.TransferCacheAsync(
        store_->cache(), [gates](uint32_t l, int32_t timeout) { return gates->Wait(l, timeout); },
        {cfg}, ToU64(table), ToU64(dst_blocks), task);
    if (!s.ok()) {
      store_->Free(table);
      WriteLine(1, "error " + std::to_string(r) + " push: " + s.ToString());
      return;
    }
    std::vector<Layered> times;
    const int64_t cstart = NowNs();
    int32_t first = Compute(r, p, table, times, [&](int l) { gates->Open(l); });
    const int64_t cend = NowNs();
    const uint64_t hash = store_->Hash(table, p);
    // The KV moves on; report when it has landed, and free our blocks then.
    reapers_.emplace_back([this, r, first, cstart, cend, hash, table, times, task] {
      Status st = task->Wait(-1);
      store_->Free(table);
      if (!st.ok()) {
        WriteLine(1, "error " + std::to_string(r) + " push: " + st.ToString());
        return;
      }
      std::string line = "pushed " + std::to_string(r) + " " + std::to_string(first) + " " +
                         std::to_string(cstart) + " " + std::to_string(cend) + " " +
                         std::to_string(hash);
      auto lt = task->LayerTimes();
      for (int l = 0; l < o_.model.layers; ++l) {
        int64_t posted = l < static_cast<int>(lt.size()) ? lt[l].posted_ns : 0;
        int64_t done = l < static_cast<int>(lt.size()) ? lt[l].done_ns : 0;
        line += " " + std::to_string(times[l].start) + " " + std::to_string(times[l].end) + " " +
                std::to_string(posted) + " " + std::to_string(done);
      }
      WriteLine(1, line);
    });
  }

  void PrefillForPull(int r, int p) {
    std::vector<int32_t> table = store_->Alloc(o_.BlocksFor(p), 30000);
    if (table.empty()) {
      WriteLine(1, "error " + std::to_string(r) + " prefill: no free KV blocks");
      return;
    }
    {
      std::lock_guard<std::mutex> lock(held_mu_);
      held_[std::to_string(r)] = table;
    }
    std::vector<Layered> times;
    const int64_t cstart = NowNs();
    int32_t first = Compute(r, p, table, times, nullptr);
    const int64_t cend = NowNs();
    WriteLine(1, "ready " + std::to_string(r) + " " + std::to_string(first) + " " +
                     std::to_string(cstart) + " " + std::to_string(cend) + " " +
                     std::to_string(store_->Hash(table, p)) + " " + std::to_string(table.size()) +
                     " " + JoinInts(table));
  }

  // Pull mode: decode tells us (after the data) which request it pulled.
  void OnEvent(const KvTransferEvent& ev) {
    if (ev.kind != KvTransferEvent::Kind::kPulled) return;
    std::vector<int32_t> blocks;
    {
      std::lock_guard<std::mutex> lock(held_mu_);
      auto it = held_.find(ev.user_tag);
      if (it == held_.end()) return;
      blocks = std::move(it->second);
      held_.erase(it);
    }
    store_->Free(blocks);
  }

  void ConnectBefore(const std::string& ip, int port) {
    sock_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    int one = 1;
    setsockopt(sock_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1 ||
        connect(sock_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      WriteLine(1, "error -1 before: cannot connect to " + ip + ":" + std::to_string(port));
      return;
    }
    WriteLine(1, "beforelinked");
  }

  // The "before" path: gather the KV into a host buffer, serialize it
  // (a header and the layers' K and V rows), send it over the socket.
  void Stage(int r, int p) {
    std::vector<int32_t> table = store_->Alloc(o_.BlocksFor(p), 30000);
    if (table.empty() || sock_ < 0) {
      WriteLine(1, "error " + std::to_string(r) + " stage: no free KV blocks or no socket");
      if (!table.empty()) store_->Free(table);
      return;
    }
    std::vector<Layered> times;
    const int64_t cstart = NowNs();
    int32_t first = Compute(r, p, table, times, nullptr);
    const int64_t cend = NowNs();
    const int64_t sstart = NowNs();
    // Device caches: the staged path starts with the blocks' copy to the host.
    if (std::string e = store_->Download(table); !e.empty()) {
      store_->Free(table);
      WriteLine(1, "error " + std::to_string(r) + " stage: " + e);
      return;
    }
    const size_t row = static_cast<size_t>(o_.model.kv_heads) * o_.model.head_dim * sizeof(float);
    const uint64_t payload = static_cast<uint64_t>(o_.model.layers) * 2 * p * row;
    std::vector<uint8_t> msg(32 + payload);
    uint64_t hdr[4] = {0x4B56424546u, static_cast<uint64_t>(r), static_cast<uint64_t>(p),
                       static_cast<uint64_t>(static_cast<uint32_t>(first))};
    std::memcpy(msg.data(), hdr, sizeof(hdr));
    uint8_t* out = msg.data() + 32;
    for (int l = 0; l < o_.model.layers; ++l) {
      for (const float* base : {store_->view().k[l], store_->view().v[l]}) {
        for (int t = 0; t < p; ++t) {
          std::memcpy(out,
                      reinterpret_cast<const uint8_t*>(base) +
                          static_cast<size_t>(table[t / o_.model.block_size]) * o_.model.block_bytes() +
                          static_cast<size_t>(t % o_.model.block_size) * row,
                      row);
          out += row;
        }
      }
    }
    size_t off = 0;
    while (off < msg.size()) {
      ssize_t n = send(sock_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
      if (n <= 0) {
        store_->Free(table);
        WriteLine(1, "error " + std::to_string(r) + " stage: send failed");
        return;
      }
      off += static_cast<size_t>(n);
    }
    const int64_t send_end = NowNs();
    const uint64_t hash = store_->Hash(table, p);  // after the send: off the critical path
    store_->Free(table);
    WriteLine(1, "sent " + std::to_string(r) + " " + std::to_string(first) + " " +
                     std::to_string(cstart) + " " + std::to_string(cend) + " " +
                     std::to_string(hash) + " " + std::to_string(sstart) + " " +
                     std::to_string(send_end));
  }

  const DemoOptions& o_;
  Model model_;
  LlmDataDist dd_;
  std::unique_ptr<KvStore> store_;
  int64_t dst_cache_ = 0;
  std::vector<std::thread> reapers_;
  std::mutex held_mu_;
  std::map<std::string, std::vector<int32_t>> held_;
  int sock_ = -1;
};

}  // namespace

int RunPrefillWorker(const DemoOptions& o) { return PrefillWorker(o).Run(); }

}  // namespace pd
