// async_pipeline: the seed's PDPrefillWorker. Each inference request's KV
// cache is written to its decode slot with hixlWriteRemoteAsync, and the next
// request's prefill runs while earlier transfers are in flight;
// poll_completions() reaps finished transfers and notifies the decode node.
//
// Adapted from the seed only where it used Ascend (run_prefill builds the
// cache in host memory) and to look requests up by the HixlRequest's
// request_id (the seed reads (*it)->request_id).
// Usage: async_pipeline <decode ip:port> <handle slot 0> [<handle slot 1> ...]
// Prints "DONE <slot>" per completed transfer (the decode node's control plane).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"
#include "kv_cache.h"

struct InferenceRequest {
  uint64_t request_id;
  std::vector<int> input_tokens;
};

class PDPrefillWorker {
 private:
  HixlEngine engine_;
  std::vector<HixlRequest> inflight_requests_;
  std::vector<HixlMemHandle> remote_handles_;                 // one decode slot per request
  std::map<uint64_t, uint64_t> transfer_to_request_;          // HixlRequest id -> request id
  std::map<uint64_t, std::unique_ptr<KVCache>> caches_;       // alive until the transfer ends
  size_t failures_ = 0;

  KVCache run_prefill_into(uint64_t request_id, size_t bytes) { return KVCache(request_id, bytes); }
  HixlMemHandle get_remote_handle_for_request(uint64_t request_id) {
    return remote_handles_[request_id];
  }
  void notify_decode_complete(uint64_t transfer_id) {
    uint64_t request_id = transfer_to_request_[transfer_id];
    transfer_to_request_.erase(transfer_id);
    caches_.erase(request_id);
    std::cout << "DONE " << request_id << std::endl;
  }

 public:
  PDPrefillWorker(HixlEngine engine, std::vector<HixlMemHandle> handles)
      : engine_(engine), remote_handles_(std::move(handles)) {}

  void process_request(const InferenceRequest& req) {
    // Stage 1: prefill (produces the KV cache).
    HixlMemHandle remote_handle = get_remote_handle_for_request(req.request_id);
    auto kv_cache = std::make_unique<KVCache>(
        run_prefill_into(req.request_id, hixlMemHandleGetSize(remote_handle)));

    // Stage 2: start the transfer without waiting.
    HixlRequest req_handle = nullptr;
    HixlStatus status = hixlWriteRemoteAsync(engine_, kv_cache->data(), kv_cache->size(),
                                             remote_handle, 0, &req_handle);
    if (status == HIXL_SUCCESS) {
      inflight_requests_.push_back(req_handle);
      transfer_to_request_[req_handle->request_id] = req.request_id;
      caches_[req.request_id] = std::move(kv_cache);
    } else {
      std::cerr << "hixlWriteRemoteAsync failed: " << hixlGetErrorString(status) << std::endl;
      ++failures_;
    }
    // Stage 3: return at once; the next request's prefill overlaps the transfer.
  }

  void poll_completions() {
    auto it = inflight_requests_.begin();
    while (it != inflight_requests_.end()) {
      HixlStatus poll_status = hixlPollRequest(engine_, *it);
      if (poll_status == HIXL_SUCCESS) {
        notify_decode_complete((*it)->request_id);
        hixlDestroyRequest(*it);
        it = inflight_requests_.erase(it);
      } else if (poll_status != HIXL_IN_PROGRESS) {
        std::cerr << "transfer failed: " << hixlGetErrorString(poll_status) << std::endl;
        ++failures_;
        hixlDestroyRequest(*it);
        it = inflight_requests_.erase(it);
      } else {
        ++it;
      }
    }
  }

  bool idle() const { return inflight_requests_.empty(); }
  size_t failures() const { return failures_; }
};

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: async_pipeline <decode ip:port> <handle>..." << std::endl;
    return 2;
  }
  HixlConfig config = nullptr;
  hixlCreateConfig(&config);
  hixlConfigSetString(config, HIXL_OPTION_LOCAL_IP, "127.0.0.1");
  hixlConfigSetString(config, HIXL_OPTION_LINK_TYPE, "HCCS");
  HixlEngine engine = nullptr;
  HixlStatus status = hixlCreateEngine(config, &engine);
  if (status != HIXL_SUCCESS) {
    std::cerr << "Failed to create engine: " << hixlGetErrorString(status) << std::endl;
    return 1;
  }
  std::vector<HixlMemHandle> handles;
  for (int i = 2; i < argc; ++i) {
    HixlMemHandle h = nullptr;
    if (hixlMemHandleDeserialize(engine, argv[i], &h) != HIXL_SUCCESS) {
      std::cerr << "bad handle: " << hixlGetLastErrorMessage() << std::endl;
      return 1;
    }
    handles.push_back(h);
  }
  PDPrefillWorker worker(engine, handles);
  for (uint64_t r = 0; r < handles.size(); ++r) {
    worker.process_request({r, std::vector<int>(16, static_cast<int>(r))});
    worker.poll_completions();
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!worker.idle() && std::chrono::steady_clock::now() < deadline) {
    worker.poll_completions();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  bool ok = worker.idle() && worker.failures() == 0;
  hixlDestroyEngine(engine);  // releases the deserialized handles
  hixlDestroyConfig(config);
  return ok ? 0 : 1;
}
