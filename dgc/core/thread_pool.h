// A small fixed-size pool for splitting one large tensor over several threads.
//
// The calling thread takes part in the work, so ThreadPool(1) starts no thread at all.
// Thread-safety: run() may be called from one thread at a time (one pool per Compressor).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dgc {

class ThreadPool {
 public:
  // `threads` >= 1 is the total number of threads that run() uses, the caller included.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls task(i) once for every i in [0, count) and returns when all calls are done. Tasks are
  // handed out in order to whichever thread is free. If tasks throw, the first exception (in
  // order of completion) is rethrown here after every task has finished.
  void run(size_t count, const std::function<void(size_t)>& task);

 private:
  void work_loop();
  void drain();  // runs tasks of the current batch until none is left

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t count_ = 0;
  size_t next_ = 0;
  size_t finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace dgc
