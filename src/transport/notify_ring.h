// NotifyRing: a single-producer byte ring in a sealed memfd that carries
// notifications from an initiator on the same host straight into the
// target's queue, with no hop through either side's control thread.
//
// The target (consumer) creates the ring for one accepted link and passes the
// memfd to that link's initiator (producer), which maps it. Layout: one page
// of header (the ring's geometry, written once by the consumer; the
// producer's tail; the consumer's head, credit, sleeping and closed words,
// each on its own cache line), then the data area, a power of two bytes.
// A record is an 8-byte header (u32 length, u16 name length, u16 message
// length) and the bytes, padded to 8; records wrap around the data area.
//
// Trust: each side treats everything the other writes as untrusted. The
// consumer copies a record out before it checks it (lengths within the
// published bytes, the engine's 1024-byte limits) and stops reading a ring
// that breaks a rule (Pop: kBroken); the producer keeps its own tail and
// count, checks the head it reads against them, and writes only inside the
// data area. Neither trusts a length it did not check.
//
// Ordering: Push publishes a record with a release store of the tail after
// every byte of it (and, by the caller's order, after the data of the
// transfer it follows); Pop acquires the tail before reading. Wake-ups: a
// consumer about to sleep sets `sleeping` and looks at the tail once more; a
// producer that sees `sleeping` after publishing rings the doorbell. Both are
// sequentially consistent, so no record is left unseen by a sleeping
// consumer. The doorbell is a Unix datagram socket pair of the ring's own
// (one per link: a producer can wake only its own ring's consumer); the
// producer sends with MSG_DONTWAIT, so nothing the consumer does to the
// socket can block a Push (a full socket buffer means a wake-up is pending).
//
// Thread safety: Push may be called from any thread (serialized inside);
// the consumer's methods from one thread at a time (the engine holds its
// inbox lock).
#ifndef HIXL_TRANSPORT_NOTIFY_RING_H_
#define HIXL_TRANSPORT_NOTIFY_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/net.h"
#include "hixl/hixl.h"

namespace hixl::transport {

class NotifyRing {
 public:
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kDefaultDataBytes = 256u << 10;
  static constexpr size_t kMinDataBytes = 4096;
  static constexpr size_t kMaxDataBytes = 16u << 20;
  // The largest record: header, both strings at their limits, padded.
  static constexpr size_t kMaxRecordBytes = 8 + kMaxNotifyNameLen + kMaxNotifyMsgLen;

  enum class PushResult {
    kPosted,  // in the ring: the target's engine holds it
    kFull,    // no room (bytes, or the target's credit): use another path
    kBroken,  // the consumer's words make no sense: use another path
    kClosed,  // the target closed the ring before the record went in
    kRaced,   // the target closed the ring while the record went in: it may
              // or may not have taken it
  };
  enum class PopResult { kEmpty, kGot, kBroken };

  ~NotifyRing();
  NotifyRing(const NotifyRing&) = delete;
  NotifyRing& operator=(const NotifyRing&) = delete;

  // Consumer: a new ring of data_bytes (a power of two in [kMinDataBytes,
  // kMaxDataBytes]) whose producer may publish `credit` records before the
  // first SetCredit. ring_fd: the sealed memfd, bell_fd: the doorbell's
  // sending end, both to hand to the producer.
  static Status Create(size_t data_bytes, uint64_t credit, std::unique_ptr<NotifyRing>& out,
                       net::Fd& ring_fd, net::Fd& bell_fd);
  // Producer: maps a ring the target passed. Checks the file (a sealed
  // memfd long enough for the geometry its header names) and the doorbell
  // (a Unix datagram socket) before anything is mapped; takes both.
  static Status Attach(net::Fd ring_fd, net::Fd bell_fd, std::unique_ptr<NotifyRing>& out);

  // ---- producer
  PushResult Push(std::string_view name, std::string_view msg);

  // ---- consumer
  // Copies the next record out and checks it.
  PopResult Pop(std::string& name, std::string& msg);
  // The producer may publish records up to this total count.
  void SetCredit(uint64_t total);
  // Announces (or withdraws) that the consumer is about to sleep on the
  // doorbell; true when a record is waiting (look before sleeping).
  bool SetSleeping(bool sleeping);
  bool HasData() const;
  // No record is taken after this; a producer sees it before its next Push.
  void Close();
  // The doorbell's receiving end: readable once a producer rang it.
  int bell_fd() const { return bell_.get(); }
  // Takes the pending rings (a bounded number of datagrams).
  void DrainBell();

  size_t data_bytes() const { return cap_; }

 private:
  NotifyRing() = default;
  uint64_t* Word(size_t offset) const;
  void CopyIn(uint64_t pos, const void* src, size_t n);
  void CopyOut(uint64_t pos, void* dst, size_t n) const;

  uint8_t* base_ = nullptr;  // the whole mapping
  size_t map_len_ = 0;
  uint8_t* data_ = nullptr;
  size_t cap_ = 0;  // data bytes, a power of two: checked once, never re-read

  // Producer.
  std::mutex push_mu_;
  uint64_t tail_ = 0;   // this side's copy: the shared word is never read back
  uint64_t count_ = 0;  // records published

  net::Fd bell_;  // the doorbell: the producer's sending end, or the consumer's receiving end

  // Consumer.
  uint64_t head_ = 0;
};

}  // namespace hixl::transport

#endif  // HIXL_TRANSPORT_NOTIFY_RING_H_
