// hixl-pd-demo: what the orchestrator and its two worker processes share —
// options, the line protocol over pipes, clocks, the paged KV cache each
// process holds (registered with LLM-DataDist), and its block allocator.
//
// Processes: the orchestrator (pd_demo.cc) runs the reference in-process,
// then starts a prefill worker and a decode worker (worker_prefill.cc,
// worker_decode.cc) and drives them with one command per line on their
// stdin; each answers one line per event on its stdout.
#ifndef HIXL_TOOLS_PD_DEMO_COMMON_H_
#define HIXL_TOOLS_PD_DEMO_COMMON_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "model.h"

namespace pd {

// Everything a run needs; workers get the same values on their command line.
struct DemoOptions {
  DemoOptions() {
    model.layers = 8;
    model.kv_heads = 4;
  }
  ModelConfig model;
  std::vector<int> prompt_lens{96, 160, 224, 288, 352, 416, 480, 512};
  int requests = 8;       // prompt_lens are used round-robin
  int gen_tokens = 16;    // tokens generated per request (the first by prefill)
  std::string link = "shm";   // shm | tcp
  std::string mode = "push";  // push | pull
  // host | cuda: where the KV caches live (cuda: device memory; the model
  // computes on the CPU in a host copy and moves each layer's blocks to the
  // device after computing them, and a received request's blocks back).
  std::string device = "host";
  int pool_blocks = 0;        // KV blocks per process; 0: enough for `inflight` longest requests
  int inflight = 3;           // requests between prefill start and decode end at once
  bool run_before = true;     // also the "before" path (staged, serialized, socket)
  bool corrupt = false;       // test-only: flip one byte of one received block
  std::string timeline;       // write a per-layer timeline (JSON) here
  std::string json;           // write per-request results (JSON lines) here
  bool quiet = false;
  // Where the workers listen (different network namespaces: --link tcp).
  std::string prefill_ip = "127.0.0.1", decode_ip = "127.0.0.1";
  std::string prefill_netns, decode_netns;

  int MaxPromptLen() const;
  int BlocksFor(int tokens) const { return (tokens + model.block_size - 1) / model.block_size; }
  int PoolBlocks() const;
  // The model and pool flags a worker needs, for its command line.
  std::vector<std::string> WorkerArgs() const;
};

// Parses argv[first..]; returns "" or the error. Accepts the worker flags too.
std::string ParseOptions(int argc, char** argv, int first, DemoOptions& o);
std::string Usage();

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
inline double NsToMs(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// Lines over file descriptors.
bool ReadLine(int fd, std::string& buffer, std::string& line);  // false on EOF
void WriteLine(int fd, const std::string& line);                // thread-safe per call
std::vector<std::string> Split(const std::string& s);
std::string JoinInts(const std::vector<int32_t>& v);
std::vector<int32_t> ParseInts(const std::vector<std::string>& f, size_t from, size_t n);

// One process's paged KV cache: 2 * layers tensors [K0, V0, K1, V1, ...],
// each pool_blocks blocks, registered with the instance (blocks model id 0),
// and a free list of blocks. Host: AllocHostMemory memory, which view()
// points into. Device (--device cuda): device memory of the driver
// (CachePlacement::kDevice); view() is then a host copy the model computes
// in, moved to and from the device by Upload and Download.
class KvStore {
 public:
  KvStore(llm_datadist::LlmDataDist& dd, const ModelConfig& m, int pool_blocks, bool device);
  ~KvStore();
  llm_datadist::Status status() const { return status_; }
  int64_t cache_id() const { return cache_id_; }
  const KvView& view() const { return view_; }
  llm_datadist::Cache cache() const;
  bool device() const { return device_; }
  // Device caches: the blocks of one layer's K and V (layer -1: every
  // layer) from the host copy to the device, or back. Host caches: nothing
  // to do. "" or the error.
  std::string Upload(int layer, const std::vector<int32_t>& blocks);
  std::string Download(const std::vector<int32_t>& blocks);

  // Takes n blocks (waits up to timeout_ms for others to be freed);
  // empty on timeout.
  std::vector<int32_t> Alloc(int n, int timeout_ms);
  void Free(const std::vector<int32_t>& blocks);
  int free_blocks() const;
  // FNV-1a of the blocks' bytes, every tensor, in table order.
  uint64_t Hash(const std::vector<int32_t>& blocks, int tokens) const;

 private:
  llm_datadist::LlmDataDist& dd_;
  ModelConfig m_;
  int pool_blocks_;
  std::string Copy(int layer, const std::vector<int32_t>& blocks, bool to_device);

  bool device_;
  llm_datadist::Status status_;
  std::vector<void*> mem_;                // registered: host or device memory
  std::vector<std::vector<float>> host_;  // device caches: the host copy
  KvView view_;
  int64_t cache_id_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int32_t> free_;
};

// FNV-1a (over 64-bit words) of the KV rows of positions 0..tokens-1, every layer's K then V,
// read through the block table: equal for equal logical contents.
uint64_t HashKv(const KvView& kv, const ModelConfig& m, const std::vector<int32_t>& blocks,
                int tokens);

inline std::vector<uint64_t> ToU64(const std::vector<int32_t>& v) {
  return std::vector<uint64_t>(v.begin(), v.end());
}

// Worker plumbing shared by both workers.
// Initializes a worker's instance: listening on listen_ip (port chosen by
// the system), the demo's link type, a generous sync deadline.
llm_datadist::Status InitWorkerInstance(llm_datadist::LlmDataDist& dd, const DemoOptions& o,
                                        const std::string& listen_ip);
// Links dd to `cluster` at ip:port; the worker's answer line.
std::string LinkLine(llm_datadist::LlmDataDist& dd, uint64_t cluster, const std::string& ip,
                     const std::string& port);
// Reads commands from stdin until EOF; a command that throws is answered
// with an error line.
void ServeCommands(const std::function<void(const std::vector<std::string>&)>& handle);

// Worker entry points (argv after "--worker NAME").
int RunPrefillWorker(const DemoOptions& o);
int RunDecodeWorker(const DemoOptions& o);

}  // namespace pd

#endif  // HIXL_TOOLS_PD_DEMO_COMMON_H_
