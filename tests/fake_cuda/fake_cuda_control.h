/* Test controls of hixl_fake_cuda, the stand-in for the CUDA driver
 * (libcuda.so.1) that hixl's tests load on machines without a GPU. Tests
 * resolve these functions by name with dlsym() on the library's handle; the
 * CUDA entry points themselves come, as from the real driver, only through
 * cuGetProcAddress_v2.
 *
 * Thread safety: every function here may be called from any thread at any
 * time, before or after cuInit, and while copies are running; none of them
 * blocks. A new delay or failure setting applies to the copies that a stream
 * starts after the call returns.
 *
 * Environment, read once by cuInit:
 *   HIXL_FAKE_CUDA_DEVICES           physical devices (default 1; 0: cuInit
 *                                    returns CUDA_ERROR_NO_DEVICE)
 *   HIXL_FAKE_CUDA_VISIBLE           "2,0": ordinal 0 is physical device 2,
 *                                    ordinal 1 is physical device 0 (like
 *                                    CUDA_VISIBLE_DEVICES, the list ends at
 *                                    the first entry that is not a new device)
 *   HIXL_FAKE_CUDA_COPY_DELAY_US     sleep before each copy a stream runs
 *   HIXL_FAKE_CUDA_FAIL_COPY_AFTER   N: the first N copies succeed, every
 *                                    later one fails with
 *                                    CUDA_ERROR_LAUNCH_FAILED and writes nothing
 *
 * cuDeviceGetUuid of physical device i gives the 16 characters
 * "hixlfakegpu%05d" (no terminating NUL), so processes that see one device
 * under different ordinals agree on its UUID.
 */
#ifndef HIXL_TESTS_FAKE_CUDA_FAKE_CUDA_CONTROL_H_
#define HIXL_TESTS_FAKE_CUDA_FAKE_CUDA_CONTROL_H_

#define HIXL_FAKE_CUDA_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Microseconds a stream sleeps before each copy (0: none). */
HIXL_FAKE_CUDA_API void hixl_fake_cuda_set_copy_delay_us(unsigned us);

/* The next n copies succeed and every copy after them fails with
 * CUDA_ERROR_LAUNCH_FAILED, leaving its destination untouched. n < 0: no copy
 * fails. The count starts at this call, not at the start of the process. */
HIXL_FAKE_CUDA_API void hixl_fake_cuda_fail_copies_after(long long n);

/* Device allocations (cuMemAlloc) not yet freed. */
HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_allocs(void);

/* IPC mappings (cuIpcOpenMemHandle) not yet closed; a handle opened twice is
 * one mapping. */
HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_ipc_mappings(void);

/* Mappings of physical memory (cuMemMap) not yet unmapped, and handles of
 * physical memory (cuMemCreate, cuMemImportFromShareableHandle,
 * cuMemRetainAllocationHandle) not yet released. */
HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_vmm_mappings(void);
HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_vmm_handles(void);

/* Copies that completed successfully, and the bytes they moved. */
HIXL_FAKE_CUDA_API long long hixl_fake_cuda_copies(void);
HIXL_FAKE_CUDA_API long long hixl_fake_cuda_bytes_copied(void);

#ifdef __cplusplus
}
#endif

#endif /* HIXL_TESTS_FAKE_CUDA_FAKE_CUDA_CONTROL_H_ */
