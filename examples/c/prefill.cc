// prefill: the seed's Prefill node. Creates an engine configured with the
// decode node as its remote, receives the decode node's serialized memory
// handle over the control plane and writes one KV cache into it with a single
// one-sided, zero-copy hixlWriteRemote.
//
// Adapted from the seed only where it used Ascend: aclrtMalloc -> host memory.
// Usage: prefill <decode ip:port> <serialized handle>
// Prints "DONE 0" (the control-plane message for the decode side) on success.
#include <cstdlib>
#include <iostream>
#include <string>

#include "hixl/hixl.h"
#include "kv_cache.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: prefill <decode ip:port> <serialized handle>" << std::endl;
    return 2;
  }
  std::string decode_engine = argv[1];
  size_t colon = decode_engine.rfind(':');
  if (colon == std::string::npos) return 2;
  std::string remote_ip = decode_engine.substr(0, colon);
  int remote_port = std::atoi(decode_engine.c_str() + colon + 1);

  // Create the HiXL engine configuration (seed values, local addresses).
  HixlConfig config = nullptr;
  hixlCreateConfig(&config);
  hixlConfigSetString(config, HIXL_OPTION_LOCAL_IP, "127.0.0.1");
  hixlConfigSetInt(config, HIXL_OPTION_LOCAL_PORT, 0);
  hixlConfigSetString(config, HIXL_OPTION_REMOTE_IP, remote_ip.c_str());
  hixlConfigSetInt(config, HIXL_OPTION_REMOTE_PORT, remote_port);
  hixlConfigSetString(config, HIXL_OPTION_LINK_TYPE, "HCCS");
  hixlConfigSetString(config, HIXL_OPTION_ENABLE_USE_FABRIC_MEM, "1");

  HixlEngine engine = nullptr;
  HixlStatus status = hixlCreateEngine(config, &engine);
  if (status != HIXL_SUCCESS) {
    std::cerr << "Failed to create engine: " << hixlGetErrorString(status) << std::endl;
    return -1;
  }
  std::cerr << "HiXL engine initialized successfully" << std::endl;

  // 2. The decode node's remote memory handle, from the control plane.
  HixlMemHandle remote_mem_handle = nullptr;
  status = hixlMemHandleDeserialize(engine, argv[2], &remote_mem_handle);
  if (status != HIXL_SUCCESS) {
    std::cerr << "hixlMemHandleDeserialize failed: " << hixlGetErrorString(status) << " ("
              << hixlGetLastErrorMessage() << ")" << std::endl;
    return -1;
  }

  // 1. The local KV cache (seed: aclrtMalloc device memory), as big as the
  //    remote buffer.
  size_t kv_cache_size = hixlMemHandleGetSize(remote_mem_handle);
  KVCache kv(/*request_id=*/0, kv_cache_size);
  void* local_kv_cache = kv.data();

  // 3. One-sided zero-copy write into the remote memory.
  HixlRequest request = nullptr;
  status = hixlWriteRemote(engine, local_kv_cache, kv_cache_size, remote_mem_handle, 0, &request);
  if (status != HIXL_SUCCESS) {
    std::cerr << "hixlWriteRemote failed: " << hixlGetErrorString(status) << " ("
              << hixlGetLastErrorMessage() << ")" << std::endl;
    return -1;
  }

  // 4. Wait for completion (already complete for the blocking call).
  hixlWaitRequest(engine, request, HIXL_WAIT_FOREVER);
  std::cerr << "KV Cache transferred successfully via zero-copy write" << std::endl;

  // 5. Release resources.
  hixlDestroyRequest(request);
  std::cout << "DONE 0" << std::endl;
  hixlUnregisterMemory(engine, remote_mem_handle);
  hixlDestroyEngine(engine);
  hixlDestroyConfig(config);
  return 0;
}
