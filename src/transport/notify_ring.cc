#include "transport/notify_ring.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace hixl::transport {
namespace {

constexpr uint64_t kMagic = 0x31474e5254584948ull;  // "HIXTRNG1"
constexpr uint32_t kVersion = 1;

// Header words (byte offsets into the first page), one cache line per writer.
constexpr size_t kOffMagic = 0;       // consumer, once
constexpr size_t kOffGeometry = 8;    // consumer, once: version << 32 | data bytes
constexpr size_t kOffTail = 64;       // producer
constexpr size_t kOffHead = 128;      // consumer
constexpr size_t kOffCredit = 136;    // consumer
constexpr size_t kOffSleeping = 192;  // consumer
constexpr size_t kOffClosed = 200;    // consumer

struct RecordHeader {
  uint32_t len;  // whole record, padded to 8
  uint16_t name_len;
  uint16_t msg_len;
};
static_assert(sizeof(RecordHeader) == 8);

size_t RecordBytes(size_t name_len, size_t msg_len) {
  return (sizeof(RecordHeader) + name_len + msg_len + 7) / 8 * 8;
}

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Every shared word is reached through atomic_ref: the other process writes
// it concurrently.
uint64_t Load(uint64_t* w, std::memory_order o) { return std::atomic_ref<uint64_t>(*w).load(o); }
void Store(uint64_t* w, uint64_t v, std::memory_order o) {
  std::atomic_ref<uint64_t>(*w).store(v, o);
}

}  // namespace

NotifyRing::~NotifyRing() {
  if (base_ != nullptr) munmap(base_, map_len_);
}

uint64_t* NotifyRing::Word(size_t offset) const {
  return reinterpret_cast<uint64_t*>(base_ + offset);
}

void NotifyRing::CopyIn(uint64_t pos, const void* src, size_t n) {
  if (n == 0) return;  // (src may be null)
  const size_t at = static_cast<size_t>(pos & (cap_ - 1));
  const size_t first = std::min(n, cap_ - at);
  std::memcpy(data_ + at, src, first);
  std::memcpy(data_, static_cast<const uint8_t*>(src) + first, n - first);
}

void NotifyRing::CopyOut(uint64_t pos, void* dst, size_t n) const {
  if (n == 0) return;
  const size_t at = static_cast<size_t>(pos & (cap_ - 1));
  const size_t first = std::min(n, cap_ - at);
  std::memcpy(dst, data_ + at, first);
  std::memcpy(static_cast<uint8_t*>(dst) + first, data_, n - first);
}

Status NotifyRing::Create(size_t data_bytes, uint64_t credit, std::unique_ptr<NotifyRing>& out,
                          net::Fd& ring_fd, net::Fd& bell_fd) {
  if (!PowerOfTwo(data_bytes) || data_bytes < kMinDataBytes || data_bytes > kMaxDataBytes) {
    return Status::ParamInvalid("notification ring size must be a power of two in 4 KiB..16 MiB");
  }
  const size_t len = kHeaderBytes + data_bytes;
  net::Fd f(memfd_create("hixl-notify", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!f.valid()) return net::ErrnoStatus("memfd_create (notification ring)", errno);
  if (ftruncate(f.get(), static_cast<off_t>(len)) != 0) {
    return net::ErrnoStatus("ftruncate (notification ring)", errno);
  }
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, f.get(), 0);
  if (p == MAP_FAILED) return net::ErrnoStatus("mmap (notification ring)", errno);
  std::unique_ptr<NotifyRing> r(new NotifyRing());
  r->base_ = static_cast<uint8_t*>(p);
  r->map_len_ = len;
  r->data_ = r->base_ + kHeaderBytes;
  r->cap_ = data_bytes;
  // A fresh memfd reads as zeros: head, tail, sleeping and closed start at 0.
  Store(r->Word(kOffGeometry), (static_cast<uint64_t>(kVersion) << 32) | data_bytes,
        std::memory_order_relaxed);
  Store(r->Word(kOffCredit), credit, std::memory_order_relaxed);
  Store(r->Word(kOffMagic), kMagic, std::memory_order_release);
  // Neither side can change the size: no SIGBUS for either.
  if (fcntl(f.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return net::ErrnoStatus("sealing the notification ring", errno);
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
    return net::ErrnoStatus("socketpair (notification doorbell)", errno);
  }
  r->bell_.Reset(sv[0]);
  net::Fd send_end(sv[1]);
  shutdown(sv[0], SHUT_WR);  // the consumer's end only receives
  out = std::move(r);
  ring_fd = std::move(f);
  bell_fd = std::move(send_end);
  return Status::Ok();
}

Status NotifyRing::Attach(net::Fd ring_fd, net::Fd bell_fd, std::unique_ptr<NotifyRing>& out) {
  // The doorbell must be a Unix datagram socket: Push sends to it with
  // MSG_DONTWAIT, which never blocks whatever its flags.
  int type = 0, domain = 0;
  socklen_t tl = sizeof(type), dl = sizeof(domain);
  if (!bell_fd.valid() || getsockopt(bell_fd.get(), SOL_SOCKET, SO_TYPE, &type, &tl) != 0 ||
      getsockopt(bell_fd.get(), SOL_SOCKET, SO_DOMAIN, &domain, &dl) != 0 || type != SOCK_DGRAM ||
      domain != AF_UNIX) {
    return Status::Failed("the peer's notification doorbell is not a Unix datagram socket");
  }
  struct stat st;
  const int seals = ring_fd.valid() ? fcntl(ring_fd.get(), F_GET_SEALS) : -1;
  if (fstat(ring_fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0) {
    return Status::Failed("the peer's notification ring is not a sealed memfd");
  }
  if (static_cast<uint64_t>(st.st_size) < kHeaderBytes + kMinDataBytes) {
    return Status::Failed("the peer's notification ring is too short");
  }
  // Map the header alone first, to learn the geometry.
  void* h = mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, ring_fd.get(), 0);
  if (h == MAP_FAILED) return net::ErrnoStatus("mmap (notification ring header)", errno);
  const uint64_t magic = Load(static_cast<uint64_t*>(h), std::memory_order_acquire);
  const uint64_t geometry =
      Load(reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(h) + kOffGeometry),
           std::memory_order_relaxed);
  munmap(h, kHeaderBytes);
  const uint64_t cap = geometry & 0xffffffffu;
  if (magic != kMagic || (geometry >> 32) != kVersion || !PowerOfTwo(cap) || cap < kMinDataBytes ||
      cap > kMaxDataBytes || static_cast<uint64_t>(st.st_size) < kHeaderBytes + cap) {
    return Status::Failed("the peer's notification ring has a header this engine cannot use");
  }
  const size_t len = kHeaderBytes + static_cast<size_t>(cap);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd.get(), 0);
  if (p == MAP_FAILED) return net::ErrnoStatus("mmap (notification ring)", errno);
  std::unique_ptr<NotifyRing> r(new NotifyRing());
  r->base_ = static_cast<uint8_t*>(p);
  r->map_len_ = len;
  r->data_ = r->base_ + kHeaderBytes;
  r->cap_ = static_cast<size_t>(cap);
  r->bell_ = std::move(bell_fd);
  // A ring is attached once, fresh: its tail is where the consumer's head is.
  r->tail_ = Load(r->Word(kOffHead), std::memory_order_acquire);
  r->count_ = 0;
  if (r->tail_ != 0) return Status::Failed("the peer's notification ring is not fresh");
  out = std::move(r);
  return Status::Ok();
}

NotifyRing::PushResult NotifyRing::Push(std::string_view name, std::string_view msg) {
  if (name.size() > kMaxNotifyNameLen || msg.size() > kMaxNotifyMsgLen) return PushResult::kFull;
  std::lock_guard<std::mutex> lock(push_mu_);
  if (Load(Word(kOffClosed), std::memory_order_acquire) != 0) return PushResult::kClosed;
  const uint64_t head = Load(Word(kOffHead), std::memory_order_acquire);
  if (head > tail_ || tail_ - head > cap_) return PushResult::kBroken;
  const size_t len = RecordBytes(name.size(), msg.size());
  if (cap_ - (tail_ - head) < len) return PushResult::kFull;
  if (count_ >= Load(Word(kOffCredit), std::memory_order_acquire)) return PushResult::kFull;
  RecordHeader rh{static_cast<uint32_t>(len), static_cast<uint16_t>(name.size()),
                  static_cast<uint16_t>(msg.size())};
  CopyIn(tail_, &rh, sizeof(rh));
  CopyIn(tail_ + sizeof(rh), name.data(), name.size());
  CopyIn(tail_ + sizeof(rh) + name.size(), msg.data(), msg.size());
  tail_ += len;
  ++count_;
  // Sequentially consistent against the consumer's closed and sleeping
  // stores: it either sees this tail or this thread sees its flag.
  Store(Word(kOffTail), tail_, std::memory_order_seq_cst);
  if (Load(Word(kOffClosed), std::memory_order_seq_cst) != 0) return PushResult::kRaced;
  if (Load(Word(kOffSleeping), std::memory_order_seq_cst) != 0) {
    // EAGAIN: rings are pending already, the consumer will wake.
    const char b = 1;
    ssize_t w = ::send(bell_.get(), &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
  }
  return PushResult::kPosted;
}

NotifyRing::PopResult NotifyRing::Pop(std::string& name, std::string& msg) {
  const uint64_t tail = Load(Word(kOffTail), std::memory_order_acquire);
  if (tail == head_) return PopResult::kEmpty;
  if (tail < head_ || tail - head_ > cap_) return PopResult::kBroken;
  const uint64_t avail = tail - head_;
  RecordHeader rh;
  if (avail < sizeof(rh)) return PopResult::kBroken;
  CopyOut(head_, &rh, sizeof(rh));
  if (rh.name_len > kMaxNotifyNameLen || rh.msg_len > kMaxNotifyMsgLen ||
      rh.len != RecordBytes(rh.name_len, rh.msg_len) || rh.len > avail) {
    return PopResult::kBroken;
  }
  name.resize(rh.name_len);
  msg.resize(rh.msg_len);
  CopyOut(head_ + sizeof(rh), name.data(), rh.name_len);
  CopyOut(head_ + sizeof(rh) + rh.name_len, msg.data(), rh.msg_len);
  head_ += rh.len;
  Store(Word(kOffHead), head_, std::memory_order_release);
  return PopResult::kGot;
}

void NotifyRing::SetCredit(uint64_t total) {
  Store(Word(kOffCredit), total, std::memory_order_release);
}

bool NotifyRing::SetSleeping(bool sleeping) {
  Store(Word(kOffSleeping), sleeping ? 1 : 0, std::memory_order_seq_cst);
  return HasData();
}

bool NotifyRing::HasData() const {
  return Load(Word(kOffTail), std::memory_order_seq_cst) != head_;
}

void NotifyRing::Close() { Store(Word(kOffClosed), 1, std::memory_order_seq_cst); }

void NotifyRing::DrainBell() {
  char b[16];
  for (int i = 0; i < 64; ++i) {
    if (::recv(bell_.get(), b, sizeof(b), MSG_DONTWAIT) < 0) return;
  }
}

}  // namespace hixl::transport
