// The memory behind a Python object, without copying, shared by the hixl and
// llm_datadist modules: an int address, a torch tensor on the CPU or on a
// CUDA device (data_ptr), any object with a C-contiguous
// __cuda_array_interface__ (CuPy, Numba, ...), a local hixl.Buffer, or any
// C-contiguous buffer-protocol object (numpy array, bytearray, memoryview,
// HostMemory, ...). device() tells CUDA device memory apart; only the
// driver may touch it (the engine, once it is registered MEM_DEVICE).
//
// Thread safety: construct and destroy with the GIL held. Ownership: the
// object (and its buffer export) is held until the Memory dies.
#ifndef HIXL_PYTHON_PY_MEMORY_H_
#define HIXL_PYTHON_PY_MEMORY_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace hixl_py {

namespace py = pybind11;

class __attribute__((visibility("hidden"))) Memory {
 public:
  // fail(message) raises the module's exception (it must throw).
  using Fail = void (*)(const std::string& message);

  Memory(py::handle obj, bool writable, Fail fail) : fail_(fail) {
    if (py::isinstance<py::bool_>(obj)) Raise("a bool is not an address");
    if (py::isinstance<py::int_>(obj)) {
      addr_ = obj.cast<uintptr_t>();
      if (addr_ == 0) Raise("address 0");
      return;
    }
    if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") &&
        py::hasattr(obj, "is_contiguous")) {  // torch.Tensor
      std::string dev = py::str(obj.attr("device").attr("type"));
      if (dev == "cuda") {
        device_ = true;
      } else if (dev != "cpu") {
        Raise("a tensor on '" + dev + "': only CPU and CUDA memory are usable here");
      }
      if (!obj.attr("is_contiguous")().cast<bool>()) {
        Raise("the tensor is not contiguous (use .contiguous() on a copy you keep)");
      }
      ref_ = py::reinterpret_borrow<py::object>(obj);
      addr_ = obj.attr("data_ptr")().cast<uintptr_t>();
      size_ = obj.attr("numel")().cast<size_t>() * obj.attr("element_size")().cast<size_t>();
      sized_ = true;
      if (addr_ == 0) Raise("the tensor has no storage");
      return;
    }
    if (py::hasattr(obj, "__cuda_array_interface__")) {
      FromCudaArrayInterface(obj, writable);
      return;
    }
    if (py::hasattr(obj, "_hixl_address")) {  // hixl.Buffer
      if (obj.attr("_hixl_address").is_none()) Raise("a remote hixl.Buffer is not local memory");
      ref_ = py::reinterpret_borrow<py::object>(obj);
      addr_ = obj.attr("_hixl_address").cast<uintptr_t>();
      size_ = obj.attr("size").cast<size_t>();
      sized_ = true;
      return;
    }
    if (!PyObject_CheckBuffer(obj.ptr())) {
      Raise("expected an int address, a CPU tensor or a buffer (numpy array, bytearray, ...), got " +
            std::string(py::str(obj.get_type())));
    }
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      std::string why = py::error_already_set().what();  // fetches and clears
      Raise(std::string(py::str(obj.get_type())) + " is not usable as " +
            (writable ? "writable " : "") + "C-contiguous memory (" + why + ")");
    }
    if (view_.len == 0) {
      PyBuffer_Release(&view_);
      Raise("the buffer is empty");
    }
    held_ = true;
    addr_ = reinterpret_cast<uintptr_t>(view_.buf);
    size_ = static_cast<size_t>(view_.len);
    sized_ = true;
  }
  ~Memory() {
    if (held_) PyBuffer_Release(&view_);
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;

  // The address, after checking n bytes fit (what: for the message).
  uintptr_t Addr(size_t n, const std::string& what = "the object") const {
    if (sized_ && n > size_) {
      Raise(what + " has " + std::to_string(size_) + " bytes, " + std::to_string(n) + " needed");
    }
    return addr_;
  }
  size_t size() const { return size_; }
  bool sized() const { return sized_; }
  // CUDA device memory (a CUDA tensor or a __cuda_array_interface__ object).
  bool device() const { return device_; }
  // Raises unless this is host memory (for CPU copies such as memmove).
  void RequireHost(const std::string& what) const {
    if (device_) Raise(what + " is CUDA device memory, which the CPU cannot copy");
  }

 private:
  // Version 2 or 3 of the interface (numba.readthedocs.io, "CUDA Array
  // Interface"): data (pointer, read-only), shape, typestr, strides (None or
  // C-contiguous), no mask.
  void FromCudaArrayInterface(py::handle obj, bool writable) {
    py::object cai_obj = obj.attr("__cuda_array_interface__");
    if (!py::isinstance<py::dict>(cai_obj)) Raise("__cuda_array_interface__ is not a dict");
    py::dict cai = cai_obj.cast<py::dict>();
    for (const char* key : {"data", "shape", "typestr"}) {
      if (!cai.contains(key)) Raise(std::string("__cuda_array_interface__ has no '") + key + "'");
    }
    if (cai.contains("mask") && !cai["mask"].is_none()) {
      Raise("a masked __cuda_array_interface__ array is not usable as memory");
    }
    py::tuple data = cai["data"].cast<py::tuple>();
    if (data.size() != 2) Raise("__cuda_array_interface__ 'data' is not (pointer, read_only)");
    addr_ = data[0].cast<uintptr_t>();
    if (writable && data[1].cast<bool>()) Raise("the device array is read-only");
    const std::string typestr = cai["typestr"].cast<std::string>();
    size_t item = 0;
    if (typestr.size() >= 3) item = std::strtoul(typestr.c_str() + 2, nullptr, 10);
    if (item == 0) Raise("__cuda_array_interface__ has a bad typestr '" + typestr + "'");
    py::tuple shape = cai["shape"].cast<py::tuple>();
    size_t count = 1;
    for (auto d : shape) count *= d.cast<size_t>();
    if (cai.contains("strides") && !cai["strides"].is_none()) {
      py::tuple strides = cai["strides"].cast<py::tuple>();
      if (strides.size() != shape.size())
        Raise("__cuda_array_interface__ strides do not match shape");
      size_t want = item;
      for (size_t i = shape.size(); i-- > 0;) {
        const size_t dim = shape[i].cast<size_t>();
        if (dim > 1 && strides[i].cast<long long>() != static_cast<long long>(want)) {
          Raise("the device array is not C-contiguous");
        }
        want *= dim;
      }
    }
    size_ = count * item;
    if (size_ == 0) Raise("the device array is empty");
    if (addr_ == 0) Raise("the device array's pointer is 0");
    ref_ = py::reinterpret_borrow<py::object>(obj);
    sized_ = true;
    device_ = true;
  }

  [[noreturn]] void Raise(const std::string& m) const {
    fail_(m);
    throw std::logic_error("hixl_py::Memory: the failure handler returned");  // not reached
  }

  Fail fail_;
  Py_buffer view_{};
  bool held_ = false;
  bool sized_ = false;
  bool device_ = false;
  uintptr_t addr_ = 0;
  size_t size_ = 0;
  py::object ref_;
};

// Defines address_of(obj, writable=False) -> (address, size or None) and
// memmove(dst, src, n) on module m, for any of the objects above; M is the
// module's Memory (raising its own exception).
template <typename M>
void DefMemoryFunctions(py::module_& m) {
  m.def(
      "address_of",
      [](py::handle obj, bool writable) {
        M mem(obj, writable);
        return py::make_tuple(mem.Addr(0), mem.sized() ? py::cast(mem.size()) : py::none());
      },
      py::arg("obj"), py::arg("writable") = false,
      "(address, size or None) of an int, CPU or CUDA tensor, __cuda_array_interface__ or "
      "buffer-protocol object (no copy).");
  m.def(
      "memmove",
      [](py::handle dst, py::handle src, size_t n) {
        M d(dst, true), s(src, false);
        d.RequireHost("dst");
        s.RequireHost("src");
        uintptr_t da = d.Addr(n, "dst"), sa = s.Addr(n, "src");
        py::gil_scoped_release nogil;
        std::memmove(reinterpret_cast<void*>(da), reinterpret_cast<const void*>(sa), n);
      },
      py::arg("dst"), py::arg("src"), py::arg("n"),
      "Copies n bytes between two memory objects (GIL released).");
}

}  // namespace hixl_py

#endif  // HIXL_PYTHON_PY_MEMORY_H_
