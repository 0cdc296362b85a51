// decode: the seed's Decode node. Registers receive buffers that prefill
// processes write into, hands their serialized handles to the control plane,
// waits for "transfer complete" messages and consumes the KV caches in place.
//
// Adapted from the seed only where it used Ascend: aclrtMallocHost -> host
// memory from posix_memalign; the control plane is this process's stdin and
// stdout (the test driver, examples/c/run_pd.sh, connects them to prefill):
//   out: "ENGINE <ip:port>", then "HANDLE <slot> <serialized handle>" per slot
//   in:  "DONE <slot>" when prefill finished writing a slot
//   out: "VERIFIED <n>" at end of input when every slot held a valid cache.
// Usage: decode [--slots N] [--size BYTES] [--port P]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "hixl/hixl.h"
#include "kv_cache.h"

namespace {

// The seed's control plane call: block until a prefill says a slot is written.
// Returns the slot, or -1 at end of input.
int wait_for_transfer_complete() {
  std::string line;
  while (std::getline(std::cin, line)) {
    int slot = -1;
    if (std::sscanf(line.c_str(), "DONE %d", &slot) == 1) return slot;
  }
  return -1;
}

bool inject_kv_cache_to_decoder(void* recv_buffer, size_t recv_size, uint64_t request_id) {
  return KVCacheValid(recv_buffer, recv_size, request_id);
}

}  // namespace

int main(int argc, char** argv) {
  int slots = 1;
  size_t recv_size = 128 * 1024 * 1024;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--slots") == 0) slots = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--size") == 0) recv_size = std::strtoull(argv[i + 1], nullptr, 0);
    else if (std::strcmp(argv[i], "--port") == 0) port = std::atoi(argv[i + 1]);
  }
  if (slots < 1 || recv_size < sizeof(KVCacheHeader)) {
    std::cerr << "usage: decode [--slots N>=1] [--size BYTES] [--port P]" << std::endl;
    return 2;
  }

  HixlConfig config = nullptr;
  hixlCreateConfig(&config);
  hixlConfigSetString(config, HIXL_OPTION_LOCAL_IP, "127.0.0.1");
  hixlConfigSetInt(config, HIXL_OPTION_LOCAL_PORT, port);
  hixlConfigSetString(config, HIXL_OPTION_LINK_TYPE, "HCCS");
  hixlConfigSetString(config, HIXL_OPTION_ENABLE_USE_FABRIC_MEM, "1");
  HixlEngine engine = nullptr;
  HixlStatus status = hixlCreateEngine(config, &engine);
  if (status != HIXL_SUCCESS) {
    std::cerr << "Failed to create engine: " << hixlGetErrorString(status) << " ("
              << hixlGetLastErrorMessage() << ")" << std::endl;
    return 1;
  }
  std::cout << "ENGINE " << hixlGetLocalEngine(engine) << std::endl;

  std::vector<void*> buffers(slots, nullptr);
  std::vector<HixlMemHandle> handles(slots, nullptr);
  for (int s = 0; s < slots; ++s) {
    // 1. Host memory as the receive buffer (seed: aclrtMallocHost).
    void* recv_buffer = nullptr;
    if (posix_memalign(&recv_buffer, 4096, recv_size) != 0) return 1;
    std::memset(recv_buffer, 0, recv_size);
    buffers[s] = recv_buffer;

    // 2. Register it; peers may write into it.
    HixlMemHandle mem_handle = nullptr;
    status = hixlRegisterMemory(engine, recv_buffer, recv_size, HIXL_MEM_PERM_WRITE, &mem_handle);
    if (status != HIXL_SUCCESS) {
      std::cerr << "hixlRegisterMemory failed: " << hixlGetErrorString(status) << std::endl;
      return 1;
    }
    handles[s] = mem_handle;

    // 3. Distribute the handle over the control plane.
    std::string handle_str = hixlMemHandleSerialize(mem_handle);
    std::cout << "HANDLE " << s << " " << handle_str << std::endl;
  }
  std::cerr << "Memory registered, handle distributed to Prefill nodes" << std::endl;

  // 4./5./6. Wait for each slot, then consume it in place (no copy).
  int verified = 0;
  bool ok = true;
  for (int slot; (slot = wait_for_transfer_complete()) >= 0;) {
    if (slot >= slots) {
      ok = false;
      continue;
    }
    void* recv_buffer = buffers[slot];
    KVCacheHeader* header = static_cast<KVCacheHeader*>(recv_buffer);
    std::cerr << "Received KV Cache: seq_len=" << header->seq_len
              << ", num_layers=" << header->num_layers << std::endl;
    if (inject_kv_cache_to_decoder(recv_buffer, recv_size, static_cast<uint64_t>(slot))) {
      ++verified;
    } else {
      std::cerr << "slot " << slot << ": KV cache is missing or corrupt" << std::endl;
      ok = false;
    }
  }

  // 7. Unregister and release.
  for (int s = 0; s < slots; ++s) {
    if (hixlUnregisterMemory(engine, handles[s]) != HIXL_SUCCESS) ok = false;
    std::free(buffers[s]);
  }
  hixlDestroyEngine(engine);
  hixlDestroyConfig(config);
  ok = ok && verified == slots;
  std::cout << (ok ? "VERIFIED " : "FAILED ") << verified << std::endl;
  return ok ? 0 : 1;
}
