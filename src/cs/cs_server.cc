#include "cs/cs_server.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/net.h"
#include "engine/options.h"

namespace hixl::cs {
namespace {

std::string JoinHostPort(const std::string& ip, uint32_t port) {
  net::HostPort hp{ip, static_cast<int>(port)};
  return hp.ToString();
}

Status Prefix(const Status& s, const std::string& what) {
  return s.ok() ? s : Status(s.code(), what + ": " + s.message());
}

}  // namespace

Status ParseResourceConfig(const char* json, std::map<std::string, std::string>& out) {
  out.clear();
  if (json == nullptr) return Status::Ok();
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::ParamInvalid("global_resource_config must be a JSON object of engine options");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == options::kLinkType || k == options::kEngineName || k == options::kMetadataServer ||
        k == options::kMetadataPrefix || k == options::kMetadataTtlS) {
      return Status::ParamInvalid("global_resource_config: '" + k +
                                  "' is set by HiXL CS itself (the endpoints decide it)");
    }
    const auto& v = it.value();
    if (v.is_string()) {
      out[k] = v.get<std::string>();
    } else if (v.is_number_integer()) {
      out[k] = std::to_string(v.get<int64_t>());
    } else if (v.is_boolean()) {
      out[k] = v.get<bool>() ? "1" : "0";
    } else {
      return Status::ParamInvalid("global_resource_config: '" + k +
                                  "' must be a string, an integer or a boolean");
    }
  }
  engine::Options parsed;
  return Prefix(engine::ParseOptions(out, parsed), "global_resource_config");
}

Status Server::Create(const HixlServerDesc& desc, const HixlServerConfig* config,
                      std::unique_ptr<Server>& out) {
  if (desc.endpoint_list == nullptr) return Status::ParamInvalid("endpoint_list is NULL");
  if (desc.endpoint_list_num == 0 || desc.endpoint_list_num > HIXL_CS_MAX_ENDPOINTS) {
    return Status::ParamInvalid("endpoint_list_num must be 1.." +
                                std::to_string(HIXL_CS_MAX_ENDPOINTS) + ", not " +
                                std::to_string(desc.endpoint_list_num));
  }
  if (desc.server_ip == nullptr) return Status::ParamInvalid("server_ip is NULL");
  if (desc.server_port > 65535) {
    return Status::ParamInvalid("server_port must be 0..65535, not " +
                                std::to_string(desc.server_port));
  }
  std::unique_ptr<Server> s(new Server());
  Status config_status = ParseConfig(config, s->options_);
  if (!config_status.ok()) return config_status;
  bool found = false;
  for (uint32_t i = 0; i < desc.endpoint_list_num; ++i) {
    const EndpointDesc& ep = desc.endpoint_list[i];
    Status st = CheckEndpoint(ep, "endpoint_list[" + std::to_string(i) + "]");
    if (!st.ok()) return st;
    Endpoint e;
    LinkType link;
    (void)MapProtocol(Raw(ep.protocol), link, e.transport);
    e.addr = ep.addr;
    {
      // The transport must exist in this build (the engine says UNSUPPORTED).
      auto opts = s->options_;
      opts[options::kLinkType] = e.transport == "shm"   ? "SHM"
                                 : e.transport == "tcp" ? "TCP"
                                                        : "UCX";
      engine::Options parsed;
      st = engine::ParseOptions(opts, parsed);
      if (!st.ok()) return Prefix(st, "endpoint_list[" + std::to_string(i) + "]");
    }
    if (!found && e.addr == desc.server_ip) {
      found = true;
      s->primary_ = i;
    }
    s->endpoints_.push_back(std::move(e));
  }
  if (!found) {
    return Status::ParamInvalid(std::string("server_ip \"") +
                                std::string(desc.server_ip).substr(0, 64) +
                                "\" is not the addr of any endpoint in endpoint_list");
  }
  s->port_ = desc.server_port;
  out = std::move(s);
  return Status::Ok();
}

Server::~Server() { (void)Shutdown(); }

ServerInfo Server::InfoLocked() const {
  ServerInfo info;
  for (const auto& e : endpoints_) {
    // Before Listen the engines' ports are not known: count the longest.
    const std::string longest = net::HostPort{e.addr, 65535}.ToString();
    info.endpoints.push_back(
        {e.transport, e.addr, e.engine_addr.empty() ? longest : e.engine_addr});
  }
  for (const auto& m : mems_) info.mems.push_back({m->tag, m->addr, m->size});
  return info;
}

Status Server::PublishLocked() {
  std::string text = EncodeInfo(InfoLocked());
  for (auto& e : endpoints_) {
    Status s = e.engine->SetLocalInfo(text);
    if (!s.ok()) return Prefix(s, "publishing the memory list");
  }
  return Status::Ok();
}

Status Server::RegMem(const char* tag, const CommMem* mem, Mem*& out) {
  std::string t;
  Status s = CheckTag(tag, t);
  if (!s.ok()) return s;
  s = CheckMem(mem);
  if (!s.ok()) return s;
  const uint64_t a = reinterpret_cast<uintptr_t>(mem->addr);
  std::lock_guard<std::mutex> l(mu_);
  if (shut_) return Status::Failed("the server is destroyed");
  if (mems_.size() >= HIXL_CS_MAX_MEMS) {
    return Status::ResourceExhausted("a server offers at most " + std::to_string(HIXL_CS_MAX_MEMS) +
                                     " regions");
  }
  for (const auto& m : mems_) {
    if (m->tag == t) return Status::ParamInvalid("mem_tag \"" + t + "\" is registered already");
    if (a < m->addr + m->size && m->addr < a + mem->size) {
      return Status::ParamInvalid("mem overlaps the memory registered as \"" + m->tag + "\"");
    }
  }
  auto m = std::make_unique<Mem>();
  m->tag = t;
  m->addr = a;
  m->size = mem->size;
  // The whole list travels in the handshake: it must fit there.
  ServerInfo info = InfoLocked();
  info.mems.push_back({t, a, mem->size});
  if (EncodeInfo(info).size() > kMaxLocalInfoLen) {
    return Status::ResourceExhausted("the memory list would exceed " +
                                     std::to_string(kMaxLocalInfoLen) + " bytes with \"" + t +
                                     "\" (shorter tags leave room for more)");
  }
  if (listening_) {
    for (auto& e : endpoints_) {
      if (!e.engine) continue;
      hixl::MemHandle h = 0;
      s = e.engine->RegisterMem({a, mem->size}, MemType::MEM_HOST, h, MEM_PERM_READ_WRITE);
      if (!s.ok()) {
        for (size_t i = 0; i < m->handles.size(); ++i)
          (void)endpoints_[i].engine->DeregisterMem(m->handles[i]);
        return s;
      }
      m->handles.push_back(h);
    }
  }
  out = m.get();
  mems_.push_back(std::move(m));
  if (listening_ && port_ != 0) {
    s = PublishLocked();
    if (!s.ok()) {
      Mem& last = *mems_.back();
      for (size_t i = 0; i < last.handles.size(); ++i) {
        (void)endpoints_[i].engine->DeregisterMem(last.handles[i]);
      }
      mems_.pop_back();
      (void)PublishLocked();  // the list as it was
      return s;
    }
  }
  return Status::Ok();
}

Status Server::Listen(uint32_t backlog) {
  if (backlog == 0 || backlog > 65535) {
    return Status::ParamInvalid("backlog must be 1..65535, not " + std::to_string(backlog));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (shut_) return Status::Failed("the server is destroyed");
  if (listening_) return Status::ParamInvalid("the server listens already (Listen is called once)");
  if (port_ == 0) {
    listening_ = true;
    HIXL_LOG(INFO) << "HiXL CS: server_port is 0: the server does not listen";
    return Status::Ok();
  }
  // The primary first, on the published port; the others on free ports.
  std::vector<size_t> order{primary_};
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (i != primary_) order.push_back(i);
  }
  auto undo = [this] {
    for (auto& e : endpoints_) {
      if (e.engine) e.engine->Finalize();
      e.engine.reset();
      e.engine_addr.clear();
    }
    for (auto& m : mems_) m->handles.clear();
  };
  for (size_t i : order) {
    Endpoint& e = endpoints_[i];
    e.engine = std::make_unique<Hixl>();
    const std::string at = JoinHostPort(e.addr, i == primary_ ? port_ : 0);
    Status s = e.engine->Initialize(at, options_);
    if (!s.ok()) {
      undo();
      return Prefix(s, "endpoint " + std::to_string(i) + " (" + e.transport + " " + at + ")");
    }
    e.engine_addr = e.engine->LocalEngine();
  }
  for (auto& m : mems_) {
    for (auto& e : endpoints_) {
      hixl::MemHandle h = 0;
      Status s =
          e.engine->RegisterMem({m->addr, m->size}, MemType::MEM_HOST, h, MEM_PERM_READ_WRITE);
      if (!s.ok()) {
        undo();
        return Prefix(s, "registering \"" + m->tag + "\"");
      }
      m->handles.push_back(h);
    }
  }
  Status published = PublishLocked();
  if (!published.ok()) {
    undo();
    return published;
  }
  listening_ = true;
  HIXL_LOG(INFO) << "HiXL CS: server listening at " << endpoints_[primary_].engine_addr << " with "
                 << endpoints_.size() << " endpoint(s)";
  return Status::Ok();
}

Status Server::UnregMem(Mem* mem) {
  std::unique_ptr<Mem> gone;
  Status result;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it =
        std::find_if(mems_.begin(), mems_.end(), [&](const auto& p) { return p.get() == mem; });
    if (it == mems_.end())
      return Status::ParamInvalid("mem_handle is not registered with this server");
    gone = std::move(*it);
    mems_.erase(it);
    if (listening_ && port_ != 0) {
      Status s = PublishLocked();  // a shorter list: fits whenever the longer did
      if (!s.ok()) {
        HIXL_LOG(ERROR) << "HiXL CS: " << s.ToString();
      }
    }
    for (size_t i = 0; i < gone->handles.size() && i < endpoints_.size(); ++i) {
      Status s = endpoints_[i].engine->DeregisterMem(gone->handles[i]);
      if (!s.ok() && result.ok()) result = s;
    }
  }
  return result;
}

Status Server::Shutdown() {
  std::lock_guard<std::mutex> l(mu_);
  if (shut_) return Status::Ok();
  shut_ = true;
  // Withdraw the memory first: DeregisterMem returns once no transfer of a
  // client touches it, so the caller may free it when Destroy returns.
  Status result;
  for (auto& m : mems_) {
    for (size_t i = 0; i < m->handles.size() && i < endpoints_.size(); ++i) {
      Status s = endpoints_[i].engine->DeregisterMem(m->handles[i]);
      if (!s.ok() && result.ok()) result = Prefix(s, "withdrawing \"" + m->tag + "\"");
    }
  }
  for (auto& e : endpoints_) {
    if (e.engine) e.engine->Finalize();
  }
  endpoints_.clear();
  mems_.clear();
  return result;
}

}  // namespace hixl::cs
