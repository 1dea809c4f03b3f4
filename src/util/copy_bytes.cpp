#include "util/copy_bytes.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace fsdp {

// [Note: rep movsb's short distance]
// glibc (2.36 here, Debian 12's) copies from ~2 KiB up to about the L2 cache's size with
// `rep movsb` on CPUs that advertise fast strings. On AMD Zen 3 and 4 that instruction runs
// ~16x slower when the destination lies 1-63 bytes past the source modulo 4 KiB: on the EPYC of
// bench/README.md a 25 KB copy took 7.3 us instead of 0.44, a 1,000,000-byte one 290 us
// instead of 20 (glibc 2.39 and later avoid it). FSDP's copies meet it when a shard or a
// parameter's piece is not a multiple of 64 bytes (odd shapes, W = 3, bf16). Such pairs are
// copied here 64 bytes at a time with SSE2 moves (0.56 us for 25 KB), up to the L2 cache's size,
// where glibc stops using `rep movsb` (larger ones the block loop would copy at 0.83x memcpy's
// speed); every other pair goes to memcpy. bench/copy_bytes_bench.cpp measures both side by side.
namespace {

constexpr size_t kBlock = 64;
constexpr size_t kSlowCaseFromBytes = 2048;  // below this, glibc copies with vector moves

// glibc's x86_rep_movsb_stop_threshold on AMD: the L2 cache's size (1 MiB if unknown).
size_t rep_movsb_stop_bytes() {
  static const size_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{1} << 20;
  }();
  return bytes;
}

bool short_distance(const void* to, const void* from) {
  const uintptr_t distance = (reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from)) % 4096;
  return distance != 0 && distance < kBlock;
}

#if defined(__x86_64__)
// Copies whole 64-byte blocks of from[0, n) with SSE2 loads and `store`; returns how many bytes.
template <class Store>
size_t copy_blocks(uint8_t* to, const uint8_t* from, size_t n, Store store) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 48));
    store(to + i, a);
    store(to + i + 16, b);
    store(to + i + 32, c);
    store(to + i + 48, d);
  }
  return i;
}
#endif

}  // namespace

void copy_bytes(void* to, const void* from, size_t n) {
#if defined(__x86_64__)
  if (n >= kSlowCaseFromBytes && n < rep_movsb_stop_bytes() && short_distance(to, from)) {
    auto* d = static_cast<uint8_t*>(to);
    const auto* s = static_cast<const uint8_t*>(from);
    const size_t done = copy_blocks(d, s, n, [](uint8_t* at, __m128i v) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(at), v);
    });
    std::memcpy(d + done, s + done, n - done);  // under 64 bytes
    return;
  }
#endif
  std::memcpy(to, from, n);
}

void stream_bytes(void* to, const void* from, size_t n) {
#if defined(__x86_64__)
  if (n >= 256) {
    auto* d = static_cast<uint8_t*>(to);
    const auto* s = static_cast<const uint8_t*>(from);
    const size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;  // streams store aligned
    std::memcpy(d, s, head);
    const size_t done = head + copy_blocks(d + head, s + head, n - head, [](uint8_t* at, __m128i v) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(at), v);
    });
    std::memcpy(d + done, s + done, n - done);
    _mm_sfence();  // the streamed bytes are visible before anything that follows
    return;
  }
#endif
  copy_bytes(to, from, n);
}

}  // namespace fsdp
