// Hixl::Impl: lifecycle, memory and notifications; transfers are in
// transfers.cc, links (the initiator's handshake, connecting, peers) in
// links.cc, the control plane (the loop thread) in control_plane.cc.
#include "engine/engine.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "common/host.h"
#include "common/log.h"
#include "transport/shm/shm_transport.h"

namespace hixl {

namespace {

using engine_detail::kIdleTickMs;
constexpr int kFinalizeDrainMs = 5000;  // Finalize lets pieces on the wire land this long

// "peer a" or "peers a, b" (for messages about peers that lost their link).
std::string JoinNames(const std::vector<std::string>& names) {
  std::string out = names.size() == 1 ? "peer " : "peers ";
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i ? ", " : "") + (names[i].empty() ? std::string("(unnamed)") : names[i]);
  }
  return out;
}

}  // namespace

Status Hixl::Impl::CheckInitialized() const {
  if (!initialized_.load(std::memory_order_acquire)) {
    return Status::Failed("engine is not initialized (call Initialize first)");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- lifecycle

Status Hixl::Impl::Initialize(const std::string& local_engine,
                              const std::map<std::string, std::string>& opts) {
  if (initialized_.load()) return Status::Failed("engine is already initialized");
  Options o;
  if (Status s = engine::ParseOptions(opts, o); !s.ok()) return s;
  net::HostPort hp;
  if (Status s = net::ParseHostPort(local_engine, hp); !s.ok()) return s;

  opts_ = o;
  if (Status s = inbox_.Start(opts_.notify_depth, opts_.poll_spin_us); !s.ok()) return s;
  generation_ = host::RandomU64();
  listening_ = hp.port >= 0;
  if (listening_) {
    int port = 0;
    if (Status s = net::TcpListen(hp, listen_fd_, port); !s.ok()) return s;
    hp.port = port;
  }
  local_engine_ = hp.ToString();

  copy_pool_.Start(static_cast<size_t>(opts_.copy_threads), "hixl-copy");
  transport::TransportContext ctx;
  ctx.generation = generation_;
  ctx.listening = listening_;
  ctx.regions = &regions_;
  ctx.copy_pool = &copy_pool_;
  ctx.copy_threads = opts_.copy_threads;
  ctx.poll_spin_us = opts_.poll_spin_us;
  ctx.listen_host = hp.host;
  ctx.handshake_timeout_ms = opts_.handshake_timeout_ms;
  ctx.hb_bound_ms = opts_.hb_interval_ms * opts_.hb_misses;
  ctx.hb_interval_ms = opts_.hb_interval_ms;
  ctx.link = opts_.link;
  ctx.settings = opts_.transport_settings;
  ctx.notify_sink = &inbox_;
  unavailable_.clear();
  transport_infos_.clear();
  for (const auto& e : transport::TransportRegistry::Global().Entries()) {
    auto t = e.factory(ctx);
    Status started = t->Start();
    transport_infos_.push_back(TransportInfo{e.name, e.type, started.ok(),
                                             started.ok() ? t->Describe() : started.message()});
    if (Status s = started; !s.ok()) {
      HIXL_LOG(WARN) << "transport " << e.name << " unavailable: " << s.ToString();
      unavailable_ += (unavailable_.empty() ? "" : "; ") + ("transport " + e.name +
                      " (LinkType " + LinkTypeName(e.type) + ") failed to start: " + s.message());
      t->Stop();
      continue;
    }
    transports_.push_back(std::move(t));
  }
  // Published before the loop runs: a peer that finds us this early waits in
  // the listen backlog.
  if (Status ns = naming_.Start(opts_, local_engine_, generation_, listening_); !ns.ok()) {
    for (auto& t : transports_) t->Stop();
    transports_.clear();
    copy_pool_.Stop();
    listen_fd_.Reset();
    return ns;
  }
  idle_tick_ms_ = std::clamp(opts_.hb_interval_ms / 4, 5, kIdleTickMs);
  loop_.SetTicker([this] { OnTick(); }, idle_tick_ms_);
  loop_.SetSpin(std::chrono::microseconds(opts_.poll_spin_us));
  Status s = loop_.Start("hixl-ctrl");
  if (s.ok() && listening_) {
    int lfd = listen_fd_.get();
    loop_.Post([this, lfd] { loop_.Add(lfd, EPOLLIN, [this](uint32_t) { OnAccept(); }); });
  }
  if (!s.ok()) {
    naming_.Stop();
    for (auto& t : transports_) t->Stop();
    transports_.clear();
    copy_pool_.Stop();
    listen_fd_.Reset();
    return s;
  }
  initialized_.store(true, std::memory_order_release);
  HIXL_LOG(INFO) << "engine " << local_engine_ << " up (generation " << generation_ << ")";
  return Status::Ok();
}

void Hixl::Impl::Finalize() {
  if (!initialized_.exchange(false)) return;
  // Peers watching the registry see this engine go at once.
  naming_.Stop();
  // 0. Connect attempts under way end (each is bounded by its timeout).
  {
    std::vector<ConnectThread> threads;
    {
      std::lock_guard<std::mutex> lock(connect_mu_);
      threads.swap(connect_threads_);
    }
    for (auto& t : threads) t.thread.join();
    std::lock_guard<std::mutex> lock(connect_mu_);
    attempts_.clear();
  }
  // 1. Every unfinished request stops and ends FAILED.
  {
    std::lock_guard<std::mutex> lock(req_mu_);
    for (auto& [id, t] : reqs_) t->RequestStop(Status::Failed("engine was finalized"));
  }
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers.swap(peers_);
  }
  const auto drain_until = net::DeadlineAfterMs(kFinalizeDrainMs);
  for (auto& [name, p] : peers) {
    p->alive.store(false);
    p->channel->Close(drain_until);
  }
  // 2. Copy threads finish what is queued (each part stops at once) and exit.
  copy_pool_.Stop();
  // 3. Control plane: tell peers goodbye, then stop the loop.
  loop_.Post([this] {
    for (auto& [id, c] : conns_) {
      if (c->established) Send(*c, control::EncodeBye());
    }
  });
  loop_.Stop();
  // The loop is stopped: its state is ours now. Links close for senders
  // first, so a notification posted from now on fails by itself.
  for (auto& [id, c] : conns_) CloseTx(*c->tx);
  FailPendingNotifies(nullptr, Status::Failed("engine was finalized"));
  conns_.clear();
  revokes_.clear();
  inbox_.Stop();
  for (auto& t : transports_) t->Stop();
  transports_.clear();
  listen_fd_.Reset();
  peers.clear();
  {
    std::lock_guard<std::mutex> lock(dereg_mu_);
    dereg_waits_.clear();
    dropped_.clear();
  }
  dereg_cv_.notify_all();
  regions_.Clear();
  {
    std::lock_guard<std::mutex> lock(share_mu_);
    shares_.clear();  // registrations end: moved pages go back
  }
  FreeAllocs();
  HIXL_LOG(INFO) << "engine " << local_engine_ << " finalized";
}

std::string Hixl::Impl::LocalEngine() const {
  return initialized_.load() ? local_engine_ : std::string();
}

// ---------------------------------------------------------------- memory

Status Hixl::Impl::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle, uint32_t perms,
                               uint32_t flags) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (type != MemType::MEM_HOST && type != MemType::MEM_DEVICE) {
    return Status::ParamInvalid("unknown memory type");
  }
  if (mem.addr == 0) return Status::ParamInvalid("RegisterMem: address is null");
  if (mem.len == 0) return Status::ParamInvalid("RegisterMem: length is 0");
  if ((perms & ~static_cast<uint32_t>(MEM_PERM_READ_WRITE)) != 0) {
    return Status::ParamInvalid("RegisterMem: unknown permission bits");
  }
  if ((flags & ~static_cast<uint32_t>(REGISTER_SHARE_BY_MAPPING)) != 0) {
    return Status::ParamInvalid("RegisterMem: unknown flag bits");
  }
  if (mem.addr + mem.len < mem.addr) {
    return Status::ParamInvalid("RegisterMem: [addr, addr+len) wraps around");
  }
  device::PtrInfo dev;
  if (Status s = CheckMemType(mem, type, flags, dev); !s.ok()) return s;
  if (type == MemType::MEM_DEVICE) return RegisterDevice(mem, perms, dev, handle);
  std::lock_guard<std::mutex> share_lock(share_mu_);
  if (auto same = regions_.FindByStart(mem.addr); same && same->len == mem.len && !same->retiring) {
    handle = same->id;  // registered already: the same handle, nothing moved again
    return Status::Ok();
  }
  if ((flags & REGISTER_SHARE_BY_MAPPING) != 0) {
    // Moving pages that belong to another registration could lose a peer's
    // concurrent write to it: refuse before anything moves.
    if (auto other = regions_.FindOverlapping(mem.addr, mem.len)) {
      return Status::ParamInvalid("RegisterMem: region overlaps registered region " +
                                  std::to_string(other->id) + " at " + std::to_string(other->addr) +
                                  " (+" + std::to_string(other->len) + ")");
    }
  }
  // How local peers may reach it: decided (and pages moved, if asked) before
  // any peer can hear of the region.
  std::unique_ptr<memory::UserShare> share;
  if (Status s = memory::UserShare::Make(mem.addr, mem.len,
                                         (flags & REGISTER_SHARE_BY_MAPPING) != 0, share);
      !s.ok()) {
    return s;
  }
  memory::LocalRegion r;
  r.addr = mem.addr;
  r.len = mem.len;
  r.perms = perms;
  r.type = type;
  if (share) r.share = share->part();
  uint64_t id = 0;
  bool added = false;
  if (Status s = regions_.Add(r, id, added); !s.ok()) return s;  // share undone
  if (added) {
    r.id = id;
    if (Status s = PrepareLocalRegion(r); !s.ok()) return s;
    if (share) shares_[id] = std::move(share);
    BroadcastRegionAdd({ToDesc(r)});
  }
  handle = id;
  return Status::Ok();
}

Status Hixl::Impl::CheckMemType(const MemDesc& mem, MemType type, uint32_t flags,
                                device::PtrInfo& dev) {
  const std::string where = "RegisterMem: [" + std::to_string(mem.addr) + ", +" +
                            std::to_string(mem.len) + ")";
  if (type == MemType::MEM_HOST) {
    // Only a process with a CUDA driver loaded can hold device memory; asking
    // the driver costs nothing then, and a device pointer passed as host
    // memory would otherwise reach memcpy and process_vm_*.
    if (!device::DriverLoaded()) return Status::Ok();
    device::PtrInfo info;
    if (device::Query(mem.addr, info).ok() && info.device) {
      return Status::ParamInvalid(where + " is CUDA device memory (device " +
                                  std::to_string(info.ordinal) + "): register it as MEM_DEVICE");
    }
    return Status::Ok();
  }
  if (Status s = device::Available(); !s.ok()) {
    return Status(s.code(), "RegisterMem: device memory: " + s.message());
  }
  if ((flags & REGISTER_SHARE_BY_MAPPING) != 0) {
    return Status::ParamInvalid("RegisterMem: REGISTER_SHARE_BY_MAPPING is for host memory");
  }
  if (Status s = device::Query(mem.addr, dev); !s.ok()) {
    return Status(s.code(), where + ": " + s.message());
  }
  if (!dev.device) {
    return Status::ParamInvalid(where + " is host memory, not CUDA device memory: register it "
                                "as MEM_HOST");
  }
  if (mem.addr < dev.base || mem.len > dev.size || mem.addr - dev.base > dev.size - mem.len) {
    return Status::ParamInvalid(where + " runs past the end of its device allocation [" +
                                std::to_string(dev.base) + ", +" + std::to_string(dev.size) +
                                ")");
  }
  return Status::Ok();
}

Status Hixl::Impl::RegisterDevice(const MemDesc& mem, uint32_t perms, const device::PtrInfo& dev,
                                  MemHandle& handle) {
  if (auto same = regions_.FindByStart(mem.addr); same && same->len == mem.len && !same->retiring) {
    handle = same->id;
    return Status::Ok();
  }
  memory::LocalRegion r;
  r.addr = mem.addr;
  r.len = mem.len;
  r.perms = perms;
  r.type = MemType::MEM_DEVICE;
  r.dev = dev;
  uint64_t id = 0;
  bool added = false;
  if (Status s = regions_.Add(r, id, added); !s.ok()) return s;
  if (added) {
    r.id = id;
    if (Status s = PrepareLocalRegion(r); !s.ok()) return s;
    device_regions_.fetch_add(1, std::memory_order_acq_rel);
    BroadcastRegionAdd({ToDesc(r)});
  }
  handle = id;
  return Status::Ok();
}

control::RegionDesc Hixl::Impl::ToDesc(const memory::LocalRegion& r) const {
  control::RegionDesc d{r.id, r.addr, r.len, r.perms, r.share.fd >= 0};
  d.device = r.type == MemType::MEM_DEVICE;
  for (const auto& t : transports_) {
    wire::Msg info;
    t->DescribeRegion(r, info);
    if (!info.is_null()) d.tp[t->name()] = std::move(info);
  }
  return d;
}

Status Hixl::Impl::PrepareLocalRegion(const memory::LocalRegion& r) {
  for (size_t i = 0; i < transports_.size(); ++i) {
    if (Status s = transports_[i]->AddRegion(r); !s.ok()) {
      for (size_t j = 0; j < i; ++j) transports_[j]->RevokeRegion(r.addr, r.len);
      regions_.Remove(r.id);
      return Status(s.code(), std::string("registering memory for transport ") +
                                  transports_[i]->name() + ": " + s.message());
    }
  }
  return Status::Ok();
}

Status Hixl::Impl::DeregisterMem(MemHandle handle) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (handle == 0) return Status::Ok();
  {
    // Memory from AllocMem stays registered until FreeMem.
    std::lock_guard<std::mutex> lock(alloc_mu_);
    for (const auto& [ptr, a] : allocs_) {
      if (a.handle == handle) {
        return Status::ParamInvalid("handle belongs to AllocMem memory; release it with FreeMem");
      }
    }
  }
  // Peers may have checked transfers against the region before they hear
  // of its removal: it keeps serving them until every peer confirmed (or
  // lost its link), then goes.
  auto r = regions_.Retire(handle);
  if (!r) return Status::Ok();  // unknown, already removed or being removed: no-op
  RevokeFromPeers(handle);
  regions_.Remove(handle);
  if (r->type == MemType::MEM_DEVICE) device_regions_.fetch_sub(1, std::memory_order_acq_rel);
  std::vector<std::string> dropped;
  const std::string exposed = StillReachable(*r, &dropped);
  for (auto& t : transports_) t->RevokeRegion(r->addr, r->len);
  // No peer maps it any more: pages moved into shared memory go back.
  {
    std::lock_guard<std::mutex> lock(share_mu_);
    shares_.erase(handle);
  }
  if (!exposed.empty()) {
    // The application owns the memory: only it can keep it out of use.
    return Status::Timeout(
        "DeregisterMem: the region is deregistered, but " + JoinNames(dropped) +
        " lost the link without confirming that it stopped writing (DeregisterTimeoutMs is " +
        std::to_string(opts_.dereg_timeout_ms) + " ms), and writes it had already issued over " +
        exposed + " may still land in the region: do not free or reuse this memory before " +
        "Finalize (or before that peer links again)");
  }
  return Status::Ok();
}

std::string Hixl::Impl::StillReachable(const memory::LocalRegion& r,
                                       std::vector<std::string>* who) {
  std::set<std::string> via;
  std::lock_guard<std::mutex> lock(dereg_mu_);
  for (auto it = dropped_.begin(); it != dropped_.end();) {
    const DroppedPeer& d = it->second;
    if (d.view.same_host && d.pid > 0 && kill(static_cast<pid_t>(d.pid), 0) != 0 &&
        errno == ESRCH) {
      it = dropped_.erase(it);  // its process is gone, and its writes with it
      continue;
    }
    bool reaches = false;
    for (const auto& t : transports_) {
      if (t->LostPeerMayReach(r, d.view)) {
        via.insert(t->name());
        reaches = true;
      }
    }
    if (reaches) who->push_back(it->first);
    ++it;
  }
  std::string names;
  for (const auto& n : via) names += (names.empty() ? "" : ", ") + n;
  return names;
}

Status Hixl::Impl::AllocMem(size_t size, MemType type, void** ptr) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (ptr == nullptr) return Status::ParamInvalid("AllocMem: ptr is null");
  if (size == 0) return Status::ParamInvalid("AllocMem: size is 0");
  if (type != MemType::MEM_HOST && type != MemType::MEM_DEVICE) {
    return Status::ParamInvalid("AllocMem: unknown memory type");
  }
  if (size > (size_t{1} << 46)) return Status::ParamInvalid("AllocMem: size too large");
  if (type == MemType::MEM_DEVICE) return AllocDevice(size, ptr);
  Alloc a;
  void* p = nullptr;
  for (auto& t : transports_) {
    std::string why;
    if ((p = t->AllocHost(size, why)) != nullptr) {
      a.by = t.get();
      a.mapped_len = size;
      break;
    }
    if (!why.empty()) {
      HIXL_LOG(WARN) << "AllocMem: transport " << t->name() << " could not allocate " << size
                     << " bytes (" << why << "); the engine allocates them instead";
    }
  }
  if (p != nullptr) {
    // Taken from a transport.
  } else if (opts_.fabric_mem) {
    if (Status s = transport::shm::AllocShareable(size, a.memfd, p, a.mapped_len); !s.ok())
      return s;
  } else {
    a.mapped_len = (size + 4095) / 4096 * 4096;
    p = mmap(nullptr, a.mapped_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return net::ErrnoStatus("AllocMem: mmap", errno);
  }
  memory::LocalRegion r;
  r.addr = reinterpret_cast<uintptr_t>(p);
  r.len = size;
  r.perms = MEM_PERM_READ_WRITE;
  r.type = type;
  if (a.memfd >= 0) r.share = memory::SharedPart{a.memfd, 0, size, 0, true};
  bool added = false;
  Status s = regions_.Add(r, a.handle, added);
  if (!s.ok()) {
    ReleaseAlloc(p, a);
    return s;
  }
  r.id = a.handle;
  if (Status ps = PrepareLocalRegion(r); !ps.ok()) {
    ReleaseAlloc(p, a);
    return ps;
  }
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    allocs_[p] = a;
  }
  BroadcastRegionAdd({ToDesc(r)});
  *ptr = p;
  return Status::Ok();
}

Status Hixl::Impl::FreeMem(void* ptr) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  Alloc a;
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    auto it = allocs_.find(ptr);
    if (it == allocs_.end())
      return Status::ParamInvalid("FreeMem: pointer did not come from AllocMem");
    a = it->second;
    allocs_.erase(it);
  }
  std::string exposed;
  std::vector<std::string> dropped;
  if (auto r = regions_.Retire(a.handle)) {  // as in DeregisterMem
    RevokeFromPeers(a.handle);
    regions_.Remove(a.handle);
    if (a.device) device_regions_.fetch_sub(1, std::memory_order_acq_rel);
    exposed = StillReachable(*r, &dropped);
    for (auto& t : transports_) t->RevokeRegion(r->addr, r->len);
  }
  if (a.memfd >= 0) ::close(a.memfd);
  if (!exposed.empty() && a.device) {
    HIXL_LOG(WARN) << "FreeMem: " << JoinNames(dropped)
                   << " lost the link without confirming that it stopped writing; copies already "
                      "issued over "
                   << exposed << " may still arrive, so its " << a.mapped_len
                   << " bytes of device memory stay allocated until Finalize";
    std::lock_guard<std::mutex> lock(alloc_mu_);
    held_device_.push_back(ptr);
    return Status::Ok();
  }
  if (!exposed.empty() && a.by != nullptr) {
    // A transport's memory cannot be replaced in place: it stays as it is,
    // the transport's, until Finalize.
    HIXL_LOG(WARN) << "FreeMem: " << JoinNames(dropped)
                   << " lost the link without confirming that it stopped writing; writes already "
                      "issued over "
                   << exposed << " may still arrive, so its " << a.mapped_len
                   << " bytes stay allocated until Finalize";
    return Status::Ok();
  }
  if (!exposed.empty()) {
    // A dropped peer's writes already on their way (over a transport that
    // cannot stop them) must land somewhere harmless: fresh private pages
    // take the range's place, so nothing else can be mapped there, until
    // Finalize. If they cannot, the old pages stay instead.
    void* q = mmap(ptr, a.mapped_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    HIXL_LOG(WARN) << "FreeMem: " << JoinNames(dropped)
                   << " lost the link without confirming that it stopped writing; writes already "
                      "issued over "
                   << exposed << " may still arrive, so its " << a.mapped_len
                   << " bytes of address space stay reserved until Finalize"
                   << (q == MAP_FAILED ? " (with their old pages)" : "");
    std::lock_guard<std::mutex> lock(alloc_mu_);
    quarantined_.emplace_back(ptr, a.mapped_len);
    return Status::Ok();
  }
  // Peers that mapped the memfd keep their own mapping of these pages until
  // they drop the region, so unmapping here can never fault a peer.
  a.memfd = -1;  // closed above
  ReleaseAlloc(ptr, a);
  return Status::Ok();
}

Status Hixl::Impl::AllocDevice(size_t size, void** ptr) {
  if (Status s = device::Available(); !s.ok()) {
    return Status(s.code(), "AllocMem: device memory: " + s.message());
  }
  uintptr_t p = 0;
  if (Status s = device::Alloc(size, p); !s.ok()) return Status(s.code(), "AllocMem: " + s.message());
  Alloc a;
  a.device = true;
  a.mapped_len = size;
  device::PtrInfo dev;
  Status s = device::Query(p, dev);
  if (s.ok() && !dev.device) s = Status::Failed("the driver does not know the memory it allocated");
  if (s.ok()) s = RegisterDevice({p, size}, MEM_PERM_READ_WRITE, dev, a.handle);
  if (!s.ok()) {
    ReleaseAlloc(reinterpret_cast<void*>(p), a);
    return Status(s.code(), "AllocMem: " + s.message());
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  allocs_[reinterpret_cast<void*>(p)] = a;
  *ptr = reinterpret_cast<void*>(p);
  return Status::Ok();
}

void Hixl::Impl::ReleaseAlloc(void* p, const Alloc& a) {
  if (a.device) {
    if (Status s = device::Free(reinterpret_cast<uintptr_t>(p)); !s.ok()) {
      HIXL_LOG(WARN) << "freeing device memory from AllocMem: " << s.message();
    }
    return;
  }
  if (a.by != nullptr) {
    a.by->FreeHost(p);
  } else {
    munmap(p, a.mapped_len);
  }
  if (a.memfd >= 0) ::close(a.memfd);
}

Status Hixl::Impl::GetMemHandle(void* ptr, MemHandle& handle) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  auto r = regions_.FindByStart(reinterpret_cast<uintptr_t>(ptr));
  if (!r) return Status::ParamInvalid("no registered region starts at that address");
  handle = r->id;
  return Status::Ok();
}

void Hixl::Impl::FreeAllocs() {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  for (auto& [ptr, a] : allocs_) {
    if (a.device) {
      ReleaseAlloc(ptr, a);
      continue;
    }
    // A transport's memory went with the transport (Transport::Stop).
    if (a.by == nullptr) munmap(ptr, a.mapped_len);
    if (a.memfd >= 0) ::close(a.memfd);
  }
  allocs_.clear();
  for (auto& [ptr, len] : quarantined_) munmap(ptr, len);
  quarantined_.clear();
  for (void* p : held_device_) ReleaseAlloc(p, Alloc{.device = true});
  held_device_.clear();
}

void Hixl::Impl::BroadcastRegionAdd(std::vector<control::RegionDesc> regions) {
  if (!listening_) return;
  loop_.Post([this, regions = std::move(regions)] {
    wire::Msg m = control::EncodeRegionAdd(regions);
    for (auto& [id, c] : conns_) {
      if (c->accepted && c->established) Send(*c, m);
    }
  });
}

void Hixl::Impl::RevokeFromPeers(uint64_t region_id) {
  if (!listening_) return;  // nobody can have connected to us
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(dereg_mu_);
    seq = next_seq_++;
    dereg_waits_[seq] = DeregWait{};
  }
  bool posted = loop_.Post([this, seq, region_id] {
    wire::Msg m = control::EncodeRegionDel(seq, {region_id});
    std::set<uint64_t> waiting;
    std::map<uint64_t, std::pair<std::string, DroppedPeer>> who;
    for (auto& [id, c] : conns_) {
      if (c->accepted && c->established) {
        Send(*c, m);
        waiting.insert(id);
        who[id] = {c->peer_name, DroppedPeer{c->peer_view, c->peer_pid}};
      }
    }
    std::lock_guard<std::mutex> lock(dereg_mu_);
    auto it = dereg_waits_.find(seq);
    if (it != dereg_waits_.end()) {
      it->second.sent = true;
      it->second.waiting = std::move(waiting);
      it->second.who = std::move(who);
    }
    dereg_cv_.notify_all();
  });
  std::unique_lock<std::mutex> lock(dereg_mu_);
  if (!posted) {
    dereg_waits_.erase(seq);
    return;
  }
  auto deadline = net::DeadlineAfterMs(opts_.dereg_timeout_ms);
  bool done = dereg_cv_.wait_until(lock, deadline, [&] {
    auto it = dereg_waits_.find(seq);
    return it == dereg_waits_.end() || (it->second.sent && it->second.waiting.empty());
  });
  std::set<uint64_t> laggards;
  if (auto it = dereg_waits_.find(seq); it != dereg_waits_.end()) {
    laggards = it->second.waiting;
    // Dropped from now on (CloseConn below runs on the loop, later).
    for (uint64_t id : laggards) dropped_[it->second.who[id].first] = it->second.who[id].second;
    dereg_waits_.erase(it);
  }
  lock.unlock();
  if (done || laggards.empty()) return;
  // A peer that cannot confirm it stopped using the region loses its link.
  loop_.Post([this, laggards] {
    for (uint64_t id : laggards) {
      CloseConn(id, "did not confirm a region removal in time", false);
    }
  });
}

// ---------------------------------------------------------------- notifications

Status Hixl::Impl::SendNotify(const std::string& remote, const NotifyDesc& notify,
                              int32_t timeout_ms) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (timeout_ms <= 0) return Status::ParamInvalid("SendNotify: timeout_ms must be > 0");
  if (notify.name.size() > kMaxNotifyNameLen || notify.notify_msg.size() > kMaxNotifyMsgLen) {
    return Status::ParamInvalid("SendNotify: name and message are limited to 1024 bytes each");
  }
  auto deadline = net::DeadlineAfterMs(timeout_ms);
  std::shared_ptr<Peer> peer;
  if (Status s = AcquirePeer(remote, deadline, peer); !s.ok()) return s;
  auto token = ActiveToken(peer);
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  auto w = std::make_shared<Wait>();
  PostNotify(peer, notify, deadline, [w](Status s) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->done = true;
    w->status = std::move(s);
    w->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(w->mu);
  // The loop answers by the deadline; the margin only guards a stalled loop.
  if (!w->cv.wait_until(lock, deadline + std::chrono::seconds(2), [&] { return w->done; })) {
    return Status::Timeout("SendNotify to " + remote + ": no answer in " +
                           std::to_string(timeout_ms) + " ms");
  }
  return w->status;
}

void Hixl::Impl::PostNotify(const std::shared_ptr<Peer>& peer, const NotifyDesc& d,
                            net::Deadline deadline, std::function<void(Status)> done) {
  // The channel's own path first (shm: straight into the target's ring), as
  // long as no frame of this link is unanswered: a record must not overtake
  // a notification sent before it.
  if (peer->ctl_notifies.load(std::memory_order_acquire) == 0 &&
      peer->alive.load(std::memory_order_acquire)) {
    switch (peer->channel->TryNotify(d.name, d.notify_msg)) {
      case transport::NotifyPath::kPosted: done(Status::Ok()); return;
      case transport::NotifyPath::kClosed:
        done(Status::NotConnected("link to " + peer->name + " is closing"));
        return;
      case transport::NotifyPath::kMaybe:
        done(Status::NotConnected("link to " + peer->name +
                                  " closed while the notification was posted (it may have been "
                                  "delivered)"));
        return;
      case transport::NotifyPath::kUnavailable: break;
    }
  }
  // Sent from this thread: the frame goes out now, not after a wake-up of the
  // control thread. The answer (nack) is matched on the control thread.
  std::shared_ptr<Tx> tx = peer->tx;
  const uint64_t seq = next_notify_seq_.fetch_add(1, std::memory_order_relaxed);
  peer->ctl_notifies.fetch_add(1, std::memory_order_acq_rel);
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    // ctl_notifies counts the frame until the target answered it (or the
    // link closed), even when the caller was told TIMEOUT before that.
    pending_notifies_[seq] =
        PendingNotify{tx, deadline, std::move(done), false,
                      [peer] { peer->ctl_notifies.fetch_sub(1, std::memory_order_acq_rel); }};
  }
  bool sent = tx && peer->alive.load(std::memory_order_acquire) &&
              SendFrame(*tx, wire::EncodeFrame(control::EncodeNotify(seq, d.name, d.notify_msg)));
  if (sent) return;
  std::function<void(Status)> fail;  // unless the link's closing already failed it
  std::function<void()> answered;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (auto it = pending_notifies_.find(seq); it != pending_notifies_.end()) {
      fail = std::move(it->second.done);
      answered = std::move(it->second.answered);
      pending_notifies_.erase(it);
    }
  }
  if (answered) answered();
  if (fail) fail(Status::NotConnected("link to " + peer->name + " was lost"));
}

void Hixl::Impl::PostLaneFence(const std::shared_ptr<Peer>& peer, std::function<void()> done) {
  std::shared_ptr<Tx> tx = peer ? peer->tx : nullptr;
  if (!tx) {
    done();  // the link is gone (its connection closed the target's lanes)
    return;
  }
  const uint64_t seq = next_notify_seq_.fetch_add(1, std::memory_order_relaxed);
  auto end = [done = std::move(done)](Status) mutable {
    if (done) done();
    done = nullptr;
  };
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_notifies_[seq] = PendingNotify{
        tx, net::DeadlineAfterMs(opts_.hb_interval_ms * opts_.hb_misses), end, /*fence=*/true, {}};
  }
  if (SendFrame(*tx, wire::EncodeFrame(control::EncodeLaneFence(seq)))) return;
  std::function<void(Status)> fail;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (auto it = pending_notifies_.find(seq); it != pending_notifies_.end()) {
      fail = std::move(it->second.done);
      pending_notifies_.erase(it);
    }
  }
  if (fail) fail(Status::Ok());
}

bool Hixl::Impl::FencePending(const Tx* tx) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  for (const auto& [seq, p] : pending_notifies_) {
    if (p.fence && p.tx.get() == tx) return true;
  }
  return false;
}

void Hixl::Impl::FailPendingNotifies(const Tx* tx, const Status& why) {
  std::vector<std::function<void(Status)>> fail;
  std::vector<std::function<void()>> answered;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (auto it = pending_notifies_.begin(); it != pending_notifies_.end();) {
      if (tx == nullptr || it->second.tx.get() == tx) {
        if (it->second.done) fail.push_back(std::move(it->second.done));
        if (it->second.answered) answered.push_back(std::move(it->second.answered));
        it = pending_notifies_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& a : answered) a();
  for (auto& f : fail) f(why);
}

Status Hixl::Impl::GetNotifies(std::vector<NotifyDesc>& out) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  inbox_.TakeAll(out);
  return Status::Ok();
}

Status Hixl::Impl::SetNotifyCallback(NotifyCallback cb) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  inbox_.SetCallback(std::move(cb));
  return Status::Ok();
}

}  // namespace hixl
