#include "transport/shm/shm_device.h"

#include <unistd.h>

#include <memory>

#include "auth/auth.h"
#include "common/host.h"
#include "common/log.h"
#include "device/cuda.h"

namespace hixl::transport::shm {
namespace {

// This process among the engines on the host: 64 random bits, drawn again
// in a child after fork. The driver refuses to open an IPC handle in the
// process that exported it, so an engine linked to another engine of its
// own process uses the peer's device pointers as they are.
uint64_t ProcessToken() {
  static std::mutex mu;
  static pid_t pid = 0;
  static uint64_t token = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (pid != getpid()) {
    pid = getpid();
    token = host::RandomU64();
  }
  return token;
}

}  // namespace

void DescribeDeviceRegion(const memory::LocalRegion& r, wire::Msg& info) {
  std::string handle;
  Status legacy = device::IpcExport(r.dev.base, r.dev.ordinal, handle);
  if (!legacy.ok()) {
    // Memory of cuMemCreate has no legacy handle; peers may get its
    // physical memory as a descriptor instead, if it was made for that.
    bool vmm = false, exportable = false;
    std::string why;
    Status probe = device::VmmProbe(r.dev.base, r.dev.ordinal, vmm, exportable, why);
    if (!probe.ok() || !vmm || !exportable) {
      if (!probe.ok() || !vmm) why = "the driver gives no IPC handle: " + legacy.message();
      HIXL_LOG(INFO) << "shm: local peers cannot reach device region " << r.id << ": " << why;
      info = wire::Msg::object();
      info["none"] = why;
      return;
    }
  }
  info = wire::Msg::object();
  if (legacy.ok()) {
    info["ipc"] = auth::Hex(reinterpret_cast<const uint8_t*>(handle.data()), handle.size());
  } else {
    info["vmm"] = true;
  }
  info["uuid"] = auth::Hex(r.dev.uuid.data(), r.dev.uuid.size());
  info["off"] = static_cast<uint64_t>(r.addr - r.dev.base);
  info["size"] = static_cast<uint64_t>(r.dev.size);
  info["buf"] = r.dev.buffer_id;
  info["proc"] = ProcessToken();
}

Status ExportDeviceRegion(const memory::LocalRegion& r, int& fd) {
  fd = -1;
  if (r.type != MemType::MEM_DEVICE) {
    return Status::ParamInvalid("region " + std::to_string(r.id) + " is not device memory");
  }
  return device::VmmExport(r.dev.base, r.dev.ordinal, fd);
}

struct DeviceImports::Import {
  uintptr_t base = 0;
  int ordinal = -1;
  size_t size = 0;
  bool own = false;  // the peer is this process: nothing was opened
  bool vmm = false;  // mapped from the peer's descriptor (VmmImport)
  ~Import() {
    if (base == 0 || own) return;
    Status s = vmm ? device::VmmClose(base, size, ordinal) : device::IpcClose(base, ordinal);
    if (!s.ok()) {
      HIXL_LOG(WARN) << "shm: closing a peer's device memory: " << s.message();
    }
  }
};

Status DeviceImports::Prepare(memory::RemoteRegion& r, const wire::Msg* info,
                              const FetchFd& fetch) {
  const std::string what = "shm: device region " + std::to_string(r.id) + " of " + peer_;
  if (info == nullptr || !info->is_object()) {
    return Status::Unsupported(what + " came without an IPC handle (the peer's driver gave none)");
  }
  if (std::string why; wire::GetStr(*info, "none", why, 1024)) {
    return Status::Unsupported(what + " cannot be opened in another process: " + why);
  }
  std::string ipc_hex, uuid_hex;
  uint64_t off = 0, size = 0, buf = 0;
  std::string handle(64, '\0');
  device::Uuid uuid{};
  bool vmm = false;
  if (info->contains("vmm") && (!wire::GetBool(*info, "vmm", vmm) || !vmm)) {
    return Status::Failed(what + ": malformed device entry");
  }
  if ((!vmm && (!wire::GetStr(*info, "ipc", ipc_hex, 2 * handle.size()) ||
                !auth::FromHex(ipc_hex, reinterpret_cast<uint8_t*>(handle.data()),
                               handle.size()))) ||
      !wire::GetStr(*info, "uuid", uuid_hex, 2 * uuid.size()) || !wire::GetU64(*info, "off", off) ||
      !wire::GetU64(*info, "size", size) || !wire::GetU64(*info, "buf", buf) ||
      !auth::FromHex(uuid_hex, uuid.data(), uuid.size())) {
    return Status::Failed(what + ": malformed device entry");
  }
  if (size == 0 || off > size || r.len > size - off) {
    return Status::Failed(what + ": the peer described a region outside its allocation");
  }
  std::shared_ptr<Import> imp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(by_buffer_, [](const auto& kv) { return kv.second.expired(); });
    if (auto it = by_buffer_.find(buf); it != by_buffer_.end()) imp = it->second.lock();
    if (imp && imp->size != size) {
      return Status::Failed(what + ": the peer named a buffer it described before with another "
                            "size");
    }
    uint64_t proc = 0;
    if (!imp && wire::GetU64(*info, "proc", proc) && proc == ProcessToken()) {
      // The peer is an engine of this process: its allocation is ours. The
      // driver must agree, allocation and buffer id alike, before a byte of
      // it is trusted.
      auto fresh = std::make_shared<Import>();
      fresh->own = true;
      device::PtrInfo got;
      const uintptr_t base = r.addr - off;
      Status q = device::Query(base, got);
      if (!q.ok() || !got.device || got.base != base || got.size != size || got.buffer_id != buf ||
          got.uuid != uuid) {
        return Status::Failed(what +
                              ": the peer, in this process, described an allocation the "
                              "driver does not know");
      }
      fresh->base = base;
      fresh->ordinal = got.ordinal;
      fresh->size = static_cast<size_t>(size);
      by_buffer_[buf] = fresh;
      imp = std::move(fresh);
    }
    if (!imp) {
      auto fresh = std::make_shared<Import>();
      Status s;
      if (vmm) {
        net::Fd fd;
        s = fetch ? fetch(r.id, fd) : Status::Unsupported("no way to ask the peer");
        if (s.ok()) {
          s = device::VmmImport(fd.get(), static_cast<size_t>(size), uuid, fresh->base,
                                fresh->ordinal);
        }
        fresh->vmm = true;
        fresh->size = static_cast<size_t>(size);
      } else {
        s = device::IpcOpen(handle, uuid, fresh->base, fresh->ordinal);
      }
      if (!s.ok()) {
        fresh->base = 0;  // nothing to close
        return Status(s.code(), what + ": " + s.message());
      }
      // What the driver mapped must hold what the peer described: never
      // trust its sizes for bounds.
      device::PtrInfo got;
      Status q = device::Query(fresh->base, got);
      if (!q.ok() || !got.device || got.base != fresh->base || got.size < size) {
        fresh.reset();  // closes it
        return Status::Failed(what + ": the opened allocation is smaller than the peer said");
      }
      fresh->size = static_cast<size_t>(size);
      by_buffer_[buf] = fresh;
      imp = std::move(fresh);
    }
  }
  r.mapped = reinterpret_cast<char*>(imp->base + off);
  r.map_lo = r.addr;
  r.map_hi = r.addr + r.len;
  r.device_ordinal = imp->ordinal;
  r.transport_state = std::move(imp);
  return Status::Ok();
}

Status CopyDevice(TransferOp op, uintptr_t local, char* mapped, size_t len, int ordinal,
                  const device::StreamEvent& after) {
  char* mine = reinterpret_cast<char*>(local);
  char* to = op == TransferOp::WRITE ? mapped : mine;
  const char* from = op == TransferOp::WRITE ? mine : mapped;
  return device::Copy(to, from, len, ordinal, after);
}

char* StagingBuffer() {
  thread_local std::unique_ptr<char[]> buf;
  if (!buf) buf = std::make_unique<char[]>(kStageBytes);
  return buf.get();
}

}  // namespace hixl::transport::shm
