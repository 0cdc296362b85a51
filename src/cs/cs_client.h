// A HiXL CS client: one engine per link, the server's memory list fetched at
// Connect, and batches striped over the links that are up (stripe.h).
//
// A batch is split into one engine transfer per link. It ends COMPLETED when
// every part did; a part whose link failed (the link is marked down) is
// striped again over the links still up; with none left, or when a part ends
// TIMEOUT or is refused by the server, the other parts are stopped first
// (CancelTransfer returns once no byte of them moves) and then the batch
// ends TIMEOUT or FAILED — nothing of it is written after that is reported.
// Sync batches are driven by their caller; async ones by each Query. A link
// that went down is tried again (ConnectAsync) at most every kReviveMs.
//
// Speed: each link's bytes per second, from the parts of sync batches of at
// least kMeasureBytes (moving average); links not measured yet count as the
// mean of those that are.
// Thread safety: every method may be called from any thread. Ownership: the
// client owns its engines and batches; registered memory stays the caller's.
#ifndef HIXL_CS_CS_CLIENT_H_
#define HIXL_CS_CS_CLIENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cs/cs_info.h"
#include "cs/stripe.h"
#include "hixl/hixl.h"
#include "hixl/hixl_cs.h"

namespace hixl::cs {

inline constexpr uint64_t kMinPiece = 256 * 1024;
inline constexpr uint64_t kMeasureBytes = 1024 * 1024;
inline constexpr int kReviveMs = 2000;
inline constexpr uint32_t kMaxBatchDescs = 1u << 20;

class Client {
 public:
  using Clock = std::chrono::steady_clock;
  struct LocalMem {
    uint64_t addr = 0;
    uint64_t size = 0;
    std::vector<hixl::MemHandle> handles;  // one per link engine
  };
  struct Batch;

  static Status Create(const HixlClientDesc& desc, const HixlClientConfig* config,
                       std::unique_ptr<Client>& out);
  ~Client();

  Status Connect(uint32_t timeout_ms);
  Status RemoteMem(CommMem** list, char*** tags, uint32_t* num);
  Status RegMem(const char* tag, const CommMem* mem, LocalMem*& out);
  Status UnregMem(LocalMem* mem);

  Status PostAsync(TransferOp op, const HixlOneSideOpDesc* descs, uint32_t n,
                   std::shared_ptr<Batch>& out);
  Status RunSync(TransferOp op, const HixlOneSideOpDesc* descs, uint32_t n, uint32_t timeout_ms);
  // Advances the batch and says where it stands; on TIMEOUT/FAILED `reason`.
  HixlCompleteStatus Query(Batch& b, std::string& reason);

  std::vector<HixlCSLinkStats> Stats();
  // Refuses new calls, closes the links (transfers under way on other
  // threads fail), waits for the calls under way, stops every batch and
  // finalizes the engines.
  void Shutdown();

  std::atomic<uint32_t> unqueried{0};  // async batches not yet reported ended

 private:
  struct Link {
    LinkType type = LinkType::AUTO;
    uint32_t protocol = 0;
    std::string transport;
    std::string local_addr;
    std::string remote_addr;  // the server endpoint's IP
    std::unique_ptr<Hixl> engine;
    // After Connect (guarded by mu_):
    std::string remote_engine;
    uint64_t generation = 0;
    bool up = false;
    bool reviving = false;
    Clock::time_point down_since{};
    double speed = 0;  // bytes per second; 0: not measured
    uint64_t in_flight = 0;
    uint64_t bytes = 0;
    uint64_t pieces = 0;
  };
  struct Sub;
  class Use;

  Client() = default;
  // Checks a batch; on success counts it as running (busy_) until Done().
  Status Check(const HixlOneSideOpDesc* descs, uint32_t n, std::vector<Piece>& pieces);
  void Done();
  // Each link's state for Stripe (links not measured yet count as the mean
  // of those that are), with its remote engine and generation. With mu_ held.
  std::vector<LinkLoad> LoadsLocked() const;
  // Plans `pieces` over the up links and posts a part per link; parts whose
  // link refuses at once are striped again. Called with b.mu held.
  Status Place(Batch& b, std::vector<Piece> pieces);
  void Drive(Batch& b);                                                     // with b.mu held
  void Finish(Batch& b, HixlCompleteStatus st, const std::string& reason);  // with b.mu held
  // Whether a part's failure means its link is gone (NOT_CONNECTED, or
  // FAILED/CANCELLED with the engine no longer holding the link).
  bool LinkLost(size_t k, const Status& why);
  void LinkDown(size_t k, const Status& why);
  void ReviveLinks();
  // kNo: the batch needs several links; kAgain: its link failed, others are up.
  enum class Inline { kNo, kAgain, kDone };
  Inline RunInline(TransferOp op, std::vector<Piece>& pieces, int64_t timeout_ms, Status& result);

  std::mutex connect_mu_;  // one Connect at a time
  std::mutex mu_;          // guards the links' state, local_, batches_, busy_, flags
  std::vector<Link> links_;
  std::string server_;  // "ip:port"
  bool connected_ = false;
  bool shut_ = false;
  std::map<std::string, std::string> options_;
  std::map<uint64_t, std::unique_ptr<LocalMem>> local_;  // by start address
  std::map<uint64_t, uint64_t> remote_;                  // server memory: start -> size
  std::set<std::shared_ptr<Batch>> batches_;             // unfinished batches
  uint64_t busy_ = 0;             // batches between Check and their end (UnregMem waits for 0)
  uint64_t users_ = 0;            // engine calls under way (Use); Shutdown waits for 0
  std::condition_variable idle_;  // users_ reached 0
  // GetRemoteMem's lists (built at Connect, stable until destruction).
  std::vector<CommMem> remote_list_;
  std::vector<std::string> remote_tags_;
  std::vector<char*> remote_tag_ptrs_;
};

}  // namespace hixl::cs

#endif  // HIXL_CS_CS_CLIENT_H_
