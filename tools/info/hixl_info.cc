// hixl-info: what hixl can do on this host, and what a running engine looks
// like from here (like ucx_info for UCX). Usage: hixl-info --help.
//
//   hixl-info                          version, build, transports usable here and why
//                                      not, UCX layers and devices, CUDA
//   hixl-info --engine ADDR|NAME       links to a running engine: who it is, the link's
//                                      transport and health, its regions (count and
//                                      bytes; addresses only on an authenticated link)
//   hixl-info --etcd URL               the engines registered in etcd, each probed
//   --json                             one JSON object instead of text
//
// It carries its own copy of the library (linked statically, for the probe):
// the version and build it prints are those it was built with.
//
// Every error is one line on stderr ("hixl-info: ...") and exit status 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/probe.h"
#include "hixl/hixl.h"
#include "info/ucx_layers.h"

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kUsage =
    "usage: hixl-info [--json] [--timeout-ms N]\n"
    "       hixl-info --engine ADDR|NAME [--etcd URL] [--prefix P] [--auth-secret-file F]\n"
    "                 [--local-ip IP] [--json] [--timeout-ms N]\n"
    "       hixl-info --etcd URL [--prefix P] [--json] [--timeout-ms N]\n"
    "\n"
    "Without --engine or --etcd: this library's version and build options, the\n"
    "transports usable on this host (shm, tcp, ucx) and why the others are not, UCX's\n"
    "transport layers and devices, and CUDA.\n"
    "  --engine ADDR|NAME  link to a running engine (\"ip:port\", or a name with --etcd)\n"
    "                      and print who it is, the link's transport and health, and its\n"
    "                      regions: count and bytes, and each address only when the link\n"
    "                      authenticated (--auth-secret-file, the engine's AuthSecret)\n"
    "  --etcd URL          etcd://host:port[,...]: list the engines registered there,\n"
    "                      each probed (alive, gone, or no answer)\n"
    "  --prefix P          the engines' MetadataPrefix (default hixl/)\n"
    "  --local-ip IP       this side's address for --engine (default 127.0.0.1)\n"
    "  --timeout-ms N      bound of each link or probe (default 3000)\n"
    "  --json              print one JSON object\n";

struct Args {
  bool json = false;
  std::string engine, etcd, prefix, secret_file, local_ip = "127.0.0.1";
  int timeout_ms = 3000;
};

// Engines may still run here: leave without running destructors under them.
[[noreturn]] void Fail(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "hixl-info: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(k + " needs a value (see --help)");
      return argv[++i];
    };
    if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (k == "--json") {
      a.json = true;
    } else if (k == "--engine") {
      a.engine = value();
    } else if (k == "--etcd") {
      a.etcd = value();
    } else if (k == "--prefix") {
      a.prefix = value();
    } else if (k == "--auth-secret-file") {
      a.secret_file = value();
    } else if (k == "--local-ip") {
      a.local_ip = value();
    } else if (k == "--timeout-ms") {
      const std::string v = value();
      char* end = nullptr;
      const long t = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || t < 1 || t > 60000) {
        Fail("--timeout-ms must be 1..60000 (got '" + v + "')");
      }
      a.timeout_ms = static_cast<int>(t);
    } else {
      Fail("unknown argument '" + k + "' (see --help)");
    }
  }
  if (!a.secret_file.empty() && a.engine.empty()) Fail("--auth-secret-file needs --engine");
  return a;
}

std::string Bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// ---- this host ---------------------------------------------------------------

json HostReport(const Args& a) {
  json out;
  out["version"] = hixl::Version();
  out["build"] = hixl::BuildInfo();
  // A throwaway engine that listens on loopback: every transport is started
  // the way an application's engine starts it.
  hixl::Hixl e;
  if (hixl::Status s = e.Initialize("127.0.0.1:0"); !s.ok()) {
    Fail("cannot start an engine on 127.0.0.1: " + s.ToString());
  }
  std::vector<hixl::TransportInfo> ts;
  if (hixl::Status s = e.GetTransports(ts); !s.ok()) Fail("GetTransports: " + s.ToString());
  e.Finalize();
  out["transports"] = json::array();
  for (const auto& t : ts) {
    out["transports"].push_back({{"name", t.name},
                                 {"link_type", hixl::LinkTypeName(t.type)},
                                 {"usable", t.usable},
                                 {"detail", t.detail}});
  }
  std::vector<hixl::info::UcxLayer> layers;
  std::string why;
  if (hixl::info::QueryUcxLayers(layers, why)) {
    json l = json::array();
    for (const auto& x : layers) {
      l.push_back({{"component", x.component},
                   {"md", x.md},
                   {"tl", x.tl},
                   {"device", x.device},
                   {"type", x.type}});
    }
    out["ucx_layers"] = l;
  } else {
    out["ucx_layers"] = json::array();
    out["ucx_layers_note"] = why;
  }
  out["cuda"] = "not in this build (device memory is host memory only in this version)";
  (void)a;
  return out;
}

void PrintHost(const json& r) {
  std::printf("hixl %s (%s)\n", r["version"].get<std::string>().c_str(),
              r["build"].get<std::string>().c_str());
  std::printf("transports on this host:\n");
  for (const auto& t : r["transports"]) {
    std::printf("  %-4s %-12s %s\n", t["name"].get<std::string>().c_str(),
                t["usable"].get<bool>() ? "usable" : "NOT USABLE",
                t["detail"].get<std::string>().c_str());
  }
  if (r.contains("ucx_layers_note")) {
    std::printf("ucx layers: %s\n", r["ucx_layers_note"].get<std::string>().c_str());
  } else {
    std::printf("ucx layers (transport/device, type):\n");
    for (const auto& l : r["ucx_layers"]) {
      std::printf("  %-12s %-16s %s\n", l["tl"].get<std::string>().c_str(),
                  l["device"].get<std::string>().c_str(), l["type"].get<std::string>().c_str());
    }
  }
  std::printf("cuda: %s\n", r["cuda"].get<std::string>().c_str());
}

// ---- a running engine -----------------------------------------------------------

std::map<std::string, std::string> ClientOptions(const Args& a) {
  std::map<std::string, std::string> o;
  if (!a.etcd.empty()) o[hixl::options::kMetadataServer] = a.etcd;
  if (!a.prefix.empty()) o[hixl::options::kMetadataPrefix] = a.prefix;
  if (!a.secret_file.empty()) o[hixl::options::kAuthSecretFile] = a.secret_file;
  return o;
}

json EngineReport(const Args& a) {
  hixl::Hixl e;
  if (hixl::Status s = e.Initialize(a.local_ip, ClientOptions(a)); !s.ok()) {
    Fail("cannot start a client engine: " + s.ToString());
  }
  json out;
  std::string address = a.engine;
  uint64_t registered_gen = 0;
  if (!a.etcd.empty()) {
    std::vector<hixl::EngineRecord> list;
    if (e.ListEngines(list).ok()) {
      for (const auto& r : list) {
        if (r.name == a.engine) {
          address = r.address;
          registered_gen = r.generation;
        }
      }
    }
  }
  out["engine"] = a.engine;
  out["address"] = address;
  const hixl::engine::ProbeResult p = hixl::engine::ProbeEngine(address, a.timeout_ms);
  if (p.kind != hixl::engine::ProbeResult::Kind::kIdent) {
    Fail(a.engine + (address != a.engine ? " (" + address + ")" : "") + ": " + p.detail);
  }
  out["generation"] = p.ident.generation;
  out["probe_rtt_us"] = static_cast<int64_t>(p.rtt_us);
  if (registered_gen != 0 && registered_gen != p.ident.generation) {
    out["registry_note"] = "etcd names generation " + std::to_string(registered_gen) +
                           ": a stale entry, or another engine now holds that address";
  }
  if (hixl::Status s = e.Connect(a.engine, a.timeout_ms); !s.ok()) {
    Fail("cannot link to " + a.engine + ": " + s.ToString());
  }
  hixl::PeerStats st;
  if (hixl::Status s = e.GetPeerStats(a.engine, st); !s.ok()) Fail("GetPeerStats: " + s.ToString());
  std::string info;
  (void)e.GetPeerInfo(a.engine, info);
  out["pid"] = st.pid;
  out["link"] = {{"transport", hixl::LinkTypeName(st.link)},
                 {"authenticated", st.authenticated},
                 {"heartbeat_ms", st.heartbeat_ms},
                 {"last_heard_ms", st.last_heard_ms}};
  out["regions"] = {{"count", st.region_count}, {"bytes", st.region_bytes}};
  if (st.authenticated) {
    json list = json::array();
    for (const auto& r : st.regions) {
      list.push_back({{"addr", r.addr},
                      {"len", r.len},
                      {"perms", std::string(r.perms & hixl::MEM_PERM_READ ? "r" : "") +
                                    (r.perms & hixl::MEM_PERM_WRITE ? "w" : "")}});
    }
    out["regions"]["list"] = list;
  }
  out["info"] = info;
  (void)e.Disconnect(a.engine, a.timeout_ms);
  e.Finalize();
  return out;
}

void PrintEngine(const json& r) {
  std::printf("engine %s at %s: generation %llu, pid %lld (probe answered in %lld us)\n",
              r["engine"].get<std::string>().c_str(), r["address"].get<std::string>().c_str(),
              static_cast<unsigned long long>(r["generation"].get<uint64_t>()),
              static_cast<long long>(r["pid"].get<int64_t>()),
              static_cast<long long>(r["probe_rtt_us"].get<int64_t>()));
  if (r.contains("registry_note")) {
    std::printf("  note: %s\n", r["registry_note"].get<std::string>().c_str());
  }
  const auto& l = r["link"];
  std::printf("link: %s, %s, heartbeat %d ms, last heard %lld ms ago\n",
              l["transport"].get<std::string>().c_str(),
              l["authenticated"].get<bool>() ? "authenticated" : "not authenticated",
              l["heartbeat_ms"].get<int>(),
              static_cast<long long>(l["last_heard_ms"].get<int64_t>()));
  const auto& g = r["regions"];
  std::printf("regions: %zu, %s", g["count"].get<size_t>(),
              Bytes(g["bytes"].get<uint64_t>()).c_str());
  if (!g.contains("list")) {
    std::printf(" (addresses are shown on an authenticated link only)\n");
  } else {
    std::printf("\n");
    for (const auto& x : g["list"]) {
      std::printf("  0x%llx  %s  %s\n", static_cast<unsigned long long>(x["addr"].get<uint64_t>()),
                  Bytes(x["len"].get<uint64_t>()).c_str(), x["perms"].get<std::string>().c_str());
    }
  }
  if (!r["info"].get<std::string>().empty()) {
    std::printf("info: %s\n", r["info"].get<std::string>().c_str());
  }
}

// ---- engines in etcd ------------------------------------------------------------

json EtcdReport(const Args& a) {
  hixl::Hixl e;
  if (hixl::Status s = e.Initialize(a.local_ip, ClientOptions(a)); !s.ok()) {
    Fail("cannot read the engines in " + a.etcd + ": " + s.ToString());
  }
  std::vector<hixl::EngineRecord> list;
  if (hixl::Status s = e.ListEngines(list); !s.ok()) Fail("ListEngines: " + s.ToString());
  e.Finalize();
  json out;
  out["etcd"] = a.etcd;
  out["prefix"] = a.prefix.empty() ? "hixl/" : a.prefix;
  out["engines"] = json::array();
  for (const auto& r : list) {
    using Kind = hixl::engine::ProbeResult::Kind;
    const auto p = hixl::engine::ProbeEngine(r.address, a.timeout_ms);
    std::string state;
    if (p.kind == Kind::kIdent) {
      state = p.ident.generation == r.generation ? "alive" : "stale (another engine answers)";
    } else if (p.kind == Kind::kRefused || p.kind == Kind::kNotHixl) {
      state = "gone";
    } else {
      state = "no answer";
    }
    out["engines"].push_back({{"name", r.name},
                              {"address", r.address},
                              {"generation", r.generation},
                              {"state", state},
                              {"detail", p.detail}});
  }
  return out;
}

void PrintEtcd(const json& r) {
  std::printf("%zu engines under %s in %s\n", r["engines"].size(),
              r["prefix"].get<std::string>().c_str(), r["etcd"].get<std::string>().c_str());
  if (r["engines"].empty()) return;
  std::printf("  %-24s %-22s %-20s %s\n", "NAME", "ADDRESS", "GENERATION", "STATE");
  for (const auto& x : r["engines"]) {
    std::printf("  %-24s %-22s %-20llu %s\n", x["name"].get<std::string>().c_str(),
                x["address"].get<std::string>().c_str(),
                static_cast<unsigned long long>(x["generation"].get<uint64_t>()),
                x["state"].get<std::string>().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The engines this tool starts stay quiet unless asked otherwise.
  setenv("HIXL_LOG_LEVEL", "ERROR", 0);
  const Args a = Parse(argc, argv);
  json report;
  if (!a.engine.empty()) {
    report = EngineReport(a);
    if (a.json) {
      std::printf("%s\n", report.dump(2).c_str());
    } else {
      PrintEngine(report);
    }
  } else if (!a.etcd.empty()) {
    report = EtcdReport(a);
    if (a.json) {
      std::printf("%s\n", report.dump(2).c_str());
    } else {
      PrintEtcd(report);
    }
  } else {
    report = HostReport(a);
    if (a.json) {
      std::printf("%s\n", report.dump(2).c_str());
    } else {
      PrintHost(report);
    }
  }
  return 0;
}
