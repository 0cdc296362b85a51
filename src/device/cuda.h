// CUDA device memory, reached through the driver API loaded at run time.
//
// hixl never links libcuda or libcudart: the first call that needs the
// driver dlopens it (HIXL_CUDA_DRIVER names the library; default
// libcuda.so.1), resolves every entry point through cuGetProcAddress_v2 at a
// pinned ABI version, and initializes it. A host without a driver, with the
// toolkit's stub driver or without a device gets UNSUPPORTED from every call
// here, with a message saying which. A build without CUDA (HIXL_WITH_CUDA
// OFF) answers UNSUPPORTED the same way.
//
// Contexts: every call makes the device's primary context current on the
// calling thread first (retained once per device, kept until the process
// exits), so any hixl thread may call in.
//
// fork: the driver's state belongs to the process that initialized it. A
// child forked after that gets UNSUPPORTED (the driver cannot be used there);
// a child of a process that never touched the driver initializes its own.
//
// Thread safety: all functions are thread-safe.
#ifndef HIXL_DEVICE_CUDA_H_
#define HIXL_DEVICE_CUDA_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hixl/hixl.h"

namespace hixl::device {

using Uuid = std::array<uint8_t, 16>;

// What the driver says about an address.
struct PtrInfo {
  bool device = false;   // inside device memory
  bool pinned = false;   // page-locked host memory the driver knows
  int ordinal = -1;      // this process's ordinal of the device (device memory)
  Uuid uuid{};           // the device's identity (ordinals differ between processes)
  uintptr_t base = 0;    // the allocation holding it (device memory)
  size_t size = 0;       // that allocation's size
  uint64_t buffer_id = 0;  // never reused within the process
};

// Loads and initializes the driver on first use. OK when device memory can
// be used in this process; UNSUPPORTED with the reason otherwise.
Status Available();

// Whether a CUDA driver is already loaded in this process (by the
// application, or by hixl), without loading one. Host registrations check
// pointers against the driver only then: a process that holds device memory
// has its driver loaded.
bool DriverLoaded();

// Describes addr. device is false for memory the driver does not know.
Status Query(uintptr_t addr, PtrInfo& out);

// Device memory of n bytes on the device current on the calling thread, or
// device 0 when none is.
Status Alloc(size_t n, uintptr_t& out);
Status Free(uintptr_t p);

// An event recorded on an application's stream (TransferArgs::stream) when
// a transfer is posted: the transfer's copies wait for it on the device, its
// CPU accesses of the application's memory on the CPU. The event is
// destroyed with its last reference.
using StreamEvent = std::shared_ptr<void>;

// Records a new event on stream (a CUstream of this process) in the calling
// thread's current context (device 0's primary context when it has none).
// Returns at once; the event completes when the work queued on stream
// before it has.
Status RecordOn(void* stream, StreamEvent& out);

// Blocks the calling thread until ev completed (null: at once).
Status WaitOnCpu(const StreamEvent& ev);

// Copies n bytes between any two of device memory (imported memory
// included) and host memory, on one of hixl's own non-blocking streams of
// device `ordinal` (the device of the device side), and returns once they
// have landed. With after (a StreamEvent's event), the copy starts on the
// device only once that event completed (the CPU does not wait for it).
// Nothing is written when the driver refuses the copy.
Status Copy(void* dst, const void* src, size_t n, int ordinal, const StreamEvent& after = nullptr);

// Legacy IPC: a handle (64 bytes) to the allocation whose base is base, on
// device ordinal, and its opening in another process (the peer's device
// identified by uuid; ordinal receives this process's ordinal of it). An
// opened handle is closed with IpcClose(the returned base, that ordinal).
Status IpcExport(uintptr_t base, int ordinal, std::string& handle);
Status IpcOpen(const std::string& handle, const Uuid& uuid, uintptr_t& base, int& ordinal);
Status IpcClose(uintptr_t base, int ordinal);

// Memory made with cuMemCreate and mapped with cuMemMap ("VMM": PyTorch's
// expandable segments, the memory savers of vLLM and SGLang) has no legacy
// IPC handle. It is shared as a POSIX file descriptor of its physical
// memory, which the application must have created with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requestedHandleTypes.
// The allocation the driver reports for an address of it (PtrInfo base and
// size) is taken to be one cuMemMap of a whole physical allocation, as those
// allocators map them.
//
// VmmProbe: vmm is true when the allocation at base is such memory;
// exportable says whether peers can open it, and why_not why they cannot.
Status VmmProbe(uintptr_t base, int ordinal, bool& vmm, bool& exportable, std::string& why_not);
// A new descriptor of the physical memory mapped at base (the caller closes it).
Status VmmExport(uintptr_t base, int ordinal, int& fd);
// Maps size bytes of the physical memory fd names (fd stays the caller's)
// into this process, readable and writable by the device with uuid
// (ordinal receives this process's ordinal of it). Undone by VmmClose.
Status VmmImport(int fd, size_t size, const Uuid& uuid, uintptr_t& base, int& ordinal);
Status VmmClose(uintptr_t base, size_t size, int ordinal);

std::string UuidString(const Uuid& u);

}  // namespace hixl::device

#endif  // HIXL_DEVICE_CUDA_H_
