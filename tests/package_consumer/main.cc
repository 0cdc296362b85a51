// Links against the installed libhixl and libllm_datadist: moves bytes
// through a loopback link to its own engine, then pulls KV blocks between two
// LLM-DataDist instances: proof that the exported package is complete.
#include <hixl/hixl.h>
#include <llm_datadist/llm_datadist.h>

#include <cstdio>
#include <cstring>
#include <vector>

// Two LLM-DataDist instances in this process: decode pulls blocks 3 and 1 of
// prompt's cache into its blocks 0 and 1.
int PullBlocks() {
  using namespace llm_datadist;
  LlmDataDist prompt(1, LlmRole::kPrompt), decode(2, LlmRole::kDecoder);
  Status st = prompt.Initialize({{"llm.ListenIpInfo", "127.0.0.1:0"}});
  if (st.ok()) st = decode.Initialize({});
  if (st != LLM_SUCCESS) return std::printf("Initialize: %s\n", st.ToString().c_str()), 1;
  CacheDesc desc;
  desc.num_tensors = 2;
  desc.data_type = DT_FLOAT16;
  desc.shape = {4, 1024};  // 4 blocks of 2 KiB per tensor
  std::vector<std::vector<char>> mem(4, std::vector<char>(4 * 2048));
  for (int b = 0; b < 4; ++b) {
    std::memset(mem[0].data() + b * 2048, 'a' + b, 2048);
    std::memset(mem[1].data() + b * 2048, 'A' + b, 2048);
  }
  int64_t src_id = 0, dst_id = 0;
  st = prompt.RegisterKvCache(desc, {reinterpret_cast<uint64_t>(mem[0].data()),
                                     reinterpret_cast<uint64_t>(mem[1].data())}, {}, src_id);
  if (st.ok())
    st = decode.RegisterKvCache(desc, {reinterpret_cast<uint64_t>(mem[2].data()),
                                       reinterpret_cast<uint64_t>(mem[3].data())}, {}, dst_id);
  if (!st.ok()) return std::printf("RegisterKvCache: %s\n", st.ToString().c_str()), 1;
  std::string addr = prompt.LocalAddress();
  ClusterInfo ci;
  ci.remote_cluster_id = 1;
  ci.remote_ip_infos.push_back({addr.substr(0, addr.rfind(':')),
                                static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)))});
  std::vector<Status> rets;
  if (!(st = decode.LinkLlmClusters({ci}, rets)).ok()) {
    return std::printf("LinkLlmClusters: %s\n", st.ToString().c_str()), 1;
  }
  Cache dst;
  dst.cache_id = dst_id;
  if (!(st = decode.PullKvBlocks(CacheIndex{1, src_id, 0}, dst, {3, 1}, {0, 1})).ok()) {
    return std::printf("PullKvBlocks: %s\n", st.ToString().c_str()), 1;
  }
  if (mem[2][0] != 'd' || mem[2][2048] != 'b' || mem[3][0] != 'D' || mem[3][2048] != 'B') {
    return std::printf("PullKvBlocks moved the wrong bytes\n"), 1;
  }
  std::printf("package consumer: KV blocks pulled through the installed libllm_datadist: OK\n");
  return 0;
}

int main() {
  hixl::Hixl engine;
  hixl::Status s = engine.Initialize("127.0.0.1:0");
  if (!s.ok()) return std::printf("Initialize: %s\n", s.ToString().c_str()), 1;
  void* target = nullptr;
  if (!(s = engine.AllocMem(1 << 20, hixl::MemType::MEM_HOST, &target)).ok()) {
    return std::printf("AllocMem: %s\n", s.ToString().c_str()), 1;
  }
  if (!(s = engine.Connect(engine.LocalEngine(), 2000)).ok()) {
    return std::printf("Connect: %s\n", s.ToString().c_str()), 1;
  }
  std::vector<char> src(1 << 20, 'k');
  s = engine.TransferSync(engine.LocalEngine(), hixl::TransferOp::WRITE,
                          {{reinterpret_cast<uintptr_t>(src.data()), reinterpret_cast<uintptr_t>(target),
                            src.size()}},
                          2000);
  if (!s.ok() || std::memcmp(target, src.data(), src.size()) != 0) {
    return std::printf("TransferSync: %s\n", s.ToString().c_str()), 1;
  }
  std::printf("package consumer: 1 MiB moved through the installed libhixl: OK\n");
  return PullBlocks();
}
