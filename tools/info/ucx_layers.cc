#include "info/ucx_layers.h"

#ifdef HIXL_HAVE_UCX
#include <uct/api/uct.h>
#endif

namespace hixl::info {

#ifdef HIXL_HAVE_UCX
namespace {

const char* DeviceType(uct_device_type_t t) {
  switch (t) {
    case UCT_DEVICE_TYPE_NET: return "net";
    case UCT_DEVICE_TYPE_SHM: return "shm";
    case UCT_DEVICE_TYPE_ACC: return "acc";
    case UCT_DEVICE_TYPE_SELF: return "self";
    default: return "other";
  }
}

// The layers of one memory domain.
void QueryMd(uct_component_h comp, const char* comp_name, const char* md_name,
             std::vector<UcxLayer>& out) {
  uct_md_config_t* cfg = nullptr;
  if (uct_md_config_read(comp, nullptr, nullptr, &cfg) != UCS_OK) return;
  uct_md_h md = nullptr;
  const ucs_status_t opened = uct_md_open(comp, md_name, cfg, &md);
  uct_config_release(cfg);
  if (opened != UCS_OK) return;
  uct_tl_resource_desc_t* res = nullptr;
  unsigned n = 0;
  if (uct_md_query_tl_resources(md, &res, &n) == UCS_OK) {
    for (unsigned i = 0; i < n; ++i) {
      out.push_back(UcxLayer{comp_name, md_name, res[i].tl_name, res[i].dev_name,
                             DeviceType(res[i].dev_type)});
    }
    uct_release_tl_resource_list(res);
  }
  uct_md_close(md);
}

}  // namespace

bool QueryUcxLayers(std::vector<UcxLayer>& out, std::string& why) {
  out.clear();
  uct_component_h* comps = nullptr;
  unsigned ncomps = 0;
  if (ucs_status_t s = uct_query_components(&comps, &ncomps); s != UCS_OK) {
    why = std::string("uct_query_components: ") + ucs_status_string(s);
    return false;
  }
  for (unsigned c = 0; c < ncomps; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(comps[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (!mds.empty() && uct_component_query(comps[c], &attr) != UCS_OK) continue;
    for (const auto& md : mds) QueryMd(comps[c], attr.name, md.md_name, out);
  }
  uct_release_component_list(comps);
  return true;
}

#else

bool QueryUcxLayers(std::vector<UcxLayer>& out, std::string& why) {
  out.clear();
  why = "this build has no UCX transport (HIXL_WITH_UCX=OFF)";
  return false;
}

#endif

}  // namespace hixl::info
