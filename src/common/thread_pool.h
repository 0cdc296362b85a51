// A fixed set of worker threads running queued jobs in FIFO order.
// Thread safety: Submit may be called from any thread; Stop from one.
#ifndef HIXL_COMMON_THREAD_POOL_H_
#define HIXL_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hixl {

class ThreadPool {
 public:
  ThreadPool() = default;
  ~ThreadPool() { Stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Start(size_t threads, const std::string& name);
  // Runs every job still queued, then joins the workers.
  void Stop();
  // Returns false (job not run) once Stop has begun.
  bool Submit(std::function<void()> job);
  size_t size() const { return threads_.size(); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace hixl

#endif  // HIXL_COMMON_THREAD_POOL_H_
