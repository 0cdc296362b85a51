// The UCX transport object: the engine's worker, the target's mapped regions
// (memory handle + packed remote key each), describing them to peers, and
// connecting (one UcxChannel per link; ucx_channel.cc).
#include "transport/ucx/ucx_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/host.h"
#include "common/log.h"
#include "transport/ucx/ucx_channel.h"
#include "transport/ucx/ucx_worker.h"

namespace hixl::transport::ucx {
namespace {

class UcxTransport : public Transport {
 public:
  explicit UcxTransport(const TransportContext& ctx) : ctx_(ctx) {}
  ~UcxTransport() override { Stop(); }

  const char* name() const override { return "ucx"; }
  LinkType link_type() const override { return LinkType::UCX; }
  // Debian's UCX has no CUDA support: device memory of a UCX link moves
  // over tcp lanes to the same peer (the engine's DeviceLanesChannel).
  bool ReachesDeviceMemory() const override { return false; }

  Status Start() override {
    if (Status s = Worker::Create(worker_); !s.ok()) return s;
    eps_ = std::make_shared<EndpointCache>(worker_);
    return Status::Ok();
  }

  std::string Describe() const override {
    const char* tls = std::getenv("UCX_TLS");
    return std::string("UCX ") + ucp_get_version_string() +
           ", UCX_TLS=" + (tls != nullptr && *tls != '\0' ? tls : "(all)") +
           (HaveRdmaDevice() ? ", RDMA devices present"
                             : ", no RDMA device (AUTO links between hosts use tcp)");
  }

  void Stop() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [addr, m] : mapped_) {
      if (!m.owned) ucp_mem_unmap(worker_->context(), m.memh);
    }
    mapped_.clear();
    // Memory this transport allocated goes when the worker does: an
    // operation UCX still holds (below) may touch it until then.
    for (auto& [addr, memh] : allocated_) {
      worker_->AtDestroy([ctx = worker_->context(), h = memh] { ucp_mem_unmap(ctx, h); });
    }
    allocated_.clear();
    // Channels and remote keys hold the worker until they go -- unless a link
    // was given up with operations UCX still holds (error handling NONE):
    // those end only once the worker is destroyed, which must happen before
    // the engine frees their memory, so it is destroyed now.
    if (worker_ && worker_->lingering()) worker_->Shutdown();
    eps_.reset();
    worker_.reset();
  }

  void DescribeForPeer(uint64_t, const auth::Key*, wire::Msg& info) override {
    if (!worker_) return;
    info = wire::Msg::object();
    info["addr"] = wire::Msg::binary(worker_->address());
  }
  void ForgetPeer(uint64_t) override {}

  void* AllocHost(size_t len, std::string& why) override {
    why.clear();
    const int64_t mode = ctx_.Setting(options::kUcxAllocMem);
    if (!worker_ || mode == kAllocEngine || (mode == kAllocAuto && ctx_.link != LinkType::UCX)) {
      return nullptr;
    }
    // UCX's shared-memory allocators reserve the whole size up front (posix:
    // fallocate in /dev/shm); a size no host memory can hold is left to the
    // engine's allocator, which fails it cleanly.
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && len > static_cast<size_t>(pages) * static_cast<size_t>(page)) {
      return nullptr;
    }
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                   UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_PROT;
    p.address = nullptr;
    p.length = len;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    p.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
             UCP_MEM_MAP_PROT_REMOTE_READ | UCP_MEM_MAP_PROT_REMOTE_WRITE;
    ucp_mem_h memh = nullptr;
    if (ucs_status_t s = ucp_mem_map(worker_->context(), &p, &memh); s != UCS_OK) {
      why = UcxStatus("ucp_mem_map(ALLOCATE, " + std::to_string(len) + " bytes)", s).message();
      return nullptr;
    }
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (ucs_status_t s = ucp_mem_query(memh, &attr);
        s != UCS_OK || attr.address == nullptr || attr.length < len) {
      why = s != UCS_OK ? UcxStatus("ucp_mem_query", s).message()
                        : std::string("ucp_mem_query: UCX allocated less than asked");
      ucp_mem_unmap(worker_->context(), memh);
      return nullptr;
    }
    // Commit the pages now, as the engine's allocator does: the first
    // transfers into fresh memory would otherwise pay for every page, and a
    // shortage shows here rather than as a fault in the middle of one.
    if (madvise(attr.address, len, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
      why = "committing " + std::to_string(len) + " bytes UCX allocated: " + std::strerror(errno);
      ucp_mem_unmap(worker_->context(), memh);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    allocated_[reinterpret_cast<uintptr_t>(attr.address)] = memh;
    return attr.address;
  }

  void FreeHost(void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocated_.end()) return;
    ucp_mem_unmap(worker_->context(), it->second);
    allocated_.erase(it);
  }

  Status AddRegion(const memory::LocalRegion& r) override {
    // Debian's UCX has no CUDA support: device memory is not mapped (peers
    // get no remote key for it and reach it over tcp lanes instead).
    if (r.type != MemType::MEM_HOST) return Status::Ok();
    {
      // Memory UCX allocated is mapped already, with remote access both
      // ways (AllocMem memory is always READ_WRITE).
      std::unique_lock<std::mutex> lock(mu_);
      if (auto it = allocated_.find(r.addr); it != allocated_.end()) {
        Mapped m;
        m.memh = it->second;
        m.owned = true;
        lock.unlock();
        if (Status s = PackKey(m); !s.ok()) return s;
        lock.lock();
        mapped_[r.addr] = std::move(m);
        return Status::Ok();
      }
    }
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                   UCP_MEM_MAP_PARAM_FIELD_PROT;
    p.address = reinterpret_cast<void*>(r.addr);
    p.length = r.len;
    p.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
    if (r.perms & MEM_PERM_READ) p.prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
    if (r.perms & MEM_PERM_WRITE) p.prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
    Mapped m;
    if (ucs_status_t s = ucp_mem_map(worker_->context(), &p, &m.memh); s != UCS_OK) {
      return UcxStatus("ucp_mem_map", s);
    }
    if (Status s = PackKey(m); !s.ok()) {
      ucp_mem_unmap(worker_->context(), m.memh);
      return s;
    }
    std::lock_guard<std::mutex> lock(mu_);
    mapped_[r.addr] = std::move(m);
    return Status::Ok();
  }

  void DescribeRegion(const memory::LocalRegion& r, wire::Msg& info) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mapped_.find(r.addr);
    if (it == mapped_.end()) return;
    info = wire::Msg::object();
    info["rkey"] = wire::Msg::binary(it->second.rkey);
  }

  void RevokeRegion(uintptr_t addr, size_t) override {
    // Every peer confirmed it stopped using the region (its transfers ended
    // after their flush, so no emulated put/get is left to serve).
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mapped_.find(addr);
    if (it == mapped_.end()) return;
    if (!it->second.owned) ucp_mem_unmap(worker_->context(), it->second.memh);
    mapped_.erase(it);
  }

  bool LostPeerMayReach(const memory::LocalRegion& r, const LostPeer& peer) const override {
    // UCX's software RMA (puts this worker applies as they arrive) and cma
    // (the peer's own process_vm_writev) do not look at keys: a dropped
    // peer's puts still land. From another host with an RDMA device here,
    // the NIC refuses the unmapped key. Under AUTO a peer on this host uses
    // UCX only where the host has an RDMA device (CanReach).
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (worker_ == nullptr || r.len == 0) return false;
    }
    const bool rdma = HaveRdmaDevice();
    switch (peer.link) {
      case LinkType::UCX: return peer.same_host || !rdma;
      case LinkType::AUTO: return peer.same_host ? rdma : !rdma;
      default: return false;
    }
  }

  bool CanReach(const PeerInfo& peer, std::string& why) const override {
    if (peer.info == nullptr || !peer.info->is_object() || !peer.info->contains("addr")) {
      why = "peer " + peer.engine + " offers no UCX endpoint (its build has no UCX, or UCX failed "
            "to start there)";
      return false;
    }
    if (!peer.chosen && !HaveRdmaDevice()) {
      why = "ucx: LinkType AUTO uses UCX only on hosts with an RDMA device (none in "
            "/sys/class/infiniband); LinkType=UCX selects it anyway";
      return false;
    }
    return true;
  }

  Status Connect(const PeerInfo& peer, net::Deadline deadline,
                 std::unique_ptr<Channel>& out) override {
    const wire::Msg& a = (*peer.info)["addr"];
    if (!a.is_binary() || a.get_binary().empty() || a.get_binary().size() > 65536) {
      return Status::Failed("peer " + peer.engine + " sent a malformed UCX worker address");
    }
    bool err_peer = true;
    switch (ctx_.Setting(kUcxErrorHandling)) {
      case kErrPeer: err_peer = true; break;
      case kErrNone: err_peer = false; break;
      default:
        // NONE only where shared memory carries the link: under PEER UCX 1.13
        // refuses it, and under NONE a peer lost on a network layer (tcp,
        // verbs) can take this process down with it.
        err_peer = peer.host_id != host::HostIdentity() || !worker_->has_shared_memory();
        break;
    }
    const int64_t pid = peer.host_id == host::HostIdentity() ? peer.pid : 0;
    auto ch =
        std::make_unique<UcxChannel>(worker_, eps_, peer.engine, err_peer, ctx_.hb_bound_ms, pid);
    if (Status s = ch->Open(a.get_binary(), deadline); !s.ok()) return s;
    if (!err_peer && !ch->on_shared_memory()) {
      HIXL_LOG(WARN) << "ucx link to " << peer.engine << " runs on " << ch->layers()
                     << " under UcxErrorHandling=NONE: UCX cannot survive this peer's loss there "
                        "(use PEER)";
    }
    out = std::move(ch);
    return Status::Ok();
  }

 private:
  struct Mapped {
    ucp_mem_h memh = nullptr;
    bool owned = false;  // memory AllocHost made: unmapped by FreeHost, not here
    std::vector<uint8_t> rkey;
  };

  Status PackKey(Mapped& m) const {
    void* packed = nullptr;
    size_t len = 0;
    if (ucs_status_t s = ucp_rkey_pack(worker_->context(), m.memh, &packed, &len); s != UCS_OK) {
      return UcxStatus("ucp_rkey_pack", s);
    }
    const auto* b = static_cast<const uint8_t*>(packed);
    m.rkey.assign(b, b + len);
    ucp_rkey_buffer_release(packed);
    return Status::Ok();
  }

  TransportContext ctx_;
  std::shared_ptr<Worker> worker_;
  std::shared_ptr<EndpointCache> eps_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Mapped> mapped_;
  std::map<uintptr_t, ucp_mem_h> allocated_;  // AllocHost's memory, by address
};

}  // namespace

std::vector<TransportOption> UcxOptions() {
  return {
      {kUcxErrorHandling, 0, 2, kErrAuto, "AUTO, PEER or NONE", {"AUTO", "PEER", "NONE"}},
      {options::kUcxAllocMem, 0, 2, kAllocAuto, "AUTO, UCX or ENGINE", {"AUTO", "UCX", "ENGINE"}}};
}

std::unique_ptr<Transport> MakeUcxTransport(const TransportContext& ctx) {
  return std::make_unique<UcxTransport>(ctx);
}

}  // namespace hixl::transport::ucx
