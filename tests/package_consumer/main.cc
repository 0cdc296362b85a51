// Links against the installed libhixl and moves bytes through a loopback link
// to its own engine: proof that the exported package is complete.
#include <hixl/hixl.h>

#include <cstdio>
#include <cstring>
#include <vector>

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
  return 0;
}
