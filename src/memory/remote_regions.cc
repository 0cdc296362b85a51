#include "memory/remote_regions.h"

#include <sys/mman.h>

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
    out.push_back(std::move(node.mapped()));
  }
  return out;
}

std::vector<RegionRef> RemoteRegionTable::RemoveAll() {
  std::vector<RegionRef> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [addr, r] : by_addr_) out.push_back(std::move(r));
  by_addr_.clear();
  by_id_.clear();
  return out;
}

size_t RemoteRegionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.size();
}

Status RemoteRegionTable::Resolve(TransferOp op, const std::vector<TransferOpDesc>& descs,
                                  std::vector<Slice>& slices, std::vector<RegionRef>& pinned) const {
  std::vector<Slice>& out = slices;
  std::vector<RegionRef>& pins = pinned;
  out.clear();
  pins.clear();
  if (descs.empty()) return Status::ParamInvalid("descriptor list is empty");
  const uint32_t need = op == TransferOp::WRITE ? MEM_PERM_WRITE : MEM_PERM_READ;
  out.reserve(descs.size());
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
  std::lock_guard<std::mutex> lock(mu_);
  const RemoteRegion* last = nullptr;
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    auto bad = [&](const std::string& why) {
      return Status::ParamInvalid("descriptor " + std::to_string(i) + " (local " +
                                  std::to_string(d.local_addr) + ", remote " +
                                  std::to_string(d.remote_addr) + ", len " + std::to_string(d.len) +
                                  "): " + why);
    };
    if (d.len == 0) return bad("length is 0");
    if (d.local_addr == 0) return bad("local address is null");
    if (d.local_addr + d.len < d.local_addr) return bad("local range wraps around");
    if (d.remote_addr + d.len < d.remote_addr) return bad("remote range wraps around");
    const RemoteRegion* r = last;
    if (r == nullptr || d.remote_addr < r->addr || d.remote_addr - r->addr >= r->len) {
      auto it = by_addr_.upper_bound(d.remote_addr);
      if (it == by_addr_.begin()) return bad("remote address is not inside any region the peer registered");
      const RegionRef& ref = std::prev(it)->second;
      r = ref.get();
      if (d.remote_addr - r->addr >= r->len) {
        return bad("remote address is not inside any region the peer registered");
      }
      if (r != last) {
        bool have = false;
        for (const auto& p : pins) have = have || p.get() == r;
        if (!have) pins.push_back(ref);
      }
      last = r;
    }
    if (d.len > r->len - (d.remote_addr - r->addr)) {
      return bad("range runs past the end of peer region " + std::to_string(r->id) + " (" +
                 std::to_string(r->addr) + " +" + std::to_string(r->len) + ")");
    }
    if ((r->perms & need) == 0) {
      return bad(std::string("peer region ") + std::to_string(r->id) + " does not permit " +
                 (op == TransferOp::WRITE ? "WRITE" : "READ"));
    }
    out.push_back(Slice{d.local_addr, d.remote_addr, d.len, const_cast<RemoteRegion*>(r)});
  }
  for (auto& p : pins) p->users.fetch_add(1, std::memory_order_acq_rel);
  undo.armed = false;
  return Status::Ok();
}

void Unpin(std::vector<RegionRef>& pinned) {
  for (auto& p : pinned) p->users.fetch_sub(1, std::memory_order_acq_rel);
  pinned.clear();
}

}  // namespace hixl::memory
