// The CPU backend's worker threads (pool.hpp). One call at a time uses them: it publishes a
// job, every thread (the caller too) claims task numbers until none is left, and the caller waits
// until every task has returned. A claim carries the job's generation in the counter's high half,
// so that a worker still busy with an old job can never claim a task of the next. The pool is never
// destroyed (its threads may be waiting when the process exits), and a child process made by fork
// starts with a new one (the parent's threads do not exist there). The waits are POSIX condition
// variables: libstdc++'s std::condition_variable::wait carries a symbol version (GLIBCXX_3.4.30)
// newer than the wheel's manylinux tag allows (docs/design.md, "Packaging").
#include "cpu/pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <system_error>
#include <thread>

namespace softlight {
namespace cpu {
namespace {

class Pool {
 public:
  bool run(int64_t tasks, int64_t workers, void (*fn)(void*, int64_t), void* ctx) {
    std::unique_lock<std::mutex> use(in_use_, std::try_to_lock);
    if (!use.owns_lock() || tasks >= (int64_t{1} << 31)) return false;
    grow(std::max<int64_t>(0, workers - 1));
    if (started_ == 0) return false;
    uint64_t gen;
    {
      Lock lock(&mu_);
      fn_ = fn;
      ctx_ = ctx;
      tasks_ = tasks;
      done_.store(0, std::memory_order_relaxed);
      gen = ++generation_;
      next_.store(gen << 32, std::memory_order_release);
      pthread_cond_broadcast(&wake_);
    }
    work(gen, fn, ctx, tasks);
    Lock lock(&mu_);
    while (done_.load(std::memory_order_acquire) != tasks) pthread_cond_wait(&finished_, &mu_);
    return true;
  }

 private:
  void grow(int64_t want) {
    for (; started_ < want; ++started_) {
      try {
        std::thread([this] { loop(); }).detach();
      } catch (const std::system_error&) {  // no more threads: the ones there are do the work
        return;
      }
    }
  }

  // Claims and runs tasks of generation gen until none is left.
  void work(uint64_t gen, void (*fn)(void*, int64_t), void* ctx, int64_t tasks) {
    for (;;) {
      uint64_t v = next_.load(std::memory_order_acquire);
      do {
        if ((v >> 32) != gen || static_cast<int64_t>(v & 0xffffffffu) >= tasks) return;
      } while (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel));
      fn(ctx, static_cast<int64_t>(v & 0xffffffffu));
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) {
        Lock lock(&mu_);
        pthread_cond_broadcast(&finished_);
      }
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      uint64_t gen;
      void (*fn)(void*, int64_t);
      void* ctx;
      int64_t tasks;
      {
        Lock lock(&mu_);
        while (generation_ == seen) pthread_cond_wait(&wake_, &mu_);
        gen = seen = generation_;
        fn = fn_;
        ctx = ctx_;
        tasks = tasks_;
      }
      work(gen, fn, ctx, tasks);
    }
  }

  // pthread_mutex_lock for the scope of a block.
  class Lock {
   public:
    explicit Lock(pthread_mutex_t* m) : m_(m) { pthread_mutex_lock(m_); }
    ~Lock() { pthread_mutex_unlock(m_); }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

   private:
    pthread_mutex_t* m_;
  };

  std::mutex in_use_;  // held by the call using the pool
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;  // guards the job's fields and the waits
  pthread_cond_t wake_ = PTHREAD_COND_INITIALIZER, finished_ = PTHREAD_COND_INITIALIZER;
  int64_t started_ = 0;  // worker threads started (detached; they live as long as the process)
  uint64_t generation_ = 0;
  void (*fn_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> done_{0};
};

std::atomic<Pool*> g_pool{nullptr};

void forget_pool_in_child() { g_pool.store(nullptr); }  // (the parent's pool is left as it is)

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { pthread_atfork(nullptr, nullptr, forget_pool_in_child); });
  static std::mutex make;
  std::lock_guard<std::mutex> lock(make);
  p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = new Pool();  // never deleted: its threads may be waiting on it when the process exits
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

bool run_tasks(int64_t tasks, int64_t workers, void (*fn)(void*, int64_t), void* ctx) {
  if (tasks <= 0) return true;
  return pool().run(tasks, workers, fn, ctx);
}

}  // namespace cpu
}  // namespace softlight
