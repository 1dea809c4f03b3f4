// memcpy against fsdp::copy_bytes, side by side in one run, for copies whose destination lies 0,
// 4 or 68 bytes past the source modulo 4 KiB ([Note: rep movsb's short distance]). Best of 5
// repetitions of back-to-back copies between two warm buffers; writes a Markdown table to the
// file given (default: stdout only).
//   build/bin/copy_bytes_bench bench/results/copy-bytes.md
#include "util/copy_bytes.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

template <class Copy>
double best_microseconds(Copy&& copy, size_t n) {
  const int reps = n > (256 << 10) ? 50 : 1000;
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    for (int k = 0; k < reps; ++k) copy();
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - start).count() / reps);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr size_t kRoom = (4 << 20) + 8192;
  auto* source = static_cast<uint8_t*>(std::aligned_alloc(4096, kRoom));
  auto* target = static_cast<uint8_t*>(std::aligned_alloc(4096, kRoom));
  std::memset(source, 1, kRoom);
  std::memset(target, 2, kRoom);
  std::string table =
      "| bytes | (to - from) % 4096 | memcpy µs | copy_bytes µs | memcpy / copy_bytes |\n|---|---|---|---|---|\n";
  for (size_t n : {size_t{4096}, size_t{25600}, size_t{204800}, size_t{1000000}, size_t{3} << 20}) {
    for (size_t distance : {size_t{0}, size_t{4}, size_t{68}}) {
      uint8_t* to = target + distance;
      const double plain = best_microseconds([&] { std::memcpy(to, source, n); asm volatile("" ::: "memory"); }, n);
      const double ours = best_microseconds([&] { fsdp::copy_bytes(to, source, n); asm volatile("" ::: "memory"); }, n);
      char row[160];
      std::snprintf(row, sizeof row, "| %zu | %zu | %.3f | %.3f | %.2f |\n", n, distance, plain, ours, plain / ours);
      table += row;
    }
  }
  std::fputs(table.c_str(), stdout);
  if (argc > 1) {
    FILE* out = std::fopen(argv[1], "w");
    if (out == nullptr) return 1;
    std::fputs(table.c_str(), out);
    std::fclose(out);
  }
  std::free(source);
  std::free(target);
  return 0;
}
