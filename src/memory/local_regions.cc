#include "memory/local_regions.h"

#include <fcntl.h>
#include <unistd.h>

namespace hixl::memory {

Status LocalRegions::Add(const LocalRegion& r, uint64_t& id, bool& added) {
  if (r.addr == 0 || r.len == 0) return Status::ParamInvalid("region address and length must be non-zero");
  if (r.addr + r.len < r.addr) return Status::ParamInvalid("region [addr, addr+len) wraps around");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.upper_bound(r.addr);
  // The region starting at or before addr, and the one after it.
  if (it != by_addr_.begin()) {
    const LocalRegion& prev = std::prev(it)->second;
    if (prev.retiring && prev.addr + prev.len > r.addr) {
      return Status::ParamInvalid("region overlaps region " + std::to_string(prev.id) +
                                  ", which is being deregistered; register it again after "
                                  "DeregisterMem returned");
    }
    if (prev.addr == r.addr && prev.len == r.len) {
      id = prev.id;
      added = false;
      return Status::Ok();
    }
    if (prev.addr + prev.len > r.addr) {
      return Status::ParamInvalid("region overlaps registered region " + std::to_string(prev.id) +
                                  " at " + std::to_string(prev.addr) + " (+" +
                                  std::to_string(prev.len) + ")");
    }
  }
  if (it != by_addr_.end() && it->second.addr < r.addr + r.len) {
    return Status::ParamInvalid("region overlaps registered region " + std::to_string(it->second.id) +
                                " at " + std::to_string(it->second.addr));
  }
  LocalRegion copy = r;
  copy.id = next_id_++;
  by_addr_.emplace(copy.addr, copy);
  by_id_.emplace(copy.id, copy.addr);
  id = copy.id;
  added = true;
  return Status::Ok();
}

std::optional<LocalRegion> LocalRegions::Retire(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  LocalRegion& r = by_addr_.at(it->second);
  if (r.retiring) return std::nullopt;
  r.retiring = true;
  return r;
}

std::optional<LocalRegion> LocalRegions::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  auto node = by_addr_.extract(it->second);
  by_id_.erase(it);
  return node.mapped();
}

std::optional<LocalRegion> LocalRegions::Find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return by_addr_.at(it->second);
}

std::optional<LocalRegion> LocalRegions::FindByStart(uintptr_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return std::nullopt;
  return it->second;
}

std::optional<LocalRegion> LocalRegions::FindOverlapping(uintptr_t addr, size_t len) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.lower_bound(addr);  // the first region starting at or after addr
  if (it != by_addr_.end() && it->second.addr < addr + len) return it->second;
  if (it != by_addr_.begin()) {
    const LocalRegion& prev = std::prev(it)->second;
    if (prev.addr + prev.len > addr) return prev;
  }
  return std::nullopt;
}

std::optional<LocalRegion> LocalRegions::FindContaining(uintptr_t addr, size_t len) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.upper_bound(addr);
  if (it == by_addr_.begin()) return std::nullopt;
  const LocalRegion& r = std::prev(it)->second;
  if (addr + len < addr || addr + len > r.addr + r.len) return std::nullopt;
  return r;
}

std::vector<LocalRegion> LocalRegions::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LocalRegion> out;
  out.reserve(by_addr_.size());
  for (const auto& [addr, r] : by_addr_) {
    if (!r.retiring) out.push_back(r);
  }
  return out;
}

SharedPart LocalRegions::DupShared(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return SharedPart{};
  SharedPart p = by_addr_.at(it->second).share;
  if (p.fd >= 0) p.fd = fcntl(p.fd, F_DUPFD_CLOEXEC, 0);
  return p;
}

std::vector<LocalRegion> LocalRegions::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LocalRegion> out;
  for (auto& [addr, r] : by_addr_) out.push_back(r);
  by_addr_.clear();
  by_id_.clear();
  return out;
}

}  // namespace hixl::memory
