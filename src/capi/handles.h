// The C API's objects behind its opaque handles, and the table of live
// handles every entry point checks a handle against before touching it (so
// NULL, foreign and destroyed handles are refused, never dereferenced).
// Thread safety: the table is guarded by its own mutex; each object's fields
// by the mutexes it declares. Ownership: the table records, it does not own;
// each object is deleted by its hixlDestroy* call.
#ifndef HIXL_CAPI_HANDLES_H_
#define HIXL_CAPI_HANDLES_H_

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "hixl/hixl.h"
#include "hixl/hixl_c.h"

struct HixlConfigObj {
  std::map<std::string, std::string> c_opts;       // the C API's own keys
  std::map<std::string, std::string> engine_opts;  // passed to Initialize
};

struct HixlEngineObj {
  hixl::Hixl engine;
  std::string local;
  std::string default_remote;
  int32_t connect_timeout_ms = 3000;
  int32_t transfer_timeout_ms = 60000;

  std::mutex connect_mu;  // one Connect at a time (concurrent first transfers)
  std::mutex mu;          // guards everything below
  std::set<std::string> connected;
  std::set<HixlMemHandleObj*> handles;
  std::set<struct RequestImpl*> requests;
  struct Alloc {
    size_t size;
    uint32_t mem_type;  // HIXL_MEM_*
  };
  std::map<uintptr_t, Alloc> allocs;             // hixlAllocMemory: start -> size, type
  std::map<hixl::MemHandle, int> registrations;  // RegisterMem handle -> C handles using it

  // hixlGetNotifies: notifications taken from the engine (whose GetNotifies
  // hands out everything) but not yet handed to the caller, oldest first.
  std::mutex notify_mu;
  std::deque<hixl::NotifyDesc> notifies;
};

struct HixlMemHandleObj {
  HixlEngineObj* owner = nullptr;  // the engine that registered or deserialized it
  bool local = false;              // registered by `owner`
  bool alloc_backed = false;       // inside hixlAllocMemory memory (not deregistered)
  hixl::MemHandle cxx = 0;
  std::string engine_addr;  // the engine whose memory this is
  uint64_t generation = 0;  // that engine's generation (0: not known, not checked)
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t perms = 0;
  std::string serialized;
};

struct RequestImpl {
  HixlRequestObj pub{};
  std::mutex mu;                    // guards the fields below
  HixlEngineObj* engine = nullptr;  // null once the engine is destroyed
  hixl::TransferReq cxx = 0;        // 0: nothing to ask the engine
  HixlStatus final_status = HIXL_IN_PROGRESS;
  std::string reason;
};

namespace hixl::capi {

enum class Kind { kConfig, kEngine, kMem, kRequest };

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, std::pair<Kind, void*>> live;
};
inline Registry& Reg() {
  static Registry* r = new Registry;  // never destroyed: usable during exit
  return *r;
}
inline void Track(const void* key, Kind k, void* obj) {
  std::lock_guard<std::mutex> l(Reg().mu);
  Reg().live[key] = {k, obj};
}
// Removes the entry; false when key is not a live handle of kind k.
inline bool Untrack(const void* key, Kind k) {
  std::lock_guard<std::mutex> l(Reg().mu);
  auto it = Reg().live.find(key);
  if (it == Reg().live.end() || it->second.first != k) return false;
  Reg().live.erase(it);
  return true;
}
template <typename T>
T* Lookup(const void* key, Kind k) {
  if (key == nullptr) return nullptr;
  std::lock_guard<std::mutex> l(Reg().mu);
  auto it = Reg().live.find(key);
  if (it == Reg().live.end() || it->second.first != k) return nullptr;
  return static_cast<T*>(it->second.second);
}

}  // namespace hixl::capi

#endif  // HIXL_CAPI_HANDLES_H_
