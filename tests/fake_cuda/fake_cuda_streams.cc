// Streams, events and copies of the fake CUDA driver (fake_cuda.cc has the
// rest). A stream is a worker thread with a FIFO queue of copies, event
// records and event waits; stream 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD
// all name one default stream, started on first use. The implicit ordering of
// the legacy default stream against other streams is not modelled.
#include <cuda.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "fake_cuda_internal.h"

namespace hixl_fake_cuda {
namespace {

// Takes one copy from the failure budget: false when this copy must fail.
bool TakeCopyBudget() {
  long long budget = g_copy_budget.load();
  for (;;) {
    if (budget < 0) return true;
    if (budget == 0) return false;
    if (g_copy_budget.compare_exchange_weak(budget, budget - 1)) return true;
  }
}

CUresult RunCopy(const Op& op) {
  if (const unsigned us = g_copy_delay_us.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  // An injected failure writes nothing, so tests can check the destination.
  if (!TakeCopyBudget()) return CUDA_ERROR_LAUNCH_FAILED;
  std::memmove(op.dst, op.src, op.n);
  g_copies.fetch_add(1);
  g_bytes_copied.fetch_add(static_cast<long long>(op.n));
  return CUDA_SUCCESS;
}

void CompleteEvent(Event& event, uint64_t gen, CUresult error) {
  State& s = GetState();
  {
    std::lock_guard lock(s.event_mu);
    // A later record that finished first (on another stream) wins.
    if (gen > event.completed) {
      event.completed = gen;
      event.error = error;
    }
  }
  s.event_cv.notify_all();
}

void WaitForEvent(Event& event, uint64_t gen) {
  State& s = GetState();
  std::unique_lock lock(s.event_mu);
  s.event_cv.wait(lock, [&] { return event.completed >= gen; });
}

void RunWorker(Stream* st) {
  for (;;) {
    Op op;
    {
      std::unique_lock lock(st->mu);
      st->cv.wait(lock, [&] { return !st->queue.empty() || st->stopping; });
      if (st->queue.empty()) return;  // stopping, and everything queued has run
      op = std::move(st->queue.front());
      st->queue.pop_front();
    }
    switch (op.kind) {
      case Op::Kind::kCopy: {
        const CUresult r = RunCopy(op);
        if (op.completion) {
          {
            std::lock_guard lock(op.completion->mu);
            op.completion->done = true;
            op.completion->result = r;
          }
          op.completion->cv.notify_all();
        } else if (r != CUDA_SUCCESS) {
          std::lock_guard lock(st->mu);
          if (st->error == CUDA_SUCCESS) {
            st->error = r;
            st->error_seq = op.seq;
          }
        }
        break;
      }
      case Op::Kind::kRecord: {
        CUresult error;
        {
          std::lock_guard lock(st->mu);
          error = st->error;
        }
        CompleteEvent(*op.event, op.gen, error);
        break;
      }
      case Op::Kind::kWait: WaitForEvent(*op.event, op.gen); break;
    }
    const uint64_t seq = op.seq;
    op = Op();  // let go of the memory and the event before reporting progress
    {
      std::lock_guard lock(st->mu);
      st->completed = seq;
    }
    st->cv.notify_all();
  }
}

CUresult StartWorker(Stream& st) {
  try {
    st.worker = std::thread(RunWorker, &st);
  } catch (const std::system_error&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

bool IsDefaultStream(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

CUresult LookupStream(CUstream h, std::shared_ptr<Stream>* out) {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  // Checked under the lock Shutdown takes, so no stream starts after it.
  if (g_shut_down.load()) return CUDA_ERROR_DEINITIALIZED;
  if (IsDefaultStream(h)) {
    if (!s.default_stream) {
      auto st = std::make_shared<Stream>();
      FAKE_CUDA_TRY(StartWorker(*st));
      s.default_stream = std::move(st);
    }
    *out = s.default_stream;
    return CUDA_SUCCESS;
  }
  auto it = s.streams.find(reinterpret_cast<const Stream*>(h));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second;
  return CUDA_SUCCESS;
}

CUresult LookupEvent(CUevent h, std::shared_ptr<Event>* out) {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(reinterpret_cast<const Event*>(h));
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second;
  return CUDA_SUCCESS;
}

CUresult Enqueue(Stream& st, Op op) {
  State& s = GetState();
  {
    std::lock_guard lock(st.mu);
    if (st.stopping) {
      return g_shut_down.load() ? CUDA_ERROR_DEINITIALIZED : CUDA_ERROR_INVALID_HANDLE;
    }
    if (op.kind != Op::Kind::kCopy) {
      // Numbered under the stream's lock, so a record can never be counted
      // without being queued.
      std::lock_guard event_lock(s.event_mu);
      if (op.kind == Op::Kind::kRecord) {
        op.gen = ++op.event->recorded;
      } else {
        op.gen = op.event->recorded;           // the latest record, as in CUDA
        if (op.gen == 0) return CUDA_SUCCESS;  // never recorded: nothing to wait for
      }
    }
    op.seq = ++st.enqueued;
    st.queue.push_back(std::move(op));
  }
  st.cv.notify_all();
  return CUDA_SUCCESS;
}

// Checks and queues a copy; `completion` is set for cuMemcpy.
CUresult EnqueueCopy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h,
                     std::shared_ptr<Completion> completion) {
  Op op;
  op.kind = Op::Kind::kCopy;
  op.n = n;
  op.completion = std::move(completion);
  {
    State& s = GetState();
    std::lock_guard lock(s.mu);
    // Both sides are checked before anything is queued, so a refused copy
    // writes nothing.
    FAKE_CUDA_TRY(ResolveCopySide(s, dst, n, &op.dst, &op.keep_dst));
    char* src_ptr = nullptr;
    FAKE_CUDA_TRY(ResolveCopySide(s, src, n, &src_ptr, &op.keep_src));
    op.src = src_ptr;
  }
  std::shared_ptr<Stream> st;
  FAKE_CUDA_TRY(LookupStream(h, &st));
  return Enqueue(*st, std::move(op));
}

}  // namespace

void RequestStop(Stream& st) {
  {
    std::lock_guard lock(st.mu);
    st.stopping = true;
  }
  st.cv.notify_all();
}

void JoinWorker(Stream& st) {
  if (st.worker.joinable()) st.worker.join();
}

CUresult MemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  FAKE_CUDA_TRY(CheckContext());
  if (bytes == 0) return CUDA_SUCCESS;
  return EnqueueCopy(dst, src, bytes, stream, nullptr);
}

CUresult Memcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  FAKE_CUDA_TRY(CheckContext());
  if (bytes == 0) return CUDA_SUCCESS;
  auto done = std::make_shared<Completion>();
  FAKE_CUDA_TRY(EnqueueCopy(dst, src, bytes, nullptr, done));
  std::unique_lock lock(done->mu);
  done->cv.wait(lock, [&] { return done->done; });
  return done->result;
}

CUresult StreamCreate(CUstream* stream, unsigned int flags) {
  FAKE_CUDA_TRY(CheckContext());
  if (stream == nullptr || (flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto st = std::make_shared<Stream>();
  State& s = GetState();
  std::lock_guard lock(s.mu);
  // Checked under the lock Shutdown takes, so no stream starts after it.
  if (g_shut_down.load()) return CUDA_ERROR_DEINITIALIZED;
  FAKE_CUDA_TRY(StartWorker(*st));
  *stream = reinterpret_cast<CUstream>(st.get());
  s.streams.emplace(st.get(), std::move(st));
  return CUDA_SUCCESS;
}

CUresult StreamDestroy(CUstream stream) {
  FAKE_CUDA_TRY(CheckContext());
  std::shared_ptr<Stream> st;
  {
    State& s = GetState();
    std::lock_guard lock(s.mu);
    auto it = s.streams.find(reinterpret_cast<const Stream*>(stream));
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    st = std::move(it->second);
    s.streams.erase(it);
  }
  // The queued work still runs; only then does the thread end.
  RequestStop(*st);
  JoinWorker(*st);
  return CUDA_SUCCESS;
}

CUresult StreamSynchronize(CUstream stream) {
  FAKE_CUDA_TRY(CheckContext());
  std::shared_ptr<Stream> st;
  FAKE_CUDA_TRY(LookupStream(stream, &st));
  std::unique_lock lock(st->mu);
  const uint64_t target = st->enqueued;
  st->cv.wait(lock, [&] { return st->completed >= target; });
  // A failure of work queued after this call began stays for the next one.
  if (st->error == CUDA_SUCCESS || st->error_seq > target) return CUDA_SUCCESS;
  const CUresult error = st->error;
  st->error = CUDA_SUCCESS;
  return error;
}

CUresult StreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  FAKE_CUDA_TRY(CheckContext());
  if (flags != CU_EVENT_WAIT_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::Kind::kWait;
  FAKE_CUDA_TRY(LookupEvent(event, &op.event));
  std::shared_ptr<Stream> st;
  FAKE_CUDA_TRY(LookupStream(stream, &st));
  return Enqueue(*st, std::move(op));
}

CUresult EventCreate(CUevent* event, unsigned int flags) {
  FAKE_CUDA_TRY(CheckContext());
  // CU_EVENT_INTERPROCESS is not supported.
  if (event == nullptr ||
      (flags & ~unsigned{CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto ev = std::make_shared<Event>();
  State& s = GetState();
  std::lock_guard lock(s.mu);
  *event = reinterpret_cast<CUevent>(ev.get());
  s.events.emplace(ev.get(), std::move(ev));
  return CUDA_SUCCESS;
}

CUresult EventRecord(CUevent event, CUstream stream) {
  FAKE_CUDA_TRY(CheckContext());
  Op op;
  op.kind = Op::Kind::kRecord;
  FAKE_CUDA_TRY(LookupEvent(event, &op.event));
  std::shared_ptr<Stream> st;
  FAKE_CUDA_TRY(LookupStream(stream, &st));
  return Enqueue(*st, std::move(op));
}

CUresult EventQuery(CUevent event) {
  FAKE_CUDA_TRY(CheckContext());
  std::shared_ptr<Event> ev;
  FAKE_CUDA_TRY(LookupEvent(event, &ev));
  State& s = GetState();
  std::lock_guard lock(s.event_mu);
  // An event never recorded counts as complete, as in CUDA.
  return ev->completed >= ev->recorded ? ev->error : CUDA_ERROR_NOT_READY;
}

CUresult EventSynchronize(CUevent event) {
  FAKE_CUDA_TRY(CheckContext());
  std::shared_ptr<Event> ev;
  FAKE_CUDA_TRY(LookupEvent(event, &ev));
  State& s = GetState();
  std::unique_lock lock(s.event_mu);
  const uint64_t target = ev->recorded;
  s.event_cv.wait(lock, [&] { return ev->completed >= target; });
  return ev->error;
}

CUresult EventDestroy(CUevent event) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  // A pending record keeps its own reference and completes into nothing.
  std::shared_ptr<Event> destroyed;
  std::lock_guard lock(s.mu);
  auto it = s.events.find(reinterpret_cast<const Event*>(event));
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  destroyed = std::move(it->second);
  s.events.erase(it);
  return CUDA_SUCCESS;
}

}  // namespace hixl_fake_cuda
