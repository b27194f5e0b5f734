#pragma once
// A thread that runs tasks in the order they were posted: the GlooCommunicator's worker (every
// operation of a group, in issue order) and its reaper (point-to-point completions over TCP).
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace trainrun::plugins {

class SerialQueue {
 public:
  SerialQueue() : thread_([this] { loop(); }) {}
  ~SerialQueue() { stop(); }

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> g(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  /// Runs `task` on the calling thread if nothing is queued or running (so it still follows
  /// everything posted before it), else queues it. Saves a thread hand-off per message on the
  /// shared-memory path, where posting is all the worker would do.
  void run_or_post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (running_ || !tasks_.empty()) {
        tasks_.push_back(std::move(task));
        cv_.notify_all();
        return;
      }
      running_ = true;
    }
    task();  // tasks catch their own errors
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      running_ = false;
      wake = !tasks_.empty() || stopping_;
    }
    // Only when the worker has something to do now: waking it after every inline task made
    // each small collective cost two context switches per rank (worker up, finds nothing,
    // sleeps), which on two cores preempted the ranks' own polling: a 4 KiB all-reduce at 2
    // ranks took 45-58 us, 3.8 switches per operation.
    if (wake) cv_.notify_all();
  }
  /// Runs what is queued, then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return (stopping_ || !tasks_.empty()) && !running_; });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
        running_ = true;
      }
      task();  // tasks catch their own errors
      {
        std::lock_guard<std::mutex> g(mu_);
        running_ = false;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false;  // a task runs, on the worker or inline in run_or_post
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace trainrun::plugins
