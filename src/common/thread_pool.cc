#include "common/thread_pool.h"

#include <pthread.h>

namespace hixl {

void ThreadPool::Start(size_t threads, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = false;
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Run(); });
    std::string n = (name + std::to_string(i)).substr(0, 15);
    pthread_setname_np(threads_.back().native_handle(), n.c_str());
  }
}

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool ThreadPool::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || threads_.empty()) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void ThreadPool::Run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace hixl
