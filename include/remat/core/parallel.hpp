#pragma once
/// @file
/// Threads for remat's kernels: one small pool, for element-wise loops and GEMMs alike. Every
/// parallel loop cuts its range into fixed chunks, so results never depend on which thread ran
/// which chunk, or on how many threads there were.
///
/// Note [blocking pool]: a thread with nothing to do (a worker after a loop, the caller waiting
/// for the workers' chunks) spins for 50 microseconds and then sleeps on a futex. OpenMP's
/// workers (libgomp) spin for much longer by default, and with OpenBLAS's threads busy in between
/// they fought for the cores: a 2-thread GPT step took 3.4 s against 1.0 s on one thread (0.66 s
/// with OMP_WAIT_POLICY=passive, a setting a library cannot make). Shorter is not better either:
/// the gaps between a step's loops (the tape's bookkeeping, a replay's hash) are tens of
/// microseconds, and a worker that slept through each one was woken by a system call, hundreds of
/// times a step. The spin was 2,000 tries, 1 microsecond on a Zen 5: 50 microseconds made the
/// mlp benchmark's 2-thread step 6 % faster in BF16, 4 % in float32 (docs/benchmarks.md).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "remat/core/config.hpp"
#include "remat/core/error.hpp"
#include "remat/core/float_mode.hpp"
#include "remat/core/memory.hpp"

namespace remat {
namespace detail {

class ThreadPool {
 public:
  static ThreadPool& instance() {
    static ThreadPool pool(default_threads());
    return pool;
  }

  ~ThreadPool() { stop_workers(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Threads a loop uses, the caller included.
  int size() const noexcept { return size_.load(std::memory_order_relaxed); }

  void resize(int threads) {
    std::lock_guard<std::mutex> lock(dispatch_);
    stop_workers();
    start_workers(threads - 1);
  }

  /// Whether this thread is running a chunk of a loop (a worker, or a caller inside run()): a
  /// loop started there runs inline, so a GEMM inside a parallel loop runs whole
  /// (pool_blas_gemm in ops/gemm.hpp), on whichever thread, with the same bits.
  static bool inside_loop() noexcept { return inside_loop_flag(); }

  /// Runs fn(c) for every chunk c in [0, chunks), on the pool and the calling thread. Runs
  /// inline when the pool is busy with another caller's loop or when called inside a loop
  /// (which never tries the lock this thread may hold).
  void run(int chunks, const std::function<void(int)>& fn) {
    if (inside_loop()) {
      for (int c = 0; c < chunks; ++c) fn(c);
      return;
    }
    const InsideLoop inside;
    std::unique_lock<std::mutex> lock(dispatch_, std::try_to_lock);
    if (!lock.owns_lock() || workers_.empty()) {
      for (int c = 0; c < chunks; ++c) fn(c);
      return;
    }
    Job job{&fn, chunks};
    {
      std::lock_guard<std::mutex> join(join_);
      job_ = &job;
    }
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    job.work();
    wait_until(job.done, chunks);
    {
      std::lock_guard<std::mutex> join(join_);  // no worker joins from now on
      job_ = nullptr;
    }
    wait_until_zero(job.users);  // and those that joined have left: `job` can go
  }

 private:
  /// How long a thread with nothing to do spins before it sleeps (Note [blocking pool]).
  static constexpr std::chrono::microseconds kSpinTime{50};

  /// Spins until ready() holds or kSpinTime has passed; whether it held. The clock is read
  /// every 256 tries: the time of a try varies by CPU (0.5 ns on a Zen 5), a spin count would too.
  template <class Ready>
  static bool spin_until(Ready&& ready) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
    for (int tries = 1;; ++tries) {
      if (ready()) return true;
      if (tries % 256 == 0 && std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

  /// One loop: its chunks are claimed from `next`; `users` counts the workers inside it.
  struct Job {
    const std::function<void(int)>* fn;
    int chunks;
    std::atomic<int> next{0}, done{0}, users{0};

    void work() {
      for (int c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        (*fn)(c);
        if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done.notify_all();
      }
    }
  };

  explicit ThreadPool(int threads) { start_workers(threads - 1); }

  static int default_threads() noexcept {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }

  static bool& inside_loop_flag() noexcept {
    thread_local bool flag = false;
    return flag;
  }
  /// Marks the calling thread inside a loop for its lifetime (run() is never re-entered inside
  /// one, so the flag was false before).
  struct InsideLoop {
    InsideLoop() noexcept { inside_loop_flag() = true; }
    ~InsideLoop() { inside_loop_flag() = false; }
    InsideLoop(const InsideLoop&) = delete;
    InsideLoop& operator=(const InsideLoop&) = delete;
  };

  static void wait_until(std::atomic<int>& value, int target) {
    if (spin_until([&] { return value.load(std::memory_order_acquire) >= target; })) return;
    for (int seen = value.load(std::memory_order_acquire); seen < target;
         seen = value.load(std::memory_order_acquire)) {
      value.wait(seen, std::memory_order_acquire);
    }
  }

  static void wait_until_zero(std::atomic<int>& value) {
    for (int seen = value.load(std::memory_order_acquire); seen != 0;
         seen = value.load(std::memory_order_acquire)) {
      value.wait(seen, std::memory_order_acquire);
    }
  }

  void worker_loop() {
    inside_loop_flag() = true;
    std::uint64_t seen = generation_.load(std::memory_order_acquire);
    while (!stopping_.load(std::memory_order_acquire)) {
      std::uint64_t now = seen;
      spin_until([&] { return (now = generation_.load(std::memory_order_acquire)) != seen; });
      if (now == seen) {
        generation_.wait(seen, std::memory_order_acquire);
        continue;
      }
      seen = now;
      Job* job = nullptr;
      {
        std::lock_guard<std::mutex> join(join_);
        job = job_;
        if (job) job->users.fetch_add(1, std::memory_order_relaxed);
      }
      if (!job) continue;
      job->work();
      if (job->users.fetch_sub(1, std::memory_order_acq_rel) == 1) job->users.notify_all();
    }
  }

  void start_workers(int count) {
    stopping_.store(false, std::memory_order_release);
    for (int i = 0; i < count; ++i) workers_.emplace_back([this] { worker_loop(); });
    size_.store(count + 1, std::memory_order_relaxed);
  }

  void stop_workers() {
    stopping_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    size_.store(1, std::memory_order_relaxed);
  }

  std::mutex dispatch_;  // one loop on the pool at a time
  std::mutex join_;      // guards job_ against workers joining a loop that is ending
  std::vector<std::thread> workers_;
  std::atomic<int> size_{1};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  Job* job_ = nullptr;
};

}  // namespace detail

/// Threads remat's kernels use (element-wise loops and GEMMs). Defaults to the machine's cores.
inline int num_threads() noexcept { return detail::ThreadPool::instance().size(); }

/// Sets the threads remat's kernels use, GEMMs included (OpenBLAS runs single-threaded on
/// them: Note [one pool] in ops/gemm.hpp). Results of a given computation are bitwise the same
/// for any thread count, except a float GEMM's, which are the same for a given thread count.
inline void set_num_threads(int count) {
  if (count < 1)
    throw ArgumentError(detail::cat("set_num_threads: count must be >= 1, got ", count));
  detail::ThreadPool::instance().resize(count);
}

namespace detail {

/// Runs fn(begin, end) over [0, n) in fixed chunks of at least `grain` items, in parallel when
/// that is worth it. fn must only touch its own chunk.
/// Every chunk runs in remat's floating-point mode (Note [flushing denormals]), on whichever
/// thread runs it; the caller's mode is back when the loop returns. In a shape-only run
/// (core/shape_only.hpp) there is nothing to loop over: the tensors have no data.
template <class Fn>
void parallel_for(std::int64_t n, std::int64_t grain, Fn&& fn) {
  if (shape_only()) return;
  const FloatModeGuard float_mode;
  ThreadPool& pool = ThreadPool::instance();
  const std::int64_t chunks =
      std::min<std::int64_t>(pool.size(), n / std::max<std::int64_t>(grain, 1));
  if (chunks > 1) {
    pool.run(static_cast<int>(chunks), [&](int c) {
      const FloatModeGuard worker_mode;  // a no-op on the calling thread, whose mode is set
      fn(n * c / chunks, n * (c + 1) / chunks);
    });
    return;
  }
  if (n > 0) fn(std::int64_t{0}, n);
}

/// Grain for element-wise loops: below this many elements, threads cost more than they save.
inline constexpr std::int64_t kElementwiseGrain = 32768;

}  // namespace detail
}  // namespace remat
