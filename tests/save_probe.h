#pragma once
// What a save costs the process, for bench/checkpoint/async_stall.py (checkpoint_tool --probe):
// the most file descriptors open at once (/proc/self/fd, sampled every millisecond by a thread)
// and the resident memory's high-water mark (VmHWM, reset through /proc/self/clear_refs), both
// less what they were when the probe started.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

class SaveProbe {
 public:
  SaveProbe() : fds_before_(open_fds()), rss_before_(status_kib("VmRSS:")) {
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
    max_fds_ = fds_before_;
    sampler_ = std::thread([this] {
      while (!stop_) {
        max_fds_ = std::max(max_fds_.load(), open_fds());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~SaveProbe() { stop(); }
  void stop() {
    stop_ = true;
    if (sampler_.joinable()) sampler_.join();
  }
  int64_t extra_fds() const { return max_fds_ - fds_before_; }
  int64_t rss_peak_bytes() const { return (status_kib("VmHWM:") - rss_before_) * 1024; }

 private:
  static int64_t open_fds() {
    int64_t n = 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != decltype(it)();
         it.increment(ec)) {
      ++n;
    }
    return n - 1;  // the iterator's own
  }
  static int64_t status_kib(const std::string& field) {
    std::ifstream status("/proc/self/status");
    std::string key;
    int64_t value = 0;
    while (status >> key) {
      if (key == field && status >> value) return value;
    }
    return 0;
  }

  int64_t fds_before_;
  int64_t rss_before_;
  std::atomic<int64_t> max_fds_{0};
  std::atomic<bool> stop_{false};
  std::thread sampler_;
};
