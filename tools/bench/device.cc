// hixl-bench --device: CUDA device memory through hixl, each row beside a
// baseline of the same size measured in the same run, reps interleaved:
//   d2d shm  write/read   local device <-> the target's device (another
//                         process, legacy IPC)  vs  cuMemcpy device->device
//                         inside this process
//   vmm shm  write/read   the same with the target's memory from cuMemCreate
//                         (mapped here from the fd it passes)  vs  the same
//   d2h shm  write        local device -> the target's host memory
//                         vs  cuMemcpy device->host (pageable) in-process
//   h2d shm  read         the target's host memory -> local device
//                         vs  cuMemcpy host->device in-process
//   d2d tcp  write/read   local device <-> the target's device over tcp
//                         (staged through host buffers on both sides)
//                         vs  hixl's tcp host->host of the same size
//   d2d ucx  write/read   the same over a UCX link (builds with UCX), whose
//                         device transfers take tcp lanes to the target
//                         vs  d2d over a tcp link (the routing's cost)
// The driver is HIXL_CUDA_DRIVER's (default libcuda.so.1). Against the fake
// driver of tests/fake_cuda the figures measure hixl's overhead around the
// copies, not hardware.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/modes.h"
#include "bench/process.h"
#include "device/driver_client.h"

namespace hixl_bench {

namespace {

using hixl::TransferOp;
using Driver = hixl::device::DriverClient;

// One engine of this process on one transport, linked to a target with
// device memory and one with host memory, with local device memory of its own.
struct Side {
  std::string transport;
  Child dev_child{"the device target"}, host_child{"the host target"};
  Child vmm_child{"the VMM device target"};
  Target dev_target, host_target, vmm_target;  // vmm_target: shm only
  hixl::Hixl engine;
  uint8_t* local_dev = nullptr;

  Side(const Options& o, const std::string& t, size_t len) : transport(t) {
    Options to = o;
    to.transport = t;
    dev_target = StartTarget(dev_child, to, "cuda");
    host_target = StartTarget(host_child, to, "alloc");
    if (t == "shm") vmm_target = StartTarget(vmm_child, to, "cuda-vmm");
    Check(engine.Initialize("127.0.0.1",
                            WithEngineOpts(o, {{hixl::options::kLinkType, LinkTypeOption(t)}})),
          "Initialize (" + t + ")");
    Check(engine.Connect(dev_target.engine, 10000), "Connect to the device target (" + t + ")");
    Check(engine.Connect(host_target.engine, 10000), "Connect to the host target (" + t + ")");
    if (t == "shm") Check(engine.Connect(vmm_target.engine, 10000), "Connect to the VMM target");
    void* p = nullptr;
    Check(engine.AllocMem(len, hixl::MemType::MEM_DEVICE, &p), "AllocMem(MEM_DEVICE)");
    local_dev = static_cast<uint8_t*>(p);
  }
  ~Side() { engine.Finalize(); }
};

void Move(hixl::Hixl& e, const Target& t, TransferOp op, uintptr_t local, size_t n) {
  const hixl::Status st = e.TransferSync(t.engine, op, {{local, t.addr, n}}, kTransferTimeoutMs);
  if (!st.ok()) Fail("TransferSync of " + HumanSize(n) + " failed: " + st.ToString());
}

// GB/s of iters calls of fn moving n bytes each.
double Rate(const std::function<void()>& fn, size_t n, uint64_t iters) {
  const auto a = Clock::now();
  for (uint64_t i = 0; i < iters; ++i) fn();
  return static_cast<double>(n) * static_cast<double>(iters) / Seconds(a, Clock::now()) / 1e9;
}

struct Row {
  const char* path;
  const char* transport;
  TransferOp op;
  const char* baseline;
  std::function<void()> hixl, base;
  // --verify: fills the source with the pattern, moves once, checks the
  // destination (throws on a mismatch).
  std::function<void(uint64_t seed)> verify;
};

// The pattern into / compared with local device memory, through the driver.
void DevFill(uint8_t* dev, size_t n, uint64_t seed) {
  std::vector<uint8_t> host(n);
  FillPattern(host.data(), n, seed);
  if (!Driver::Get().Copy(dev, host.data(), n)) Fail("the driver's copy to the device failed");
}
void DevExpect(const uint8_t* dev, size_t n, uint64_t seed, const std::string& where) {
  std::vector<uint8_t> host(n);
  if (!Driver::Get().Copy(host.data(), dev, n)) Fail("the driver's copy from the device failed");
  const size_t bad = FindPatternMismatch(host.data(), n, seed);
  if (bad != SIZE_MAX)
    Fail("VERIFY FAILED (" + where + "): bytes differ at offset " + std::to_string(bad));
}
void TargetFill(Child& c, size_t n, uint64_t seed) {
  const std::string r = c.Request("fill " + std::to_string(seed) + " " + std::to_string(n));
  if (r != "OK") Fail("the target could not fill its region: " + r);
}
void TargetExpect(Child& c, size_t n, uint64_t seed, const std::string& where) {
  const std::string r = c.Request("check " + std::to_string(seed) + " " + std::to_string(n));
  if (r != "OK") Fail("VERIFY FAILED (" + where + "): the target says " + r);
}

}  // namespace

int RunDevice(const Options& o) {
  Driver& cuda = Driver::Get();
  if (!cuda.ok())
    Fail("--device needs a CUDA driver (HIXL_CUDA_DRIVER or libcuda.so.1): " + cuda.error());
  std::vector<uint64_t> sizes =
      o.blocks_given ? o.blocks : std::vector<uint64_t>{1 * MiB, 16 * MiB, 128 * MiB};
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(),
                             [&](uint64_t s) { return s > o.region_size || s == 0; }),
              sizes.end());
  if (sizes.empty()) Fail("--device: no --blocks size fits --region-size");
  const size_t len = *std::max_element(sizes.begin(), sizes.end());

  Side shm(o, "shm", len), tcp(o, "tcp", len);
#ifdef HIXL_HAVE_UCX
  auto ucx = std::make_unique<Side>(o, "ucx", len);
#endif
  // In-process baselines: two device buffers and a host buffer of the driver.
  const uintptr_t dev_a = cuda.Alloc(len), dev_b = cuda.Alloc(len);
  if (dev_a == 0 || dev_b == 0) Fail("cuMemAlloc of " + HumanSize(len) + " failed");
  std::vector<uint8_t> host(len, 0x5a), host_tcp(len, 0x5a);
  auto* a = reinterpret_cast<uint8_t*>(dev_a);
  auto* b = reinterpret_cast<uint8_t*>(dev_b);

  if (o.table) {
    std::fprintf(stderr, "%-6s %-4s %-6s %9s %10s %10s %7s  %s\n", "path", "via", "op", "size",
                 "GB/s", "base GB/s", "ratio", "baseline");
  }
  for (const uint64_t n : sizes) {
    const uint64_t iters =
        o.iters ? o.iters : std::max<uint64_t>(3, std::min<uint64_t>(1000, 256 * MiB / n));
    auto copy = [&](void* d, const void* s) {
      return [&cuda, d, s, n] {
        if (!cuda.Copy(d, s, n)) Fail("the driver's copy failed");
      };
    };
    // A row moving n bytes between side's local device memory and target
    // (which: 'd' its device target, 'v' its VMM device target, 'h' its host
    // target).
    auto row = [&](const char* path, Side& side, char which, TransferOp op,
                   const char* baseline, std::function<void()> base) {
      const Target& t = which == 'd'   ? side.dev_target
                        : which == 'v' ? side.vmm_target
                                       : side.host_target;
      Child& child = which == 'd' ? side.dev_child : which == 'v' ? side.vmm_child : side.host_child;
      uint8_t* local = side.local_dev;
      const std::string where = std::string(path) + " " + side.transport +
                                (op == TransferOp::WRITE ? " write" : " read");
      auto move = [&side, &t, op, local, n] {
        Move(side.engine, t, op, reinterpret_cast<uintptr_t>(local), n);
      };
      auto verify = [&child, op, local, n, move, where](uint64_t seed) {
        if (op == TransferOp::WRITE) {
          DevFill(local, n, seed);
          move();
          TargetExpect(child, n, seed, where);
        } else {
          TargetFill(child, n, seed);
          move();
          DevExpect(local, n, seed, where);
        }
      };
      return Row{path, side.transport.c_str(), op, baseline, move, std::move(base), verify};
    };
    auto tcp_host = [&](TransferOp op) {
      return [&tcp, &host_tcp, op, n] {
        Move(tcp.engine, tcp.host_target, op, reinterpret_cast<uintptr_t>(host_tcp.data()), n);
      };
    };
    const char* d2d = "in-process cuMemcpy device->device";
    std::vector<Row> rows = {
        row("d2d", shm, 'd', TransferOp::WRITE, d2d, copy(b, a)),
        row("d2d", shm, 'd', TransferOp::READ, d2d, copy(a, b)),
        row("vmm", shm, 'v', TransferOp::WRITE, d2d, copy(b, a)),
        row("vmm", shm, 'v', TransferOp::READ, d2d, copy(a, b)),
        row("d2h", shm, 'h', TransferOp::WRITE, "in-process cuMemcpy device->host (pageable)",
            copy(host.data(), a)),
        row("h2d", shm, 'h', TransferOp::READ, "in-process cuMemcpy host (pageable)->device",
            copy(a, host.data())),
        row("d2d", tcp, 'd', TransferOp::WRITE, "hixl tcp host->host", tcp_host(TransferOp::WRITE)),
        row("d2d", tcp, 'd', TransferOp::READ, "hixl tcp host->host", tcp_host(TransferOp::READ)),
    };
#ifdef HIXL_HAVE_UCX
    auto tcp_dev = [&tcp, n](TransferOp op) {
      return [&tcp, op, n] {
        Move(tcp.engine, tcp.dev_target, op, reinterpret_cast<uintptr_t>(tcp.local_dev), n);
      };
    };
    const char* d2d_tcp = "hixl tcp device->device";
    rows.push_back(row("d2d", *ucx, 'd', TransferOp::WRITE, d2d_tcp, tcp_dev(TransferOp::WRITE)));
    rows.push_back(row("d2d", *ucx, 'd', TransferOp::READ, d2d_tcp, tcp_dev(TransferOp::READ)));
#endif
    for (Row& r : rows) {
      if (r.op == TransferOp::WRITE ? !o.do_write : !o.do_read) continue;
      r.hixl();  // warm-up: links, imports, staging buffers
      r.base();
      std::vector<double> mine, base;
      for (uint64_t rep = 0; rep < o.reps; ++rep) {
        base.push_back(Rate(r.base, n, iters));
        mine.push_back(Rate(r.hixl, n, iters));
      }
      bool verified = false;
      if (o.verify) {
        r.verify(Mix(n) ^ (r.op == TransferOp::WRITE ? 1 : 2) ^ std::strlen(r.path));
        verified = true;
      }
      const double g = Median(mine), bg = Median(base);
      const char* op = r.op == TransferOp::WRITE ? "write" : "read";
      std::printf(
          "{\"mode\":\"device\",\"path\":\"%s\",\"transport\":\"%s\",\"op\":\"%s\",\"bytes\":"
          "%" PRIu64 ",\"iters\":%" PRIu64 ",\"reps\":%" PRIu64
          ",\"gbps\":%.3f,\"base_gbps\":%.3f,\"ratio\":%.3f,\"baseline\":\"%s\",\"verified\":%s}\n",
          r.path, r.transport, op, n, iters, o.reps, g, bg, bg > 0 ? g / bg : 0.0, r.baseline,
          o.verify ? (verified ? "true" : "false") : "null");
      std::fflush(stdout);
      if (o.table) {
        std::fprintf(stderr, "%-6s %-4s %-6s %9s %10.2f %10.2f %7.2f  %s\n", r.path, r.transport,
                     op, HumanSize(n).c_str(), g, bg, bg > 0 ? g / bg : 0.0, r.baseline);
      }
    }
  }
  cuda.Free(dev_a);
  cuda.Free(dev_b);
  return 0;
}

}  // namespace hixl_bench
