#include "memory/remote_regions.h"

#include <sys/mman.h>

#include <algorithm>
#include <string>

namespace hixl::memory {

RemoteRegion::~RemoteRegion() {
  if (map_base != nullptr) ::munmap(map_base, map_len);
}

bool RemoteRegionTable::Insert(RegionRef r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_id_.count(r->id) != 0) return false;
  by_id_.emplace(r->id, r->addr);
  by_addr_.emplace(r->addr, std::move(r));
  return true;
}

bool RemoteRegionTable::Contains(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.count(id) != 0;
}

std::vector<RegionRef> RemoteRegionTable::Remove(const std::vector<uint64_t>& ids) {
  std::vector<RegionRef> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : ids) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) continue;
    auto node = by_addr_.extract(it->second);
    by_id_.erase(it);
    node.mapped()->revoked.store(true, std::memory_order_release);
    out.push_back(std::move(node.mapped()));
  }
  return out;
}

std::vector<RegionRef> RemoteRegionTable::RemoveAll() {
  std::vector<RegionRef> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [addr, r] : by_addr_) {
    r->revoked.store(true, std::memory_order_release);
    out.push_back(std::move(r));
  }
  by_addr_.clear();
  by_id_.clear();
  return out;
}

size_t RemoteRegionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.size();
}

std::vector<RegionRef> RemoteRegionTable::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RegionRef> out;
  out.reserve(by_addr_.size());
  for (const auto& [addr, r] : by_addr_) out.push_back(r);
  return out;
}

namespace {

Status BadDesc(size_t i, const TransferOpDesc& d, const std::string& why) {
  return Status::ParamInvalid(
      "descriptor " + std::to_string(i) + " (local " + std::to_string(d.local_addr) + ", remote " +
      std::to_string(d.remote_addr) + ", len " + std::to_string(d.len) + "): " + why);
}

// What descriptor i must satisfy before any region is looked at.
Status CheckAlone(size_t i, const TransferOpDesc& d) {
  if (d.len == 0) return BadDesc(i, d, "length is 0");
  if (d.local_addr == 0) return BadDesc(i, d, "local address is null");
  if (d.local_addr + d.len < d.local_addr) return BadDesc(i, d, "local range wraps around");
  if (d.remote_addr + d.len < d.remote_addr) return BadDesc(i, d, "remote range wraps around");
  return Status::Ok();
}

bool StartsIn(const TransferOpDesc& d, const RemoteRegion& r) {
  return d.remote_addr >= r.addr && d.remote_addr - r.addr < r.len;
}

// What descriptor i, which starts inside r, must satisfy against r.
Status CheckIn(size_t i, const TransferOpDesc& d, const RemoteRegion& r, TransferOp op) {
  if (d.len > r.len - (d.remote_addr - r.addr)) {
    return BadDesc(i, d,
                   "range runs past the end of peer region " + std::to_string(r.id) + " (" +
                       std::to_string(r.addr) + " +" + std::to_string(r.len) + ")");
  }
  const uint32_t need = op == TransferOp::WRITE ? MEM_PERM_WRITE : MEM_PERM_READ;
  if ((r.perms & need) == 0) {
    return BadDesc(i, d,
                   std::string("peer region ") + std::to_string(r.id) + " does not permit " +
                       (op == TransferOp::WRITE ? "WRITE" : "READ"));
  }
  return Status::Ok();
}

// Whether descriptor d, against r, passes every check of CheckAlone and
// CheckIn: the common case, decided without building a Status. Where it is
// false the callers run those two for the reason (or, on the lock-free path,
// take the locked one).
inline bool Fits(const TransferOpDesc& d, const RemoteRegion& r, uint32_t need) {
  return d.len != 0 && d.local_addr != 0 && d.local_addr + d.len >= d.local_addr &&
         d.remote_addr + d.len >= d.remote_addr && d.remote_addr >= r.addr &&
         d.remote_addr - r.addr < r.len && d.len <= r.len - (d.remote_addr - r.addr) &&
         (r.perms & need) != 0;
}

}  // namespace

Status RemoteRegionTable::Resolve(TransferOp op, const std::vector<TransferOpDesc>& descs,
                                  std::vector<Slice>& slices, std::vector<RegionRef>& pinned,
                                  RegionHint* hint) const {
  std::vector<Slice>& out = slices;
  std::vector<RegionRef>& pins = pinned;
  out.clear();
  pins.clear();
  if (descs.empty()) return Status::ParamInvalid("descriptor list is empty");
  struct Undo {
    std::vector<Slice>& out;
    std::vector<RegionRef>& pins;
    bool armed = true;
    ~Undo() {
      if (!armed) return;
      out.clear();
      pins.clear();
    }
  } undo{out, pins};
  const uint32_t need = op == TransferOp::WRITE ? MEM_PERM_WRITE : MEM_PERM_READ;
  out.resize(descs.size());  // filled in place below; Undo empties it on failure
  // The thread's last region, when it holds every descriptor: no lock. A
  // region still referenced is not yet acknowledged as removed, so the
  // peer's memory behind it is valid for as long as this transfer pins it;
  // one marked revoked takes no new transfer.
  if (hint != nullptr) {
    RegionRef r = hint->lock();
    if (r && !r->revoked.load(std::memory_order_acquire)) {
      size_t i = 0;
      for (; i < descs.size() && Fits(descs[i], *r, need); ++i) {
        const TransferOpDesc& d = descs[i];
        out[i] = Slice{d.local_addr, d.remote_addr, d.len, r.get()};
      }
      if (i == descs.size()) {
        pins.push_back(std::move(r));
        undo.armed = false;
        return Status::Ok();
      }
      // A descriptor outside r, or one that fails a check: the locked path
      // finds its region or gives the same reason it would without a hint.
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const RemoteRegion* last = nullptr;
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    const RemoteRegion* r = last;
    if (r == nullptr || !StartsIn(d, *r)) {
      if (Status s = CheckAlone(i, d); !s.ok()) return s;
      auto it = by_addr_.upper_bound(d.remote_addr);
      if (it == by_addr_.begin() || !StartsIn(d, *std::prev(it)->second)) {
        return BadDesc(i, d, "remote address is not inside any region the peer registered");
      }
      const RegionRef& ref = std::prev(it)->second;
      r = ref.get();
      if (r != last) {
        bool have = false;
        for (const auto& p : pins) have = have || p.get() == r;
        if (!have) pins.push_back(ref);
      }
      last = r;
    }
    if (!Fits(d, *r, need)) {
      if (Status s = CheckAlone(i, d); !s.ok()) return s;
      if (Status s = CheckIn(i, d, *r, op); !s.ok()) return s;
    }
    out[i] = Slice{d.local_addr, d.remote_addr, d.len, const_cast<RemoteRegion*>(r)};
  }
  if (hint != nullptr && pins.size() == 1) *hint = pins[0];
  undo.armed = false;
  return Status::Ok();
}

}  // namespace hixl::memory
