// tests/test_peer.cc — hixl_test_peer: a separate process with its own hixl
// engine, driven line by line over stdin/stdout by the behaviour tests.
//
// Usage: hixl_test_peer [--listen ADDR] [--opt Key=Value]...
// On start: Initialize(ADDR, options) (ADDR defaults to "127.0.0.1:0") and
// print "READY <LocalEngine()>"
// (or "ERR <status>" and exit 2). Then one reply line per command line:
//
//   alloc NAME SIZE            AllocMem                         -> OK <addr>
//   devalloc NAME SIZE         AllocMem(MEM_DEVICE)             -> OK <addr>
//   devreg NAME TOTAL OFF SIZE [PERMS]  device memory of TOTAL bytes from the
//                              driver (tests/device/test_cuda.h), bytes
//                              [OFF, OFF+SIZE) registered MEM_DEVICE -> OK <addr>
//                              (fill, fillpat and hash reach device regions
//                              through the driver)
//   devvmm NAME TOTAL OFF SIZE [PERMS [nofd]]  like devreg, the memory made
//                              with cuMemCreate and mapped (VMM), shareable
//                              as a file descriptor unless nofd
//   devdelay US                the fake driver (tests/fake_cuda) sleeps US
//                              microseconds before each copy
//   devfail N                  the fake driver (tests/fake_cuda) lets the
//                              next N copies succeed and fails every later
//                              one; N < 0: none fails
//   reg NAME SIZE PERMS        allocate SIZE + 2*4096 guard bytes (0xCD) as
//                              plain anonymous memory (mmap, zero-filled; not
//                              engine memory), register the middle SIZE bytes,
//                              PERMS r|w|rw|none -> OK <addr>
//   regsplit A B SIZE PERMS    one block with guards holding two ADJACENT
//                              regions A=[m, m+SIZE) and B=[m+SIZE, m+2*SIZE),
//                              each registered separately  -> OK <addrA> <addrB>
//   regshare NAME SIZE PERMS SHIFT
//                              like reg, the region starting SHIFT bytes after
//                              the first guard (those bytes are guard too), and
//                              registered with REGISTER_SHARE_BY_MAPPING
//   filereg NAME SIZE KIND FLAG  a shared file mapping of SIZE bytes, registered
//                              (FLAG 1: with REGISTER_SHARE_BY_MAPPING); KIND
//                              sealed|unsealed (memfd "hixl-test-memfd", sealed
//                              against shrinking or not) or shm (a /dev/shm
//                              file, unlinked at once); the descriptor is kept
//                              open. No guards.      -> OK <addr>
//   mapstate NAME              how the region's first whole page is mapped here
//                              -> OK shared <path> | OK private
//   buf NAME SIZE              plain buffer (zero-filled), not registered -> OK <addr>
//   addr NAME                  -> OK <addr> <size>
//   fill NAME BYTE             memset the region (BYTE decimal or 0xNN)
//   fillpat NAME SEED          hixl_test::FillPattern over the region
//   hash NAME OFFSET LEN       -> OK <hixl_test::Fnv1a64 as 16 hex digits>
//   canary NAME                -> OK intact | ERR canary damaged at offset X
//   dereg NAME                 DeregisterMem (memory stays allocated)
//   free NAME                  FreeMem for alloc, DeregisterMem + free otherwise
//   connect ENGINE [TIMEOUT_MS]
//   disconnect ENGINE
//   linktype ENGINE            -> OK <LinkTypeName>
//   write NAME OFFSET ENGINE REMOTE_ADDR LEN [TIMEOUT_MS]   TransferSync WRITE
//   read  NAME OFFSET ENGINE REMOTE_ADDR LEN [TIMEOUT_MS]   TransferSync READ
//   writenotify NAME OFFSET ENGINE REMOTE_ADDR LEN NNAME NMSG [TIMEOUT_MS]
//                              TransferSync WRITE with TransferArgs::notify
//                              {NNAME, NMSG}
//   sendnotify ENGINE NAME MSG [TIMEOUT_MS]   SendNotify (default 1000 ms)
//   getnotifies [from|names]   drain GetNotifies -> OK <n> <name>=<msg> ...
//                              (oldest first; with "from": <name>=<msg>@<from>;
//                              with "names": <name> only)
//   watchnotify NAME COUNT TIMEOUT_MS
//                              poll GetNotifies (every ~100 us) until COUNT
//                              notifications arrived. Each msg must be
//                              "OFFSET:LEN:HASH" (HASH: 16 hex digits); when it
//                              is observed, Fnv1a64 of region NAME's bytes
//                              [OFFSET, OFFSET+LEN) must equal HASH -> OK <count>
//                              | ERR mismatch <name> ... | ERR duplicate <name>
//                              | ERR badmsg <name> <msg> | ERR timeout got <k>
//   gen                        -> OK <Generation()>
//   peergen ENGINE             -> OK <GetPeerGeneration(ENGINE)>
//   connstatus ENGINE          GetConnectStatus -> OK <CONNECTED|CONNECTING|
//                              NOT_CONNECTED|FAILED> [reason]
//   engine                     -> OK <LocalEngine()>
//   ping                       -> OK pong
//   quit                       Finalize, reply OK, exit 0
// Stdin EOF behaves like quit. Failures answer "ERR <Status::ToString()>".
//
// The engine may log to stdout; replies therefore go to a private duplicate of
// the original stdout and fd 1 is pointed at stderr before the engine starts.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"
#include "device/test_cuda.h"
#include "peer_process.h"

namespace {

constexpr size_t kGuard = 4096;
constexpr unsigned char kCanary = 0xCD;

FILE* g_reply = nullptr;

void Reply(const std::string& line) {
  std::string l = line;
  for (char& c : l) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(g_reply, "%s\n", l.c_str());
  std::fflush(g_reply);
}

std::string Err(const hixl::Status& s) { return "ERR " + s.ToString(); }

// memset of a region (its own function so tsan_peer.supp can name it).
__attribute__((noinline)) void FillRegionBytes(unsigned char* p, int byte, size_t n) {
  std::memset(p, byte, n);
}

// guard | payload | guard, from mmap: zeroed and page-aligned without
// touching the payload (a memset of hundreds of MiB is slow under TSan).
struct Block {
  unsigned char* base = nullptr;
  size_t total = 0;
  size_t mapped = 0;
  size_t head = kGuard;  // guard bytes in front of the payload
  int fd = -1;           // a shared file mapping's descriptor (filereg)
  ~Block() {
    if (base) munmap(base, mapped);
    if (fd >= 0) close(fd);
  }
};

enum class Kind { kAlloc, kReg, kBuf };

struct Region {
  Kind kind = Kind::kReg;
  unsigned char* addr = nullptr;
  size_t size = 0;
  hixl::MemHandle handle = 0;
  bool registered = false;
  std::shared_ptr<Block> block;  // kReg / kBuf
  bool device = false;           // CUDA device memory (devalloc, devreg)
  uintptr_t dev_alloc = 0;       // devreg: the allocation it lies in (freed with it)
  size_t dev_vmm_size = 0;       // devvmm: dev_alloc is VMM memory of this size
};

// Device memory is read and written only through the driver (the fake
// driver's device memory faults on any CPU access).
bool DevFill(const Region& r, uint64_t seed, int byte) {
  std::vector<unsigned char> host(r.size);
  if (byte >= 0) {
    std::memset(host.data(), byte, host.size());
  } else {
    hixl_test::FillPattern(host.data(), host.size(), seed);
  }
  return hixl_test::TestCuda::Get().Copy(r.addr, host.data(), r.size);
}
bool DevHash(const Region& r, size_t off, size_t len, uint64_t& h) {
  std::vector<unsigned char> host(len);
  if (!hixl_test::TestCuda::Get().Copy(host.data(), r.addr + off, len)) return false;
  h = hixl_test::Fnv1a64(host.data(), len);
  return true;
}

// "OK shared <path>" when the page at addr is a shared mapping here, else
// "OK private" (from /proc/self/maps).
std::string MapState(uintptr_t addr) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return "ERR cannot read /proc/self/maps";
  char line[512];
  std::string out = "ERR address not mapped";
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long long lo = 0, hi = 0;
    char perms[5] = {};
    int name_at = 0;
    if (std::sscanf(line, "%llx-%llx %4s %*s %*s %*s %n", &lo, &hi, perms, &name_at) < 3) continue;
    if (addr < lo || addr >= hi) continue;
    std::string path = line + name_at;
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    out = perms[3] == 's' ? "OK shared " + path : "OK private";
    break;
  }
  std::fclose(f);
  return out;
}

bool ParsePerms(const std::string& s, uint32_t& perms) {
  if (s == "r")
    perms = hixl::MEM_PERM_READ;
  else if (s == "w")
    perms = hixl::MEM_PERM_WRITE;
  else if (s == "rw")
    perms = hixl::MEM_PERM_READ_WRITE;
  else if (s == "none")
    perms = hixl::MEM_PERM_NONE;
  else
    return false;
  return true;
}

std::shared_ptr<Block> NewBlock(size_t payload) {
  auto b = std::make_shared<Block>();
  b->total = payload + 2 * kGuard;
  b->mapped = (b->total + kGuard - 1) / kGuard * kGuard;
  void* p = mmap(nullptr, b->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  b->base = static_cast<unsigned char*>(p);
  std::memset(b->base, kCanary, kGuard);
  std::memset(b->base + kGuard + payload, kCanary, kGuard);
  return b;
}

class Peer {
 public:
  hixl::Hixl engine;
  std::map<std::string, Region> regions;

  Region* Find(const std::string& name) {
    auto it = regions.find(name);
    return it == regions.end() ? nullptr : &it->second;
  }

  // watchnotify: see the command list above.
  std::string WatchNotify(const Region& r, size_t count, int64_t timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::set<std::string> seen;
    size_t got = 0;
    std::vector<hixl::NotifyDesc> batch;
    for (;;) {
      batch.clear();
      hixl::Status s = engine.GetNotifies(batch);
      if (!s.ok()) return Err(s);
      for (const auto& n : batch) {
        ++got;
        if (!seen.insert(n.name).second) return "ERR duplicate " + n.name;
        // "OFFSET:LEN:HASH"
        const std::string& m = n.notify_msg;
        size_t c1 = m.find(':');
        size_t c2 = c1 == std::string::npos ? c1 : m.find(':', c1 + 1);
        if (c2 == std::string::npos) return "ERR badmsg " + n.name + " " + m;
        char* end = nullptr;
        const std::string off_s = m.substr(0, c1), len_s = m.substr(c1 + 1, c2 - c1 - 1);
        unsigned long long off = std::strtoull(off_s.c_str(), &end, 10);
        if (off_s.empty() || *end != '\0') return "ERR badmsg " + n.name + " " + m;
        unsigned long long len = std::strtoull(len_s.c_str(), &end, 10);
        if (len_s.empty() || *end != '\0') return "ERR badmsg " + n.name + " " + m;
        const std::string want = m.substr(c2 + 1);
        if (off > r.size || len > r.size - off)
          return "ERR badmsg " + n.name + " " + m + " (outside the region)";
        const std::string have = hixl_test::HashHex(hixl_test::Fnv1a64(r.addr + off, len));
        if (have != want) {
          return "ERR mismatch " + n.name + " offset " + off_s + " len " + len_s + " expected " +
                 want + " got " + have + " (notification #" + std::to_string(got) + ")";
        }
      }
      if (got >= count) return "OK " + std::to_string(got);
      if (std::chrono::steady_clock::now() >= deadline)
        return "ERR timeout got " + std::to_string(got);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Returns false when the peer should exit.
  bool Handle(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd.empty()) {
      Reply("ERR empty command");
      return true;
    }
    if (cmd == "quit") {
      engine.Finalize();
      Reply("OK");
      return false;
    }
    if (cmd == "ping") return Reply("OK pong"), true;
    if (cmd == "engine") return Reply("OK " + engine.LocalEngine()), true;
    if (cmd == "alloc") {
      std::string name;
      size_t size = 0;
      if (!(in >> name >> size) || Find(name)) return Reply("ERR usage/duplicate"), true;
      void* p = nullptr;
      hixl::Status s = engine.AllocMem(size, hixl::MemType::MEM_HOST, &p);
      if (!s.ok()) return Reply(Err(s)), true;
      Region r;
      r.kind = Kind::kAlloc;
      r.addr = static_cast<unsigned char*>(p);
      r.size = size;
      r.registered = true;
      hixl::Status hs = engine.GetMemHandle(p, r.handle);
      if (!hs.ok()) return Reply("ERR GetMemHandle after AllocMem: " + hs.ToString()), true;
      regions[name] = r;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(p))), true;
    }
    if (cmd == "devalloc") {  // devalloc NAME SIZE: AllocMem(MEM_DEVICE)
      std::string name;
      size_t size = 0;
      if (!(in >> name >> size) || Find(name)) return Reply("ERR usage/duplicate"), true;
      void* p = nullptr;
      hixl::Status s = engine.AllocMem(size, hixl::MemType::MEM_DEVICE, &p);
      if (!s.ok()) return Reply(Err(s)), true;
      Region r;
      r.kind = Kind::kAlloc;
      r.addr = static_cast<unsigned char*>(p);
      r.size = size;
      r.registered = true;
      r.device = true;
      if (hixl::Status hs = engine.GetMemHandle(p, r.handle); !hs.ok())
        return Reply("ERR GetMemHandle after AllocMem: " + hs.ToString()), true;
      regions[name] = r;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(p))), true;
    }
    if (cmd == "devdelay") {  // devdelay US: the fake driver's streams sleep US before each copy
      unsigned us = 0;
      if (!(in >> us)) return Reply("ERR usage"), true;
      auto& cuda = hixl_test::TestCuda::Get();
      void* f = cuda.ok() ? cuda.Symbol("hixl_fake_cuda_set_copy_delay_us") : nullptr;
      if (f == nullptr) return Reply("ERR not the fake driver"), true;
      reinterpret_cast<void (*)(unsigned)>(f)(us);
      return Reply("OK"), true;
    }
    if (cmd == "devfail") {  // devfail N: the fake driver's next N copies succeed, later ones fail
      long long n = 0;
      if (!(in >> n)) return Reply("ERR usage"), true;
      auto& cuda = hixl_test::TestCuda::Get();
      void* f = cuda.ok() ? cuda.Symbol("hixl_fake_cuda_fail_copies_after") : nullptr;
      if (f == nullptr) return Reply("ERR not the fake driver"), true;
      reinterpret_cast<void (*)(long long)>(f)(n);
      return Reply("OK"), true;
    }
    if (cmd == "devreg" || cmd == "devvmm") {
      // devreg NAME TOTAL OFFSET SIZE [perms]: part of a device allocation;
      // devvmm NAME TOTAL OFFSET SIZE [perms [nofd]]: of VMM memory
      std::string name, perm_s = "rw", fd_s;
      size_t total = 0, off = 0, size = 0;
      if (!(in >> name >> total >> off >> size) || Find(name) || off + size > total)
        return Reply("ERR usage/duplicate"), true;
      in >> perm_s >> fd_s;
      uint32_t perms = 0;
      if (!ParsePerms(perm_s, perms)) return Reply("ERR bad perms"), true;
      auto& cuda = hixl_test::TestCuda::Get();
      if (!cuda.ok()) return Reply("ERR no test driver: " + cuda.error()), true;
      size_t vmm_size = 0;
      uintptr_t base = cmd == "devreg" ? cuda.Alloc(total)
                                       : cuda.AllocVmm(total, fd_s != "nofd", &vmm_size);
      if (base == 0) return Reply("ERR device allocation failed"), true;
      auto release = [&] { return vmm_size != 0 ? cuda.FreeVmm(base, vmm_size) : cuda.Free(base); };
      Region r;
      r.kind = Kind::kReg;
      r.addr = reinterpret_cast<unsigned char*>(base + off);
      r.size = size;
      r.device = true;
      r.dev_alloc = base;
      r.dev_vmm_size = vmm_size;
      hixl::MemDesc d{base + off, size};
      hixl::Status s = engine.RegisterMem(d, hixl::MemType::MEM_DEVICE, r.handle, perms);
      if (!s.ok()) {
        release();
        return Reply(Err(s)), true;
      }
      r.registered = true;
      regions[name] = r;
      return Reply("OK " + std::to_string(base + off)), true;
    }
    if (cmd == "reg" || cmd == "buf") {
      std::string name, perm_s = "rw";
      size_t size = 0;
      if (!(in >> name >> size) || Find(name)) return Reply("ERR usage/duplicate"), true;
      if (cmd == "reg") in >> perm_s;
      uint32_t perms = 0;
      if (!ParsePerms(perm_s, perms)) return Reply("ERR bad perms"), true;
      Region r;
      r.kind = cmd == "reg" ? Kind::kReg : Kind::kBuf;
      r.block = NewBlock(size);
      if (!r.block) return Reply("ERR out of memory"), true;
      r.addr = r.block->base + kGuard;
      r.size = size;
      if (cmd == "reg") {
        hixl::MemDesc d{reinterpret_cast<uintptr_t>(r.addr), size};
        hixl::Status s = engine.RegisterMem(d, hixl::MemType::MEM_HOST, r.handle, perms);
        if (!s.ok()) return Reply(Err(s)), true;
        r.registered = true;
      }
      regions[name] = r;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(r.addr))), true;
    }
    if (cmd == "regshare") {
      std::string name, perm_s;
      size_t size = 0, shift = 0;
      uint32_t perms = 0;
      if (!(in >> name >> size >> perm_s >> shift) || Find(name) || !ParsePerms(perm_s, perms))
        return Reply("ERR usage/duplicate"), true;
      Region r;
      r.block = NewBlock(size + shift);
      if (!r.block) return Reply("ERR out of memory"), true;
      r.block->head = kGuard + shift;
      std::memset(r.block->base + kGuard, kCanary, shift);
      r.addr = r.block->base + r.block->head;
      r.size = size;
      hixl::MemDesc d{reinterpret_cast<uintptr_t>(r.addr), size};
      hixl::Status s = engine.RegisterMem(d, hixl::MemType::MEM_HOST, r.handle, perms,
                                          hixl::REGISTER_SHARE_BY_MAPPING);
      if (!s.ok()) return Reply(Err(s)), true;
      r.registered = true;
      regions[name] = r;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(r.addr))), true;
    }
    if (cmd == "filereg") {
      std::string name, kind;
      size_t size = 0;
      int flag = 0;
      if (!(in >> name >> size >> kind >> flag) || Find(name) || size == 0)
        return Reply("ERR usage/duplicate"), true;
      auto b = std::make_shared<Block>();
      if (kind == "shm") {
        const std::string path = "/hixl-test-" + std::to_string(getpid()) + "-" + name;
        b->fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (b->fd >= 0) shm_unlink(path.c_str());
      } else if (kind == "sealed" || kind == "unsealed") {
        b->fd = memfd_create("hixl-test-memfd", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      } else {
        return Reply("ERR usage: KIND sealed|unsealed|shm"), true;
      }
      if (b->fd < 0 || ftruncate(b->fd, static_cast<off_t>(size)) != 0)
        return Reply(std::string("ERR ") + std::strerror(errno)), true;
      if (kind == "sealed" && fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        return Reply(std::string("ERR seal: ") + std::strerror(errno)), true;
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
      if (p == MAP_FAILED) return Reply(std::string("ERR mmap: ") + std::strerror(errno)), true;
      b->base = static_cast<unsigned char*>(p);
      b->total = b->mapped = size;
      Region r;
      r.block = b;
      r.addr = b->base;
      r.size = size;
      hixl::MemDesc d{reinterpret_cast<uintptr_t>(r.addr), size};
      hixl::Status s =
          engine.RegisterMem(d, hixl::MemType::MEM_HOST, r.handle, hixl::MEM_PERM_READ_WRITE,
                             flag ? hixl::REGISTER_SHARE_BY_MAPPING : hixl::REGISTER_DEFAULT);
      if (!s.ok()) return Reply(Err(s)), true;
      r.registered = true;
      regions[name] = r;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(r.addr))), true;
    }
    if (cmd == "mapstate") {
      std::string name;
      in >> name;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      const uintptr_t at = (reinterpret_cast<uintptr_t>(r->addr) + page - 1) / page * page;
      return Reply(MapState(at)), true;
    }
    if (cmd == "regsplit") {
      std::string a, b, perm_s;
      size_t size = 0;
      if (!(in >> a >> b >> size >> perm_s) || Find(a) || Find(b) || a == b)
        return Reply("ERR usage/duplicate"), true;
      uint32_t perms = 0;
      if (!ParsePerms(perm_s, perms)) return Reply("ERR bad perms"), true;
      auto block = NewBlock(2 * size);
      if (!block) return Reply("ERR out of memory"), true;
      Region ra, rb;
      ra.kind = rb.kind = Kind::kReg;
      ra.block = rb.block = block;
      ra.addr = block->base + kGuard;
      rb.addr = ra.addr + size;
      ra.size = rb.size = size;
      for (Region* r : {&ra, &rb}) {
        hixl::MemDesc d{reinterpret_cast<uintptr_t>(r->addr), size};
        hixl::Status s = engine.RegisterMem(d, hixl::MemType::MEM_HOST, r->handle, perms);
        if (!s.ok()) {
          if (ra.registered) (void)engine.DeregisterMem(ra.handle);
          return Reply(Err(s)), true;
        }
        r->registered = true;
      }
      regions[a] = ra;
      regions[b] = rb;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(ra.addr)) + " " +
                   std::to_string(reinterpret_cast<uintptr_t>(rb.addr))),
             true;
    }
    if (cmd == "addr") {
      std::string name;
      in >> name;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      return Reply("OK " + std::to_string(reinterpret_cast<uintptr_t>(r->addr)) + " " +
                   std::to_string(r->size)),
             true;
    }
    if (cmd == "fill") {
      std::string name, byte_s;
      in >> name >> byte_s;
      Region* r = Find(name);
      if (!r || byte_s.empty()) return Reply("ERR no such region/usage"), true;
      unsigned long v = std::strtoul(byte_s.c_str(), nullptr, 0);
      if (r->device) {
        return Reply(DevFill(*r, 0, static_cast<int>(v & 0xff)) ? "OK" : "ERR device copy"), true;
      }
      FillRegionBytes(r->addr, static_cast<int>(v & 0xff), r->size);
      return Reply("OK"), true;
    }
    if (cmd == "fillpat") {
      std::string name;
      uint64_t seed = 0;
      in >> name >> seed;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      if (r->device) return Reply(DevFill(*r, seed, -1) ? "OK" : "ERR device copy"), true;
      hixl_test::FillPattern(r->addr, r->size, seed);
      return Reply("OK"), true;
    }
    if (cmd == "hash") {
      std::string name;
      size_t off = 0, len = 0;
      if (!(in >> name >> off >> len)) return Reply("ERR usage"), true;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      if (off > r->size || len > r->size - off) return Reply("ERR range outside region"), true;
      if (r->device) {
        uint64_t h = 0;
        if (!DevHash(*r, off, len, h)) return Reply("ERR device copy"), true;
        return Reply("OK " + hixl_test::HashHex(h)), true;
      }
      return Reply("OK " + hixl_test::HashHex(hixl_test::Fnv1a64(r->addr + off, len))), true;
    }
    if (cmd == "canary") {
      std::string name;
      in >> name;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      if (!r->block || r->device) return Reply("OK intact"), true;  // no guards
      const Block& b = *r->block;
      if (b.fd >= 0) return Reply("OK intact"), true;  // filereg: no guards
      for (size_t i = 0; i < b.head; ++i) {
        if (b.base[i] != kCanary)
          return Reply("ERR canary damaged at offset " + std::to_string(i)), true;
      }
      for (size_t i = 0; i < kGuard; ++i) {
        size_t j = b.total - kGuard + i;
        if (b.base[j] != kCanary)
          return Reply("ERR canary damaged at offset " + std::to_string(j)), true;
      }
      return Reply("OK intact"), true;
    }
    if (cmd == "dereg") {
      std::string name;
      in >> name;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      hixl::Status s = engine.DeregisterMem(r->handle);
      if (!s.ok()) return Reply(Err(s)), true;
      r->registered = false;
      return Reply("OK"), true;
    }
    if (cmd == "free") {
      std::string name;
      in >> name;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      hixl::Status s;
      if (r->kind == Kind::kAlloc) {
        s = engine.FreeMem(r->addr);
      } else if (r->registered) {
        s = engine.DeregisterMem(r->handle);
      }
      if (r->dev_alloc != 0 && s.ok()) {
        auto& cuda = hixl_test::TestCuda::Get();
        if (r->dev_vmm_size != 0) {
          cuda.FreeVmm(r->dev_alloc, r->dev_vmm_size);
        } else {
          cuda.Free(r->dev_alloc);
        }
      }
      regions.erase(name);  // frees the block when no other region shares it
      if (!s.ok()) return Reply(Err(s)), true;
      return Reply("OK"), true;
    }
    if (cmd == "connect" || cmd == "disconnect") {
      std::string eng;
      int32_t timeout = cmd == "connect" ? 3000 : 1000;
      in >> eng;
      int32_t t = 0;
      if (in >> t) timeout = t;
      hixl::Status s =
          cmd == "connect" ? engine.Connect(eng, timeout) : engine.Disconnect(eng, timeout);
      if (!s.ok()) return Reply(Err(s)), true;
      return Reply("OK"), true;
    }
    if (cmd == "linktype") {
      std::string eng;
      in >> eng;
      hixl::LinkType t{};
      hixl::Status s = engine.GetLinkType(eng, t);
      if (!s.ok()) return Reply(Err(s)), true;
      const char* n = hixl::LinkTypeName(t);
      return Reply(std::string("OK ") + (n ? n : "(null)")), true;
    }
    if (cmd == "write" || cmd == "read") {
      std::string name, eng;
      size_t off = 0, len = 0;
      uintptr_t remote = 0;
      int32_t timeout = 10000;
      if (!(in >> name >> off >> eng >> remote >> len)) return Reply("ERR usage"), true;
      int32_t t = 0;
      if (in >> t) timeout = t;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      if (off > r->size || len > r->size - off) return Reply("ERR range outside region"), true;
      hixl::TransferOpDesc d{reinterpret_cast<uintptr_t>(r->addr + off), remote, len};
      hixl::Status s = engine.TransferSync(
          eng, cmd == "write" ? hixl::TransferOp::WRITE : hixl::TransferOp::READ, {d}, timeout);
      if (!s.ok()) return Reply(Err(s)), true;
      return Reply("OK"), true;
    }
    if (cmd == "writenotify") {
      std::string name, eng, nname, nmsg;
      size_t off = 0, len = 0;
      uintptr_t remote = 0;
      int32_t timeout = 10000;
      if (!(in >> name >> off >> eng >> remote >> len >> nname >> nmsg))
        return Reply("ERR usage"), true;
      int32_t t = 0;
      if (in >> t) timeout = t;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      if (off > r->size || len > r->size - off) return Reply("ERR range outside region"), true;
      hixl::TransferOpDesc d{reinterpret_cast<uintptr_t>(r->addr + off), remote, len};
      hixl::TransferArgs args;
      args.notify = hixl::NotifyDesc{nname, nmsg, ""};
      hixl::Status s = engine.TransferSync(eng, hixl::TransferOp::WRITE, {d}, args, timeout);
      if (!s.ok()) return Reply(Err(s)), true;
      return Reply("OK"), true;
    }
    if (cmd == "sendnotify") {
      std::string eng, name, msg;
      int32_t timeout = 1000;
      if (!(in >> eng >> name >> msg)) return Reply("ERR usage"), true;
      int32_t t = 0;
      if (in >> t) timeout = t;
      hixl::Status s = engine.SendNotify(eng, hixl::NotifyDesc{name, msg, ""}, timeout);
      if (!s.ok()) return Reply(Err(s)), true;
      return Reply("OK"), true;
    }
    if (cmd == "getnotifies") {
      std::string opt;
      in >> opt;
      std::vector<hixl::NotifyDesc> got;
      hixl::Status s = engine.GetNotifies(got);
      if (!s.ok()) return Reply(Err(s)), true;
      std::string out = "OK " + std::to_string(got.size());
      for (const auto& n : got) {
        if (opt == "names") {
          out += " " + n.name;
          continue;
        }
        out += " " + n.name + "=" + n.notify_msg;
        if (opt == "from") out += "@" + n.from;
      }
      return Reply(out), true;
    }
    if (cmd == "watchnotify") {
      std::string name;
      size_t count = 0;
      int64_t timeout = 0;
      if (!(in >> name >> count >> timeout)) return Reply("ERR usage"), true;
      Region* r = Find(name);
      if (!r) return Reply("ERR no such region"), true;
      return Reply(WatchNotify(*r, count, timeout)), true;
    }
    if (cmd == "gen") return Reply("OK " + std::to_string(engine.Generation())), true;
    if (cmd == "peergen") {
      std::string eng;
      in >> eng;
      uint64_t g = 0;
      hixl::Status s = engine.GetPeerGeneration(eng, g);
      if (!s.ok()) return Reply(Err(s)), true;
      return Reply("OK " + std::to_string(g)), true;
    }
    if (cmd == "connstatus") {
      std::string eng;
      in >> eng;
      hixl::ConnectStatus cs = hixl::ConnectStatus::FAILED;
      hixl::Status why;
      hixl::Status s = engine.GetConnectStatus(eng, cs, &why);
      if (!s.ok()) return Reply(Err(s)), true;
      const char* n = "FAILED";
      switch (cs) {
        case hixl::ConnectStatus::NOT_CONNECTED: n = "NOT_CONNECTED"; break;
        case hixl::ConnectStatus::CONNECTING: n = "CONNECTING"; break;
        case hixl::ConnectStatus::CONNECTED: n = "CONNECTED"; break;
        case hixl::ConnectStatus::FAILED: n = "FAILED"; break;
      }
      std::string out = std::string("OK ") + n;
      if (!why.ok()) out += " " + why.ToString();
      return Reply(out), true;
    }
    Reply("ERR unknown command: " + cmd);
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  // Replies go to the original stdout; anything else written to fd 1 (engine
  // logs) goes to stderr so it cannot corrupt the protocol.
  int reply_fd = dup(1);
  if (reply_fd < 0 || dup2(2, 1) < 0) return 3;
  g_reply = fdopen(reply_fd, "w");
  if (g_reply == nullptr) return 3;

  std::map<std::string, std::string> opts;
  std::string listen = "127.0.0.1:0";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (a == "--opt" && i + 1 < argc) {
      std::string kv = argv[++i];
      size_t eq = kv.find('=');
      if (eq == std::string::npos) {
        Reply("ERR bad --opt " + kv);
        return 2;
      }
      opts[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else {
      Reply("ERR unknown argument " + a);
      return 2;
    }
  }

  auto peer = std::make_unique<Peer>();
  hixl::Status s = peer->engine.Initialize(listen, opts);
  if (!s.ok()) {
    Reply(Err(s));
    return 2;
  }
  Reply("READY " + peer->engine.LocalEngine());

  std::string line;
  bool go_on = true;
  while (go_on && std::getline(std::cin, line)) {
    go_on = peer->Handle(line);
  }
  // quit or stdin EOF: Finalize before the memory behind registrations goes.
  peer->engine.Finalize();
  peer.reset();
  std::fclose(g_reply);
  return 0;
}
