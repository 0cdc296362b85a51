// hixl-info: the UCX transport layers (UCT) and devices on this host, as
// UCX itself reports them (uct_query_components, uct_md_query_tl_resources).
// Thread safety: call from one thread. Ownership: plain values.
#ifndef HIXL_TOOLS_INFO_UCX_LAYERS_H_
#define HIXL_TOOLS_INFO_UCX_LAYERS_H_

#include <string>
#include <vector>

namespace hixl::info {

struct UcxLayer {
  std::string component;  // "posix", "tcp", "ib", ...
  std::string md;         // memory domain
  std::string tl;         // transport layer ("tcp", "rc_mlx5", "posix", ...)
  std::string device;     // "lo", "eth0", "mlx5_0:1", "memory"
  std::string type;       // "net", "shm", "acc", "self"
};

// false (with why) when UCX could not be asked, or this build has no UCX.
bool QueryUcxLayers(std::vector<UcxLayer>& out, std::string& why);

}  // namespace hixl::info

#endif  // HIXL_TOOLS_INFO_UCX_LAYERS_H_
