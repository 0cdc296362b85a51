// The memory behind a Python object, without copying, shared by the hixl and
// llm_datadist modules: an int address, a CPU torch tensor (data_ptr), a
// local hixl.Buffer, or any C-contiguous buffer-protocol object (numpy array,
// bytearray, memoryview, HostMemory, ...).
//
// Thread safety: construct and destroy with the GIL held. Ownership: the
// object (and its buffer export) is held until the Memory dies.
#ifndef HIXL_PYTHON_PY_MEMORY_H_
#define HIXL_PYTHON_PY_MEMORY_H_

#include <pybind11/pybind11.h>

#include <cstdint>
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
      if (dev != "cpu") Raise("a tensor on '" + dev + "': only host (CPU) memory is usable here");
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

 private:
  [[noreturn]] void Raise(const std::string& m) const {
    fail_(m);
    throw std::logic_error("hixl_py::Memory: the failure handler returned");  // not reached
  }

  Fail fail_;
  Py_buffer view_{};
  bool held_ = false;
  bool sized_ = false;
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
      "(address, size or None) of an int, CPU tensor or buffer-protocol object (no copy).");
  m.def(
      "memmove",
      [](py::handle dst, py::handle src, size_t n) {
        M d(dst, true), s(src, false);
        uintptr_t da = d.Addr(n, "dst"), sa = s.Addr(n, "src");
        py::gil_scoped_release nogil;
        std::memmove(reinterpret_cast<void*>(da), reinterpret_cast<const void*>(sa), n);
      },
      py::arg("dst"), py::arg("src"), py::arg("n"),
      "Copies n bytes between two memory objects (GIL released).");
}

}  // namespace hixl_py

#endif  // HIXL_PYTHON_PY_MEMORY_H_
