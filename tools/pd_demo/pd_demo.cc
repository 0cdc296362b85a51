// hixl-pd-demo: prefill/decode disaggregation of a small deterministic
// transformer, three ways in one invocation:
//   reference      prefill and decode in this process;
//   disaggregated  a prefill process and a decode process; the KV cache moves
//                  through LLM-DataDist — by default pushed layer by layer
//                  while the next layer computes (--mode pull: decode pulls);
//   before         the KV staged into a host buffer, serialized, sent over a
//                  socket, deserialized and copied into the block table.
// The disaggregated and before runs must generate exactly the reference's
// tokens from exactly the reference's KV (hashes compared); any difference
// is reported and the exit status is 1.
//
// This file: options, the reference run, the scheduler that drives the two
// workers (common.h, worker_*.cc), and the report.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "common.h"

namespace pd {
namespace {

struct LayerSpan {
  int64_t cstart = 0, cend = 0, tpost = 0, tdone = 0;
};

// What one request did in one run.
struct Result {
  int r = 0;
  int p = 0;
  uint64_t kv_bytes = 0;
  int64_t compute_start = 0, compute_end = 0;
  int64_t transfer_start = 0, transfer_end = 0;
  int64_t kv_ready = 0;  // decode holds the whole KV
  int64_t end = 0;       // last token generated
  uint64_t prefill_hash = 0, decode_hash = 0;
  std::vector<int32_t> tokens;
  std::vector<LayerSpan> layers;
  bool done = false;  // decode finished
  bool sent = false;  // before path: prefill's report arrived (it may come after decode's)

  double ComputeMs() const { return NsToMs(compute_end - compute_start); }
  // Time the KV was on its way: per layer from post to landing when pushed
  // layer by layer (layers overlap the compute of later ones), else the
  // whole transfer.
  double TransferMs() const {
    if (layers.empty()) return NsToMs(transfer_end - transfer_start);
    double t = 0;
    for (const auto& l : layers) t += NsToMs(l.tdone - l.tpost);
    return t;
  }
  // KV time on the critical path: from the end of prefill compute until
  // decode holds the whole KV (0 when it all landed during compute).
  double ExposedMs() const {
    return std::max(0.0, NsToMs(std::max(kv_ready, transfer_end) - compute_end));
  }
  // Share of the KV transfer that overlapped prefill compute.
  double HiddenShare() const {
    double t = TransferMs();
    return t <= 0 ? 0.0 : std::clamp(1.0 - ExposedMs() / t, 0.0, 1.0);
  }
  double TtftMs() const { return NsToMs(std::max(kv_ready, compute_end) - compute_start); }
};

struct Run {
  std::string name;
  std::vector<Result> results;
  int64_t start = 0, end = 0;
  double WallS() const { return NsToMs(end - start) / 1e3; }
};

// "  reference: 3/8 requests" on stderr, redrawn in place on a terminal.
void Progress(const DemoOptions& o, const std::string& name, int done) {
  if (o.quiet) return;
  const bool tty = isatty(2);
  if (!tty && done != o.requests) return;
  std::fprintf(stderr, "%s  %-28s %d/%d requests%s", tty ? "\r" : "", name.c_str(), done,
               o.requests, done == o.requests ? "\n" : "");
}

int PromptLen(const DemoOptions& o, int r) { return o.prompt_lens[r % o.prompt_lens.size()]; }

uint64_t KvBytes(const DemoOptions& o, int p) {
  return static_cast<uint64_t>(p) * o.model.layers * 2 * o.model.kv_heads * o.model.head_dim *
         sizeof(float);
}

// ---------------------------------------------------------------------------
// Reference: everything in this process.

Run Reference(const DemoOptions& o, const Model& model) {
  Run run;
  run.name = "reference";
  run.start = NowNs();
  const ModelConfig& m = o.model;
  for (int r = 0; r < o.requests; ++r) {
    const int p = PromptLen(o, r);
    const int nblocks = o.BlocksFor(p + o.gen_tokens);
    std::vector<std::vector<float>> mem(2 * m.layers,
                                        std::vector<float>(m.block_bytes() / 4 * nblocks));
    KvView kv;
    for (int l = 0; l < m.layers; ++l) {
      kv.k.push_back(mem[2 * l].data());
      kv.v.push_back(mem[2 * l + 1].data());
    }
    kv.num_blocks = nblocks;
    std::vector<int32_t> table(nblocks);
    for (int b = 0; b < nblocks; ++b) table[b] = b;
    Result res;
    res.r = r;
    res.p = p;
    res.kv_bytes = KvBytes(o, p);
    const auto prompt = MakePrompt(m.seed, r, p, m.vocab);
    std::vector<float> hidden(static_cast<size_t>(p) * m.hidden());
    res.compute_start = NowNs();
    model.Embed(prompt.data(), p, hidden.data());
    for (int l = 0; l < m.layers; ++l) model.PrefillLayer(l, hidden.data(), p, kv, table);
    int32_t tok = model.Sample(hidden.data() + static_cast<size_t>(p - 1) * m.hidden());
    res.compute_end = res.kv_ready = NowNs();
    res.prefill_hash = res.decode_hash = HashKv(kv, m, table, p);
    res.tokens.push_back(tok);
    for (int pos = p; static_cast<int>(res.tokens.size()) < o.gen_tokens; ++pos) {
      tok = model.DecodeStep(tok, pos, kv, table);
      res.tokens.push_back(tok);
    }
    res.end = NowNs();
    res.done = true;
    run.results.push_back(std::move(res));
    Progress(o, run.name, r + 1);
  }
  run.end = NowNs();
  return run;
}

// ---------------------------------------------------------------------------
// The two worker processes.

struct Worker {
  pid_t pid = -1;
  int in = -1;   // its stdin
  int out = -1;  // its stdout
  std::string name;
};

Worker Spawn(const DemoOptions& o, const std::string& role, const std::string& netns) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) {
    std::perror("pipe");
    std::exit(2);
  }
  std::vector<std::string> args;
  if (!netns.empty()) args = {"ip", "netns", "exec", netns};
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) std::exit(2);
  self[n] = '\0';
  args.push_back(self);
  args.push_back("--worker");
  args.push_back(role);
  for (auto& a : o.WorkerArgs()) args.push_back(a);
  if (o.corrupt) args.push_back("--corrupt");
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::perror("exec");
    std::_Exit(127);
  }
  close(to[0]);
  close(from[1]);
  Worker w;
  w.pid = pid;
  w.in = to[1];
  w.out = from[0];
  w.name = role;
  return w;
}

// Lines from both workers, in arrival order.
class Inbox {
 public:
  void Start(Worker& w) {
    threads_.emplace_back([this, &w] {
      std::string buf, line;
      while (ReadLine(w.out, buf, line)) Put(w.name, line);
      Put(w.name, "eof");
    });
  }
  void Put(const std::string& from, const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.emplace_back(from, line);
    }
    cv_.notify_all();
  }
  // False after timeout_ms without a line.
  bool Get(std::pair<std::string, std::string>& out, int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); })) {
      return false;
    }
    out = std::move(q_.front());
    q_.pop_front();
    return true;
  }
  void Join() {
    for (auto& t : threads_) t.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> q_;
  std::vector<std::thread> threads_;
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "\nhixl-pd-demo: %s\n", why.c_str());
  std::exit(1);
}

// Waits for the next line from `who` that starts with `prefix`.
std::vector<std::string> Expect(Inbox& inbox, const std::string& who, const std::string& prefix) {
  std::pair<std::string, std::string> m;
  while (inbox.Get(m, 30000)) {
    auto f = Split(m.second);
    if (f.empty()) continue;
    if (f[0] == "error" || f[0] == "eof") Die(m.first + ": " + m.second);
    if (m.first == who && f[0] == prefix) return f;
  }
  Die("no answer from the " + who + " worker");
}

class Disaggregated {
 public:
  Disaggregated(const DemoOptions& o) : o_(o) {}

  void Start() {
    prefill_ = Spawn(o_, "prefill", o_.prefill_netns);
    decode_ = Spawn(o_, "decode", o_.decode_netns);
    inbox_.Start(prefill_);
    inbox_.Start(decode_);
    std::vector<std::string> pf, df;
    for (int i = 0; i < 2; ++i) {  // in either order
      std::pair<std::string, std::string> m;
      if (!inbox_.Get(m, 30000)) Die("the workers did not start");
      auto f = Split(m.second);
      if (f.empty() || f[0] != "READY") Die(m.first + ": " + m.second);
      (m.first == "prefill" ? pf : df) = f;
    }
    if (pf.size() < 2 || df.size() < 4) Die("the workers did not start");
    prefill_addr_ = pf[1];
    decode_addr_ = df[1];
    before_port_ = df[2];
    decode_cache_ = df[3];
    auto split = [](const std::string& a) {
      auto c = a.rfind(':');
      return std::make_pair(a.substr(0, c), a.substr(c + 1));
    };
    if (o_.mode == "push") {
      auto [ip, port] = split(decode_addr_);
      WriteLine(prefill_.in, "link " + ip + " " + port + " " + decode_cache_);
      Expect(inbox_, "prefill", "linked");
    } else {
      auto [ip, port] = split(prefill_addr_);
      WriteLine(decode_.in, "link " + ip + " " + port);
      Expect(inbox_, "decode", "linked");
    }
  }

  Run RunLlmDataDist() {
    Run run;
    run.name = "disaggregated (" + o_.mode + ", " + o_.link +
               (o_.device == "cuda" ? ", cuda" : "") + ")";
    results_.assign(o_.requests, {});
    run.start = NowNs();
    Drive(o_.mode == "push" ? Path::kPush : Path::kPull, run.name);
    run.end = NowNs();
    run.results = results_;
    return run;
  }

  Run RunBefore() {
    auto [ip, port] = std::make_pair(decode_addr_.substr(0, decode_addr_.rfind(':')), before_port_);
    WriteLine(prefill_.in, "before " + ip + " " + port);
    Expect(inbox_, "prefill", "beforelinked");
    Run run;
    run.name = "before (staged + socket)";
    results_.assign(o_.requests, {});
    run.start = NowNs();
    Drive(Path::kBefore, run.name);
    run.end = NowNs();
    run.results = results_;
    return run;
  }

  void Stop() {
    close(prefill_.in);
    close(decode_.in);
    for (pid_t pid : {prefill_.pid, decode_.pid}) {
      int st = 0;
      for (int i = 0; i < 100; ++i) {
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        if (i == 99) {
          kill(pid, SIGKILL);
          waitpid(pid, &st, 0);
        }
        usleep(50000);
      }
    }
    inbox_.Join();
  }

 private:
  enum class Path { kPush, kPull, kBefore };

  void Submit(Path path, int r) {
    const int p = PromptLen(o_, r);
    Result& res = results_[r];
    res.r = r;
    res.p = p;
    res.kv_bytes = KvBytes(o_, p);
    if (path == Path::kPush) {
      WriteLine(decode_.in, "alloc " + std::to_string(r) + " " + std::to_string(o_.BlocksFor(p)));
    } else if (path == Path::kPull) {
      WriteLine(prefill_.in, "prefill " + std::to_string(r) + " " + std::to_string(p));
    } else {
      WriteLine(prefill_.in, "stage " + std::to_string(r) + " " + std::to_string(p));
    }
  }

  void Finished(int& inflight, int& done, const std::string& name) {
    --inflight;
    ++done;
    Progress(o_, name, done);
  }

  void Drive(Path path, const std::string& name) {
    int next = 0, inflight = 0, done = 0;
    std::deque<int> retry;  // push: waiting for free decode blocks
    auto fill = [&] {
      while (!retry.empty() && inflight < o_.inflight) {
        int r = retry.front();
        retry.pop_front();
        ++inflight;
        Submit(path, r);
      }
      while (next < o_.requests && inflight < o_.inflight) {
        ++inflight;
        Submit(path, next++);
      }
    };
    fill();
    const int64_t deadline = NowNs() + int64_t{600} * 1000000000;
    while (done < o_.requests) {
      if (NowNs() > deadline) Die(name + ": did not finish in 600 s");
      std::pair<std::string, std::string> m;
      if (!inbox_.Get(m, 30000)) Die(name + ": no progress for 30 s");
      auto f = Split(m.second);
      if (f.empty()) continue;
      const std::string& what = f[0];
      if (what == "error" || what == "eof") Die(m.first + ": " + m.second);
      const int r = f.size() > 1 ? std::stoi(f[1]) : -1;
      if (r < 0 || r >= o_.requests) Die("unexpected line from " + m.first + ": " + m.second);
      Result& res = results_[r];
      if (what == "full") {  // decode has no room yet: retry when a request ends
        --inflight;
        retry.push_back(r);
        if (inflight == 0) Die("the decode pool cannot hold one request; raise --pool-blocks");
      } else if (what == "blocks") {
        std::vector<int32_t> b = ParseInts(f, 2, f.size() - 2);
        WriteLine(prefill_.in, "push " + std::to_string(r) + " " + std::to_string(res.p) + " " +
                                   JoinInts(b));
      } else if (what == "pushed") {
        const int32_t first = std::stoi(f[2]);
        res.compute_start = std::stoll(f[3]);
        res.compute_end = std::stoll(f[4]);
        res.prefill_hash = std::stoull(f[5]);
        for (int l = 0; l < o_.model.layers; ++l) {
          LayerSpan s{std::stoll(f[6 + 4 * l]), std::stoll(f[7 + 4 * l]), std::stoll(f[8 + 4 * l]),
                      std::stoll(f[9 + 4 * l])};
          res.layers.push_back(s);
        }
        res.transfer_start = res.layers.front().tpost;
        res.transfer_end = res.layers.back().tdone;
        WriteLine(decode_.in, "decode " + std::to_string(r) + " " + std::to_string(res.p) + " " +
                                  std::to_string(first));
      } else if (what == "ready") {  // pull: prefill computed; decode pulls
        res.compute_start = std::stoll(f[3]);
        res.compute_end = std::stoll(f[4]);
        res.prefill_hash = std::stoull(f[5]);
        std::vector<std::string> rest(f.begin() + 6, f.end());
        std::string blocks;
        for (auto& x : rest) blocks += " " + x;
        WriteLine(decode_.in, "pull " + std::to_string(r) + " " + std::to_string(res.p) + " " +
                                  f[2] + blocks);
      } else if (what == "sent") {  // before: prefill computed and sent
        res.compute_start = std::stoll(f[3]);
        res.compute_end = std::stoll(f[4]);
        res.prefill_hash = std::stoull(f[5]);
        res.transfer_start = std::stoll(f[6]);
        res.sent = true;
        if (res.done) Finished(inflight, done, name);
      } else if (what == "done") {
        res.decode_hash = std::stoull(f[2]);
        res.kv_ready = std::stoll(f[3]);
        const int64_t pull_start = std::stoll(f[4]);
        res.end = std::stoll(f[5]);
        res.tokens = ParseInts(f, 6, f.size() - 6);
        if (path == Path::kPull) {
          res.transfer_start = pull_start;
          res.transfer_end = res.kv_ready;
        } else if (path == Path::kBefore) {
          res.transfer_end = res.kv_ready;
        }
        res.done = true;
        if (path != Path::kBefore || res.sent) Finished(inflight, done, name);
      } else {
        Die("unexpected line from " + m.first + ": " + m.second);
      }
      fill();
    }
  }

  const DemoOptions& o_;
  Worker prefill_, decode_;
  Inbox inbox_;
  std::string prefill_addr_, decode_addr_, before_port_, decode_cache_;
  std::vector<Result> results_;
};

// ---------------------------------------------------------------------------
// Report

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// Compares a run with the reference; prints every difference.
int CountMismatches(const Run& ref, const Run& run) {
  int bad = 0;
  for (size_t i = 0; i < run.results.size(); ++i) {
    const Result& a = ref.results[i];
    const Result& b = run.results[i];
    if (b.prefill_hash != a.prefill_hash || b.decode_hash != a.decode_hash) {
      std::printf("MISMATCH %s request %d: KV differs from the reference (hash %016llx, %s side)\n",
                  run.name.c_str(), b.r, static_cast<unsigned long long>(b.decode_hash),
                  b.prefill_hash != a.prefill_hash ? "prefill" : "decode");
      ++bad;
    }
    if (b.tokens != a.tokens) {
      std::printf("MISMATCH %s request %d: tokens [%s] vs reference [%s]\n", run.name.c_str(),
                  b.r, JoinInts(b.tokens).c_str(), JoinInts(a.tokens).c_str());
      ++bad;
    }
  }
  return bad;
}

void PrintRequests(const Run& run) {
  std::printf("\n%s\n", run.name.c_str());
  std::printf("  %4s %6s %9s %10s %11s %8s %9s %8s\n", "req", "prompt", "KV KiB", "prefill ms",
              "transfer ms", "hidden", "TTFT ms", "e2e ms");
  for (const Result& r : run.results) {
    std::printf("  %4d %6d %9.1f %10.2f %11.3f %7.1f%% %9.2f %8.2f\n", r.r, r.p,
                r.kv_bytes / 1024.0, r.ComputeMs(), r.TransferMs(), 100.0 * r.HiddenShare(),
                r.TtftMs(),
                NsToMs(r.end - r.compute_start));
  }
}

struct Summary {
  double wall_s, ttft_ms, transfer_ms, exposed_ms, hidden;
};
Summary Summarize(const Run& run) {
  std::vector<double> ttft, transfer, exposed;
  double tsum = 0, hsum = 0;
  for (const Result& r : run.results) {
    ttft.push_back(r.TtftMs());
    transfer.push_back(r.TransferMs());
    exposed.push_back(r.ExposedMs());
    tsum += r.TransferMs();
    hsum += std::max(0.0, r.TransferMs() - r.ExposedMs());
  }
  return {run.WallS(), Mean(ttft), Mean(transfer), Mean(exposed), tsum > 0 ? hsum / tsum : 0};
}

void WriteJson(const std::string& path, const std::vector<const Run*>& runs) {
  std::ofstream f(path);
  for (const Run* run : runs) {
    for (const Result& r : run->results) {
      f << "{\"run\":\"" << run->name << "\",\"request\":" << r.r << ",\"prompt\":" << r.p
        << ",\"kv_bytes\":" << r.kv_bytes << ",\"prefill_ms\":" << r.ComputeMs()
        << ",\"transfer_ms\":" << r.TransferMs() << ",\"exposed_ms\":" << r.ExposedMs()
        << ",\"ttft_ms\":" << r.TtftMs() << ",\"e2e_ms\":" << NsToMs(r.end - r.compute_start)
        << ",\"tokens\":[" << JoinInts(r.tokens) << "]}\n";
    }
  }
}

// Per request and layer: compute (prefill process) and transfer (posted to
// complete) on one time axis, in ms from the first compute.
void WriteTimeline(const std::string& path, const Run& run, const DemoOptions& o) {
  int64_t t0 = INT64_MAX;
  for (const Result& r : run.results) t0 = std::min(t0, r.compute_start);
  std::ofstream f(path);
  f << "{\"run\":\"" << run.name << "\",\"layers\":" << o.model.layers << ",\"requests\":[";
  for (size_t i = 0; i < run.results.size(); ++i) {
    const Result& r = run.results[i];
    f << (i ? "," : "") << "{\"request\":" << r.r << ",\"prompt\":" << r.p
      << ",\"kv_ready\":" << NsToMs(r.kv_ready - t0) << ",\"end\":" << NsToMs(r.end - t0)
      << ",\"layers\":[";
    for (size_t l = 0; l < r.layers.size(); ++l) {
      const LayerSpan& s = r.layers[l];
      f << (l ? "," : "") << "{\"compute\":[" << NsToMs(s.cstart - t0) << "," << NsToMs(s.cend - t0)
        << "],\"transfer\":[" << NsToMs(s.tpost - t0) << "," << NsToMs(s.tdone - t0) << "]}";
    }
    f << "]}";
  }
  f << "]}\n";
}

}  // namespace
}  // namespace pd

int main(int argc, char** argv) {
  using namespace pd;
  signal(SIGPIPE, SIG_IGN);
  DemoOptions o;
  const bool worker = argc >= 3 && std::string(argv[1]) == "--worker";
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("%s", Usage().c_str());
    return 0;
  }
  if (std::string err = ParseOptions(argc, argv, worker ? 3 : 1, o); !err.empty()) {
    std::fprintf(stderr, "hixl-pd-demo: %s\n%s", err.c_str(), Usage().c_str());
    return 2;
  }
  if (worker) {
    std::string role = argv[2];
    if (role == "prefill") return RunPrefillWorker(o);
    if (role == "decode") return RunDecodeWorker(o);
    std::fprintf(stderr, "hixl-pd-demo: unknown worker %s\n", role.c_str());
    return 2;
  }
  const ModelConfig& m = o.model;
  Model model(m);
  std::printf("hixl-pd-demo: %d layers, %d heads (%d KV heads) x %d dims, MLP %d, vocab %d; "
              "KV blocks of %d tokens (%.1f KiB per layer per K/V block)\n",
              m.layers, m.heads, m.kv_heads, m.head_dim, m.mlp_dim, m.vocab, m.block_size,
              m.block_bytes() / 1024.0);
  std::printf("%d requests, prompts of %d..%d tokens, %d tokens generated each; link %s, mode %s, "
              "KV caches in %s memory\n",
              o.requests, *std::min_element(o.prompt_lens.begin(), o.prompt_lens.end()),
              o.MaxPromptLen(), o.gen_tokens, o.link.c_str(), o.mode.c_str(),
              o.device == "cuda" ? "CUDA device" : "host");
  std::fflush(stdout);

  Run ref = Reference(o, model);
  Disaggregated d(o);
  d.Start();
  Run dis = d.RunLlmDataDist();
  std::optional<Run> before;
  if (o.run_before) before = d.RunBefore();
  d.Stop();

  const bool overlap = o.mode == "push";
  PrintRequests(dis);
  if (before) PrintRequests(*before);
  int bad = CountMismatches(ref, dis);
  if (before) bad += CountMismatches(ref, *before);

  Summary sr = Summarize(ref), sd = Summarize(dis);
  std::printf("\nsummary (%d requests; per-request means)\n", o.requests);
  std::printf("  %-32s %7s %9s %12s %11s %7s\n", "run", "wall s", "TTFT ms", "KV moving ms",
              "exposed ms", "hidden");
  auto row = [](const std::string& name, const Summary& x, bool moved) {
    if (!moved) {
      std::printf("  %-32s %7.2f %9.2f %12s %11s %7s\n", name.c_str(), x.wall_s, x.ttft_ms, "-",
                  "-", "-");
      return;
    }
    std::printf("  %-32s %7.2f %9.2f %12.3f %11.3f %6.1f%%\n", name.c_str(), x.wall_s, x.ttft_ms,
                x.transfer_ms, x.exposed_ms, 100 * x.hidden);
  };
  row(ref.name, sr, false);
  row(dis.name, sd, true);
  if (before) {
    Summary sb = Summarize(*before);
    row(before->name, sb, true);
    std::printf("  KV time on the critical path (after prefill, before decode can start): "
                "%.3f ms with LLM-DataDist vs %.3f ms before (%.1fx less)\n",
                sd.exposed_ms, sb.exposed_ms, sb.exposed_ms / std::max(sd.exposed_ms, 1e-3));
  }
  if (!o.json.empty()) {
    std::vector<const Run*> runs{&ref, &dis};
    if (before) runs.push_back(&*before);
    WriteJson(o.json, runs);
  }
  if (!o.timeline.empty() && overlap) WriteTimeline(o.timeline, dis, o);
  if (bad > 0) {
    std::printf("\nFAILED: %d mismatch(es) against the reference\n", bad);
    return 1;
  }
  std::printf("\ntokens match the reference for every request (%s%s)\n", dis.name.c_str(),
              before ? " and before" : "");
  return 0;
}
