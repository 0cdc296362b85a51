// llm_datadist._llm_datadist: pybind11 bindings of llm_datadist::LlmDataDist
// (include/llm_datadist/llm_datadist.h). The public Python API (LLMDataDist,
// the cache manager, the key and config classes, the enums) is pure Python in
// python/llm_datadist/; this module is the thin layer under it: plain ints,
// tuples and lists in, plain values out, failures raised as
// llm_datadist.LLMException (handed over by the package through _init).
//
// Memory: a cache's tensors may be int addresses, C-contiguous
// buffer-protocol objects (numpy arrays, bytearray, HostMemory, ...) or CPU
// torch tensors; no copies are made. The objects (their buffer exports) are
// held by the instance while the cache is registered and released after
// UnregisterKvCache or Finalize returned, so peers never touch freed memory.
//
// The GIL: every engine call runs with the GIL released. The event callback
// and the layer gate of transfer_cache_async run on instance threads and take
// the GIL themselves; the Python callables they hold are released under the
// GIL. Instances alive at interpreter exit are finalized by an atexit hook
// (while Python threads still run), the instance behind
// allocate_host_memory last.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "py_memory.h"

namespace py = pybind11;
namespace ldd = llm_datadist;
using namespace pybind11::literals;

namespace {

PyObject* g_exc = nullptr;  // llm_datadist.LLMException (set by _init, never released)

[[noreturn]] void Raise(uint32_t code, const std::string& msg) {
  if (g_exc == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, msg.c_str());
    throw py::error_already_set();
  }
  py::object e = py::reinterpret_borrow<py::object>(g_exc)(msg, code);
  PyErr_SetObject(g_exc, e.ptr());
  throw py::error_already_set();
}
[[noreturn]] void RaiseParam(const std::string& msg) {
  Raise(ldd::LLM_PARAM_INVALID, "LLM_PARAM_INVALID: " + msg);
}
void Check(const ldd::Status& s) {
  if (!s.ok()) Raise(s.code(), s.ToString());
}
py::tuple StatusTuple(const ldd::Status& s) {
  return py::make_tuple(s.code(), s.ok() ? std::string() : s.ToString());
}

// Runs f (an engine call) with the GIL released.
template <typename F>
auto NoGil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

// str (UTF-8, surrogate escapes kept) or bytes-like -> std::string.
std::string Bytes(py::handle obj, const char* what) {
  if (PyUnicode_Check(obj.ptr())) {
    py::object b = py::reinterpret_steal<py::object>(
        PyUnicode_AsEncodedString(obj.ptr(), "utf-8", "surrogateescape"));
    if (!b) throw py::error_already_set();
    return std::string(PyBytes_AS_STRING(b.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(b.ptr())));
  }
  Py_buffer view{};
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    RaiseParam(std::string(what) + " must be str or bytes, got " +
               std::string(py::str(obj.get_type())));
  }
  std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return out;
}
py::object Str(const std::string& s) {
  py::object o = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape"));
  if (!o) throw py::error_already_set();
  return o;
}

// ---------------------------------------------------------------- memory

// The memory behind a Python object (py_memory.h), failing with LLMException.
class Memory : public hixl_py::Memory {
 public:
  Memory(py::handle obj, bool writable) : hixl_py::Memory(obj, writable, &RaiseParam) {}
};

// A Python callable held by C++ code that may drop it on any thread: it is
// released with the GIL taken (or leaked once the interpreter is gone).
std::shared_ptr<py::object> Hold(py::object fn) {
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* o) {
    if (!Py_IsInitialized()) {
      o->release();
      delete o;
      return;
    }
    py::gil_scoped_acquire gil;
    delete o;
  });
}

// Set while an instance thread runs Python code for us (event callback,
// layer gate): finalizing from there would join the very thread.
thread_local bool t_in_callback = false;
struct CallbackScope {
  bool old = t_in_callback;
  CallbackScope() { t_in_callback = true; }
  ~CallbackScope() { t_in_callback = old; }
};

// ---------------------------------------------------------------- instances

struct Core;
std::mutex g_live_mu;                                // only taken with the GIL released
std::set<Core*>* g_live = new std::set<Core*>;       // never destroyed
std::shared_ptr<Core>* g_allocator = nullptr;        // allocate_host_memory's instance

// One LlmDataDist plus the Python objects behind its registered caches.
struct Core {
  std::unique_ptr<ldd::LlmDataDist> dd;
  std::map<int64_t, std::vector<std::unique_ptr<Memory>>> held;  // GIL held
  bool allocator = false;

  Core(uint64_t cluster_id, int32_t role)
      : dd(std::make_unique<ldd::LlmDataDist>(cluster_id, static_cast<ldd::LlmRole>(role))) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(g_live_mu);
    g_live->insert(this);
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core() {
    const bool gil = Py_IsInitialized() && PyGILState_Check();
    auto unlive = [this] {
      std::lock_guard<std::mutex> l(g_live_mu);
      g_live->erase(this);
    };
    if (t_in_callback) {
      // The last reference went inside a callback on an instance thread:
      // finish on another thread; the held memory is leaked (it must stay
      // valid until that Finalize is done).
      if (gil) {
        py::gil_scoped_release nogil;
        unlive();
      } else {
        unlive();
      }
      ldd::LlmDataDist* p = dd.release();
      std::thread([p] { delete p; }).detach();
      for (auto& [id, v] : held)
        for (auto& m : v) (void)m.release();
      return;
    }
    if (gil) {
      {
        py::gil_scoped_release nogil;
        unlive();
        dd.reset();  // ~LlmDataDist finalizes
      }
      held.clear();
    } else {
      unlive();
      dd.reset();
      for (auto& [id, v] : held)
        for (auto& m : v) (void)m.release();
    }
  }

  void Finalize() {
    if (t_in_callback) {
      Raise(ldd::LLM_FAILED,
            "LLM_FAILED: finalize from an event callback or layer synchronizer would deadlock "
            "(the instance joins the thread running it)");
    }
    NoGil([&] { dd->Finalize(); });
    held.clear();
  }
};

void FinalizeAll() {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> l(g_live_mu);
  for (Core* c : *g_live)
    if (!c->allocator) c->dd->Finalize();
  for (Core* c : *g_live)
    if (c->allocator) c->dd->Finalize();
}

// Memory from AllocHostMemory, freed when the last HostMemory using it dies.
struct HostAlloc {
  std::shared_ptr<Core> core;
  uintptr_t addr = 0;
  size_t size = 0;
  ~HostAlloc() {
    if (!core || !Py_IsInitialized()) return;
    auto free = [&] { (void)core->dd->FreeHostMemory(reinterpret_cast<void*>(addr)); };
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      free();
    } else {
      free();
    }
  }
};

// A buffer-protocol view of host memory (1-D, unsigned bytes) with an address.
struct HostMemory {
  uintptr_t addr = 0;
  size_t size = 0;
  bool readonly = false;
  std::shared_ptr<HostAlloc> alloc;  // owned memory (allocate_host_memory)
  py::object owner;                  // views: what keeps the memory valid
};

HostMemory Alloc(const std::shared_ptr<Core>& core, size_t size) {
  if (size == 0) RaiseParam("size must be > 0");
  void* p = nullptr;
  Check(NoGil([&] { return core->dd->AllocHostMemory(size, &p); }));
  auto a = std::make_shared<HostAlloc>();
  a->core = core;
  a->addr = reinterpret_cast<uintptr_t>(p);
  a->size = size;
  HostMemory h;
  h.addr = a->addr;
  h.size = size;
  h.alloc = std::move(a);
  return h;
}

// A posted transfer_cache_async.
// Layer gates opened from Python and waited for by a layer-wise task's
// thread without the GIL (a LayerSynchronizer needs the GIL for every layer,
// which a thread busy with the model's forward pass holds most of the time).
class LayerGates {
 public:
  explicit LayerGates(uint32_t layers) : open_(layers, false) {}
  void Open(uint32_t layer) {
    std::lock_guard<std::mutex> lock(mu_);
    if (layer < open_.size()) open_[layer] = true;
    cv_.notify_all();
  }
  void OpenAll() {
    std::lock_guard<std::mutex> lock(mu_);
    all_ = true;
    cv_.notify_all();
  }
  void Fail() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }
  // True once the layer (or every layer) is open; false on Fail or timeout.
  bool Wait(uint32_t layer, int32_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return failed_ || all_ || (layer < open_.size() && open_[layer]); };
    if (timeout_ms < 0) {
      cv_.wait(lock, ready);
    } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
      return false;
    }
    if (failed_) return false;
    if (!all_) ++early_;
    return true;
  }
  // Waits that a layer's own gate ended (not OpenAll).
  uint64_t Early() {
    std::lock_guard<std::mutex> lock(mu_);
    return early_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> open_;
  bool all_ = false;
  bool failed_ = false;
  uint64_t early_ = 0;
};

struct Task {
  std::shared_ptr<ldd::KvTransferTask> task;
  std::shared_ptr<Core> core;  // the instance outlives its tasks
};

// ---------------------------------------------------------------- conversions

ldd::Cache LocalCache(int64_t cache_id) {
  ldd::Cache c;
  c.cache_id = cache_id;  // tensor_addrs empty: the registered addresses
  return c;
}

py::tuple EventTuple(const ldd::KvTransferEvent& ev) {
  py::object key = py::none();
  if (ev.key) key = py::make_tuple(ev.key->prompt_cluster_id, ev.key->req_id, ev.key->model_id);
  return py::make_tuple(static_cast<int32_t>(ev.kind), ev.peer_cluster_id, ev.cache_id, key,
                        py::cast(ev.blocks), ev.batch_index,
                        py::make_tuple(ev.layer_range.first, ev.layer_range.second),
                        Str(ev.user_tag));
}

using IpList = std::vector<std::pair<std::string, uint16_t>>;
using ClusterTuple = std::tuple<uint64_t, int32_t, IpList, IpList>;

std::vector<ldd::ClusterInfo> Clusters(const std::vector<ClusterTuple>& in) {
  std::vector<ldd::ClusterInfo> out;
  for (const auto& [id, role, local, remote] : in) {
    ldd::ClusterInfo c;
    c.remote_cluster_id = id;
    c.remote_role_type = role;
    for (const auto& [ip, port] : local) c.local_ip_infos.push_back({ip, port});
    for (const auto& [ip, port] : remote) c.remote_ip_infos.push_back({ip, port});
    out.push_back(std::move(c));
  }
  return out;
}

py::tuple LinkResult(const ldd::Status& s, const std::vector<ldd::Status>& rets) {
  py::list l;
  for (const auto& r : rets) l.append(StatusTuple(r));
  return py::make_tuple(s.code(), s.ok() ? std::string() : s.ToString(), l);
}

using Range = std::pair<int32_t, int32_t>;
using KeyTuple = std::tuple<uint64_t, uint64_t, uint64_t>;
// (dst_cluster_id, dst_cache_id, dst_addrs, dst_key, src_range, dst_range,
//  src_batch_index, dst_batch_index)
using ConfigTuple = std::tuple<uint64_t, int64_t, std::vector<uint64_t>, std::optional<KeyTuple>,
                               Range, Range, uint32_t, uint32_t>;

// Remote cache kinds of DataDist.transfer.
enum RemoteKind { kByIndex = 0, kByKey = 1, kByBlocksKey = 2 };

// ---------------------------------------------------------------- DataDist

class DataDist {
 public:
  DataDist(uint64_t cluster_id, int32_t role) : core_(std::make_shared<Core>(cluster_id, role)) {}

  ldd::LlmDataDist& dd() const { return *core_->dd; }
  const std::shared_ptr<Core>& core() const { return core_; }

  void Initialize(const std::map<std::string, std::string>& opts) {
    Check(NoGil([&] { return dd().Initialize(opts); }));
  }
  void Finalize() { core_->Finalize(); }
  void SetRole(int32_t role, const std::map<std::string, std::string>& opts) {
    Check(NoGil([&] { return dd().SetRole(static_cast<ldd::LlmRole>(role), opts); }));
  }
  int32_t Role() const { return static_cast<int32_t>(NoGil([&] { return dd().Role(); })); }
  std::string LocalAddress() const { return NoGil([&] { return dd().LocalAddress(); }); }

  py::tuple Link(const std::vector<ClusterTuple>& clusters, int32_t timeout_ms) {
    auto cs = Clusters(clusters);
    std::vector<ldd::Status> rets;
    ldd::Status s = NoGil([&] { return dd().LinkLlmClusters(cs, rets, timeout_ms); });
    return LinkResult(s, rets);
  }
  py::tuple Unlink(const std::vector<ClusterTuple>& clusters, int32_t timeout_ms, bool force) {
    auto cs = Clusters(clusters);
    std::vector<ldd::Status> rets;
    ldd::Status s = NoGil([&] { return dd().UnlinkLlmClusters(cs, rets, timeout_ms, force); });
    return LinkResult(s, rets);
  }

  // -> (cache_id, [tensor addresses])
  py::tuple Register(int32_t placement, uint32_t num_tensors, int32_t data_type,
                     const std::vector<int64_t>& shape, py::sequence addrs,
                     const std::vector<KeyTuple>& keys, int64_t lease_ms,
                     std::optional<uint64_t> blocks_model_id) {
    ldd::CacheDesc desc;
    desc.placement = static_cast<ldd::CachePlacement>(placement);
    desc.num_tensors = num_tensors;
    desc.data_type = static_cast<ldd::DataType>(data_type);
    desc.shape = shape;
    // Bytes per tensor, to check the objects against (when computable).
    std::optional<size_t> bytes;
    if (size_t es = ldd::DataTypeSize(data_type); es != 0 && !shape.empty()) {
      __uint128_t n = es;
      bool ok = true;
      for (int64_t d : shape) {
        if (d <= 0) ok = false;
        if (ok) n *= static_cast<__uint128_t>(d);
        if (n > (__uint128_t{1} << 62)) ok = false;
      }
      if (ok) bytes = static_cast<size_t>(n);
    }
    std::vector<std::unique_ptr<Memory>> mems;
    std::vector<uint64_t> a;
    size_t i = 0;
    for (py::handle obj : addrs) {
      auto m = std::make_unique<Memory>(obj, /*writable=*/true);
      std::string what = "tensor " + std::to_string(i++);
      a.push_back(m->Addr(bytes.value_or(0), what + " (one tensor of the CacheDesc is " +
                                                 std::to_string(bytes.value_or(0)) + " bytes)"));
      mems.push_back(std::move(m));
    }
    // The placement follows the objects: CUDA tensors (and other
    // __cuda_array_interface__ objects) are device memory, everything else
    // (arrays, CPU tensors, HostMemory, ints) host memory. Placement.DEVICE,
    // the published default, is kept only for device memory; HOST with a
    // CUDA tensor and a mix of both are errors.
    size_t on_device = 0;
    for (const auto& m : mems) on_device += m->device() ? 1 : 0;
    if (on_device != 0 && on_device != mems.size()) {
      RaiseParam("the tensors of one cache are all CUDA memory or all host memory, not a mix");
    }
    if (on_device != 0 && desc.placement == ldd::CachePlacement::kHost) {
      RaiseParam("placement is Placement.HOST but the tensors are CUDA memory");
    }
    desc.placement = on_device != 0 ? ldd::CachePlacement::kDevice : ldd::CachePlacement::kHost;
    ldd::RegisterCfg cfg;
    for (const auto& [p, r, mid] : keys) cfg.cache_keys.push_back({p, r, mid});
    cfg.lease_ms = lease_ms;
    cfg.blocks_model_id = blocks_model_id;
    int64_t id = 0;
    Check(NoGil([&] { return dd().RegisterKvCache(desc, a, cfg, id); }));
    core_->held[id] = std::move(mems);
    return py::make_tuple(id, py::cast(a));
  }
  void Unregister(int64_t cache_id) {
    Check(NoGil([&] { return dd().UnregisterKvCache(cache_id); }));
    core_->held.erase(cache_id);  // after: no peer's transfer touches it any more
  }
  bool Registered(int64_t cache_id) const { return core_->held.count(cache_id) != 0; }

  // One pull (push=false) or push of a whole batch entry (blocks=false) or
  // of block lists. remote: kind + (a, b, c) = CacheIndex(cluster, cache_id,
  // batch_index), CacheKey(prompt_cluster_id, req_id, model_id) or
  // BlocksCacheKey(prompt_cluster_id, model_id, -).
  void Transfer(bool push, bool blocks, int kind, uint64_t a, uint64_t b, uint64_t c,
                int64_t local_cache_id, uint32_t local_batch, int64_t size,
                const std::vector<uint64_t>& local_blocks,
                const std::vector<uint64_t>& remote_blocks, Range src_range, Range dst_range,
                int32_t tpl, py::handle user_tag) {
    ldd::KvCacheExtParam ext;
    ext.src_layer_range = src_range;
    ext.dst_layer_range = dst_range;
    ext.tensor_num_per_layer = tpl;
    if (!user_tag.is_none()) ext.user_tag = Bytes(user_tag, "user_tag");
    ldd::Cache local = LocalCache(local_cache_id);
    ldd::CacheIndex index{a, static_cast<int64_t>(b), static_cast<uint32_t>(c)};
    ldd::CacheKey key{a, b, c};
    ldd::BlocksCacheKey bkey{a, b};
    if (kind != kByIndex && kind != kByKey && kind != kByBlocksKey) RaiseParam("unknown key kind");
    if (!blocks && kind == kByBlocksKey) RaiseParam("a BlocksCacheKey names a paged cache");
    if (blocks && kind == kByKey) RaiseParam("a CacheKey names a batch entry, not blocks");
    ldd::LlmDataDist& d = dd();
    ldd::Status s = NoGil([&]() -> ldd::Status {
      if (!push && !blocks) {
        return kind == kByIndex ? d.PullKvCache(index, local, local_batch, size, ext)
                                : d.PullKvCache(key, local, local_batch, size, ext);
      }
      if (!push) {
        return kind == kByIndex ? d.PullKvBlocks(index, local, remote_blocks, local_blocks, ext)
                                : d.PullKvBlocks(bkey, local, remote_blocks, local_blocks, ext);
      }
      if (!blocks) {
        return kind == kByIndex ? d.PushKvCache(local, index, local_batch, size, ext)
                                : d.PushKvCache(local, key, local_batch, size, ext);
      }
      return kind == kByIndex ? d.PushKvBlocks(local, index, local_blocks, remote_blocks, ext)
                              : d.PushKvBlocks(local, bkey, local_blocks, remote_blocks, ext);
    });
    Check(s);
  }

  Task TransferAsync(int64_t local_cache_id, py::object synchronizer,
                     const std::vector<ConfigTuple>& configs,
                     const std::vector<uint64_t>& src_blocks,
                     const std::vector<uint64_t>& dst_blocks, int32_t tpl) {
    ldd::LayerGate gate;
    if (synchronizer.is_none()) {
      gate = [](uint32_t, int32_t) { return true; };
    } else if (py::isinstance<LayerGates>(synchronizer)) {
      auto gates = synchronizer.cast<std::shared_ptr<LayerGates>>();
      gate = [gates](uint32_t layer, int32_t timeout_ms) { return gates->Wait(layer, timeout_ms); };
    } else {
      if (!py::hasattr(synchronizer, "synchronize_layer"))
        RaiseParam("layer_synchronizer must have a synchronize_layer(layer_index, timeout) method");
      auto holder = Hold(std::move(synchronizer));
      gate = [holder](uint32_t layer, int32_t timeout_ms) -> bool {
        if (!Py_IsInitialized()) return false;
        py::gil_scoped_acquire gil;
        CallbackScope scope;
        try {
          py::object t = timeout_ms < 0 ? py::object(py::none()) : py::object(py::int_(timeout_ms));
          py::object r = holder->attr("synchronize_layer")(layer, t);
          int ok = PyObject_IsTrue(r.ptr());
          if (ok < 0) throw py::error_already_set();
          return ok == 1;
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable(*holder);
        } catch (const std::exception& e) {
          PyErr_SetString(PyExc_RuntimeError, e.what());
          PyErr_WriteUnraisable(holder->ptr());
        }
        return false;
      };
    }
    std::vector<ldd::LayerTransferConfig> cfgs;
    for (const auto& [cluster, cache_id, addrs, key, src, dst, sb, db] : configs) {
      ldd::LayerTransferConfig c;
      c.dst_cluster_id = cluster;
      c.dst_cache_id = cache_id;
      c.dst_addrs = addrs;
      if (key) c.dst_key = ldd::CacheKey{std::get<0>(*key), std::get<1>(*key), std::get<2>(*key)};
      c.src_layer_range = src;
      c.dst_layer_range = dst;
      c.src_batch_index = sb;
      c.dst_batch_index = db;
      cfgs.push_back(std::move(c));
    }
    ldd::Cache local = LocalCache(local_cache_id);
    std::shared_ptr<ldd::KvTransferTask> task;
    Check(NoGil([&] {
      return dd().TransferCacheAsync(local, std::move(gate), cfgs, src_blocks, dst_blocks, task,
                                     tpl);
    }));
    if (!task) Raise(ldd::LLM_FAILED, "LLM_FAILED: TransferCacheAsync returned no task");
    return Task{std::move(task), core_};
  }

  py::list GetEvents() {
    std::vector<ldd::KvTransferEvent> evs;
    Check(NoGil([&] { return dd().GetKvTransferEvents(evs); }));
    py::list out;
    for (const auto& e : evs) out.append(EventTuple(e));
    return out;
  }
  void SetCallback(py::object fn) {
    ldd::KvTransferCallback cb;
    if (!fn.is_none()) {
      if (!PyCallable_Check(fn.ptr())) RaiseParam("callback must be callable or None");
      auto holder = Hold(std::move(fn));
      cb = [holder](const ldd::KvTransferEvent& ev) {
        if (!Py_IsInitialized()) return;
        py::gil_scoped_acquire gil;
        CallbackScope scope;
        try {
          (*holder)(EventTuple(ev));
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable(*holder);
        } catch (const std::exception& e) {
          PyErr_SetString(PyExc_RuntimeError, e.what());
          PyErr_WriteUnraisable(holder->ptr());
        }
      };
    }
    Check(NoGil([&] { return dd().SetKvTransferCallback(std::move(cb)); }));
  }

  HostMemory AllocHost(size_t size) { return Alloc(core_, size); }

 private:
  std::shared_ptr<Core> core_;
};

HostMemory ModuleAlloc(size_t size) {
  if (g_allocator == nullptr) {
    auto core = std::make_shared<Core>(~uint64_t{0}, static_cast<int32_t>(ldd::LlmRole::kMix));
    core->allocator = true;
    Check(NoGil([&] { return core->dd->Initialize({}); }));  // links out only
    g_allocator = new std::shared_ptr<Core>(std::move(core));  // never destroyed
  }
  return Alloc(*g_allocator, size);
}

}  // namespace

PYBIND11_MODULE(_llm_datadist, m) {
  m.doc() = "llm_datadist._llm_datadist: bindings of llm_datadist::LlmDataDist (internal; use the "
            "llm_datadist package)";

  m.def(
      "_init",
      [](py::object exc) {
        Py_XDECREF(g_exc);
        g_exc = exc.release().ptr();
      },
      "exception_class"_a, "Sets the class failures raise: exc(message, status_code).");
  m.def(
      "status_code_name", [](uint32_t c) { return std::string(ldd::StatusCodeName(c)); }, "code"_a);
  m.def(
      "data_type_size", [](int32_t t) { return ldd::DataTypeSize(t); }, "data_type"_a);

  py::module_ o = m.def_submodule("options", "Option keys of LlmDataDist::Initialize.");
  o.attr("LISTEN_IP_INFO") = ldd::options::kListenIpInfo;
  o.attr("SYNC_KV_CACHE_WAIT_TIME") = ldd::options::kSyncKvCacheWaitTime;
  o.attr("DEVICE_ID") = ldd::options::kDeviceId;
  o.attr("ENABLE_SWITCH_ROLE") = ldd::options::kEnableSwitchRole;
  o.attr("TRANSFER_BACKEND") = ldd::options::kTransferBackend;
  o.attr("GLOBAL_RESOURCE_CONFIG") = ldd::options::kGlobalResourceConfig;
  o.attr("CACHE_LEASE_MS") = ldd::options::kCacheLeaseMs;
  o.attr("SHARE_CACHES_BY_MAPPING") = ldd::options::kShareCachesByMapping;

  py::class_<HostMemory>(m, "HostMemory", py::buffer_protocol(),
                         "Host memory as a 1-D byte buffer (numpy.asarray(h), memoryview(h)) with "
                         "its address; no copies.")
      .def_buffer([](HostMemory& h) {
        return py::buffer_info(reinterpret_cast<void*>(h.addr), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(h.size)}, {py::ssize_t{1}}, h.readonly);
      })
      .def_property_readonly("address", [](const HostMemory& h) { return h.addr; })
      .def_property_readonly("size", [](const HostMemory& h) { return h.size; })
      .def_property_readonly("nbytes", [](const HostMemory& h) { return h.size; })
      .def_property_readonly("readonly", [](const HostMemory& h) { return h.readonly; })
      .def("__len__", [](const HostMemory& h) { return h.size; })
      .def("__repr__", [](const HostMemory& h) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "<llm_datadist.HostMemory address=0x%llx size=%zu%s>",
                      static_cast<unsigned long long>(h.addr), h.size,
                      h.alloc ? " owned" : "");
        return std::string(buf);
      });

  m.def(
      "view",
      [](uintptr_t addr, size_t size, py::object owner, bool readonly) {
        if (addr == 0 || size == 0) RaiseParam("view of no memory");
        HostMemory h;
        h.addr = addr;
        h.size = size;
        h.readonly = readonly;
        h.owner = std::move(owner);
        return h;
      },
      "address"_a, "size"_a, "owner"_a = py::none(), "readonly"_a = false,
      "A HostMemory over [address, address + size) that keeps owner alive.");
  hixl_py::DefMemoryFunctions<Memory>(m);
  m.def("allocate_host_memory", &ModuleAlloc, "size"_a,
        "size bytes of page-aligned host memory from the module's own LlmDataDist instance "
        "(AllocHostMemory): a HostMemory, freed when the last reference to it goes.");

  py::class_<LayerGates, std::shared_ptr<LayerGates>>(
      m, "LayerGates", "Layer gates a layer-wise task waits for without the GIL (see LayerGates).")
      .def(py::init<uint32_t>(), "layers"_a)
      .def("open", &LayerGates::Open, "layer"_a)
      .def("open_all", &LayerGates::OpenAll)
      .def("fail", &LayerGates::Fail)
      .def_property_readonly("early", &LayerGates::Early);

  py::class_<Task>(m, "Task", "A posted transfer_cache_async (internal; see CacheTask).")
      .def(
          "wait",
          [](Task& t, int32_t timeout_ms) {
            ldd::Status s = NoGil([&] { return t.task->Wait(timeout_ms); });
            return StatusTuple(s);
          },
          "timeout_ms"_a = -1)
      .def("done", [](Task& t) { return NoGil([&] { return t.task->Done(); }); })
      .def("results", [](Task& t) {
        std::vector<ldd::Status> r = NoGil([&] { return t.task->Results(); });
        py::list out;
        for (const auto& s : r) out.append(StatusTuple(s));
        return out;
      });

  py::class_<DataDist>(m, "DataDist", "llm_datadist::LlmDataDist (internal; see LLMDataDist).")
      .def(py::init<uint64_t, int32_t>(), "cluster_id"_a, "role"_a)
      .def_property_readonly("cluster_id", [](DataDist& d) { return d.dd().ClusterId(); })
      .def("initialize", &DataDist::Initialize, "options"_a)
      .def("finalize", &DataDist::Finalize)
      .def("set_role", &DataDist::SetRole, "role"_a, "options"_a)
      .def("role", &DataDist::Role)
      .def("local_address", &DataDist::LocalAddress)
      .def("link", &DataDist::Link, "clusters"_a, "timeout_ms"_a)
      .def("unlink", &DataDist::Unlink, "clusters"_a, "timeout_ms"_a, "force"_a)
      .def("register", &DataDist::Register, "placement"_a, "num_tensors"_a, "data_type"_a,
           "shape"_a, "addrs"_a, "cache_keys"_a, "lease_ms"_a, "blocks_model_id"_a)
      .def("unregister", &DataDist::Unregister, "cache_id"_a)
      .def("registered", &DataDist::Registered, "cache_id"_a)
      .def("transfer", &DataDist::Transfer, "push"_a, "blocks"_a, "kind"_a, "a"_a, "b"_a, "c"_a,
           "local_cache_id"_a, "local_batch"_a, "size"_a, "local_blocks"_a, "remote_blocks"_a,
           "src_range"_a, "dst_range"_a, "tensor_num_per_layer"_a, "user_tag"_a)
      .def("transfer_cache_async", &DataDist::TransferAsync, "local_cache_id"_a,
           "synchronizer"_a, "configs"_a, "src_blocks"_a, "dst_blocks"_a,
           "tensor_num_per_layer"_a)
      .def("get_events", &DataDist::GetEvents)
      .def("set_callback", &DataDist::SetCallback, "callback"_a)
      .def("alloc_host", &DataDist::AllocHost, "size"_a);

  // Instances alive at exit are finalized while Python threads still run (an
  // instance thread may be waiting for the GIL to run a callback).
  py::module_::import("atexit").attr("register")(py::cpp_function(&FinalizeAll));
}
