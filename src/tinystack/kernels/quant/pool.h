// Splitting a matmul's output rows over threads so that a late thread never delays the caller.
//
// at::parallel_for (OpenMP) gives each thread a fixed share and then waits for all of them: on a busy
// machine whose second core is taken by another process, every one of a decode step's ~200 small
// matmuls waits for a descheduled thread (measured: 2 threads several times slower than 1 on 2 busy cores).
// Here the caller and the helper threads take chunks from one atomic counter; the caller waits only
// for chunks a helper has already *started*, so when no helper wakes in time the caller simply does all
// the work itself. Helpers spin briefly after a task (decode calls arrive back to back) and then sleep.
// Threads: at::get_num_threads() - 1 helpers (torch.set_num_threads applies); one task at a time: a
// second caller arriving meanwhile runs its task alone.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

class RowPool {
 public:
  using Body = std::function<void(int64_t, int64_t)>;

  // Run body(n0, n1) over [0, n) in chunks of `grain` rows; returns when every chunk is done.
  void run(int64_t n, int64_t grain, const Body& body) {
    const int64_t chunks = (n + grain - 1) / grain;
    const int want = (int)std::min<int64_t>(at::get_num_threads() - 1, chunks - 1);
    std::unique_lock<std::mutex> busy(submit_, std::try_to_lock);
    if (want <= 0 || !busy.owns_lock()) return body(0, n);
    ensure_helpers(want);
    body_ = &body, n_ = n, grain_ = grain, chunks_ = chunks;  // published by the generation increment
    next_.store(0);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> g(m_);
      gen = generation_.fetch_add(1) + 1;
    }
    cv_.notify_all();
    take_chunks();
    // Close, then wait for helpers inside. (Dekker: a helper raises `active_` before it checks `closed_`,
    // all seq_cst, so either we see it here and wait, or it sees the task closed and touches nothing.)
    closed_.store(gen);
    while (active_.load() != 0) _mm_pause();
  }

 private:
  void take_chunks() {
    for (int64_t c = next_.fetch_add(1); c < chunks_; c = next_.fetch_add(1))
      (*body_)(c * grain_, std::min(n_, (c + 1) * grain_));
  }

  void ensure_helpers(int want) {
    while ((int)helpers_.size() < want) {
      helpers_.emplace_back([this] { helper_loop(); });
      helpers_.back().detach();  // the pool lives as long as the process; exit does not wait for idle helpers
    }
  }

  void helper_loop() {
    uint64_t seen = generation_.load();
    while (true) {
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while (generation_.load() == seen && std::chrono::steady_clock::now() < spin_until) _mm_pause();
      if (generation_.load() == seen) {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return generation_.load() != seen; });
      }
      seen = generation_.load();
      active_.fetch_add(1);
      if (generation_.load() == seen && closed_.load() != seen) take_chunks();  // else: too late, leave it
      active_.fetch_sub(1);
    }
  }

  std::mutex submit_, m_;
  std::condition_variable cv_;
  std::vector<std::thread> helpers_;
  std::atomic<uint64_t> generation_{0}, closed_{0};
  std::atomic<int64_t> next_{0}, active_{0};
  const Body* body_ = nullptr;
  int64_t n_ = 0, grain_ = 1, chunks_ = 0;
};

inline RowPool& row_pool() {
  static RowPool* pool = new RowPool();  // never destroyed: its helpers are detached
  return *pool;
}
