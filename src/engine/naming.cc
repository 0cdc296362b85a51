#include "engine/naming.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "common/host.h"
#include "common/log.h"
#include "common/net.h"
#include "engine/probe.h"
#ifdef HIXL_HAVE_ETCD
#include "discovery/registry.h"
#endif

namespace hixl::engine {

struct Naming::Impl {
#ifdef HIXL_HAVE_ETCD
  // One per Start (a registry starts once); callers take a reference under
  // mu, so a Stop racing with a lookup never frees it under the lookup.
  std::shared_ptr<discovery::Registry> registry;
  std::shared_ptr<discovery::Registry> Get() const {
    std::lock_guard<std::mutex> lock(mu);
    return registry;
  }
#endif
  mutable std::mutex mu;
  bool started = false;  // under mu
  std::string self;      // under mu
};

Naming::Naming() : impl_(std::make_unique<Impl>()) {}
Naming::~Naming() { Stop(); }

bool Naming::enabled() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->started;
}
std::string Naming::self_name() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->self;
}

Status Naming::Start(const Options& o, const std::string& address, uint64_t generation,
                     bool listening) {
  if (o.metadata_server.empty()) return Status::Ok();
#ifdef HIXL_HAVE_ETCD
  discovery::RegistryConfig c;
  c.endpoints = o.metadata_server;
  c.prefix = o.metadata_prefix;
  c.ttl_s = o.metadata_ttl_s;
  c.self.name = o.engine_name.empty() ? address : o.engine_name;
  c.self.address = address;
  c.self.generation = generation;
  c.self.host_id = host::HostIdentity();
  c.self.pid = getpid();
  // A holder of our name that the pid test cannot show dead (another host,
  // or a pid that exists) is asked who it is: gone when nothing listens at
  // its address, or something else (another engine, another program) does.
  // Bounded so that a few probes fit well inside the new lease's TTL.
  const int probe_ms =
      std::clamp(o.handshake_timeout_ms, 100, std::min(3000, o.metadata_ttl_s * 250));
  c.holder_gone = [probe_ms, address](const discovery::EngineEntry& h, std::string& why) {
    net::HostPort hp;
    if (!net::ParseHostPort(h.address, hp).ok()) {
      why = "its address " + h.address + " cannot be probed";
      return false;
    }
    // Boot id and network namespace alike: its addresses are ours to try.
    const std::string& self_id = host::HostIdentity();
    const bool same_network =
        h.host_id.substr(0, h.host_id.find("/pid:")) == self_id.substr(0, self_id.find("/pid:"));
    if (same_network && h.address == address) {
      why = "this engine now listens at its address " + h.address;
      return true;
    }
    if (!same_network && (net::IsLoopbackOrUnspecified(hp.host) || h.address == address)) {
      why = "its address " + h.address + " is not reachable from this host";
      return false;
    }
    const ProbeResult r = ProbeEngine(h.address, probe_ms);
    switch (r.kind) {
      case ProbeResult::Kind::kRefused:
      case ProbeResult::Kind::kNotHixl: why = r.detail; return true;
      case ProbeResult::Kind::kIdent:
        if (r.ident.generation != h.generation) {
          why = h.address + " now serves another engine (generation " +
                std::to_string(r.ident.generation) + ", the entry's is " +
                std::to_string(h.generation) + ")";
          return true;
        }
        why = "it answers at " + h.address;
        return false;
      case ProbeResult::Kind::kNoAnswer: break;
    }
    why = r.detail;
    return false;
  };
  if (!listening) {
    // Nothing to publish: a client-only engine has no address peers can reach.
    c.self.name.clear();
  }
  auto registry = std::make_shared<discovery::Registry>();
  if (Status s = registry->Start(c); !s.ok()) {
    return Status(s.code(), std::string("MetadataServer ") + o.metadata_server + ": " + s.message());
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->registry = std::move(registry);
    impl_->started = true;
    impl_->self = c.self.name;
  }
  HIXL_LOG(INFO) << "published as '" << c.self.name << "' under " << o.metadata_prefix << " in "
                 << o.metadata_server;
  return Status::Ok();
#else
  (void)address;
  (void)generation;
  (void)listening;
  return Status::Unsupported("MetadataServer: this build has no etcd discovery (HIXL_WITH_ETCD)");
#endif
}

void Naming::Stop() {
#ifdef HIXL_HAVE_ETCD
  std::shared_ptr<discovery::Registry> r;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->started) return;
    r = std::move(impl_->registry);
    impl_->started = false;
    impl_->self.clear();
  }
  r->Stop();
#endif
}

Status Naming::Resolve(const std::string& name, std::string& address, uint64_t& generation) {
#ifdef HIXL_HAVE_ETCD
  auto registry = impl_->Get();
#else
  void* registry = nullptr;
#endif
  if (!registry) {
    return Status::ParamInvalid("'" + name + "' is not an ip:port address (engine names need "
                                "the MetadataServer option)");
  }
#ifdef HIXL_HAVE_ETCD
  if (Status s = discovery::CheckEngineName(name); !s.ok()) return s;
  discovery::EngineEntry e;
  if (Status s = registry->Lookup(name, e); !s.ok()) return s;
  address = e.address;
  generation = e.generation;
  return Status::Ok();
#else
  (void)address;
  (void)generation;
  return Status::Unsupported("engine names need etcd discovery (HIXL_WITH_ETCD)");
#endif
}

Status Naming::List(std::vector<EngineRecord>& out) const {
#ifdef HIXL_HAVE_ETCD
  auto registry = impl_->Get();
#else
  void* registry = nullptr;
#endif
  if (!registry) {
    return Status::Unsupported("ListEngines needs the MetadataServer option");
  }
#ifdef HIXL_HAVE_ETCD
  out.clear();
  for (const auto& e : registry->List()) {
    out.push_back(EngineRecord{e.name, e.address, e.generation});
  }
  return Status::Ok();
#else
  (void)out;
  return Status::Unsupported("ListEngines needs etcd discovery (HIXL_WITH_ETCD)");
#endif
}

}  // namespace hixl::engine
