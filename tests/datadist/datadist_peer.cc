// tests/datadist/datadist_peer.cc — llm_datadist_test_peer: a separate process
// holding one llm_datadist::LlmDataDist, driven line by line over stdin/stdout
// by the LLM-DataDist behaviour tests (through hixl_test::PeerProcess).
//
// Usage: llm_datadist_test_peer [--listen ADDR|none] [--opt Key=Value]...
// peer.cluster=N and peer.role=prompt|decoder|mix pick the instance; every
// other --opt goes to Initialize, and llm.ListenIpInfo=ADDR is added unless
// --listen none (default ADDR 127.0.0.1:0). Prints "READY <LocalAddress()>"
// or "ERR <code-name> <message>" (exit 2). Then one reply line per command;
// failures answer "ERR <code-name> <message>". Stdin EOF: Finalize, exit 0.
//
//   cache NAME NT DTYPE SHAPE [mem=malloc|host|onehost] [keys=K;K..] [lease=MS]
//         [model=ID] [noreg=1]     allocate NT tensors (zero-filled) and
//                                  register them      -> OK <id> <addr,addr,..>
//   reg NAME [keys=..] [lease=..] [model=..]   register again -> OK <id>
//   unreg NAME                     UnregisterKvCache (memory stays)
//   fill NAME SEED [T0 T1]         tensor t := FillPattern(TensorSeed(SEED, t))
//   fillbyte NAME BYTE             memset every tensor
//   hasht NAME                     -> OK <hash of tensor 0>,<tensor 1>,...
//   hashb NAME T0 T1 BLOCKS        -> OK <CombineHashes over tensors T0..T1,
//                                     then the listed blocks, of each piece>
//   hashe NAME T0 T1 ENTRY SIZE    the same over the first SIZE bytes (-1: all)
//                                  of batch entry ENTRY of tensors T0..T1
//   hashr NAME T0 T1 OFFSET LEN    the same over bytes [OFFSET, OFFSET+LEN)
//   link ID ADDR [TIMEOUT_MS]      LinkLlmClusters({ID, remote ADDR})
//   unlink ID ADDR [TIMEOUT_MS] [force]
//   xfer pullc|pullb|pushc|pushb NAME k=v..   a pull/push with local cache NAME
//        remote: cluster=ID cache=ID batch=N | key=c:r:m | bkey=c:m
//        local:  lbatch=N size=N src=LIST dst=LIST sl=a:b dl=a:b tpl=N tag=S
//                explicit=1 (Cache::tensor_addrs given)        -> OK <micros>
//   async NAME k=v.. cfg=F/F/..  TransferCacheAsync of local cache NAME;
//        src=LIST dst=LIST tpl=N; gate: fillseed=S (refill the layer's
//        tensors with TensorSeed(S+layer, t) first) failat=L sleep0=MS
//        (layer 0's gate sleeps first) sleepall=MS (every gate does);
//        waitfirst=MS (a first Wait(MS)); cfg fields: cluster=ID cache=ID
//        key=c:r:m addrs=a,b sl=a:b dl=a:b sb=N db=N (one cfg= per config)
//        cfg tag=S sets the config's user_tag
//        -> OK times=<layer/gate-to-post ns/post-to-done ns,..> first=<code>
//              donefirst=0|1 final=<code> done=0|1 results=<code,..>
//              gates=<layers> msg=<final message>
//   events [MIN WAIT_MS]           drain events (waiting until MIN arrived)
//        -> OK <n> | kind=.. peer=.. cache=.. key=c:r:m|none blocks=LIST
//                    batch=N layers=a:b tag=S | ...
//   callback on|off                SetKvTransferCallback (events still drain)
//   setrole prompt|decoder|mix     SetRole
//   sleep MS | ping | quit
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dd_common.h"
#include "dd_peer_util.h"
#include "llm_datadist/llm_datadist.h"
#include "peer_process.h"

namespace dd_test {
namespace {

namespace ld = llm_datadist;
using Kv = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

FILE* g_reply = nullptr;

void Reply(const std::string& line) {
  std::string l = line;
  for (char& c : l) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(g_reply, "%s\n", l.c_str());
  std::fflush(g_reply);
}

std::string Err(const ld::Status& s) {
  return std::string("ERR ") + ld::StatusCodeName(s.code()) + " " + s.message();
}
std::string CodeName(const ld::Status& s) { return ld::StatusCodeName(s.code()); }

class Peer {
 public:
  Peer(uint64_t cluster, ld::LlmRole role) : dd(cluster, role) {}
  ~Peer() {
    dd.Finalize();
    for (auto& [name, c] : caches) {
      if (c.mem == "malloc") for (void* p : c.owned) std::free(p);
    }
  }

  ld::LlmDataDist dd;
  std::map<std::string, LocalCache> caches;
  std::mutex cb_mu;
  std::vector<ld::KvTransferEvent> cb_events;

  static ld::Cache AsCache(const LocalCache& c, bool explicit_addrs) {
    ld::Cache out;
    out.cache_id = c.id;
    out.cache_desc = c.desc;
    if (explicit_addrs) out.tensor_addrs = c.addrs;
    return out;
  }

  std::string Register(LocalCache& c, const Kv& kv) {
    ld::RegisterCfg cfg;
    if (auto it = kv.find("keys"); it != kv.end()) {
      std::stringstream ss(it->second);
      std::string k;
      while (std::getline(ss, k, ';')) {
        ld::CacheKey key;
        if (!dd_test::ParseKey(k, key)) return "ERR usage bad key " + k;
        cfg.cache_keys.push_back(key);
      }
    }
    if (auto it = kv.find("lease"); it != kv.end()) cfg.lease_ms = std::stoll(it->second);
    if (auto it = kv.find("model"); it != kv.end()) cfg.blocks_model_id = std::stoull(it->second);
    int64_t id = 0;
    ld::Status s = dd.RegisterKvCache(c.desc, c.addrs, cfg, id);
    if (!s.ok()) return Err(s);
    c.id = id;
    c.registered = true;
    return "OK " + std::to_string(id);
  }

  std::string NewCache(const std::string& name, std::istringstream& in, const Kv& kv) {
    if (caches.count(name)) return "ERR usage duplicate cache name";
    LocalCache c;
    std::string dt_s, shape_s;
    if (!(in >> c.desc.num_tensors >> dt_s >> shape_s) ||
        !dd_test::ParseDataType(dt_s, c.desc.data_type) ||
        !dd_test::ParseShape(shape_s, c.desc.shape))
      return "ERR usage cache NAME NT DTYPE SHAPE";
    size_t elems = 1;
    for (int64_t d : c.desc.shape) elems *= static_cast<size_t>(d > 0 ? d : 1);
    const size_t es = ld::DataTypeSize(c.desc.data_type);
    c.tensor_bytes = elems * (es ? es : 1);
    c.entry_bytes = c.tensor_bytes / static_cast<size_t>(c.desc.shape[0] > 0 ? c.desc.shape[0] : 1);
    if (auto it = kv.find("mem"); it != kv.end()) c.mem = it->second;
    const size_t rounded = (c.tensor_bytes + 4095) / 4096 * 4096;
    if (c.mem == "malloc") {
      for (uint32_t t = 0; t < c.desc.num_tensors; ++t) {
        void* p = std::aligned_alloc(4096, rounded ? rounded : 4096);
        if (!p) return "ERR LLM_OUT_OF_MEMORY malloc";
        std::memset(p, 0, rounded);
        c.owned.push_back(p);
        c.addrs.push_back(reinterpret_cast<uint64_t>(p));
      }
    } else if (c.mem == "host" || c.mem == "onehost") {
      const bool one = c.mem == "onehost";
      for (uint32_t t = 0; t < (one ? 1u : c.desc.num_tensors); ++t) {
        void* p = nullptr;
        const size_t n = one ? c.tensor_bytes * c.desc.num_tensors : c.tensor_bytes;
        ld::Status s = dd.AllocHostMemory(n, &p);
        if (!s.ok()) return Err(s);
        std::memset(p, 0, n);
        c.owned.push_back(p);
      }
      for (uint32_t t = 0; t < c.desc.num_tensors; ++t) {
        c.addrs.push_back(one ? reinterpret_cast<uint64_t>(c.owned[0]) + t * c.tensor_bytes
                              : reinterpret_cast<uint64_t>(c.owned[t]));
      }
    } else {
      return "ERR usage mem=malloc|host|onehost";
    }
    std::string addrs;
    for (uint64_t a : c.addrs) addrs += (addrs.empty() ? "" : ",") + std::to_string(a);
    auto& stored = caches[name] = std::move(c);
    if (kv.count("noreg")) return "OK 0 " + addrs;
    std::string r = Register(stored, kv);
    if (r.rfind("OK ", 0) != 0) return r;
    return r + " " + addrs;
  }

  std::string Xfer(const std::string& op, const LocalCache& c, const Kv& kv) {
    auto get = [&](const char* k, const std::string& dflt) {
      auto it = kv.find(k);
      return it == kv.end() ? dflt : it->second;
    };
    ld::KvCacheExtParam ext;
    if (!dd_test::ParseRange(get("sl", "-1:-1"), ext.src_layer_range) ||
        !dd_test::ParseRange(get("dl", "-1:-1"), ext.dst_layer_range))
      return "ERR usage bad layer range";
    ext.tensor_num_per_layer = std::stoi(get("tpl", "2"));
    ext.user_tag = get("tag", "");
    std::vector<uint64_t> src, dst;
    if (!dd_test::ParseList(get("src", "none"), src) || !dd_test::ParseList(get("dst", "none"), dst))
      return "ERR usage bad block list";
    const uint32_t lbatch = static_cast<uint32_t>(std::stoul(get("lbatch", "0")));
    const int64_t size = std::stoll(get("size", "-1"));
    const ld::Cache local = AsCache(c, kv.count("explicit") > 0);
    ld::CacheIndex idx;
    idx.cluster_id = std::stoull(get("cluster", "0"));
    idx.cache_id = std::stoll(get("cache", "0"));
    idx.batch_index = static_cast<uint32_t>(std::stoul(get("batch", "0")));
    ld::CacheKey key;
    const bool by_key = kv.count("key") > 0;
    if (by_key && !dd_test::ParseKey(kv.at("key"), key)) return "ERR usage bad key";
    ld::BlocksCacheKey bkey;
    const bool by_bkey = kv.count("bkey") > 0;
    if (by_bkey) {
      const std::string& b = kv.at("bkey");
      const size_t colon = b.find(':');
      if (colon == std::string::npos) return "ERR usage bkey=c:m";
      bkey.prompt_cluster_id = std::stoull(b.substr(0, colon));
      bkey.model_id = std::stoull(b.substr(colon + 1));
    }
    const auto t0 = Clock::now();
    ld::Status s;
    if (op == "pullc") {
      s = by_key ? dd.PullKvCache(key, local, lbatch, size, ext)
                 : dd.PullKvCache(idx, local, lbatch, size, ext);
    } else if (op == "pushc") {
      s = by_key ? dd.PushKvCache(local, key, lbatch, size, ext)
                 : dd.PushKvCache(local, idx, lbatch, size, ext);
    } else if (op == "pullb") {
      s = by_bkey ? dd.PullKvBlocks(bkey, local, src, dst, ext)
                  : dd.PullKvBlocks(idx, local, src, dst, ext);
    } else if (op == "pushb") {
      s = by_bkey ? dd.PushKvBlocks(local, bkey, src, dst, ext)
                  : dd.PushKvBlocks(local, idx, src, dst, ext);
    } else {
      return "ERR usage unknown xfer op " + op;
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
    if (!s.ok()) return Err(s);
    return "OK " + std::to_string(us.count());
  }

  std::string Async(LocalCache& c, const Kv& kv, const std::vector<std::string>& cfgs) {
    std::vector<uint64_t> src, dst;
    auto get = [&](const char* k, const std::string& dflt) {
      auto it = kv.find(k);
      return it == kv.end() ? dflt : it->second;
    };
    if (!dd_test::ParseList(get("src", "none"), src) || !dd_test::ParseList(get("dst", "none"), dst))
      return "ERR usage bad block list";
    const int tpl = std::stoi(get("tpl", "2"));
    std::vector<ld::LayerTransferConfig> configs;
    for (const std::string& f : cfgs) {
      ld::LayerTransferConfig lc;
      if (std::string e = ParseLayerConfig(f, lc); !e.empty()) return "ERR usage " + e;
      configs.push_back(lc);
    }
    const bool fill = kv.count("fillseed") > 0;
    const uint64_t fillseed = fill ? std::stoull(kv.at("fillseed")) : 0;
    const long failat = std::stol(get("failat", "-1"));
    const int sleep0 = std::stoi(get("sleep0", "0"));
    const int sleepall = std::stoi(get("sleepall", "0"));
    auto gate_mu = std::make_shared<std::mutex>();
    auto gates = std::make_shared<std::vector<uint32_t>>();
    auto opened = std::make_shared<std::map<uint32_t, int64_t>>();  // layer -> ns its gate opened
    const LocalCache* cp = &c;
    ld::LayerGate gate = [=](uint32_t layer, int32_t /*timeout_ms*/) {
      {
        std::lock_guard<std::mutex> l(*gate_mu);
        gates->push_back(layer);
      }
      if (layer == 0 && sleep0 > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep0));
      if (sleepall > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepall));
      if (static_cast<long>(layer) == failat) return false;
      if (fill) {
        for (int k = 0; k < tpl; ++k) {
          const size_t t = static_cast<size_t>(layer) * static_cast<size_t>(tpl) + static_cast<size_t>(k);
          if (t < cp->addrs.size())
            hixl_test::FillPattern(cp->T(t), cp->tensor_bytes, dd_test::TensorSeed(fillseed + layer, t));
        }
      }
      std::lock_guard<std::mutex> l(*gate_mu);
      (*opened)[layer] = Clock::now().time_since_epoch().count();
      return true;
    };
    std::shared_ptr<ld::KvTransferTask> task;
    ld::Status s = dd.TransferCacheAsync(AsCache(c, false), gate, configs, src, dst, task, tpl);
    if (!s.ok()) return Err(s);
    if (!task) return "ERR LLM_FAILED TransferCacheAsync returned success without a task";
    std::string first = "none";
    int donefirst = -1;
    if (kv.count("waitfirst")) {
      first = CodeName(task->Wait(std::stoi(kv.at("waitfirst"))));
      donefirst = task->Done() ? 1 : 0;
    }
    ld::Status fin = task->Wait(30000);
    std::string results;
    const bool done = task->Done();
    for (const ld::Status& r : task->Results()) results += (results.empty() ? "" : ",") + CodeName(r);
    std::vector<uint64_t> gl;
    {
      std::lock_guard<std::mutex> l(*gate_mu);
      gl.assign(gates->begin(), gates->end());
    }
    // Per layer moved: layer/ns from its gate opening to the post/ns from the
    // post to its completion (negative: posted before the gate opened).
    std::string times;
    if (done) {
      std::lock_guard<std::mutex> l(*gate_mu);
      for (const auto& t : task->LayerTimes()) {
        auto it = opened->find(static_cast<uint32_t>(t.layer));
        const int64_t after_gate = it == opened->end() ? -1 : t.posted_ns - it->second;
        times += (times.empty() ? "" : ",") + std::to_string(t.layer) + "/" + std::to_string(after_gate) +
                 "/" + std::to_string(t.done_ns - t.posted_ns);
      }
    }
    return "OK times=" + (times.empty() ? std::string("none") : times) + " first=" + first + " donefirst=" + std::to_string(donefirst) + " final=" +
           CodeName(fin) + " done=" + std::to_string(done ? 1 : 0) + " results=" +
           (results.empty() ? "none" : results) + " gates=" + dd_test::FormatList(gl) +
           " msg=" + fin.message();
  }

  std::string Events(size_t min, int wait_ms) {
    std::vector<ld::KvTransferEvent> all;
    const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
    for (;;) {
      ld::Status s = dd.GetKvTransferEvents(all);
      if (!s.ok()) return Err(s);
      {
        std::lock_guard<std::mutex> l(cb_mu);
        all.insert(all.end(), cb_events.begin(), cb_events.end());
        cb_events.clear();
      }
      if (all.size() >= min || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::string out = "OK " + std::to_string(all.size());
    for (const auto& e : all) out += " | " + FormatEvent(e);
    return out;
  }

  // One command line -> one reply line. False: exit.
  bool Handle(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd.empty()) return Reply("ERR usage empty command"), true;
    if (cmd == "quit") return false;
    if (cmd == "ping") return Reply("OK pong"), true;
    if (cmd == "sleep") {
      int ms = 0;
      in >> ms;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return Reply("OK"), true;
    }
    if (cmd == "link" || cmd == "unlink") {
      ld::ClusterInfo ci;
      std::string addr, force;
      int32_t timeout = cmd == "link" ? 3000 : 1000;
      if (!(in >> ci.remote_cluster_id >> addr)) return Reply("ERR usage link ID ADDR"), true;
      ld::IpInfo ip;
      if (!SplitAddr(addr, ip)) return Reply("ERR usage bad address"), true;
      ci.remote_ip_infos.push_back(ip);
      int32_t t = 0;
      if (in >> t) timeout = t;
      in >> force;
      std::vector<ld::Status> rets;
      ld::Status s = cmd == "link" ? dd.LinkLlmClusters({ci}, rets, timeout)
                                   : dd.UnlinkLlmClusters({ci}, rets, timeout, force == "force");
      if (!s.ok()) return Reply(Err(s)), true;
      if (rets.size() != 1 || !rets[0].ok())
        return Reply("ERR LLM_FAILED call succeeded but rets=" + std::to_string(rets.size()) +
                     (rets.empty() ? "" : " " + rets[0].ToString())), true;
      return Reply("OK"), true;
    }
    if (cmd == "events") {
      size_t min = 0;
      int wait = 0;
      in >> min >> wait;
      return Reply(Events(min, wait)), true;
    }
    if (cmd == "callback") {
      std::string on;
      in >> on;
      ld::Status s = on == "on" ? dd.SetKvTransferCallback([this](const ld::KvTransferEvent& e) {
        std::lock_guard<std::mutex> l(cb_mu);
        cb_events.push_back(e);
      })
                                : dd.SetKvTransferCallback(nullptr);
      return Reply(s.ok() ? "OK" : Err(s)), true;
    }
    if (cmd == "setrole") {
      std::string r;
      ld::LlmRole role{};
      if (!(in >> r) || !ParseRole(r, role)) return Reply("ERR usage setrole ROLE"), true;
      ld::Status s = dd.SetRole(role);
      return Reply(s.ok() ? "OK" : Err(s)), true;
    }
    std::string name;
    std::string op;
    if (cmd == "xfer" && !(in >> op)) return Reply("ERR usage xfer OP NAME"), true;
    if (!(in >> name)) return Reply("ERR usage missing cache name"), true;
    // The rest: positional words (cache/hash) or k=v tokens.
    Kv kv;
    std::vector<std::string> cfgs;
    auto parse_kv = [&]() {
      std::string tok;
      while (in >> tok) {
        const size_t eq = tok.find('=');
        if (eq == std::string::npos) continue;
        if (tok.compare(0, eq, "cfg") == 0) cfgs.push_back(tok.substr(eq + 1));
        else kv[tok.substr(0, eq)] = tok.substr(eq + 1);
      }
    };
    if (cmd == "cache") {
      std::string nt, dt, shape;
      in >> nt >> dt >> shape;
      parse_kv();
      std::istringstream head(nt + " " + dt + " " + shape);
      return Reply(NewCache(name, head, kv)), true;
    }
    auto it = caches.find(name);
    if (it == caches.end()) return Reply("ERR usage no cache named " + name), true;
    LocalCache& c = it->second;
    if (cmd == "hasht" || cmd == "hashb" || cmd == "hashe" || cmd == "hashr") return Reply(HashCommand(cmd, c, in)), true;
    if (cmd == "fill") {
      uint64_t seed = 0;
      size_t t0 = 0, t1 = c.addrs.size() - 1;
      in >> seed;
      if (in >> t0) in >> t1;
      for (size_t t = t0; t <= t1 && t < c.addrs.size(); ++t)
        hixl_test::FillPattern(c.T(t), c.tensor_bytes, dd_test::TensorSeed(seed, t));
      return Reply("OK"), true;
    }
    if (cmd == "fillbyte") {
      std::string b;
      in >> b;
      for (size_t t = 0; t < c.addrs.size(); ++t)
        std::memset(c.T(t), static_cast<int>(std::strtoul(b.c_str(), nullptr, 0) & 0xff), c.tensor_bytes);
      return Reply("OK"), true;
    }
    if (cmd == "unreg") {
      ld::Status s = dd.UnregisterKvCache(c.id);
      if (s.ok()) c.registered = false;
      return Reply(s.ok() ? "OK" : Err(s)), true;
    }
    parse_kv();
    if (cmd == "reg") return Reply(Register(c, kv)), true;
    if (cmd == "xfer") return Reply(Xfer(op, c, kv)), true;
    if (cmd == "async") return Reply(Async(c, kv, cfgs)), true;
    Reply("ERR usage unknown command: " + cmd);
    return true;
  }
};

}  // namespace
}  // namespace dd_test

int main(int argc, char** argv) {
  using namespace dd_test;
  namespace ld = llm_datadist;
  // Replies go to the original stdout; library logs written to fd 1 go to
  // stderr so they cannot corrupt the protocol.
  int reply_fd = dup(1);
  if (reply_fd < 0 || dup2(2, 1) < 0) return 3;
  g_reply = fdopen(reply_fd, "w");
  if (g_reply == nullptr) return 3;

  std::map<std::string, std::string> opts;
  std::string listen = "127.0.0.1:0";
  uint64_t cluster = 1;
  ld::LlmRole role = ld::LlmRole::kPrompt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (a == "--opt" && i + 1 < argc) {
      const std::string kv = argv[++i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) return Reply("ERR usage bad --opt " + kv), 2;
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "peer.cluster") cluster = std::stoull(v);
      else if (k == "peer.role" && ParseRole(v, role)) continue;
      else if (k == "peer.role") return Reply("ERR usage bad role " + v), 2;
      else opts[k] = v;
    } else {
      return Reply("ERR usage unknown argument " + a), 2;
    }
  }
  if (listen != "none") opts[ld::options::kListenIpInfo] = listen;

  auto peer = std::make_unique<Peer>(cluster, role);
  ld::Status s = peer->dd.Initialize(opts);
  if (!s.ok()) return Reply(Err(s)), 2;
  Reply("READY " + peer->dd.LocalAddress());

  std::string line;
  while (std::getline(std::cin, line)) {
    bool go_on = true;
    try {
      go_on = peer->Handle(line);
    } catch (const std::exception& e) {
      Reply(std::string("ERR usage ") + e.what());
    }
    if (!go_on) break;
  }
  peer.reset();  // Finalize before the caches' memory goes
  Reply("OK");
  std::fclose(g_reply);
  return 0;
}
