#include "transport/transport.h"

#include <algorithm>

#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace hixl::transport {

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* reg = [] {
    auto* r = new TransportRegistry();
    r->Register({"shm", LinkType::SHM, 10, &shm::MakeShmTransport});
    r->Register({"tcp", LinkType::TCP, 20, &tcp::MakeTcpTransport});
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

}  // namespace hixl::transport
