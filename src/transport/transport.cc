#include "transport/transport.h"

#include <algorithm>

#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef HIXL_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace hixl::transport {

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* reg = [] {
    auto* r = new TransportRegistry();
    r->Register({"shm", LinkType::SHM, 10, &shm::MakeShmTransport, shm::ShmOptions()});
    r->Register({"tcp", LinkType::TCP, 20, &tcp::MakeTcpTransport, tcp::TcpOptions()});
#ifdef HIXL_HAVE_UCX
    r->Register({"ucx", LinkType::UCX, 15, &ucx::MakeUcxTransport, ucx::UcxOptions()});
#endif
    return r;
  }();
  return *reg;
}

void TransportRegistry::Register(Entry e) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(std::move(e));
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.preference < b.preference; });
}

std::vector<TransportRegistry::Entry> TransportRegistry::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

std::vector<TransportOption> TransportRegistry::Options() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TransportOption> out;
  for (const auto& e : entries_) out.insert(out.end(), e.options.begin(), e.options.end());
  return out;
}

int64_t TransportContext::Setting(const char* key) const {
  if (auto it = settings.find(key); it != settings.end()) return it->second;
  for (const auto& o : TransportRegistry::Global().Options()) {
    if (std::string(o.key) == key) return o.def;
  }
  return 0;
}

}  // namespace hixl::transport
