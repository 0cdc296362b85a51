#include "transport/ucx/ucx_worker.h"

#include <poll.h>
#include <ucs/debug/log_def.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <chrono>
#include <cstdarg>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include "common/log.h"

namespace hixl::transport::ucx {

Status UcxStatus(const std::string& what, ucs_status_t s) {
  std::string msg = what + ": UCX " + ucs_status_string(s);
  if (s == UCS_ERR_UNREACHABLE) {
    msg += " (no UCX transport layer reaches the peer: check UCX_TLS / UCX_NET_DEVICES on both "
           "sides; under UcxErrorHandling=PEER, UCX 1.13 refuses shared memory)";
  }
  if (s == UCS_ERR_NO_DEVICE) {
    msg += " (UCX found no usable transport layer: check UCX_TLS / UCX_NET_DEVICES)";
  }
  if (s == UCS_ERR_TIMED_OUT) return Status::Timeout(msg);
  if (s == UCS_ERR_UNREACHABLE || s == UCS_ERR_CONNECTION_RESET ||
      s == UCS_ERR_ENDPOINT_TIMEOUT) {
    return Status::NotConnected(msg);
  }
  // UCX cancels what is in flight when an endpoint is closed under it: for
  // the transfer that is the link going away, not a cancellation it asked for.
  if (s == UCS_ERR_CANCELED) return Status::NotConnected(msg + " (the link was closed)");
  return Status::Failed(msg);
}

namespace {
// UCX logs to stdout by default, which would mix its warnings into an
// application's (or a test peer's) own output: its lines go through hixl's
// log (stderr, HIXL_LOG_LEVEL) instead.
ucs_log_func_rc_t ForwardUcxLog(const char* file, unsigned line, const char*,
                                ucs_log_level_t level, const ucs_log_component_config_t*,
                                const char* format, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof(msg), format, ap);
  const char* base = strrchr(file, '/');
  base = base == nullptr ? file : base + 1;
  if (level <= UCS_LOG_LEVEL_ERROR) {
    HIXL_LOG(ERROR) << "UCX " << base << ":" << line << ": " << msg;
  } else if (level == UCS_LOG_LEVEL_WARN) {
    HIXL_LOG(WARN) << "UCX " << base << ":" << line << ": " << msg;
  } else {
    HIXL_LOG(DEBUG) << "UCX " << base << ":" << line << ": " << msg;
  }
  return UCS_LOG_FUNC_RC_STOP;
}
}  // namespace

Status Worker::Create(std::shared_ptr<Worker>& out) {
  static std::once_flag log_once;
  std::call_once(log_once, [] { ucs_log_push_handler(&ForwardUcxLog); });
  // The last holder may let go on the progress thread itself (a transfer's
  // end there releases its link, whose channel holds the worker): that
  // thread cannot join itself, so the worker then goes on a thread of its own.
  std::shared_ptr<Worker> w(new Worker(), [](Worker* p) {
    if (p->thread_.get_id() == std::this_thread::get_id()) {
      std::thread([p] { delete p; }).detach();
    } else {
      delete p;
    }
  });
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxStatus("reading the UCX configuration", s);
  }
  w->has_shm_ = false;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucs_status_t s = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    w->context_ = nullptr;
    return UcxStatus("ucp_init", s);
  }
  {
    char* buf = nullptr;
    size_t len = 0;
    if (FILE* f = open_memstream(&buf, &len); f != nullptr) {
      ucp_context_print_info(w->context_, f);
      fclose(f);
      w->has_shm_ = IsSharedMemory(std::string(buf, len));
      free(buf);
    }
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  if (s = ucp_worker_create(w->context_, &wp, &w->worker_); s != UCS_OK) {
    w->worker_ = nullptr;
    return UcxStatus("ucp_worker_create", s);
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS;
  if (s = ucp_worker_query(w->worker_, &attr); s != UCS_OK) {
    return UcxStatus("ucp_worker_query", s);
  }
  const auto* a = reinterpret_cast<const uint8_t*>(attr.address);
  w->address_.assign(a, a + attr.address_length);
  ucp_worker_release_address(w->worker_, attr.address);
  if (attr.thread_mode != UCS_THREAD_MODE_MULTI) {
    return Status::Unsupported("this UCX library was built without multi-thread support");
  }
  if (s = ucp_worker_get_efd(w->worker_, &w->efd_); s != UCS_OK) {
    return UcxStatus("ucp_worker_get_efd", s);
  }
  w->thread_ = std::thread([raw = w.get()] { raw->Run(); });
  out = std::move(w);
  return Status::Ok();
}

Worker::~Worker() { Shutdown(); }

void Worker::Shutdown() {
  std::lock_guard<std::mutex> once(shutdown_mu_);
  if (down_.load(std::memory_order_acquire)) return;
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    ucp_worker_signal(worker_);
    thread_.join();
  }
  down_.store(true, std::memory_order_release);
  // worker_ and context_ keep their (dead) values: nothing uses them after down_.
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  // No UCX callback runs and no operation moves a byte from here on.
  SettleLingering(/*worker_gone=*/true);
  std::vector<std::function<void()>> at_destroy;
  {
    std::lock_guard<std::mutex> lock(at_destroy_mu_);
    at_destroy.swap(at_destroy_);
  }
  for (auto& f : at_destroy) f();
  if (context_ != nullptr) ucp_cleanup(context_);
}

void Worker::Wake() {
  if (!down_.load(std::memory_order_acquire)) ucp_worker_signal(worker_);
}

void Worker::AtDestroy(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(at_destroy_mu_);
  at_destroy_.push_back(std::move(f));
}

void Worker::Linger(std::function<bool(bool)> settle) {
  std::lock_guard<std::mutex> lock(linger_mu_);
  linger_.push_back(std::move(settle));
}

bool Worker::lingering() const {
  std::lock_guard<std::mutex> lock(linger_mu_);
  return !linger_.empty();
}

void Worker::SettleLingering(bool worker_gone) {
  std::vector<std::function<bool(bool)>> all;
  {
    std::lock_guard<std::mutex> lock(linger_mu_);
    all.swap(linger_);
  }
  if (all.empty()) return;
  std::vector<std::function<bool(bool)>> left;
  for (auto& f : all) {
    if (!f(worker_gone)) left.push_back(std::move(f));
  }
  std::lock_guard<std::mutex> lock(linger_mu_);
  for (auto& f : left) linger_.push_back(std::move(f));
}

void Worker::Run() {
  pthread_setname_np(pthread_self(), "hixl-ucx");
  using Clock = std::chrono::steady_clock;
  // Links given up with operations UCX still holds are looked at every
  // kLingerCheckMs, both at the top of each round and inside the spin: UCX
  // may stay busy without end with operations queued for a peer that does
  // not drain them (progress always reporting work, or arm answering BUSY).
  auto last_settle = Clock::now();
  auto settle_when_due = [&] {
    if (Clock::now() - last_settle < std::chrono::milliseconds(kLingerCheckMs)) return;
    last_settle = Clock::now();
    SettleLingering(/*worker_gone=*/false);
  };
  while (!stop_.load(std::memory_order_acquire)) {
    settle_when_due();
    // After activity, keep progressing for a short while before sleeping: a
    // burst (an emulated put's next piece, a flush answer) is served without
    // a wake-up. Bounded, so an idle worker sleeps.
    auto idle_since = Clock::now();
    for (unsigned i = 1; Clock::now() - idle_since < std::chrono::microseconds(kSpinUs); ++i) {
      if (ucp_worker_progress(worker_) != 0) idle_since = Clock::now();
      if (stop_.load(std::memory_order_relaxed)) break;
      if (i % 1024 == 0) settle_when_due();
    }
    ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    if (s != UCS_OK) {
      HIXL_LOG(ERROR) << "ucx: ucp_worker_arm: " << ucs_status_string(s);
    }
    // The timeout only bounds how long a missed wake-up could delay work.
    pollfd p{efd_, POLLIN, 0};
    ::poll(&p, 1, lingering() ? kLingerCheckMs : 100);
  }
}

ucp_ep_h EndpointCache::Take(const std::vector<uint8_t>& address) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if (it->first == address) {
      ucp_ep_h ep = it->second;
      idle_.erase(it);
      return ep;
    }
  }
  return nullptr;
}

void EndpointCache::Put(const std::vector<uint8_t>& address, ucp_ep_h ep) {
  ucp_ep_h evict = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.emplace_back(address, ep);
    if (idle_.size() > kMax) {
      evict = idle_.front().second;
      idle_.erase(idle_.begin());
    }
  }
  if (evict != nullptr) {
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_ep_close_nbx(evict, &p);  // not awaited: released when done
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
    worker_->Wake();
  }
}

std::string EndpointLayers(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return "?";
  ucp_ep_print_info(ep, f);
  fclose(f);
  std::istringstream in(std::string(buf, len));
  free(buf);
  // Lines like "#  lane[1]:  4:posix/memory.0 md[3] -> md[3]/posix/sysdev[255] ..."
  std::set<std::string> seen;
  std::string out, line;
  while (std::getline(in, line)) {
    auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    auto colon = line.find(':', line.find("]:", lane) + 2);
    if (colon == std::string::npos) continue;
    auto end = line.find_first_of(" .", colon + 1);
    std::string layer = line.substr(colon + 1, end == std::string::npos ? end : end - colon - 1);
    if (layer.empty() || layer.rfind("self/", 0) == 0 || !seen.insert(layer).second) continue;
    out += (out.empty() ? "" : ", ") + layer;
  }
  return out.empty() ? "self" : out;
}

bool IsSharedMemory(const std::string& layers) {
  for (const char* tl : {"posix/", "sysv/", "cma/", "knem/", "xpmem/"}) {
    if (layers.find(tl) != std::string::npos) return true;
  }
  return false;
}

bool HaveRdmaDevice() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

}  // namespace hixl::transport::ucx
