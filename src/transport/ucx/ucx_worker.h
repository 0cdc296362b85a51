// One engine's UCP context and worker, and the progress thread that drives
// it: the thread progresses the worker until it has nothing left, arms it and
// sleeps on its event fd; Wake() (ucp_worker_signal) rouses it after another
// thread posted work. The worker is created with UCS_THREAD_MODE_MULTI, so any
// thread may post operations on its endpoints; completion callbacks run on the
// progress thread.
// Ownership: shared (shared_ptr) by the transport, its channels and every
// unpacked remote key, so the worker outlives all of them; the destructor
// stops the thread and destroys the worker and context.
// Thread safety: all methods are thread-safe.
#ifndef HIXL_TRANSPORT_UCX_UCX_WORKER_H_
#define HIXL_TRANSPORT_UCX_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hixl/status.h"

namespace hixl::transport::ucx {

// A UCX status as a hixl Status naming what was being done.
Status UcxStatus(const std::string& what, ucs_status_t s);

class Worker {
 public:
  // How long the progress thread keeps polling after the last activity
  // before it arms the worker and sleeps.
  static constexpr int kSpinUs = 20;
  static Status Create(std::shared_ptr<Worker>& out);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::vector<uint8_t>& address() const { return address_; }
  // The context has a shared-memory transport layer (UCX_TLS allows one).
  bool has_shared_memory() const { return has_shm_; }
  // Rouses the progress thread (after posting work from another thread).
  void Wake();
  // Runs f once the UCP worker is destroyed (no UCX callback can run then):
  // frees what only an operation UCX never completed still refers to.
  void AtDestroy(std::function<void()> f);
  // Work UCX still holds after its link was given up (error handling NONE,
  // where UCX cannot cancel): the progress thread calls settle(false) about
  // every kLingerCheckMs until it returns true (nothing is left, or what is
  // left can no longer be touched by UCX and was ended). Shutdown calls
  // settle(true) after the UCP worker is destroyed: then it must end the rest.
  void Linger(std::function<bool(bool worker_gone)> settle);
  static constexpr int kLingerCheckMs = 50;
  // Links given up with work that UCX still holds (see Linger).
  bool lingering() const;
  // Stops the progress thread and destroys the worker and context now, even
  // while channels or keys still hold this object (they must make no UCX
  // call afterwards: a closed channel makes none), then runs the settles and
  // AtDestroy callbacks. Idempotent; the destructor calls it.
  void Shutdown();
  bool shut_down() const { return down_.load(std::memory_order_acquire); }

 private:
  Worker() = default;
  void Run();
  void SettleLingering(bool worker_gone);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  bool has_shm_ = false;
  std::vector<uint8_t> address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex at_destroy_mu_;
  std::vector<std::function<void()>> at_destroy_;
  mutable std::mutex linger_mu_;
  std::vector<std::function<bool(bool)>> linger_;
  std::mutex shutdown_mu_;
  std::atomic<bool> down_{false};
};

// Idle endpoints under error handling NONE, kept for the next link to the
// same worker: UCX 1.13 has no disconnect under NONE, so both sides of a
// closed shared-memory endpoint keep its mappings (three per link, measured);
// a link made again to the same peer reuses the endpoint instead. At most
// kMax endpoints are kept (the oldest is closed beyond).
// Thread safety: thread-safe. Ownership: holds the worker; the endpoints go
// with the worker.
class EndpointCache {
 public:
  static constexpr size_t kMax = 256;
  explicit EndpointCache(std::shared_ptr<Worker> worker) : worker_(std::move(worker)) {}
  // An idle endpoint to the worker at address, or null.
  ucp_ep_h Take(const std::vector<uint8_t>& address);
  // Gives back an endpoint that has nothing in flight and no remote keys.
  void Put(const std::vector<uint8_t>& address, ucp_ep_h ep);

 private:
  std::shared_ptr<Worker> worker_;
  std::mutex mu_;
  std::vector<std::pair<std::vector<uint8_t>, ucp_ep_h>> idle_;  // oldest first
};

// The UCX transport layers an endpoint uses (e.g. "posix/memory, cma/memory"),
// from ucp_ep_print_info: what HIXL_LOG_LEVEL=INFO shows for a link.
std::string EndpointLayers(ucp_ep_h ep);

// True when a list of layers ("posix/memory, tcp/lo") names a shared-memory one.
bool IsSharedMemory(const std::string& layers);

// True when this host has an RDMA device (/sys/class/infiniband).
bool HaveRdmaDevice();

}  // namespace hixl::transport::ucx

#endif  // HIXL_TRANSPORT_UCX_UCX_WORKER_H_
