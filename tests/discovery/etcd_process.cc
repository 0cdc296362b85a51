#include "etcd_process.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

extern char** environ;

namespace hixl::testing {

namespace {

// Whether a TCP listener could bind 127.0.0.1:port now (0: any; *got the port).
bool Bindable(int port, int* got) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (ok && got) *got = ntohs(a.sin_port);
  close(fd);
  return ok;
}

// The first port the kernel hands out to connections and port-0 binds.
int EphemeralLow() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (f >> lo >> hi && lo > 1024) return lo;
  return 32768;
}

}  // namespace

// A free port below the ephemeral range: etcd is restarted on the same
// ports, and while it is down a port the kernel hands out (to any of the
// tests running beside this one) could be taken by another connection.
int PickFreePort() {
  const int hi = EphemeralLow();
  const int lo = hi > 12000 ? 10000 : 1025;
  std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> pick(lo, hi - 1);
  int port = 0;
  for (int i = 0; i < 200; ++i) {
    if (Bindable(pick(rng), &port)) return port;
  }
  return Bindable(0, &port) ? port : 0;
}

namespace {

size_t Collect(char* p, size_t s, size_t n, void* ud) {
  auto* out = static_cast<std::string*>(ud);
  if (out->size() < 4096) out->append(p, s * n);
  return s * n;
}

bool Healthy(int port) {
  CURL* h = curl_easy_init();
  if (h == nullptr) return false;
  std::string body;
  std::string url = "http://127.0.0.1:" + std::to_string(port) + "/health";
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  CURLcode rc = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(h);
  return rc == CURLE_OK && code == 200 && body.find("\"health\":\"true\"") != std::string::npos;
}

}  // namespace

EtcdProcess::~EtcdProcess() {
  EndProcess(/*gentle=*/false);
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string EtcdProcess::endpoints() const {
  return "etcd://127.0.0.1:" + std::to_string(client_port_);
}

std::string EtcdProcess::LogTail() const {
  std::ifstream f(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  return s.size() > 3000 ? s.substr(s.size() - 3000) : s;
}

bool EtcdProcess::Start(std::string& why, int timeout_ms) {
  if (dir_.empty()) {
    char tmpl[] = "/tmp/hixl-etcd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      why = "mkdtemp failed";
      return false;
    }
    dir_ = tmpl;
  }
  client_port_ = PickFreePort();
  peer_port_ = PickFreePort();
  while (peer_port_ == client_port_) peer_port_ = PickFreePort();
  if (client_port_ == 0 || peer_port_ == 0) {
    why = "no free port";
    return false;
  }
  return Spawn(why, timeout_ms);
}

bool EtcdProcess::Restart(std::string& why, int timeout_ms) {
  EndProcess(/*gentle=*/true);
  return Spawn(why, timeout_ms);
}

bool EtcdProcess::Spawn(std::string& why, int timeout_ms) {
  const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {
      HIXL_ETCD_BIN, "--name=t", "--data-dir=" + dir_ + "/data",
      "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=t=" + peer, "--initial-cluster-state=new", "--unsafe-no-fsync",
      "--heartbeat-interval=10", "--election-timeout=50", "--log-level=warn",
      "--enable-v2=false"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    why = std::string("posix_spawn etcd: ") + strerror(rc);
    return false;
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      why = "etcd exited at start; log:\n" + LogTail();
      return false;
    }
    if (Healthy(client_port_)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  why = "etcd not healthy within " + std::to_string(timeout_ms) + " ms; log:\n" + LogTail();
  EndProcess(false);
  return false;
}

void EtcdProcess::EndProcess(bool gentle) {
  if (pid_ <= 0) return;
  kill(pid_, gentle ? SIGTERM : SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
}

void EtcdProcess::Stop() { EndProcess(/*gentle=*/true); }
void EtcdProcess::Kill() { EndProcess(/*gentle=*/false); }

}  // namespace hixl::testing
