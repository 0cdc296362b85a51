// tests/load/load_peer.cc — hixl_load_peer: the process the load tests start
// many of. One executable, two roles, chosen by the commands it is sent: a
// TARGET registers memory and checks every notification it receives; an
// INITIATOR drives a bounded stream of transfers with notifications into a
// target and checks every byte it reads. It speaks the protocol of
// tests/peer_process.h (print "READY <engine>", then one reply line per
// command line on stdin), so the tests start it with hixl_test::PeerProcess.
//
// Usage: hixl_load_peer [--listen ADDR] [--opt Key=Value]...
//   (ADDR defaults to 127.0.0.1:0; the options go to Initialize, e.g.
//   --opt LinkType=TCP for an initiator.)
//
// Target commands:
//   target n=N slice=S pat=P patseed=X
//       Sets up regions for N initiators: each owns a slice of S bytes, the
//       even ones in an AllocMem region ("WA", memory peers map), the odd ones
//       in plain mmap memory registered READ|WRITE ("WR"); a READ-only region
//       of P bytes filled with FillPattern(X) ("pattern"); a READ-only ack
//       region of one 64-bit word per initiator. Starts the watcher thread,
//       which takes every notification as it appears (GetNotifies every
//       ~100 us), hashes the bytes it names and compares with its message
//       (see load_common.h), records it per initiator and seq, and publishes
//       in ack word i how many of initiator i's seqs are verified without a
//       gap, so that initiator knows which slot bytes it may reuse.
//       -> OK wa=<addr> wr=<addr> pat=<addr> ack=<addr>
//   stats    -> OK recv= distinct= dup= early= corrupt= bad= bytes= first=<first problem>
//       early: the hash was wrong when the notification appeared but right
//       a little later (the notification overtook its data); corrupt: never
//       right; bad: a name or message not in the load format, an unknown
//       initiator, or an initiator whose sender name changed.
//   counts   -> OK <distinct_0>/<gapless_0> <distinct_1>/<gapless_1> ...
//   waitcount TOTAL TIMEOUT_MS   waits until `distinct` reaches TOTAL, then as stats
//
// Initiator commands:
//   connect ENGINE [TIMEOUT_MS]      disconnect ENGINE [TIMEOUT_MS]
//   linktype ENGINE                  -> OK <LinkTypeName>
//   run id=I target=E base=B slice=S pat=P patsize=PS patseed=X ack=A count=N
//       [minlen=4096] [maxlen=16777216] [window=4] [preads=25] [readbacks=30]
//       [seed=1] [deadline=120000] [optimeout=60000]
//       N operations against target E, at most `window` in flight
//       (TransferAsync), each with a notification: `preads`% are READs of a
//       random range of the pattern region (checked here against the
//       pattern), the others WRITEs of a fresh pattern into a range of this
//       initiator's slice [B, B+S), `readbacks`% of which are then READ back
//       (checked here too). Lengths are log-uniform in [minlen, maxlen], one
//       in 16 exactly maxlen, one in 4 an odd length. Slice bytes are reused
//       only after the target's ack word (READ from A + 8*I) says their
//       notifications were verified. Stops issuing after `deadline` ms.
//       -> OK link= issued= sent= writes= readbacks= preads= bytes= ackreads= ms= errors= first=
//   cycles targets=E1,E2.. remotes=A1,A2.. n=N [len=4096]
//       N rounds of: Connect to every target, WRITE a fresh pattern of len
//       bytes to its address, READ it back and compare, then Disconnect from
//       every target (GetConnectStatus must then say NOT_CONNECTED). Stops
//       at the first failure.
//       -> OK rounds= connects= ms=  | ERR round R target E: <what>
//   notify target=E name=N msg=M [remote=A len=L seed=S delay=MS]
//       SendNotify (lets a test feed the target bad notifications on
//       purpose); with remote=, `delay` ms later also a plain WRITE of L
//       bytes of FillPattern(S) to A: data that arrives after its notification.
// Both: ping -> OK pong; quit (also stdin EOF): Finalize, exit 0.
//
// The engine may log to stdout; replies go to a private duplicate of the
// original stdout and fd 1 is pointed at stderr before the engine starts.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"
#include "load_common.h"

#if defined(__SANITIZE_ADDRESS__)
#define HIXL_LOAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HIXL_LOAD_ASAN 1
#endif
#endif

#ifdef HIXL_LOAD_ASAN
// A small quarantine keeps freed memory from piling up in RSS, so the
// resource-bound tests measure the engine and not ASan's delay of frees.
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=8"; }
#endif

namespace {

using Clock = std::chrono::steady_clock;
using hixl::Status;

FILE* g_reply = nullptr;

void Reply(const std::string& line) {
  std::string l = line;
  for (char& c : l) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(g_reply, "%s\n", l.c_str());
  std::fflush(g_reply);
}

std::string Err(const Status& s) { return "ERR " + s.ToString(); }

long long MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Anonymous private memory, zero-filled, page-aligned, unmapped on destruction.
class Mapping {
 public:
  explicit Mapping(size_t len) : len_(std::max<size_t>(len, 4096)) {
    void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<unsigned char*>(p);
  }
  ~Mapping() {
    if (data_) munmap(data_, len_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  unsigned char* data() const { return data_; }

 private:
  size_t len_;
  unsigned char* data_ = nullptr;
};

// A heap buffer of len bytes (8-byte aligned) for one transfer's local side.
class LocalBuf {
 public:
  explicit LocalBuf(size_t len) : words_(new uint64_t[len / 8 + 1]), len_(len) {}
  unsigned char* data() { return reinterpret_cast<unsigned char*>(words_.get()); }
  uintptr_t addr() { return reinterpret_cast<uintptr_t>(data()); }
  size_t len() const { return len_; }

 private:
  std::unique_ptr<uint64_t[]> words_;
  size_t len_;
};

// ===========================================================================
// Target

class Target {
 public:
  explicit Target(hixl::Hixl& e) : engine_(e) {}
  ~Target() { Stop(); }

  void Stop() {
    stop_.store(true);
    if (watcher_.joinable()) watcher_.join();
  }

  std::string Setup(const hixl_load::Args& a) {
    if (watcher_.joinable()) return "ERR target already set up";
    bool ok = true;
    n_ = a.U64("n", 0, &ok);
    slice_ = a.U64("slice", 0, &ok);
    pat_size_ = a.U64("pat", 0, &ok);
    pat_seed_ = a.U64("patseed", 1, &ok);
    if (!ok || n_ == 0 || n_ > 4096 || slice_ == 0 || slice_ % 8 != 0 || pat_size_ == 0 ||
        pat_size_ % 8 != 0)
      return "ERR usage: target n=N slice=S pat=P patseed=X (S, P multiples of 8)";
    const size_t wa_len = (n_ + 1) / 2 * slice_;
    const size_t wr_len = n_ / 2 * slice_;
    void* wa = nullptr;
    if (Status s = engine_.AllocMem(wa_len, hixl::MemType::MEM_HOST, &wa); !s.ok()) return Err(s);
    wa_ = static_cast<unsigned char*>(wa);
    if (wr_len > 0) {
      wr_map_ = std::make_unique<Mapping>(wr_len);
      if (!wr_map_->data()) return "ERR mmap failed";
      wr_ = wr_map_->data();
      hixl::MemHandle h = 0;
      Status s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(wr_), wr_len},
                                     hixl::MemType::MEM_HOST, h, hixl::MEM_PERM_READ_WRITE);
      if (!s.ok()) return Err(s);
    }
    pat_map_ = std::make_unique<Mapping>(pat_size_);
    ack_map_ = std::make_unique<Mapping>(n_ * 8);
    if (!pat_map_->data() || !ack_map_->data()) return "ERR mmap failed";
    hixl_test::FillPattern(pat_map_->data(), pat_size_, pat_seed_);
    ack_ = reinterpret_cast<uint64_t*>(ack_map_->data());
    hixl::MemHandle h = 0;
    Status s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(pat_map_->data()), pat_size_},
                                   hixl::MemType::MEM_HOST, h, hixl::MEM_PERM_READ);
    if (!s.ok()) return Err(s);
    s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(ack_), (n_ * 8 + 4095) / 4096 * 4096},
                            hixl::MemType::MEM_HOST, h, hixl::MEM_PERM_READ);
    if (!s.ok()) return Err(s);
    sources_.assign(n_, Source{});
    watcher_ = std::thread([this] { Watch(); });
    auto addr = [](const void* p) { return std::to_string(reinterpret_cast<uintptr_t>(p)); };
    return "OK wa=" + addr(wa_) + " wr=" + addr(wr_) + " pat=" + addr(pat_map_->data()) +
           " ack=" + addr(ack_);
  }

  std::string Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream o;
    o << "OK recv=" << recv_ << " distinct=" << distinct_ << " dup=" << dup_ << " early=" << early_
      << " corrupt=" << corrupt_ << " bad=" << bad_ << " bytes=" << bytes_
      << " first=" << (first_.empty() ? "-" : first_);
    return o.str();
  }

  std::string Counts() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = "OK";
    for (const Source& s : sources_) {
      out += " " + std::to_string(s.distinct) + "/" + std::to_string(s.gapless);
    }
    return out;
  }

  std::string WaitCount(uint64_t total, int64_t timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, deadline, [&] { return distinct_ >= total; });
    }
    return Stats();
  }

 private:
  struct Source {
    std::vector<bool> seen;  // by seq
    uint64_t distinct = 0;
    uint64_t gapless = 0;  // seqs [0, gapless) all seen
    std::string from;
  };

  void Problem(uint64_t& counter, const std::string& what) {
    ++counter;
    if (first_.empty()) first_ = what;
  }

  void Watch() {
    std::vector<hixl::NotifyDesc> batch;
    while (!stop_.load()) {
      batch.clear();
      Status s = engine_.GetNotifies(batch);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        Problem(bad_, "GetNotifies: " + s.ToString());
        return;
      }
      if (batch.empty()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      for (const auto& n : batch) Check(n);
      cv_.notify_all();
    }
  }

  // Region bytes a notification names, or nullptr (bad).
  const unsigned char* Locate(char kind, uint64_t init, uint64_t off, uint64_t len) const {
    if (kind == 'p') {
      if (off > pat_size_ || len > pat_size_ - off) return nullptr;
      return pat_map_->data() + off;
    }
    if (off > slice_ || len > slice_ - off) return nullptr;
    const unsigned char* base = (init % 2 == 0 ? wa_ : wr_) + init / 2 * slice_;
    return base + off;
  }

  void Check(const hixl::NotifyDesc& n) {
    // name "<kind>.<init>.<seq>", msg "<off>:<len>:<hash>"
    char kind = 0;
    unsigned long long init = 0, seq = 0, off = 0, len = 0;
    char hash[17] = {0};
    int used = 0;
    bool parsed = std::sscanf(n.name.c_str(), "%c.%llu.%llu%n", &kind, &init, &seq, &used) == 3 &&
                  static_cast<size_t>(used) == n.name.size() &&
                  (kind == 'w' || kind == 'b' || kind == 'p');
    used = 0;
    parsed = parsed &&
             std::sscanf(n.notify_msg.c_str(), "%llu:%llu:%16[0-9a-f]%n", &off, &len, hash,
                         &used) == 3 &&
             static_cast<size_t>(used) == n.notify_msg.size() && std::strlen(hash) == 16;
    const unsigned char* bytes = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++recv_;
      if (!parsed || init >= n_ || seq >= (1ull << 26)) {
        Problem(bad_,
                "notification '" + n.name + "' '" + n.notify_msg + "' not in the load format");
        return;
      }
      bytes = Locate(kind, init, off, len);
      if (bytes == nullptr) {
        Problem(bad_,
                "notification " + n.name + " names bytes outside its region: " + n.notify_msg);
        return;
      }
      Source& src = sources_[init];
      if (src.from.empty()) {
        src.from = n.from;
      } else if (src.from != n.from) {
        Problem(bad_, "initiator " + std::to_string(init) + " sent from " + n.from + " after " +
                          src.from);
      }
      if (seq < src.seen.size() && src.seen[seq]) {
        Problem(dup_, "notification " + n.name + " delivered twice");
        return;  // its slot bytes may already hold a later write
      }
    }
    // Hash outside the lock: stats stay responsive while 16 MiB are hashed.
    const std::string want(hash);
    bool early = false;
    bool good = hixl_test::HashHex(hixl_test::Fnv1a64(bytes, len)) == want;
    if (!good) {
      // Wrong now: right a little later means the notification overtook its
      // data; never right means the data is wrong. (The initiator reuses the
      // bytes only after the ack below, so nothing else changes them.)
      const auto until = Clock::now() + std::chrono::milliseconds(2000);
      while (!good && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        good = hixl_test::HashHex(hixl_test::Fnv1a64(bytes, len)) == want;
      }
      early = good;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!good) {
      Problem(corrupt_,
              "notification " + n.name + " " + n.notify_msg + ": the bytes never matched the hash");
    } else if (early) {
      Problem(early_, "notification " + n.name + " " + n.notify_msg +
                          " was seen before its data was in place");
    }
    bytes_ += len;
    Source& src = sources_[init];
    if (src.seen.size() <= seq) src.seen.resize(std::max<size_t>(seq + 1, src.seen.size() * 2));
    src.seen[seq] = true;
    ++src.distinct;
    ++distinct_;
    while (src.gapless < src.seen.size() && src.seen[src.gapless]) ++src.gapless;
    __atomic_store_n(&ack_[init], src.gapless, __ATOMIC_RELEASE);
  }

  hixl::Hixl& engine_;
  uint64_t n_ = 0;
  size_t slice_ = 0, pat_size_ = 0;
  uint64_t pat_seed_ = 0;
  unsigned char* wa_ = nullptr;  // AllocMem: released by Finalize
  unsigned char* wr_ = nullptr;
  std::unique_ptr<Mapping> wr_map_, pat_map_, ack_map_;
  uint64_t* ack_ = nullptr;

  std::thread watcher_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Source> sources_;
  uint64_t recv_ = 0, distinct_ = 0, dup_ = 0, early_ = 0, corrupt_ = 0, bad_ = 0, bytes_ = 0;
  std::string first_;
};

// ===========================================================================
// Initiator

// Byte ranges of the slice in use, oldest first, reused in ring order. An
// entry is freed once no local operation uses it and the target has verified
// every notification up to the last one that named it.
class Ring {
 public:
  struct Entry {
    size_t off = 0, len = 0;
    uint64_t last_seq = 0;
    int pending = 0;  // local operations (WRITE, read-back) not yet ended
  };

  explicit Ring(size_t cap) : cap_(cap) {}

  // Returns the id of a new entry of len bytes (64-byte aligned), or nothing
  // when the free part of the ring is too small now.
  std::optional<uint64_t> Alloc(size_t len) {
    if (len > cap_) return std::nullopt;
    size_t off;
    if (live_.empty()) {
      off = 0;
    } else {
      const size_t tail = live_.front().off;
      const size_t head = (live_.back().off + live_.back().len + 63) / 64 * 64;
      const bool wrapped = live_.back().off < tail;
      if (!wrapped && head + len <= cap_) {
        off = head;
      } else if (!wrapped && len <= tail) {
        off = 0;
      } else if (wrapped && head + len <= tail) {
        off = head;
      } else {
        return std::nullopt;
      }
    }
    live_.push_back(Entry{off, len, 0, 0});
    return base_id_ + live_.size() - 1;
  }
  Entry& at(uint64_t id) { return live_[id - base_id_]; }
  // Frees the oldest entries that are done; returns whether the oldest
  // entry now waits only for the target's ack.
  bool Release(uint64_t gapless) {
    while (!live_.empty() && live_.front().pending == 0 && live_.front().last_seq < gapless) {
      live_.pop_front();
      ++base_id_;
    }
    return !live_.empty() && live_.front().pending == 0;
  }
  bool empty() const { return live_.empty(); }

 private:
  size_t cap_;
  uint64_t base_id_ = 0;
  std::deque<Entry> live_;
};

class Initiator {
 public:
  explicit Initiator(hixl::Hixl& e) : engine_(e) {}

  std::string Run(const hixl_load::Args& a);
  std::string Cycles(const hixl_load::Args& a);

 private:
  enum class Kind { kWrite, kReadBack, kPatternRead };
  struct Op {
    Kind kind = Kind::kWrite;
    uint64_t seq = 0;
    size_t off = 0, len = 0;
    uint64_t seed = 0;  // pattern seed of the bytes (slot pattern or region pattern)
    uint64_t ring_id = 0;
    std::unique_ptr<LocalBuf> buf;
    hixl::TransferReq req = 0;
  };

  hixl::Hixl& engine_;
  std::map<std::string, uint64_t> next_seq_;  // per target engine
};

const char* StatusName(hixl::TransferStatus s) {
  switch (s) {
    case hixl::TransferStatus::WAITING: return "WAITING";
    case hixl::TransferStatus::COMPLETED: return "COMPLETED";
    case hixl::TransferStatus::TIMEOUT: return "TIMEOUT";
    case hixl::TransferStatus::FAILED: return "FAILED";
    case hixl::TransferStatus::CANCELLED: return "CANCELLED";
  }
  return "UNKNOWN";
}

const char* KindChar(int k) { return k == 0 ? "w" : k == 1 ? "b" : "p"; }

std::string Initiator::Run(const hixl_load::Args& a) {
  bool ok = true;
  const uint64_t id = a.U64("id", 0, &ok);
  const std::string target = a.Str("target");
  const uintptr_t base = a.U64("base", 0, &ok);
  const size_t slice = a.U64("slice", 0, &ok);
  const uintptr_t pat = a.U64("pat", 0, &ok);
  const size_t pat_size = a.U64("patsize", 0, &ok);
  const uint64_t pat_seed = a.U64("patseed", 1, &ok);
  const uintptr_t ack = a.U64("ack", 0, &ok);
  const uint64_t count = a.U64("count", 0, &ok);
  const size_t minlen = std::max<size_t>(1, a.U64("minlen", 4096, &ok));
  const size_t maxlen = a.U64("maxlen", 16u << 20, &ok);
  const size_t window = std::clamp<uint64_t>(a.U64("window", 4, &ok), 1, 64);
  const uint64_t preads = a.U64("preads", 25, &ok);
  const uint64_t readbacks = a.U64("readbacks", 30, &ok);
  const uint64_t seed = a.U64("seed", 1, &ok);
  const int64_t deadline_ms = static_cast<int64_t>(a.U64("deadline", 120000, &ok));
  const int32_t op_timeout = static_cast<int32_t>(a.U64("optimeout", 60000, &ok));
  if (!ok || target.empty() || base == 0 || pat == 0 || ack == 0 || minlen > maxlen ||
      maxlen > slice || maxlen > pat_size || pat_size % 8 != 0)
    return "ERR usage: run id= target= base= slice= pat= patsize= patseed= ack= count= ... "
           "(minlen <= maxlen <= slice, patsize)";
  hixl::LinkType lt{};
  if (Status s = engine_.GetLinkType(target, lt); !s.ok()) return Err(s);
  const char* link = hixl::LinkTypeName(lt);

  uint64_t& next_seq = next_seq_[target];
  const uint64_t first_seq = next_seq;
  Ring ring(slice);
  std::deque<Op> inflight;
  std::deque<Op> ready;       // read-backs waiting for a window place
  std::optional<Op> blocked;  // a WRITE waiting for slice bytes
  uint64_t issued_ops = 0, sent = 0, writes = 0, rbs = 0, prs = 0, bytes = 0, ackreads = 0;
  uint64_t errors = 0;
  std::string first;
  uint64_t gapless = 0;
  auto error = [&](const std::string& what) {
    if (errors++ == 0) first = what;
  };
  auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(deadline_ms);
  auto last_ack = Clock::now() - std::chrono::seconds(1);
  std::chrono::microseconds ack_every(100);
  const double span = std::log2(static_cast<double>(maxlen) / static_cast<double>(minlen));

  auto plan = [&](uint64_t i) {
    Op op;
    const uint64_t r = hixl_test::SplitMix64(seed * 0x9E3779B97F4A7C15ull + i * 7 + id * 1000003);
    size_t len;
    if (r % 16 == 0) {
      len = maxlen;
    } else {
      const double u = static_cast<double>((r >> 8) & 0xFFFFFF) / static_cast<double>(1 << 24);
      len = static_cast<size_t>(static_cast<double>(minlen) * std::exp2(u * span));
      len = std::clamp(len, minlen, maxlen);
      if ((r >> 40) % 4 == 0) len = std::max(minlen, len - ((r >> 44) % 61) - 1);  // odd lengths
    }
    op.len = len;
    if ((r >> 52) % 100 < preads) {
      op.kind = Kind::kPatternRead;
      op.off = static_cast<size_t>(hixl_test::SplitMix64(r) % ((pat_size - len) / 8 + 1)) * 8;
      op.seed = pat_seed;
    } else {
      op.kind = Kind::kWrite;
      op.seed = hixl_test::SplitMix64(r ^ 0x5EED);
    }
    return op;
  };
  auto post = [&](Op& op) -> bool {
    op.seq = next_seq++;
    const bool write = op.kind == Kind::kWrite;
    op.buf = std::make_unique<LocalBuf>(op.len);
    uint64_t hash;
    if (write) {
      hixl_test::FillPattern(op.buf->data(), op.len, op.seed);
      hash = hixl_test::Fnv1a64(op.buf->data(), op.len);
    } else {
      std::memset(op.buf->data(), 0xEE, op.len);  // a READ that moves nothing is caught
      hash =
          hixl_load::PatternRangeHash(op.seed, op.kind == Kind::kPatternRead ? op.off : 0, op.len);
    }
    const uintptr_t remote = (op.kind == Kind::kPatternRead ? pat : base) + op.off;
    hixl::TransferArgs args;
    args.user_data = op.seq;
    args.timeout_ms = op_timeout;
    hixl::NotifyDesc d;
    d.name = KindChar(static_cast<int>(op.kind));
    d.name += "." + std::to_string(id) + "." + std::to_string(op.seq);
    d.notify_msg = std::to_string(op.off) + ":" + std::to_string(op.len) + ":";
    d.notify_msg += hixl_test::HashHex(hash);
    args.notify = std::move(d);
    Status s =
        engine_.TransferAsync(target, write ? hixl::TransferOp::WRITE : hixl::TransferOp::READ,
                              {{op.buf->addr(), remote, op.len}}, args, op.req);
    if (!s.ok()) {
      error("post seq " + std::to_string(op.seq) + ": " + s.ToString());
      return false;
    }
    if (op.kind != Kind::kPatternRead) ring.at(op.ring_id).last_seq = op.seq;
    return true;
  };
  auto finish = [&](Op& op, hixl::TransferStatus st, const Status& why) {
    if (op.kind != Kind::kPatternRead) --ring.at(op.ring_id).pending;
    if (st != hixl::TransferStatus::COMPLETED) {
      error("seq " + std::to_string(op.seq) + " (" + KindChar(static_cast<int>(op.kind)) + ", " +
            std::to_string(op.len) + " bytes) ended " + StatusName(st) + ": " + why.ToString());
      return;
    }
    ++sent;
    bytes += op.len;
    if (op.kind == Kind::kWrite) {
      ++writes;
      const uint64_t r = hixl_test::SplitMix64(op.seed);
      if (r % 100 < readbacks) {
        Op rb;
        rb.kind = Kind::kReadBack;
        rb.off = op.off;
        rb.len = op.len;
        rb.seed = op.seed;
        rb.ring_id = op.ring_id;
        ++ring.at(op.ring_id).pending;
        ready.push_back(std::move(rb));
      }
      return;
    }
    long long bad = hixl_load::PatternMismatch(op.buf->data(), op.seed,
                                               op.kind == Kind::kPatternRead ? op.off : 0, op.len);
    if (bad >= 0) {
      error("seq " + std::to_string(op.seq) + ": READ of " + std::to_string(op.len) +
            " bytes at offset " + std::to_string(op.off) + " differs at byte " +
            std::to_string(bad));
    }
    if (op.kind == Kind::kReadBack) {
      ++rbs;
    } else {
      ++prs;
    }
  };

  while (issued_ops < count || blocked || !ready.empty() || !inflight.empty()) {
    bool progress = false;
    for (auto it = inflight.begin(); it != inflight.end();) {
      hixl::TransferStatus st = hixl::TransferStatus::WAITING;
      Status why;
      Status s = engine_.GetTransferStatus(it->req, st, why);
      if (!s.ok()) {
        error("GetTransferStatus seq " + std::to_string(it->seq) + ": " + s.ToString());
        st = hixl::TransferStatus::FAILED;
        why = s;
      }
      if (st == hixl::TransferStatus::WAITING) {
        ++it;
        continue;
      }
      finish(*it, st, why);
      it = inflight.erase(it);
      progress = true;
    }
    const bool stop_issuing = errors > 0 || Clock::now() >= deadline;
    if (stop_issuing) {
      if (errors == 0) error("run deadline of " + std::to_string(deadline_ms) + " ms passed");
      ready.clear();
      blocked.reset();
      issued_ops = count;
      if (inflight.empty()) break;
    }
    const bool ack_only = ring.Release(gapless);
    while (!stop_issuing && inflight.size() < window) {
      if (!ready.empty()) {
        Op op = std::move(ready.front());
        ready.pop_front();
        if (!post(op)) break;
        inflight.push_back(std::move(op));
        progress = true;
        continue;
      }
      if (!blocked) {
        if (issued_ops >= count) break;
        blocked = plan(issued_ops++);
      }
      if (blocked->kind == Kind::kWrite) {
        std::optional<uint64_t> rid = ring.Alloc(blocked->len);
        if (!rid) break;  // wait for completions or the target's ack
        blocked->ring_id = *rid;
        blocked->off = ring.at(*rid).off;
        ring.at(*rid).pending = 1;
      }
      Op op = std::move(*blocked);
      blocked.reset();
      if (!post(op)) {
        if (op.kind == Kind::kWrite) --ring.at(op.ring_id).pending;
        break;
      }
      inflight.push_back(std::move(op));
      progress = true;
    }
    if (progress) continue;
    if (ack_only && blocked && Clock::now() - last_ack >= ack_every) {
      // The oldest slice bytes wait for the target: read its ack word.
      uint64_t word = 0;
      Status s =
          engine_.TransferSync(target, hixl::TransferOp::READ,
                               {{reinterpret_cast<uintptr_t>(&word), ack + 8 * id, 8}}, op_timeout);
      last_ack = Clock::now();
      ++ackreads;
      if (!s.ok()) {
        error("READ of the ack word: " + s.ToString());
      } else if (word > next_seq) {
        error("ack word " + std::to_string(word) + " is ahead of the seqs issued (" +
              std::to_string(next_seq) + ")");
      } else {
        // Poll faster while the target keeps up, back off while it does not.
        ack_every = word > gapless ? std::chrono::microseconds(100)
                                   : std::min(ack_every * 2, std::chrono::microseconds(2000));
        gapless = std::max(gapless, word);
      }
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

  std::ostringstream o;
  o << "OK link=" << (link ? link : "?") << " issued=" << (next_seq - first_seq) << " sent=" << sent
    << " writes=" << writes << " readbacks=" << rbs << " preads=" << prs << " bytes=" << bytes
    << " ackreads=" << ackreads << " ms=" << MsSince(t0) << " errors=" << errors
    << " first=" << (first.empty() ? "-" : first);
  return o.str();
}

std::string Initiator::Cycles(const hixl_load::Args& a) {
  bool ok = true;
  const std::vector<std::string> targets = hixl_load::SplitList(a.Str("targets"));
  const std::vector<std::string> remotes_s = hixl_load::SplitList(a.Str("remotes"));
  const uint64_t rounds = a.U64("n", 0, &ok);
  const size_t len = std::max<size_t>(8, a.U64("len", 4096, &ok));
  if (!ok || targets.empty() || targets.size() != remotes_s.size())
    return "ERR usage: cycles targets=E1,E2 remotes=A1,A2 n=N [len=L]";
  std::vector<uintptr_t> remotes;
  for (const auto& r : remotes_s) remotes.push_back(std::strtoull(r.c_str(), nullptr, 0));
  LocalBuf out(len), in(len);
  const auto t0 = Clock::now();
  uint64_t connects = 0;
  for (uint64_t r = 0; r < rounds; ++r) {
    auto fail = [&](size_t j, const std::string& what) {
      for (const auto& t : targets) (void)engine_.Disconnect(t, 1000);
      return "ERR round " + std::to_string(r) + " target " + targets[j] + ": " + what;
    };
    for (size_t j = 0; j < targets.size(); ++j) {
      if (Status s = engine_.Connect(targets[j], 5000); !s.ok()) return fail(j, Err(s));
      ++connects;
      const uint64_t seed = hixl_test::SplitMix64(r * 131 + j);
      hixl_test::FillPattern(out.data(), len, seed);
      std::memset(in.data(), 0, len);
      Status s = engine_.TransferSync(targets[j], hixl::TransferOp::WRITE,
                                      {{out.addr(), remotes[j], len}}, 10000);
      if (!s.ok()) return fail(j, "WRITE: " + s.ToString());
      s = engine_.TransferSync(targets[j], hixl::TransferOp::READ, {{in.addr(), remotes[j], len}},
                               10000);
      if (!s.ok()) return fail(j, "READ: " + s.ToString());
      long long bad = hixl_load::PatternMismatch(in.data(), seed, 0, len);
      if (bad >= 0) return fail(j, "read back differs at byte " + std::to_string(bad));
    }
    for (size_t j = 0; j < targets.size(); ++j) {
      if (Status s = engine_.Disconnect(targets[j], 1000); !s.ok())
        return fail(j, "Disconnect: " + s.ToString());
      hixl::ConnectStatus cs = hixl::ConnectStatus::CONNECTED;
      if (Status s = engine_.GetConnectStatus(targets[j], cs); !s.ok())
        return fail(j, "GetConnectStatus after Disconnect: " + s.ToString());
      if (cs != hixl::ConnectStatus::NOT_CONNECTED)
        return fail(j, "still connected after Disconnect (status " +
                           std::to_string(static_cast<int>(cs)) + ")");
    }
  }
  return "OK rounds=" + std::to_string(rounds) + " connects=" + std::to_string(connects) +
         " ms=" + std::to_string(MsSince(t0));
}

// ===========================================================================

class LoadPeer {
 public:
  hixl::Hixl engine;
  std::unique_ptr<Target> target;
  std::unique_ptr<Initiator> initiator;

  ~LoadPeer() {
    // The watcher uses the engine: stop it first.
    if (target) target->Stop();
    engine.Finalize();
  }

  // Returns false when the process should exit.
  bool Handle(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "quit") {
      if (target) target->Stop();
      engine.Finalize();
      Reply("OK");
      return false;
    }
    if (cmd == "ping") return Reply("OK pong"), true;
    if (cmd == "connect" || cmd == "disconnect") {
      std::string eng;
      int32_t timeout = cmd == "connect" ? 5000 : 1000;
      int32_t t = 0;
      in >> eng;
      if (in >> t) timeout = t;
      Status s = cmd == "connect" ? engine.Connect(eng, timeout) : engine.Disconnect(eng, timeout);
      return Reply(s.ok() ? "OK" : Err(s)), true;
    }
    if (cmd == "linktype") {
      std::string eng;
      in >> eng;
      hixl::LinkType t{};
      Status s = engine.GetLinkType(eng, t);
      if (!s.ok()) return Reply(Err(s)), true;
      const char* n = hixl::LinkTypeName(t);
      return Reply(std::string("OK ") + (n ? n : "(null)")), true;
    }
    // The rest take key=value arguments (waitcount: two numbers).
    if (cmd == "waitcount") {
      uint64_t total = 0;
      int64_t timeout = 0;
      if (!target || !(in >> total >> timeout)) return Reply("ERR usage/not a target"), true;
      return Reply(target->WaitCount(total, timeout)), true;
    }
    hixl_load::Args a;
    std::string err;
    if (!a.Parse(in, &err)) return Reply("ERR " + err), true;
    if (cmd == "target") {
      if (initiator) return Reply("ERR this process is an initiator"), true;
      if (!target) target = std::make_unique<Target>(engine);
      return Reply(target->Setup(a)), true;
    }
    if (cmd == "stats" || cmd == "counts") {
      if (!target) return Reply("ERR not a target"), true;
      return Reply(cmd == "stats" ? target->Stats() : target->Counts()), true;
    }
    if (cmd == "run" || cmd == "cycles") {
      if (target) return Reply("ERR this process is a target"), true;
      if (!initiator) initiator = std::make_unique<Initiator>(engine);
      return Reply(cmd == "run" ? initiator->Run(a) : initiator->Cycles(a)), true;
    }
    if (cmd == "notify") {
      Status s = engine.SendNotify(a.Str("target"), {a.Str("name"), a.Str("msg"), ""}, 5000);
      if (!s.ok() || !a.Has("remote")) return Reply(s.ok() ? "OK" : Err(s)), true;
      // notify ... remote=A len=L seed=S delay=MS: the data after its notification.
      std::this_thread::sleep_for(std::chrono::milliseconds(a.U64("delay", 100)));
      LocalBuf b(a.U64("len", 8));
      hixl_test::FillPattern(b.data(), b.len(), a.U64("seed", 1));
      s = engine.TransferSync(a.Str("target"), hixl::TransferOp::WRITE,
                              {{b.addr(), a.U64("remote", 0), b.len()}}, 10000);
      return Reply(s.ok() ? "OK" : Err(s)), true;
    }
    Reply("ERR unknown command: " + cmd);
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int reply_fd = dup(1);
  if (reply_fd < 0 || dup2(2, 1) < 0) return 3;
  g_reply = fdopen(reply_fd, "w");
  if (g_reply == nullptr) return 3;

  std::map<std::string, std::string> opts;
  std::string listen = "127.0.0.1:0";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (a == "--opt" && i + 1 < argc) {
      std::string kv = argv[++i];
      size_t eq = kv.find('=');
      if (eq == std::string::npos) {
        Reply("ERR bad --opt " + kv);
        return 2;
      }
      opts[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else {
      Reply("ERR unknown argument " + a);
      return 2;
    }
  }

  auto peer = std::make_unique<LoadPeer>();
  Status s = peer->engine.Initialize(listen, opts);
  if (!s.ok()) {
    Reply(Err(s));
    return 2;
  }
  Reply("READY " + peer->engine.LocalEngine());
  std::string line;
  bool go_on = true;
  while (go_on && std::getline(std::cin, line)) go_on = peer->Handle(line);
  peer.reset();
  std::fclose(g_reply);
  return 0;
}
