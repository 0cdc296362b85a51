// hixl._hixl: pybind11 bindings. hixl.Hixl wraps the C++ class hixl::Hixl
// (every method, snake_case); hixl._hixl.Endpoint wraps the C API for the
// convenience layer hixl.Context (python/hixl/__init__.py). Failures raise
// hixl.HixlError with .code (the status number) and .code_name.
//
// The GIL: every call into the engine runs with the GIL released (the engine
// may block, and its notify thread needs the GIL to run a Python callback
// while it holds engine locks). The notify callback takes the GIL itself;
// the Python callable it holds is released under the GIL. Engines still
// alive at interpreter exit are finalized by an atexit hook, before the
// interpreter stops running Python threads.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hixl/hixl.h"
#include "py_memory.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

PyObject* g_error = nullptr;

[[noreturn]] void Raise(int code, const std::string& msg) {
  py::object exc = py::reinterpret_borrow<py::object>(g_error)(msg);
  exc.attr("code") = code;
  exc.attr("code_name") =
      code == HIXL_IN_PROGRESS
          ? std::string("IN_PROGRESS")
          : std::string(hixl::StatusCodeName(static_cast<hixl::StatusCode>(code)));
  PyErr_SetObject(g_error, exc.ptr());
  throw py::error_already_set();
}
void Check(const hixl::Status& s) {
  if (!s.ok()) Raise(static_cast<int>(s.code()), s.ToString());
}
void CheckC(HixlStatus s) {
  if (s != HIXL_SUCCESS) {
    std::string m = hixlGetLastErrorMessage();
    Raise(static_cast<int>(s), m.empty() ? hixlGetErrorString(s) : m);
  }
}

[[noreturn]] void RaiseMemory(const std::string& m) { Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: " + m); }

// The memory behind a Python object (py_memory.h), failing with HixlError.
class Memory : public hixl_py::Memory {
 public:
  Memory(py::handle obj, bool writable) : hixl_py::Memory(obj, writable, &RaiseMemory) {}
};

// TransferArgs::stream from Python: None, an int CUstream, or a stream
// object: torch.cuda.Stream (.cuda_stream) or CuPy's (.ptr).
void* StreamArg(py::handle s) {
  if (s.is_none()) return nullptr;
  py::handle v = s;
  py::object attr;
  if (py::hasattr(s, "cuda_stream")) {
    attr = s.attr("cuda_stream");
    v = attr;
  } else if (py::hasattr(s, "ptr")) {
    attr = s.attr("ptr");
    v = attr;
  }
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
    Raise(HIXL_PARAM_INVALID,
          "PARAM_INVALID: stream must be None, an int CUstream or a torch/CuPy CUDA stream");
  }
  void* p = reinterpret_cast<void*>(v.cast<uintptr_t>());
  if (p == nullptr) {
    Raise(HIXL_PARAM_INVALID,
          "PARAM_INVALID: stream 0 is no stream here: pass None, or CU_STREAM_LEGACY (1) for the "
          "legacy default stream");
  }
  return p;
}

// Descriptors: a sequence of TransferOpDesc or (local, remote, len) triples,
// or -- without a Python object per descriptor -- a C-contiguous N x 3 array of
// 64-bit unsigned integers (e.g. numpy uint64), one row per descriptor.
std::vector<hixl::TransferOpDesc> Descs(py::handle seq) {
  std::vector<hixl::TransferOpDesc> out;
  if (PyObject_CheckBuffer(seq.ptr()) && !PyBytes_Check(seq.ptr())) {
    py::buffer_info b = py::reinterpret_borrow<py::buffer>(seq).request();
    std::string f = b.format;
    if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.erase(0, 1);
    const bool u64 = b.itemsize == 8 && (f == "Q" || f == "L" || f == "K");
    if (b.ndim != 2 || b.shape[1] != 3 || !u64 || b.strides[1] != 8 || b.strides[0] != 24)
      Raise(HIXL_PARAM_INVALID,
            "PARAM_INVALID: a descriptor array must be C-contiguous N x 3 uint64 "
            "(local, remote, len)");
    out.resize(static_cast<size_t>(b.shape[0]));
    const auto* row = static_cast<const uint64_t*>(b.ptr);
    for (auto& d : out) {
      d = {static_cast<uintptr_t>(row[0]), static_cast<uintptr_t>(row[1]),
           static_cast<size_t>(row[2])};
      row += 3;
    }
    return out;
  }
  for (py::handle item : seq) {
    if (py::isinstance<hixl::TransferOpDesc>(item)) {
      out.push_back(item.cast<hixl::TransferOpDesc>());
    } else {
      auto t = item.cast<py::sequence>();
      if (t.size() != 3)
        Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: descriptor must be (local, remote, len)");
      out.push_back({t[0].cast<uintptr_t>(), t[1].cast<uintptr_t>(), t[2].cast<size_t>()});
    }
  }
  return out;
}

// ---------------------------------------------------------------- notifications

PyObject* g_notify_type = nullptr;  // hixl.NotifyDesc (a namedtuple), never released

// hixl.NotifyDesc(name: str, msg: bytes, sender: str). A name that is not
// valid UTF-8 keeps its bytes as surrogate escapes (name.encode("utf-8",
// "surrogateescape") gives them back).
py::object ToPy(const hixl::NotifyDesc& d) {
  py::object name = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
      d.name.data(), static_cast<Py_ssize_t>(d.name.size()), "surrogateescape"));
  if (!name) throw py::error_already_set();
  py::object sender = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(d.from.data(), static_cast<Py_ssize_t>(d.from.size()), "replace"));
  if (!sender) throw py::error_already_set();
  return py::reinterpret_borrow<py::object>(g_notify_type)(name, py::bytes(d.notify_msg), sender);
}

// str (UTF-8, surrogate escapes kept) or any bytes-like object.
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
    Raise(HIXL_PARAM_INVALID, std::string("PARAM_INVALID: ") + what +
                                  " must be str or bytes-like, got " +
                                  std::string(py::str(obj.get_type())));
  }
  std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return out;
}

// notify=: None, "name", (name,), (name, msg) or a NotifyDesc (sender ignored).
std::optional<hixl::NotifyDesc> NotifyArg(py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  hixl::NotifyDesc d;
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr())) {
    d.name = Bytes(obj, "notify name");
    return d;
  }
  if (!py::isinstance<py::sequence>(obj)) {
    Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: notify must be (name, msg), a name or None");
  }
  auto t = py::reinterpret_borrow<py::sequence>(obj);
  if (t.size() < 1 || t.size() > 3) {
    Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: notify must be (name, msg), a name or None");
  }
  d.name = Bytes(t[0], "notify name");
  if (t.size() >= 2) d.notify_msg = Bytes(t[1], "notify msg");
  return d;
}

// The notify callback runs on an engine thread; when set, it runs Python.
thread_local bool t_in_notify_callback = false;

hixl::Hixl::NotifyCallback MakeCallback(py::object fn) {
  // The callable is released with the GIL held, wherever the engine drops its
  // last copy (it does so with the GIL released: see the file comment).
  std::shared_ptr<py::object> holder(new py::object(std::move(fn)), [](py::object* o) {
    if (!Py_IsInitialized()) {
      o->release();  // the interpreter is gone: leak the reference
      delete o;
      return;
    }
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [holder](const hixl::NotifyDesc& d) {
    py::gil_scoped_acquire gil;
    t_in_notify_callback = true;
    try {
      (*holder)(ToPy(d));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(*holder);  // printed like an exception in __del__
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(holder->ptr());
    }
    t_in_notify_callback = false;
  };
}

// ---------------------------------------------------------------- engine lifetime

// Engines alive, finalized by the atexit hook. g_live_mu is only ever taken
// with the GIL released (Finalize may need the GIL to drop a callback).
std::mutex g_live_mu;
std::set<hixl::Hixl*>* g_live = new std::set<hixl::Hixl*>;  // never destroyed

// Deletes an engine with the GIL released (~Hixl finalizes: it joins the
// notify thread, which may be waiting for the GIL to run the callback).
struct HixlDeleter {
  void operator()(hixl::Hixl* h) const {
    if (t_in_notify_callback) {
      // The last reference went inside the callback: Finalize would join this
      // very thread. Finish on another thread once the callback returned.
      {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> l(g_live_mu);
        g_live->erase(h);
      }
      std::thread([h] { delete h; }).detach();
      return;
    }
    auto drop = [h] {
      {
        std::lock_guard<std::mutex> l(g_live_mu);
        g_live->erase(h);
      }
      delete h;
    };
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      drop();
    } else {
      drop();
    }
  }
};
using HixlHolder = std::unique_ptr<hixl::Hixl, HixlDeleter>;

HixlHolder NewHixl() {
  HixlHolder h(new hixl::Hixl);
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> l(g_live_mu);
  g_live->insert(h.get());
  return h;
}

void FinalizeAll() {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> l(g_live_mu);
  for (hixl::Hixl* h : *g_live) h->Finalize();
}

// Runs f (an engine call) with the GIL released.
template <typename F>
auto NoGil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

// The C API engine behind hixl.Context.
class Endpoint {
 public:
  Endpoint(const std::string& ip, int port, const std::string& link) {
    HixlConfig cfg = nullptr;
    CheckC(hixlCreateConfig(&cfg));
    HixlStatus s = hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, ip.c_str());
    if (s == HIXL_SUCCESS && port >= 0) s = hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, port);
    if (s == HIXL_SUCCESS) s = hixlConfigSetString(cfg, HIXL_OPTION_LINK_TYPE, link.c_str());
    if (s == HIXL_SUCCESS) s = hixlCreateEngine(cfg, &engine_);
    std::string msg = hixlGetLastErrorMessage();
    hixlDestroyConfig(cfg);
    if (s != HIXL_SUCCESS) Raise(s, msg);
  }
  ~Endpoint() { Close(); }
  void Close() {
    if (engine_ == nullptr) return;
    hixlDestroyEngine(engine_);  // releases handles and engine memory
    engine_ = nullptr;
    for (void* p : private_) std::free(p);
    private_.clear();
    handles_.clear();
  }
  HixlEngine engine() const {
    if (engine_ == nullptr) Raise(HIXL_FAILED, "FAILED: the context is closed");
    return engine_;
  }
  std::string Address() const { return hixlGetLocalEngine(engine()); }

  // -> (address, handle id, serialized handle)
  py::tuple Alloc(size_t size, bool shareable) {
    HixlEngine e = engine();
    if (size == 0) Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: size must be > 0");
    void* p = nullptr;
    if (shareable) {
      CheckC(hixlAllocMemory(e, size, &p));
    } else {
      if (posix_memalign(&p, 4096, size) != 0)
        Raise(HIXL_RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED: out of memory");
      std::memset(p, 0, size);
      private_.push_back(p);
    }
    HixlMemHandle h = nullptr;
    CheckC(hixlRegisterMemory(e, p, size, HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE, &h));
    uint64_t id = next_id_++;
    handles_[id] = h;
    return py::make_tuple(reinterpret_cast<uintptr_t>(p), id,
                          std::string(hixlMemHandleSerialize(h)));
  }
  // -> (handle id, size)
  py::tuple Import(const std::string& str) {
    HixlMemHandle h = nullptr;
    CheckC(hixlMemHandleDeserialize(engine(), str.c_str(), &h));
    uint64_t id = next_id_++;
    handles_[id] = h;
    return py::make_tuple(id, hixlMemHandleGetSize(h));
  }
  void Release(uint64_t id) {
    auto it = handles_.find(id);
    if (it == handles_.end()) Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: unknown buffer");
    CheckC(hixlUnregisterMemory(engine(), it->second));
    handles_.erase(it);
  }
  void Transfer(bool write, py::handle local, uint64_t id, uint64_t offset, size_t n) {
    HixlEngine e = engine();
    auto it = handles_.find(id);
    if (it == handles_.end())
      Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: unknown or released buffer");
    if (n == 0) Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: n must be > 0");
    Memory m(local, /*writable=*/!write);
    uintptr_t a = m.Addr(n);
    HixlMemHandle h = it->second;
    HixlStatus s;
    {
      py::gil_scoped_release nogil;
      s = write ? hixlWriteRemote(e, reinterpret_cast<void*>(a), n, h, offset, nullptr)
                : hixlReadRemote(e, reinterpret_cast<void*>(a), n, h, offset, nullptr);
    }
    CheckC(s);
  }

 private:
  HixlEngine engine_ = nullptr;
  std::map<uint64_t, HixlMemHandle> handles_;
  std::vector<void*> private_;
  uint64_t next_id_ = 1;
};

}  // namespace

PYBIND11_MODULE(_hixl, m) {
  m.doc() = "hixl: one-sided READ/WRITE into memory another process registered";
  g_error = PyErr_NewExceptionWithDoc(
      "hixl.HixlError", "A hixl call failed; .code is the status number, .code_name its name.",
      PyExc_RuntimeError, nullptr);
  m.attr("HixlError") = py::handle(g_error);

  py::enum_<hixl::StatusCode>(m, "StatusCode")
      .value("SUCCESS", hixl::StatusCode::kSuccess)
      .value("PARAM_INVALID", hixl::StatusCode::kParamInvalid)
      .value("TIMEOUT", hixl::StatusCode::kTimeout)
      .value("NOT_CONNECTED", hixl::StatusCode::kNotConnected)
      .value("ALREADY_CONNECTED", hixl::StatusCode::kAlreadyConnected)
      .value("NOTIFY_FAILED", hixl::StatusCode::kNotifyFailed)
      .value("UNSUPPORTED", hixl::StatusCode::kUnsupported)
      .value("RESOURCE_EXHAUSTED", hixl::StatusCode::kResourceExhausted)
      .value("FAILED", hixl::StatusCode::kFailed)
      .value("CANCELLED", hixl::StatusCode::kCancelled);
  py::enum_<hixl::MemType>(m, "MemType")
      .value("MEM_DEVICE", hixl::MemType::MEM_DEVICE)
      .value("MEM_HOST", hixl::MemType::MEM_HOST);
  py::enum_<hixl::TransferOp>(m, "TransferOp")
      .value("READ", hixl::TransferOp::READ)
      .value("WRITE", hixl::TransferOp::WRITE);
  py::enum_<hixl::TransferStatus>(m, "TransferStatus")
      .value("WAITING", hixl::TransferStatus::WAITING)
      .value("COMPLETED", hixl::TransferStatus::COMPLETED)
      .value("TIMEOUT", hixl::TransferStatus::TIMEOUT)
      .value("FAILED", hixl::TransferStatus::FAILED)
      .value("CANCELLED", hixl::TransferStatus::CANCELLED);
  py::enum_<hixl::ConnectStatus>(m, "ConnectStatus")
      .value("NOT_CONNECTED", hixl::ConnectStatus::NOT_CONNECTED)
      .value("CONNECTING", hixl::ConnectStatus::CONNECTING)
      .value("CONNECTED", hixl::ConnectStatus::CONNECTED)
      .value("FAILED", hixl::ConnectStatus::FAILED);
  py::enum_<hixl::LinkType>(m, "LinkType")
      .value("AUTO", hixl::LinkType::AUTO)
      .value("SHM", hixl::LinkType::SHM)
      .value("TCP", hixl::LinkType::TCP)
      .value("UCX", hixl::LinkType::UCX);
  m.attr("MEM_PERM_NONE") = static_cast<uint32_t>(hixl::MEM_PERM_NONE);
  m.attr("MEM_PERM_READ") = static_cast<uint32_t>(hixl::MEM_PERM_READ);
  m.attr("MEM_PERM_WRITE") = static_cast<uint32_t>(hixl::MEM_PERM_WRITE);
  m.attr("MEM_PERM_READ_WRITE") = static_cast<uint32_t>(hixl::MEM_PERM_READ_WRITE);
  m.attr("REGISTER_DEFAULT") = static_cast<uint32_t>(hixl::REGISTER_DEFAULT);
  m.attr("REGISTER_SHARE_BY_MAPPING") = static_cast<uint32_t>(hixl::REGISTER_SHARE_BY_MAPPING);
  m.attr("MAX_NOTIFY_NAME_LEN") = hixl::kMaxNotifyNameLen;
  m.attr("MAX_NOTIFY_MSG_LEN") = hixl::kMaxNotifyMsgLen;

  // Option keys for Hixl.initialize (hixl::options).
  py::module_ o = m.def_submodule("options", "Option keys for Hixl.initialize (see hixl.h).");
  o.attr("LINK_TYPE") = hixl::options::kLinkType;
  o.attr("COPY_THREADS") = hixl::options::kCopyThreads;
  o.attr("ENABLE_USE_FABRIC_MEM") = hixl::options::kEnableUseFabricMem;
  o.attr("DEREGISTER_TIMEOUT_MS") = hixl::options::kDeregisterTimeoutMs;
  o.attr("HANDSHAKE_TIMEOUT_MS") = hixl::options::kHandshakeTimeoutMs;
  o.attr("TCP_LANES") = hixl::options::kTcpLanes;
  o.attr("TCP_SLICE_SIZE") = hixl::options::kTcpSliceSize;
  o.attr("TCP_IO_THREADS") = hixl::options::kTcpIoThreads;
  o.attr("SHM_NOTIFY_RING") = hixl::options::kShmNotifyRing;
  o.attr("HEARTBEAT_INTERVAL_MS") = hixl::options::kHeartbeatIntervalMs;
  o.attr("HEARTBEAT_MISSES") = hixl::options::kHeartbeatMisses;
  o.attr("AUTO_CONNECT") = hixl::options::kAutoConnect;
  o.attr("CONNECT_TIMEOUT_MS") = hixl::options::kConnectTimeoutMs;
  o.attr("MAX_PEERS") = hixl::options::kMaxPeers;
  o.attr("PEERS_LOW_WATER") = hixl::options::kPeersLowWater;
  o.attr("NOTIFY_QUEUE_DEPTH") = hixl::options::kNotifyQueueDepth;
  o.attr("AUTH_SECRET") = hixl::options::kAuthSecret;
  o.attr("AUTH_SECRET_FILE") = hixl::options::kAuthSecretFile;
  o.attr("AUTH_REQUIRED") = hixl::options::kAuthRequired;
  o.attr("UCX_ERROR_HANDLING") = hixl::options::kUcxErrorHandling;
  o.attr("UCX_ALLOC_MEM") = hixl::options::kUcxAllocMem;
  o.attr("METADATA_SERVER") = hixl::options::kMetadataServer;
  o.attr("METADATA_PREFIX") = hixl::options::kMetadataPrefix;
  o.attr("ENGINE_NAME") = hixl::options::kEngineName;
  o.attr("METADATA_TTL_S") = hixl::options::kMetadataTtlS;

  py::object nt = py::module_::import("collections")
                      .attr("namedtuple")("NotifyDesc", py::make_tuple("name", "msg", "sender"));
  nt.attr("__module__") = "hixl";
  nt.attr("__doc__") =
      "A received notification: name (str), msg (bytes), sender (the sending engine, str).";
  g_notify_type = nt.release().ptr();
  m.attr("NotifyDesc") = py::handle(g_notify_type);

  py::class_<hixl::MemDesc>(m, "MemDesc")
      .def(py::init([](uintptr_t addr, size_t len) {
             return hixl::MemDesc{addr, len};
           }),
           "addr"_a = 0, "len"_a = 0)
      .def_readwrite("addr", &hixl::MemDesc::addr)
      .def_readwrite("len", &hixl::MemDesc::len);
  py::class_<hixl::TransferOpDesc>(m, "TransferOpDesc")
      .def(py::init([](uintptr_t l, uintptr_t r, size_t n) {
             return hixl::TransferOpDesc{l, r, n};
           }),
           "local_addr"_a = 0, "remote_addr"_a = 0, "len"_a = 0)
      .def_readwrite("local_addr", &hixl::TransferOpDesc::local_addr)
      .def_readwrite("remote_addr", &hixl::TransferOpDesc::remote_addr)
      .def_readwrite("len", &hixl::TransferOpDesc::len);

  py::class_<hixl::Hixl, HixlHolder>(m, "Hixl",
                                     "hixl::Hixl; every method raises HixlError on failure.")
      .def(py::init(&NewHixl))
      .def(
          "initialize",
          [](hixl::Hixl& h, const std::string& local,
             const std::map<std::string, std::string>& opts) {
            Check(NoGil([&] { return h.Initialize(local, opts); }));
          },
          "local_engine"_a, "options"_a = std::map<std::string, std::string>{})
      .def(
          "finalize",
          [](hixl::Hixl& h) {
            if (t_in_notify_callback) {
              Raise(HIXL_FAILED,
                    "FAILED: finalize from the notify callback would deadlock "
                    "(the engine joins the thread running it)");
            }
            NoGil([&] { h.Finalize(); });
          },
          "Disconnects every peer, fails unfinished requests, stops all threads. Safe twice.")
      .def("local_engine", [](hixl::Hixl& h) { return NoGil([&] { return h.LocalEngine(); }); })
      .def(
          "generation", [](hixl::Hixl& h) { return NoGil([&] { return h.Generation(); }); },
          "This engine's generation (incarnation id; 0 before initialize).")
      .def(
          "register_mem",
          [](hixl::Hixl& h, py::object mem, std::optional<size_t> len,
             std::optional<hixl::MemType> type, uint32_t perms, uint32_t flags) {
            uintptr_t addr;
            size_t n;
            bool device = false;
            if (py::isinstance<hixl::MemDesc>(mem)) {
              auto d = mem.cast<hixl::MemDesc>();
              addr = d.addr;
              n = d.len;
            } else {
              Memory m(mem, /*writable=*/false);
              if (!len && !m.sized())
                Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: len is required with an address");
              n = len ? *len : m.size();
              addr = m.Addr(n);
              device = m.device();
            }
            const hixl::MemType t =
                type ? *type : (device ? hixl::MemType::MEM_DEVICE : hixl::MemType::MEM_HOST);
            hixl::MemHandle handle = 0;
            Check(NoGil([&] { return h.RegisterMem({addr, n}, t, handle, perms, flags); }));
            return handle;
          },
          "mem"_a, "len"_a = py::none(), "type"_a = py::none(),
          "perms"_a = static_cast<uint32_t>(hixl::MEM_PERM_READ_WRITE),
          "flags"_a = static_cast<uint32_t>(hixl::REGISTER_DEFAULT),
          "Registers memory for remote access. type: MemType; by default MEM_DEVICE for a CUDA "
          "tensor or __cuda_array_interface__ object, MEM_HOST otherwise (docs/GPU.md). "
          "flags=REGISTER_SHARE_BY_MAPPING lets local peers "
          "map it (numpy/torch CPU memory is moved in place into shared memory until "
          "deregister_mem; see docs/USER_MEMORY.md).")
      .def(
          "deregister_mem",
          [](hixl::Hixl& h, hixl::MemHandle handle) {
            Check(NoGil([&] { return h.DeregisterMem(handle); }));
          },
          "handle"_a)
      .def(
          "alloc_mem",
          [](hixl::Hixl& h, size_t size, hixl::MemType type) {
            void* p = nullptr;
            Check(NoGil([&] { return h.AllocMem(size, type, &p); }));
            return reinterpret_cast<uintptr_t>(p);
          },
          "size"_a, "type"_a = hixl::MemType::MEM_HOST)
      .def(
          "free_mem",
          [](hixl::Hixl& h, uintptr_t p) {
            Check(NoGil([&] { return h.FreeMem(reinterpret_cast<void*>(p)); }));
          },
          "ptr"_a)
      .def(
          "get_mem_handle",
          [](hixl::Hixl& h, uintptr_t p) {
            hixl::MemHandle handle = 0;
            Check(NoGil([&] { return h.GetMemHandle(reinterpret_cast<void*>(p), handle); }));
            return handle;
          },
          "ptr"_a)
      .def(
          "connect",
          [](hixl::Hixl& h, const std::string& remote, int32_t timeout_ms) {
            Check(NoGil([&] { return h.Connect(remote, timeout_ms); }));
          },
          "remote_engine"_a, "timeout_ms"_a = 1000)
      .def(
          "connect_async",
          [](hixl::Hixl& h, const std::string& remote, int32_t timeout_ms) {
            Check(NoGil([&] { return h.ConnectAsync(remote, timeout_ms); }));
          },
          "remote_engine"_a, "timeout_ms"_a = 1000,
          "Starts connecting and returns at once; see get_connect_status.")
      .def(
          "get_connect_status",
          [](hixl::Hixl& h, const std::string& remote, bool with_reason) -> py::object {
            hixl::ConnectStatus st = hixl::ConnectStatus::NOT_CONNECTED;
            hixl::Status reason;
            Check(NoGil([&] { return h.GetConnectStatus(remote, st, &reason); }));
            if (!with_reason) return py::cast(st);
            return py::make_tuple(st, static_cast<int>(reason.code()), reason.ToString());
          },
          "remote_engine"_a, "with_reason"_a = false,
          "NOT_CONNECTED, CONNECTING, CONNECTED or FAILED; with_reason=True: (status, code, "
          "message).")
      .def(
          "disconnect",
          [](hixl::Hixl& h, const std::string& remote, int32_t timeout_ms) {
            Check(NoGil([&] { return h.Disconnect(remote, timeout_ms); }));
          },
          "remote_engine"_a, "timeout_ms"_a = 1000)
      .def(
          "get_link_type",
          [](hixl::Hixl& h, const std::string& remote) {
            hixl::LinkType t;
            Check(NoGil([&] { return h.GetLinkType(remote, t); }));
            return t;
          },
          "remote_engine"_a)
      .def(
          "get_peer_generation",
          [](hixl::Hixl& h, const std::string& remote) {
            uint64_t g = 0;
            Check(NoGil([&] { return h.GetPeerGeneration(remote, g); }));
            return g;
          },
          "remote_engine"_a, "The generation of a connected peer (a restarted peer has a new one).")
      .def(
          "list_engines",
          [](hixl::Hixl& h) {
            std::vector<hixl::EngineRecord> v;
            Check(NoGil([&] { return h.ListEngines(v); }));
            py::list out;
            for (const auto& e : v) out.append(py::make_tuple(e.name, e.address, e.generation));
            return out;
          },
          "Engines registered in etcd discovery (needs options.METADATA_SERVER): a list of\n"
          "(name, address, generation).")
      .def(
          "transfer_sync",
          [](hixl::Hixl& h, const std::string& remote, hixl::TransferOp op, py::handle descs,
             int32_t timeout_ms, py::handle notify, uint64_t remote_generation, py::handle stream) {
            auto d = Descs(descs);
            hixl::TransferArgs args;
            args.notify = NotifyArg(notify);
            args.remote_generation = remote_generation;
            args.stream = StreamArg(stream);
            Check(NoGil([&] { return h.TransferSync(remote, op, d, args, timeout_ms); }));
          },
          "remote_engine"_a, "op"_a, "descs"_a, "timeout_ms"_a = 1000, py::kw_only(),
          "notify"_a = py::none(), "remote_generation"_a = 0, "stream"_a = py::none(),
          "Moves every descriptor (local, remote, len) and returns when all bytes are in place.\n"
          "notify=(name, msg): delivered to the peer after the data; remote_generation: refuse\n"
          "unless the peer is still that incarnation (0: no check); stream: a CUDA stream whose\n"
          "queued work must finish before the local memory is touched (docs/GPU.md).")
      .def(
          "transfer_async",
          [](hixl::Hixl& h, const std::string& remote, hixl::TransferOp op, py::handle descs,
             uint64_t user_data, int32_t timeout_ms, py::handle notify, uint64_t remote_generation,
             py::handle stream) {
            auto d = Descs(descs);
            hixl::TransferArgs args;
            args.user_data = user_data;
            args.timeout_ms = timeout_ms;
            args.notify = NotifyArg(notify);
            args.remote_generation = remote_generation;
            args.stream = StreamArg(stream);
            hixl::TransferReq req = 0;
            Check(NoGil([&] { return h.TransferAsync(remote, op, d, args, req); }));
            return req;
          },
          "remote_engine"_a, "op"_a, "descs"_a, "user_data"_a = 0, py::kw_only(),
          "timeout_ms"_a = 0, "notify"_a = py::none(), "remote_generation"_a = 0,
          "stream"_a = py::none(),
          "Posts the transfer and returns its request. timeout_ms > 0: it ends TIMEOUT after that\n"
          "long (0: no deadline); notify, remote_generation and stream as for transfer_sync.")
      .def(
          "get_transfer_status",
          [](hixl::Hixl& h, hixl::TransferReq req, bool with_reason) -> py::object {
            hixl::TransferStatus st;
            hixl::Status reason;
            Check(NoGil([&] { return h.GetTransferStatus(req, st, reason); }));
            if (!with_reason) return py::cast(st);
            return py::make_tuple(st, static_cast<int>(reason.code()), reason.ToString());
          },
          "req"_a, "with_reason"_a = false,
          "WAITING, COMPLETED, TIMEOUT, FAILED or CANCELLED; with_reason=True: (status, code, "
          "message).")
      .def(
          "cancel_transfer",
          [](hixl::Hixl& h, hixl::TransferReq req) {
            Check(NoGil([&] { return h.CancelTransfer(req); }));
          },
          "req"_a,
          "Stops an async request and returns once it stopped; get_transfer_status then says\n"
          "CANCELLED (or how it ended first).")
      .def(
          "send_notify",
          [](hixl::Hixl& h, const std::string& remote, py::handle name, py::handle msg,
             int32_t timeout_ms) {
            hixl::NotifyDesc d;
            d.name = Bytes(name, "name");
            d.notify_msg = Bytes(msg, "msg");
            Check(NoGil([&] { return h.SendNotify(remote, d, timeout_ms); }));
          },
          "remote_engine"_a, "name"_a, "msg"_a = py::bytes(), "timeout_ms"_a = 1000,
          "Sends a named message (str or bytes, up to 1024 bytes each) and returns once the peer\n"
          "queued it. RESOURCE_EXHAUSTED: the peer's queue for this engine is full.")
      .def(
          "get_notifies",
          [](hixl::Hixl& h) {
            std::vector<hixl::NotifyDesc> got;
            Check(NoGil([&] { return h.GetNotifies(got); }));
            py::list out;
            for (const auto& d : got) out.append(ToPy(d));
            return out;
          },
          "Takes every queued notification: a list of NotifyDesc(name, msg, sender), each\n"
          "sender's oldest first (different senders' may come grouped by sender).")
      .def(
          "set_notify_callback",
          [](hixl::Hixl& h, py::object cb) {
            hixl::Hixl::NotifyCallback f;
            if (!cb.is_none()) {
              if (!PyCallable_Check(cb.ptr())) {
                Raise(HIXL_PARAM_INVALID, "PARAM_INVALID: callback must be callable or None");
              }
              f = MakeCallback(std::move(cb));
            }
            Check(NoGil([&] { return h.SetNotifyCallback(std::move(f)); }));
          },
          "callback"_a,
          "callback(NotifyDesc) gets every notification from now on, called from an engine\n"
          "thread, each sender's in order (exceptions are printed, not raised); None: back to\n"
          "get_notifies. The callback must not call finalize.");

  py::class_<Endpoint>(m, "Endpoint", "The C API engine behind hixl.Context (internal).")
      .def(py::init<const std::string&, int, const std::string&>(), "ip"_a = "127.0.0.1",
           "port"_a = 0, "link_type"_a = "AUTO")
      .def_property_readonly("address", &Endpoint::Address)
      .def("alloc", &Endpoint::Alloc, "size"_a, "shareable"_a = true)
      .def("import_handle", &Endpoint::Import, "handle"_a)
      .def("release", &Endpoint::Release, "id"_a)
      .def("write", [](Endpoint& e, py::handle src, uint64_t id, uint64_t off,
                       size_t n) { e.Transfer(true, src, id, off, n); })
      .def("read", [](Endpoint& e, uint64_t id, py::handle dst, uint64_t off,
                      size_t n) { e.Transfer(false, dst, id, off, n); })
      .def("close", &Endpoint::Close);

  hixl_py::DefMemoryFunctions<Memory>(m);
  // Engines alive at exit are finalized while Python threads still run (an
  // engine thread may be waiting for the GIL to call a notify callback).
  py::module_::import("atexit").attr("register")(py::cpp_function(&FinalizeAll));

  m.def("view", [](uintptr_t addr, size_t n) {
    return py::memoryview::from_memory(reinterpret_cast<void*>(addr), static_cast<py::ssize_t>(n),
                                       false);
  });
}
