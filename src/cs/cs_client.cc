#include "cs/cs_client.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "common/net.h"
#include "cs/cs_server.h"

namespace hixl::cs {
namespace {

Status Prefix(const Status& s, const std::string& what) {
  return s.ok() ? s : Status(s.code(), what + ": " + s.message());
}

bool IsZero(const EndpointDesc& e) {
  if (Raw(e.protocol) != 0 || Raw(e.location) != 0 || e.addr != nullptr) return false;
  for (uint32_t r : e.reserved) {
    if (r != 0) return false;
  }
  return true;
}

bool Same(const EndpointDesc& a, const EndpointDesc& b) {
  return Raw(a.protocol) == Raw(b.protocol) && Raw(a.location) == Raw(b.location) &&
         a.addr != nullptr && b.addr != nullptr && std::strcmp(a.addr, b.addr) == 0;
}

const char* LinkTypeOption(LinkType t) {
  switch (t) {
    case LinkType::SHM: return "SHM";
    case LinkType::TCP: return "TCP";
    case LinkType::UCX: return "UCX";
    default: return "AUTO";
  }
}

int32_t MsLeft(Client::Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Client::Clock::now())
                  .count();
  return static_cast<int32_t>(std::clamp<int64_t>(left, 0, INT32_MAX));
}

}  // namespace

struct Client::Sub {
  size_t link = 0;
  std::vector<Piece> pieces;
  uint64_t bytes = 0;
  TransferReq req = 0;
  bool done = false;
  Clock::time_point posted{};
};

// Holds off Shutdown's Finalize while an engine call is under way (Finalize
// must not race with other calls on an engine).
class Client::Use {
 public:
  explicit Use(Client* c) : c_(c) {
    std::lock_guard<std::mutex> l(c_->mu_);
    ok_ = !c_->shut_;
    if (ok_) ++c_->users_;
  }
  ~Use() {
    if (!ok_) return;
    std::lock_guard<std::mutex> l(c_->mu_);
    if (--c_->users_ == 0) c_->idle_.notify_all();
  }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  bool ok() const { return ok_; }

 private:
  Client* c_;
  bool ok_ = false;
};

struct Client::Batch {
  std::mutex mu;
  TransferOp op = TransferOp::WRITE;
  bool has_deadline = false;
  Clock::time_point deadline{};
  bool measure = false;  // sync: parts' times are their own
  bool async = false;    // counted in busy_ until Finish (sync: until RunSync returns)
  std::vector<Sub> subs;
  HixlCompleteStatus final = HIXL_COMPLETE_STATUS_WAITING;
  std::string reason;
};

Status Client::Create(const HixlClientDesc& desc, const HixlClientConfig* config,
                      std::unique_ptr<Client>& out) {
  if (desc.server_ip == nullptr) return Status::ParamInvalid("server_ip is NULL");
  net::HostPort hp;
  if (!net::ParseHostPort(desc.server_ip, hp).ok() || hp.port >= 0) {
    return Status::ParamInvalid("server_ip is not an IPv4 or IPv6 literal");
  }
  if (desc.server_port == 0 || desc.server_port > 65535) {
    return Status::ParamInvalid("server_port must be 1..65535, not " +
                                std::to_string(desc.server_port));
  }
  if (desc.tc > 255)
    return Status::ParamInvalid("tc must be 0..255, not " + std::to_string(desc.tc));
  if (desc.sl > 15) return Status::ParamInvalid("sl must be 0..15, not " + std::to_string(desc.sl));

  std::vector<std::pair<const EndpointDesc*, const EndpointDesc*>> pairs;
  if (desc.endpoint_list_num == 0) {
    pairs.emplace_back(&desc.local_endpoint, &desc.remote_endpoint);
  } else {
    if (desc.endpoint_list_num > HIXL_CS_MAX_ENDPOINTS) {
      return Status::ParamInvalid("endpoint_list_num must be 0.." +
                                  std::to_string(HIXL_CS_MAX_ENDPOINTS));
    }
    if (desc.local_endpoint_list == nullptr || desc.remote_endpoint_list == nullptr) {
      return Status::ParamInvalid(
          "endpoint_list_num > 0 needs local_endpoint_list and remote_endpoint_list");
    }
    if (!(IsZero(desc.local_endpoint) && IsZero(desc.remote_endpoint)) &&
        !(Same(desc.local_endpoint, desc.local_endpoint_list[0]) &&
          Same(desc.remote_endpoint, desc.remote_endpoint_list[0]))) {
      return Status::ParamInvalid(
          "with endpoint lists, local_endpoint and remote_endpoint must be zero or the lists' "
          "first pair");
    }
    for (uint32_t i = 0; i < desc.endpoint_list_num; ++i) {
      pairs.emplace_back(&desc.local_endpoint_list[i], &desc.remote_endpoint_list[i]);
    }
  }

  std::unique_ptr<Client> c(new Client());
  Status config_status = ParseConfig(config, c->options_);
  if (!config_status.ok()) return config_status;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const std::string n = pairs.size() == 1 ? "" : "[" + std::to_string(i) + "]";
    Status st = CheckEndpoint(*pairs[i].first, "local endpoint" + n);
    if (st.ok()) st = CheckEndpoint(*pairs[i].second, "remote endpoint" + n);
    if (!st.ok()) return st;
    Link l;
    std::string remote_transport;
    LinkType remote_type;
    (void)MapProtocol(Raw(pairs[i].first->protocol), l.type, l.transport);
    (void)MapProtocol(Raw(pairs[i].second->protocol), remote_type, remote_transport);
    if (remote_type != l.type) {
      return Status::ParamInvalid("link" + n + ": the local endpoint is " + l.transport +
                                  ", the remote one " + remote_transport + " (they must match)");
    }
    l.protocol = Raw(pairs[i].first->protocol);
    l.local_addr = pairs[i].first->addr;
    l.remote_addr = pairs[i].second->addr;
    c->links_.push_back(std::move(l));
  }
  c->server_ = net::HostPort{desc.server_ip, static_cast<int>(desc.server_port)}.ToString();
  for (size_t i = 0; i < c->links_.size(); ++i) {
    Link& l = c->links_[i];
    auto opts = c->options_;
    opts[options::kLinkType] = LinkTypeOption(l.type);
    l.engine = std::make_unique<Hixl>();
    Status st = l.engine->Initialize(l.local_addr, opts);
    if (!st.ok()) {
      for (auto& done : c->links_) {
        if (done.engine) done.engine->Finalize();
      }
      return Prefix(
          st, "link " + std::to_string(i) + " (" + l.transport + " from " + l.local_addr + ")");
    }
  }
  out = std::move(c);
  return Status::Ok();
}

Client::~Client() { Shutdown(); }

Status Client::Connect(uint32_t timeout_ms) {
  if (timeout_ms == 0 || timeout_ms > INT32_MAX) {
    return Status::ParamInvalid("timeout_ms must be 1.." + std::to_string(INT32_MAX));
  }
  Use use(this);
  if (!use.ok()) return Status::Failed("the client is destroyed");
  std::lock_guard<std::mutex> once(connect_mu_);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shut_) return Status::Failed("the client is destroyed");
    if (connected_)
      return Status::ParamInvalid("the client is connected already (Connect is called once)");
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  Link& first = links_[0];
  Status st = first.engine->Connect(server_, std::max(1, MsLeft(deadline)));
  if (!st.ok() && st.code() != StatusCode::kAlreadyConnected) {
    return Prefix(st, "connecting to the HiXL CS server at " + server_);
  }
  std::string text;
  ServerInfo info;
  st = first.engine->GetPeerInfo(server_, text);
  if (st.ok()) st = DecodeInfo(text, info);
  if (!st.ok()) {
    (void)first.engine->Disconnect(server_, 100);
    return Prefix(st, server_);
  }
  std::vector<std::string> engines(links_.size());
  std::vector<uint64_t> generations(links_.size());
  auto undo = [&] {
    for (size_t i = 0; i < links_.size(); ++i) {
      if (!engines[i].empty()) (void)links_[i].engine->Disconnect(engines[i], 100);
    }
    (void)first.engine->Disconnect(server_, 100);
  };
  for (size_t i = 0; i < links_.size(); ++i) {
    Link& l = links_[i];
    std::string have;
    for (const auto& ep : info.endpoints) {
      if (ep.transport == l.transport && ep.addr == l.remote_addr) {
        engines[i] = ep.engine;
        break;
      }
      have += (have.empty() ? "" : ", ") + ep.transport + " " + ep.addr;
    }
    if (engines[i].empty()) {
      undo();
      return Status::ParamInvalid("link " + std::to_string(i) + ": the server has no " +
                                  l.transport + " endpoint at " + l.remote_addr +
                                  " (it has: " + have + ")");
    }
    st = l.engine->Connect(engines[i], std::max(1, MsLeft(deadline)));
    if (!st.ok() && st.code() != StatusCode::kAlreadyConnected) {
      const std::string to = engines[i];
      engines[i].clear();
      undo();
      return Prefix(st, "link " + std::to_string(i) + " (" + l.transport + " " + l.local_addr +
                            " to " + to + ")");
    }
    st = l.engine->GetPeerGeneration(engines[i], generations[i]);
    if (!st.ok()) {
      undo();
      return Prefix(st, "link " + std::to_string(i));
    }
  }
  if (engines[0] != server_) (void)first.engine->Disconnect(server_, 100);

  std::lock_guard<std::mutex> l(mu_);
  if (shut_) return Status::Failed("the client is destroyed");
  for (size_t i = 0; i < links_.size(); ++i) {
    links_[i].remote_engine = engines[i];
    links_[i].generation = generations[i];
    links_[i].up = true;
  }
  for (const auto& m : info.mems) {
    remote_[m.addr] = m.size;
    remote_tags_.push_back(m.tag);
    remote_list_.push_back(CommMem{COMM_MEM_TYPE_HOST, reinterpret_cast<void*>(m.addr), m.size});
  }
  for (auto& t : remote_tags_) remote_tag_ptrs_.push_back(t.data());
  connected_ = true;
  HIXL_LOG(INFO) << "HiXL CS: client connected to " << server_ << " over " << links_.size()
                 << " link(s); " << remote_list_.size() << " remote region(s)";
  return Status::Ok();
}

Status Client::RemoteMem(CommMem** list, char*** tags, uint32_t* num) {
  std::lock_guard<std::mutex> l(mu_);
  if (shut_) return Status::Failed("the client is destroyed");
  if (!connected_) return Status::NotConnected("call HixlCSClientConnect first");
  *list = remote_list_.data();
  *tags = remote_tag_ptrs_.data();
  *num = static_cast<uint32_t>(remote_list_.size());
  return Status::Ok();
}

Status Client::RegMem(const char* tag, const CommMem* mem, LocalMem*& out) {
  Status s;
  if (tag != nullptr) {
    std::string t;
    s = CheckTag(tag, t);
    if (!s.ok()) return s;
  }
  s = CheckMem(mem);
  if (!s.ok()) return s;
  const uint64_t a = reinterpret_cast<uintptr_t>(mem->addr);
  Use use(this);
  if (!use.ok()) return Status::Failed("the client is destroyed");
  std::lock_guard<std::mutex> l(mu_);
  if (connected_) {
    return Status::ParamInvalid("register client memory before HixlCSClientConnect, not after");
  }
  for (const auto& [start, m] : local_) {
    if (a < start + m->size && start < a + mem->size) {
      return Status::ParamInvalid("mem overlaps memory this client registered already");
    }
  }
  auto m = std::make_unique<LocalMem>();
  m->addr = a;
  m->size = mem->size;
  for (auto& link : links_) {
    hixl::MemHandle h = 0;
    Status s = link.engine->RegisterMem({a, mem->size}, MemType::MEM_HOST, h, MEM_PERM_NONE);
    if (!s.ok()) {
      for (size_t i = 0; i < m->handles.size(); ++i)
        (void)links_[i].engine->DeregisterMem(m->handles[i]);
      return s;
    }
    m->handles.push_back(h);
  }
  out = m.get();
  local_[a] = std::move(m);
  return Status::Ok();
}

Status Client::UnregMem(LocalMem* mem) {
  Use use(this);
  if (!use.ok()) return Status::Failed("the client is destroyed");
  std::lock_guard<std::mutex> l(mu_);
  auto it = std::find_if(local_.begin(), local_.end(),
                         [&](const auto& e) { return e.second.get() == mem; });
  if (it == local_.end())
    return Status::ParamInvalid("mem_handle is not registered with this client");
  if (busy_ > 0) {
    return Status::ParamInvalid(
        std::to_string(busy_) +
        " batch(es) still run on this client: wait for them (query async ones "
        "to their end) first");
  }
  for (size_t i = 0; i < mem->handles.size(); ++i)
    (void)links_[i].engine->DeregisterMem(mem->handles[i]);
  local_.erase(it);
  return Status::Ok();
}

Status Client::Check(const HixlOneSideOpDesc* descs, uint32_t n, std::vector<Piece>& pieces) {
  if (n == 0) return Status::ParamInvalid("list_num is 0");
  if (n > kMaxBatchDescs) {
    return Status::ParamInvalid("list_num " + std::to_string(n) + " is more than " +
                                std::to_string(kMaxBatchDescs));
  }
  if (descs == nullptr) return Status::ParamInvalid("desc_list is NULL");
  std::lock_guard<std::mutex> l(mu_);
  if (shut_) return Status::Failed("the client is destroyed");
  if (!connected_) return Status::NotConnected("call HixlCSClientConnect first");
  pieces.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const auto& d = descs[i];
    const uint64_t la = reinterpret_cast<uintptr_t>(d.local_buf);
    const uint64_t ra = reinterpret_cast<uintptr_t>(d.remote_buf);
    const std::string at = "desc_list[" + std::to_string(i) + "]: ";
    if (d.len == 0) return Status::ParamInvalid(at + "len is 0");
    if (la + d.len < la || ra + d.len < ra)
      return Status::ParamInvalid(at + "a range wraps around");
    auto li = local_.upper_bound(la);
    if (li == local_.begin() || la + d.len > std::prev(li)->first + std::prev(li)->second->size) {
      return Status::ParamInvalid(at + "local_buf is not inside memory this client registered");
    }
    auto ri = remote_.upper_bound(ra);
    if (ri == remote_.begin() || ra + d.len > std::prev(ri)->first + std::prev(ri)->second) {
      return Status::ParamInvalid(at + "remote_buf is not inside memory of the server's list");
    }
    pieces.push_back({la, ra, d.len});
  }
  ++busy_;
  return Status::Ok();
}

void Client::Done() {
  std::lock_guard<std::mutex> l(mu_);
  --busy_;
}

std::vector<LinkLoad> Client::LoadsLocked() const {
  double sum = 0;
  int measured = 0;
  for (const auto& link : links_) {
    if (link.up && link.speed > 0) {
      sum += link.speed;
      ++measured;
    }
  }
  const double guess = measured > 0 ? sum / measured : 1e9;
  std::vector<LinkLoad> loads(links_.size());
  for (size_t k = 0; k < links_.size(); ++k) {
    loads[k] = {links_[k].up, links_[k].speed > 0 ? links_[k].speed : guess, links_[k].in_flight};
  }
  return loads;
}

bool Client::LinkLost(size_t k, const Status& why) {
  if (why.code() == StatusCode::kNotConnected) return true;
  if (why.code() != StatusCode::kFailed && why.code() != StatusCode::kCancelled) return false;
  // FAILED also covers faults of one transfer (a bad local page, a region the
  // server withdrew): only a link the engine no longer holds counts as lost.
  std::string remote;
  {
    std::lock_guard<std::mutex> l(mu_);
    remote = links_[k].remote_engine;
  }
  ConnectStatus cs = ConnectStatus::NOT_CONNECTED;
  return !links_[k].engine->GetConnectStatus(remote, cs).ok() || cs != ConnectStatus::CONNECTED;
}

void Client::LinkDown(size_t k, const Status& why) {
  std::lock_guard<std::mutex> l(mu_);
  Link& link = links_[k];
  if (!link.up) return;
  link.up = false;
  link.reviving = false;
  link.down_since = Clock::now();
  HIXL_LOG(WARN) << "HiXL CS: link " << k << " (" << link.transport << " " << link.local_addr
                 << " to " << link.remote_engine << ") failed: " << why.ToString()
                 << "; its transfers go to the other links";
}

void Client::ReviveLinks() {
  std::lock_guard<std::mutex> l(mu_);
  if (!connected_ || shut_) return;
  const auto now = Clock::now();
  for (size_t k = 0; k < links_.size(); ++k) {
    Link& link = links_[k];
    if (link.up) continue;
    if (!link.reviving) {
      if (now - link.down_since < std::chrono::milliseconds(kReviveMs)) continue;
      Status s = link.engine->ConnectAsync(link.remote_engine, 1000);
      link.reviving = s.ok() || s.code() == StatusCode::kAlreadyConnected;
      if (!link.reviving) link.down_since = now;
      continue;
    }
    ConnectStatus cs = ConnectStatus::NOT_CONNECTED;
    (void)link.engine->GetConnectStatus(link.remote_engine, cs);
    if (cs == ConnectStatus::CONNECTING) continue;
    link.reviving = false;
    uint64_t gen = 0;
    if (cs == ConnectStatus::CONNECTED &&
        link.engine->GetPeerGeneration(link.remote_engine, gen).ok() && gen == link.generation) {
      link.up = true;
      HIXL_LOG(INFO) << "HiXL CS: link " << k << " to " << link.remote_engine << " is back";
    } else {
      link.down_since = now;  // not back (or the server restarted: its memory list is stale)
    }
  }
}

Status Client::Place(Batch& b, std::vector<Piece> pieces) {
  for (size_t attempt = 0; attempt <= links_.size() && !pieces.empty(); ++attempt) {
    std::vector<LinkLoad> loads(links_.size());
    std::vector<std::string> remotes(links_.size());
    std::vector<uint64_t> gens(links_.size());
    {
      std::lock_guard<std::mutex> l(mu_);
      if (shut_) return Status::Failed("the client is destroyed");
      loads = LoadsLocked();
      for (size_t k = 0; k < links_.size(); ++k) {
        remotes[k] = links_[k].remote_engine;
        gens[k] = links_[k].generation;
      }
    }
    auto plan = Stripe(pieces, loads, kMinPiece);
    if (plan.empty()) return Status::Failed("no link to the server " + server_ + " is up");
    std::vector<Piece> again;
    for (size_t k = 0; k < plan.size(); ++k) {
      if (plan[k].empty()) continue;
      Sub s;
      s.link = k;
      s.pieces = std::move(plan[k]);
      std::vector<TransferOpDesc> descs;
      descs.reserve(s.pieces.size());
      for (const auto& p : s.pieces) {
        descs.push_back({static_cast<uintptr_t>(p.local), static_cast<uintptr_t>(p.remote), p.len});
        s.bytes += p.len;
      }
      TransferArgs args;
      args.remote_generation = gens[k];
      if (b.has_deadline) {
        args.timeout_ms = MsLeft(b.deadline);
        if (args.timeout_ms <= 0) return Status::Timeout("the batch's deadline passed");
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        links_[k].in_flight += s.bytes;
        links_[k].pieces += 1;
      }
      s.posted = Clock::now();
      Status st = links_[k].engine->TransferAsync(remotes[k], b.op, descs, args, s.req);
      if (st.ok()) {
        b.subs.push_back(std::move(s));
        continue;
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        links_[k].in_flight -= s.bytes;
        links_[k].pieces -= 1;
      }
      if (!LinkLost(k, st)) return st;
      LinkDown(k, st);
      again.insert(again.end(), s.pieces.begin(), s.pieces.end());
    }
    pieces = std::move(again);
  }
  if (!pieces.empty())
    return Status::Failed("no link to the server " + server_ + " took the transfer");
  return Status::Ok();
}

void Client::Finish(Batch& b, HixlCompleteStatus st, const std::string& reason) {
  if (st != HIXL_COMPLETE_STATUS_COMPLETED) {
    // Stop every part still running: CancelTransfer returns once no byte of
    // it moves, so nothing is written after the end is reported.
    for (auto& s : b.subs) {
      if (s.done) continue;
      Hixl* e = links_[s.link].engine.get();
      (void)e->CancelTransfer(s.req);
      TransferStatus ts;
      Status why;
      (void)e->GetTransferStatus(s.req, ts, why);
      s.done = true;
      std::lock_guard<std::mutex> l(mu_);
      links_[s.link].in_flight -= s.bytes;
    }
  }
  b.final = st;
  b.reason = reason;
  std::lock_guard<std::mutex> l(mu_);
  if (b.async) --busy_;
  for (auto it = batches_.begin(); it != batches_.end(); ++it) {
    if (it->get() == &b) {
      batches_.erase(it);
      break;
    }
  }
}

void Client::Drive(Batch& b) {
  bool pending = false;
  for (size_t i = 0; i < b.subs.size(); ++i) {
    if (b.subs[i].done) continue;
    const size_t k = b.subs[i].link;
    TransferStatus ts = TransferStatus::WAITING;
    Status why;
    Status q = links_[k].engine->GetTransferStatus(b.subs[i].req, ts, why);
    if (!q.ok()) {
      ts = TransferStatus::FAILED;
      why = q;
    }
    if (ts == TransferStatus::WAITING) {
      pending = true;
      continue;
    }
    Sub& s = b.subs[i];
    s.done = true;
    const double secs = std::chrono::duration<double>(Clock::now() - s.posted).count();
    {
      std::lock_guard<std::mutex> l(mu_);
      Link& link = links_[k];
      link.in_flight -= s.bytes;
      if (ts == TransferStatus::COMPLETED) {
        link.bytes += s.bytes;
        if (b.measure && s.bytes >= kMeasureBytes && secs > 0) {
          const double rate = static_cast<double>(s.bytes) / secs;
          link.speed = link.speed > 0 ? 0.5 * link.speed + 0.5 * rate : rate;
        }
      }
    }
    if (ts == TransferStatus::COMPLETED) continue;
    if (ts == TransferStatus::TIMEOUT) {
      Finish(b, HIXL_COMPLETE_STATUS_TIMEOUT, why.ToString());
      return;
    }
    if (!LinkLost(k, why)) {
      Finish(b, HIXL_COMPLETE_STATUS_FAILED, why.ToString());
      return;
    }
    LinkDown(k, why);
    std::vector<Piece> moved = s.pieces;
    Status st = Place(b, std::move(moved));
    if (!st.ok()) {
      Finish(b,
             st.code() == StatusCode::kTimeout ? HIXL_COMPLETE_STATUS_TIMEOUT
                                               : HIXL_COMPLETE_STATUS_FAILED,
             "link " + std::to_string(k) + " failed (" + why.ToString() + ") and " + st.ToString());
      return;
    }
    pending = true;  // the moved parts run now
  }
  if (!pending) Finish(b, HIXL_COMPLETE_STATUS_COMPLETED, "");
}

Client::Inline Client::RunInline(TransferOp op, std::vector<Piece>& pieces, int64_t timeout_ms,
                                 Status& result) {
  // One part on one link: TransferSync on the caller's thread (no polling).
  std::vector<LinkLoad> loads;
  size_t k = 0;
  std::string remote;
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    loads = LoadsLocked();
  }
  auto plan = Stripe(pieces, loads, kMinPiece);
  size_t used = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].empty()) {
      ++used;
      k = i;
    }
  }
  if (used != 1) return Inline::kNo;
  uint64_t bytes = 0;
  std::vector<TransferOpDesc> descs;
  descs.reserve(pieces.size());
  for (const auto& p : pieces) {
    descs.push_back({static_cast<uintptr_t>(p.local), static_cast<uintptr_t>(p.remote), p.len});
    bytes += p.len;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    remote = links_[k].remote_engine;
    gen = links_[k].generation;
    links_[k].in_flight += bytes;
    links_[k].pieces += 1;
  }
  TransferArgs args;
  args.remote_generation = gen;
  const auto t0 = Clock::now();
  result =
      links_[k].engine->TransferSync(remote, op, descs, args, static_cast<int32_t>(timeout_ms));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> l(mu_);
    Link& link = links_[k];
    link.in_flight -= bytes;
    if (result.ok()) {
      link.bytes += bytes;
      if (bytes >= kMeasureBytes && secs > 0) {
        const double rate = static_cast<double>(bytes) / secs;
        link.speed = link.speed > 0 ? 0.5 * link.speed + 0.5 * rate : rate;
      }
    }
  }
  if (!result.ok() && LinkLost(k, result)) {
    LinkDown(k, result);
    bool others = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& link : links_) others = others || link.up;
    }
    if (others) return Inline::kAgain;  // try again over the links still up
  }
  return Inline::kDone;
}

Status Client::RunSync(TransferOp op, const HixlOneSideOpDesc* descs, uint32_t n,
                       uint32_t timeout_ms) {
  if (timeout_ms == 0 || timeout_ms > INT32_MAX)
    return Status::ParamInvalid("timeout_ms must be > 0");
  Use use(this);
  if (!use.ok()) return Status::Failed("the client is destroyed");
  std::vector<Piece> pieces;
  Status st = Check(descs, n, pieces);
  if (!st.ok()) return st;
  struct Guard {
    Client* c;
    ~Guard() { c->Done(); }
  } guard{this};
  // The published outcomes: SUCCESS, TIMEOUT, FAILED (and PARAM_INVALID for
  // what the server refused); a link that went away is a FAILED batch.
  auto outcome = [](const Status& r) {
    if (r.ok() || r.code() == StatusCode::kTimeout || r.code() == StatusCode::kParamInvalid ||
        r.code() == StatusCode::kFailed) {
      return r;
    }
    return Status::Failed(r.ToString());
  };
  ReviveLinks();
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (size_t attempt = 0; attempt < links_.size(); ++attempt) {
    const int32_t left = MsLeft(deadline);
    if (left <= 0) return Status::Timeout("the batch's deadline passed");
    Status result;
    Inline r = RunInline(op, pieces, left, result);
    if (r == Inline::kDone) return outcome(result);
    if (r == Inline::kNo) break;
  }
  auto b = std::make_shared<Batch>();
  b->op = op;
  b->has_deadline = true;
  b->deadline = deadline;
  b->measure = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shut_) return Status::Failed("the client is destroyed");
    batches_.insert(b);
  }
  std::unique_lock<std::mutex> bl(b->mu);
  if (b->final != HIXL_COMPLETE_STATUS_WAITING) return Status::Failed(b->reason);
  st = Place(*b, std::move(pieces));
  if (!st.ok()) {
    Finish(*b, HIXL_COMPLETE_STATUS_FAILED, st.ToString());
    return outcome(st);
  }
  int64_t sleep_us = 5;
  for (;;) {
    Drive(*b);
    if (b->final != HIXL_COMPLETE_STATUS_WAITING) break;
    bl.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, 500);
    bl.lock();
    if (b->final != HIXL_COMPLETE_STATUS_WAITING) break;  // ended by Shutdown
  }
  switch (b->final) {
    case HIXL_COMPLETE_STATUS_COMPLETED: return Status::Ok();
    case HIXL_COMPLETE_STATUS_TIMEOUT: return Status::Timeout(b->reason);
    default: return Status::Failed(b->reason);
  }
}

Status Client::PostAsync(TransferOp op, const HixlOneSideOpDesc* descs, uint32_t n,
                         std::shared_ptr<Batch>& out) {
  Use use(this);
  if (!use.ok()) return Status::Failed("the client is destroyed");
  std::vector<Piece> pieces;
  Status st = Check(descs, n, pieces);
  if (!st.ok()) return st;
  ReviveLinks();
  auto b = std::make_shared<Batch>();
  b->op = op;
  b->async = true;  // busy_ from Check on, until Finish
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shut_) {
      --busy_;
      return Status::Failed("the client is destroyed");
    }
    batches_.insert(b);
  }
  std::lock_guard<std::mutex> bl(b->mu);
  if (b->final != HIXL_COMPLETE_STATUS_WAITING) return Status::Failed(b->reason);
  st = Place(*b, std::move(pieces));
  if (!st.ok()) {
    Finish(*b, HIXL_COMPLETE_STATUS_FAILED, st.ToString());
    return st;
  }
  out = b;
  return Status::Ok();
}

HixlCompleteStatus Client::Query(Batch& b, std::string& reason) {
  Use use(this);
  if (use.ok()) ReviveLinks();
  std::lock_guard<std::mutex> bl(b.mu);
  if (b.final == HIXL_COMPLETE_STATUS_WAITING) {
    if (!use.ok()) {
      reason = "FAILED: the client was destroyed";
      return HIXL_COMPLETE_STATUS_FAILED;  // Shutdown ends it
    }
    Drive(b);
  }
  reason = b.reason;
  return b.final;
}

std::vector<HixlCSLinkStats> Client::Stats() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<HixlCSLinkStats> out;
  for (const auto& link : links_) {
    HixlCSLinkStats s{};
    std::snprintf(s.local_addr, sizeof(s.local_addr), "%s", link.local_addr.c_str());
    std::snprintf(s.remote_engine, sizeof(s.remote_engine), "%s", link.remote_engine.c_str());
    s.protocol = static_cast<CommProtocol>(link.protocol);
    s.up = link.up ? 1 : 0;
    s.bytes = link.bytes;
    s.pieces = link.pieces;
    s.bytes_per_second = link.speed;
    out.push_back(s);
  }
  return out;
}

void Client::Shutdown() {
  std::vector<std::pair<size_t, std::string>> remotes;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shut_) return;
    shut_ = true;  // no new engine call starts
    for (size_t k = 0; k < links_.size(); ++k) {
      if (!links_[k].remote_engine.empty()) remotes.emplace_back(k, links_[k].remote_engine);
    }
  }
  // Close the links: transfers under way on other threads end FAILED at once
  // (Disconnect may run beside other calls; Finalize may not).
  for (const auto& [k, remote] : remotes) (void)links_[k].engine->Disconnect(remote, 100);
  std::vector<std::shared_ptr<Batch>> running;
  {
    std::unique_lock<std::mutex> l(mu_);
    idle_.wait(l, [this] { return users_ == 0; });
    running.assign(batches_.begin(), batches_.end());
  }
  for (auto& b : running) {
    std::lock_guard<std::mutex> bl(b->mu);
    if (b->final == HIXL_COMPLETE_STATUS_WAITING) {
      Finish(*b, HIXL_COMPLETE_STATUS_FAILED, "FAILED: the client was destroyed");
    }
  }
  for (auto& link : links_) {
    if (link.engine) link.engine->Finalize();
  }
}

}  // namespace hixl::cs
