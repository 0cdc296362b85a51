// hixl-pd-demo's decode worker: owns the block table requests decode from,
// learns that a request's KV is complete from LLM-DataDist's event (sent
// after the data), and generates the remaining tokens.
//
// Commands (stdin) -> answers (stdout):
//   link IP PORT             -> "linked" (pull mode: we read prefill's cache)
//   alloc R N                -> "blocks R B..." or "full R" (no N free blocks now)
//   decode R P FIRST         -> later "done R HASH KVREADY PULLSTART DEND TOKENS..."
//       push mode: wait for the event saying R's KV landed, then decode
//   pull R P FIRST N B...    -> later "done ..." (pull prefill's blocks B..., then decode)
//   (before path)            -> "done ..." for each request received on the socket
//   EOF                      -> exit
// It prints "READY <engine address> <before-path port>" first. With
// --corrupt it flips one byte of the first received block of the first
// request (a test of the checks).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "common.h"

namespace pd {
namespace {

using namespace llm_datadist;

struct Job {
  enum Kind { kPushed, kPull, kBefore } kind = kPushed;
  int r = 0;
  int p = 0;
  int32_t first = 0;
  std::vector<int32_t> blocks;      // ours
  std::vector<int32_t> src_blocks;  // prefill's (pull)
  int64_t kv_ready = 0;             // before path: set when copied in
  int64_t start = 0;                // pull/receive start
};

class DecodeWorker {
 public:
  explicit DecodeWorker(const DemoOptions& o)
      : o_(o), model_(o.model), dd_(2, LlmRole::kDecoder) {}

  int Run() {
    Status s = InitWorkerInstance(dd_, o_, o_.decode_ip);
    if (!s.ok()) return Fail("Initialize: " + s.ToString());
    store_ = std::make_unique<KvStore>(dd_, o_.model, o_.PoolBlocks(), o_.device == "cuda");
    if (!store_->status().ok()) return Fail("KV cache: " + store_->status().ToString());
    (void)dd_.SetKvTransferCallback([this](const KvTransferEvent& ev) { OnEvent(ev); });
    if (!Listen()) return Fail("before path: cannot listen");
    WriteLine(1, "READY " + dd_.LocalAddress() + " " + std::to_string(before_port_) + " " +
                     std::to_string(store_->cache_id()));
    std::thread worker([this] { DecodeLoop(); });
    std::thread receiver([this] { ReceiveLoop(); });
    ServeCommands([this](const std::vector<std::string>& f) { Handle(f); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker.join();
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    if (conn_fd_ >= 0) shutdown(conn_fd_, SHUT_RDWR);
    receiver.join();
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
      WriteLine(1, LinkLine(dd_, 1, f[1], f[2]));
    } else if (cmd == "alloc") {
      auto b = store_->Alloc(std::stoi(f[2]), 0);
      WriteLine(1, b.empty() ? "full " + f[1] : "blocks " + f[1] + " " + JoinInts(b));
      if (!b.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        allocated_[std::stoi(f[1])] = b;
      }
    } else if (cmd == "decode" || cmd == "pull") {
      Job j;
      j.kind = cmd == "decode" ? Job::kPushed : Job::kPull;
      j.r = std::stoi(f[1]);
      j.p = std::stoi(f[2]);
      j.first = std::stoi(f[3]);
      if (j.kind == Job::kPull) j.src_blocks = ParseInts(f, 5, std::stoul(f[4]));
      Enqueue(std::move(j));
    } else {
      WriteLine(1, "error -1 unknown command " + cmd);
    }
  }

  void Enqueue(Job j) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(j));
    }
    cv_.notify_all();
  }

  // Push mode: the event (after the data) tells us request R's KV is whole.
  void OnEvent(const KvTransferEvent& ev) {
    if (ev.kind != KvTransferEvent::Kind::kPushed) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kv_ready_[std::atoi(ev.user_tag.c_str())] = NowNs();
    }
    cv_.notify_all();
  }

  void DecodeLoop() {
    for (;;) {
      Job j;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Decode(j);
    }
  }

  void Decode(Job& j) {
    const std::string rs = std::to_string(j.r);
    if (j.kind == Job::kPushed) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return stop_ || kv_ready_.count(j.r) > 0; }) ||
          kv_ready_.count(j.r) == 0) {
        WriteLine(1, "error " + rs + " the KV of request " + rs + " never arrived");
        return;
      }
      j.kv_ready = kv_ready_[j.r];
      kv_ready_.erase(j.r);
      j.blocks = allocated_[j.r];
      allocated_.erase(j.r);
    } else if (j.kind == Job::kPull) {
      j.blocks = store_->Alloc(o_.BlocksFor(j.p), 30000);
      if (j.blocks.empty()) {
        WriteLine(1, "error " + rs + " pull: no free KV blocks");
        return;
      }
      KvCacheExtParam ext;
      ext.user_tag = rs;  // tells prefill which request's blocks it may free
      j.start = NowNs();
      Status s = dd_.PullKvBlocks(BlocksCacheKey{1, 0}, store_->cache(), ToU64(j.src_blocks),
                                  ToU64(j.blocks), ext);
      if (!s.ok()) {
        store_->Free(j.blocks);
        WriteLine(1, "error " + rs + " pull: " + s.ToString());
        return;
      }
      j.kv_ready = NowNs();
    }
    // Device caches: the received blocks from the device into the host copy
    // the model computes in (the hash below is of the device's bytes).
    if (std::string e = store_->Download(j.blocks); !e.empty()) {
      store_->Free(j.blocks);
      WriteLine(1, "error " + rs + " decode: " + e);
      return;
    }
    if (o_.corrupt && !corrupted_) {
      corrupted_ = true;
      reinterpret_cast<uint8_t*>(store_->view().k[0] +
                                 static_cast<size_t>(j.blocks[0]) * o_.model.block_bytes() / 4)[3] ^= 0x40;
    }
    const uint64_t hash = store_->Hash(j.blocks, j.p);
    std::vector<int32_t> tokens{j.first};
    int32_t tok = j.first;
    for (int pos = j.p; static_cast<int>(tokens.size()) < o_.gen_tokens; ++pos) {
      if (pos / o_.model.block_size >= static_cast<int>(j.blocks.size())) {
        auto more = store_->Alloc(1, 30000);
        if (more.empty()) {
          WriteLine(1, "error " + rs + " decode: no free KV block to grow into");
          store_->Free(j.blocks);
          return;
        }
        j.blocks.push_back(more[0]);
      }
      tok = model_.DecodeStep(tok, pos, store_->view(), j.blocks);
      tokens.push_back(tok);
    }
    const int64_t end = NowNs();
    store_->Free(j.blocks);  // finished: the blocks are reused by later requests
    WriteLine(1, "done " + rs + " " + std::to_string(hash) + " " + std::to_string(j.kv_ready) +
                     " " + std::to_string(j.start) + " " + std::to_string(end) + " " +
                     JoinInts(tokens));
  }

  bool Listen() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, o_.decode_ip.c_str(), &a.sin_addr) != 1) return false;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listen_fd_, 1) != 0) {
      return false;
    }
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    before_port_ = ntohs(a.sin_port);
    return true;
  }

  bool RecvAll(void* p, size_t n) {
    auto* b = static_cast<uint8_t*>(p);
    while (n > 0) {
      ssize_t k = recv(conn_fd_, b, n, 0);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  // The "before" path's receiving end: deserialize into a host buffer, then
  // copy every row into the block table.
  void ReceiveLoop() {
    conn_fd_ = accept(listen_fd_, nullptr, nullptr);
    if (conn_fd_ < 0) return;
    const size_t row = static_cast<size_t>(o_.model.kv_heads) * o_.model.head_dim * sizeof(float);
    for (;;) {
      uint64_t hdr[4];
      if (!RecvAll(hdr, sizeof(hdr))) break;
      Job j;
      j.kind = Job::kBefore;
      j.start = NowNs();
      j.r = static_cast<int>(hdr[1]);
      j.p = static_cast<int>(hdr[2]);
      j.first = static_cast<int32_t>(static_cast<uint32_t>(hdr[3]));
      if (hdr[0] != 0x4B56424546u || j.p <= 0 || j.p > (1 << 20)) {
        WriteLine(1, "error -1 before path: bad header");
        break;
      }
      std::vector<uint8_t> staging(static_cast<size_t>(o_.model.layers) * 2 * j.p * row);
      if (!RecvAll(staging.data(), staging.size())) break;
      j.blocks = store_->Alloc(o_.BlocksFor(j.p), 30000);
      if (j.blocks.empty()) {
        WriteLine(1, "error " + std::to_string(j.r) + " before path: no free KV blocks");
        continue;
      }
      const uint8_t* in = staging.data();
      for (int l = 0; l < o_.model.layers; ++l) {
        for (float* base : {store_->view().k[l], store_->view().v[l]}) {
          for (int t = 0; t < j.p; ++t) {
            std::memcpy(reinterpret_cast<uint8_t*>(base) +
                            static_cast<size_t>(j.blocks[t / o_.model.block_size]) *
                                o_.model.block_bytes() +
                            static_cast<size_t>(t % o_.model.block_size) * row,
                        in, row);
            in += row;
          }
        }
      }
      // Device caches: the rows go on to the device, as the decode's cache
      // lives there (and come back before decoding, as for the other paths).
      if (std::string e = store_->Upload(-1, j.blocks); !e.empty()) {
        store_->Free(j.blocks);
        WriteLine(1, "error " + std::to_string(j.r) + " before path: " + e);
        continue;
      }
      j.kv_ready = NowNs();
      Enqueue(std::move(j));
    }
  }

  const DemoOptions& o_;
  Model model_;
  LlmDataDist dd_;
  std::unique_ptr<KvStore> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Job> jobs_;
  std::map<int, int64_t> kv_ready_;
  std::map<int, std::vector<int32_t>> allocated_;
  bool corrupted_ = false;
  int listen_fd_ = -1;
  int conn_fd_ = -1;
  int before_port_ = 0;
};

}  // namespace

int RunDecodeWorker(const DemoOptions& o) { return DecodeWorker(o).Run(); }

}  // namespace pd
