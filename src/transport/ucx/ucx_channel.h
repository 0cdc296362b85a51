// The initiator's side of a UCX link: one endpoint to the peer's worker,
// the peer's regions' unpacked remote keys, and the transfers in flight.
//
// A transfer posts one ucp_put_nbx/ucp_get_nbx per slice, then one
// ucp_ep_flush_nbx; it ends from the flush's completion (on the worker's
// progress thread), so it never reports COMPLETED before its bytes arrived.
// A stopped transfer stops posting and still waits for its flush: bytes
// already posted land before it ends. A flush the peer leaves unanswered
// for longer than the heartbeat bound after its transfer was stopped makes
// the channel unhealthy (the engine drops the link); Close then force-closes
// the endpoint (error mode PEER), which completes every operation with an
// error. Under error mode NONE UCX can neither cancel an operation nor stop
// copying its bytes (a put queued for room in the peer's shared memory, a
// get's late answer): what is left ends when UCX completes it, when the peer
// process has exited, or when the worker is shut down (Worker::Linger), and
// the endpoint stays until the worker goes.
// Thread safety: all methods are thread-safe.
#ifndef HIXL_TRANSPORT_UCX_UCX_CHANNEL_H_
#define HIXL_TRANSPORT_UCX_UCX_CHANNEL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/ucx/ucx_worker.h"

namespace hixl::transport::ucx {

class UcxChannel : public Channel {
 public:
  // cache: where an idle endpoint goes when the channel closes under error
  // handling NONE (and where Open looks for one first). peer_pid: the peer's
  // process when it runs on this host (same pid namespace), else 0.
  UcxChannel(std::shared_ptr<Worker> worker, std::shared_ptr<EndpointCache> cache,
             std::string engine, bool err_peer, int hb_bound_ms, int64_t peer_pid);
  ~UcxChannel() override;

  // Creates the endpoint to the peer's worker and waits (until deadline)
  // for UCX to confirm it can reach it.
  Status Open(const std::vector<uint8_t>& peer_address, net::Deadline deadline);
  std::string layers() const { return layers_; }
  // The endpoint uses a shared-memory layer (posix, sysv, cma, knem, xpmem).
  bool on_shared_memory() const { return IsSharedMemory(layers_); }

  LinkType link_type() const override { return LinkType::UCX; }
  Status PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) override;
  void Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) override;
  // Over shared memory (posix, cma) puts and gets are copies the calling
  // thread makes: small transfers run inline, without a Transfer object.
  size_t InlineLimit() const override { return shared_memory_ ? kInlineBytes : 0; }
  bool InlineMayWait() const override { return true; }
  Status RunInline(TransferOp op, const memory::Slice* slices, size_t n,
                   net::Deadline deadline) override;
  static constexpr size_t kInlineBytes = 64u << 10;
  void Close(net::Deadline drain_until) override;
  Status Health() const override;
  void Poll() override;

  struct Core;  // what completion callbacks share with the channel (ucx_channel.cc)

 private:
  // Posts the flush that ends t (post_mu held by post; released here) and,
  // when caller_waits, progresses the worker a bounded while for it.
  // result: an error met while posting t's operations.
  void FlushAndTrack(std::unique_lock<std::mutex>& post, const std::shared_ptr<Transfer>& t,
                     Status result, bool caller_waits);

  std::shared_ptr<Worker> worker_;
  std::shared_ptr<EndpointCache> cache_;
  std::vector<uint8_t> peer_address_;
  std::shared_ptr<Core> core_;
  int64_t peer_pid_ = 0;
  std::string layers_;
  bool shared_memory_ = false;  // on_shared_memory(), set by Open
};

}  // namespace hixl::transport::ucx

#endif  // HIXL_TRANSPORT_UCX_UCX_CHANNEL_H_
