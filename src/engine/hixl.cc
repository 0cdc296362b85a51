// hixl::Hixl: the public class forwards to Impl (see engine/engine.h).
#include "hixl/hixl.h"

#include "engine/engine.h"

namespace hixl {

const char* Version() { return HIXL_VERSION_STRING; }

const char* BuildInfo() {
#ifdef HIXL_HAVE_UCX
#define HIXL_INFO_UCX "on"
#else
#define HIXL_INFO_UCX "off"
#endif
#ifdef HIXL_HAVE_ETCD
#define HIXL_INFO_ETCD "on"
#else
#define HIXL_INFO_ETCD "off"
#endif
  return "ucx=" HIXL_INFO_UCX " etcd=" HIXL_INFO_ETCD " sanitizer=" HIXL_SANITIZER_NAME
         " type=" HIXL_BUILD_TYPE_NAME;
}

Hixl::Hixl() : impl_(std::make_unique<Impl>()) {}
Hixl::~Hixl() = default;

Status Hixl::Initialize(const std::string& local_engine,
                        const std::map<std::string, std::string>& options) {
  return impl_->Initialize(local_engine, options);
}
void Hixl::Finalize() { impl_->Finalize(); }
std::string Hixl::LocalEngine() const { return impl_->LocalEngine(); }

Status Hixl::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle, uint32_t perms,
                         uint32_t flags) {
  return impl_->RegisterMem(mem, type, handle, perms, flags);
}
Status Hixl::DeregisterMem(MemHandle handle) { return impl_->DeregisterMem(handle); }
Status Hixl::AllocMem(size_t size, MemType type, void** ptr) {
  return impl_->AllocMem(size, type, ptr);
}
Status Hixl::FreeMem(void* ptr) { return impl_->FreeMem(ptr); }
Status Hixl::GetMemHandle(void* ptr, MemHandle& handle) const {
  return impl_->GetMemHandle(ptr, handle);
}

Status Hixl::Connect(const std::string& remote_engine, int32_t timeout_ms) {
  return impl_->Connect(remote_engine, timeout_ms);
}
Status Hixl::ConnectAsync(const std::string& remote_engine, int32_t timeout_ms) {
  return impl_->ConnectAsync(remote_engine, timeout_ms);
}
Status Hixl::GetConnectStatus(const std::string& remote_engine, ConnectStatus& status,
                              Status* reason) const {
  return impl_->GetConnectStatus(remote_engine, status, reason);
}
Status Hixl::SetLocalInfo(const std::string& info) { return impl_->SetLocalInfo(info); }
Status Hixl::GetPeerInfo(const std::string& remote_engine, std::string& info) const {
  return impl_->GetPeerInfo(remote_engine, info);
}
Status Hixl::GetPeerGeneration(const std::string& remote_engine, uint64_t& generation) const {
  return impl_->GetPeerGeneration(remote_engine, generation);
}
uint64_t Hixl::Generation() const { return impl_->Generation(); }
Status Hixl::ListEngines(std::vector<EngineRecord>& engines) const {
  return impl_->ListEngines(engines);
}
Status Hixl::Disconnect(const std::string& remote_engine, int32_t timeout_ms) {
  return impl_->Disconnect(remote_engine, timeout_ms);
}
Status Hixl::GetLinkType(const std::string& remote_engine, LinkType& type) const {
  return impl_->GetLinkType(remote_engine, type);
}
Status Hixl::GetTransports(std::vector<TransportInfo>& transports) const {
  return impl_->GetTransports(transports);
}
Status Hixl::GetPeerStats(const std::string& remote_engine, PeerStats& stats) const {
  return impl_->GetPeerStats(remote_engine, stats);
}

Status Hixl::TransferSync(const std::string& remote_engine, TransferOp op,
                          const std::vector<TransferOpDesc>& descs, int32_t timeout_ms) {
  return impl_->TransferSync(remote_engine, op, descs, TransferArgs{}, timeout_ms);
}
Status Hixl::TransferSync(const std::string& remote_engine, TransferOp op,
                          const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                          int32_t timeout_ms) {
  return impl_->TransferSync(remote_engine, op, descs, args, timeout_ms);
}
Status Hixl::TransferAsync(const std::string& remote_engine, TransferOp op,
                           const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                           TransferReq& req) {
  return impl_->TransferAsync(remote_engine, op, descs, args, req);
}
Status Hixl::GetTransferStatus(TransferReq req, TransferStatus& status) {
  return impl_->GetTransferStatus(req, status, nullptr);
}
Status Hixl::GetTransferStatus(TransferReq req, TransferStatus& status, Status& reason) {
  return impl_->GetTransferStatus(req, status, &reason);
}
Status Hixl::CancelTransfer(TransferReq req) { return impl_->CancelTransfer(req); }

Status Hixl::SendNotify(const std::string& remote_engine, const NotifyDesc& notify,
                        int32_t timeout_ms) {
  return impl_->SendNotify(remote_engine, notify, timeout_ms);
}
Status Hixl::GetNotifies(std::vector<NotifyDesc>& notifies) { return impl_->GetNotifies(notifies); }
Status Hixl::SetNotifyCallback(NotifyCallback callback) {
  return impl_->SetNotifyCallback(std::move(callback));
}

}  // namespace hixl
