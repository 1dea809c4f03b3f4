// copy_bytes and stream_bytes (src/util/copy_bytes.cpp): every byte copied and none around it, at
// the distances modulo 4 KiB that take copy_bytes' 64-byte block path (1-63) and at others, for
// sizes below and above that path's threshold and stream_bytes' (256), with and without a tail of
// under 64 bytes, from destinations at several offsets modulo 16 (stream_bytes aligns its stores).
// The reference is a byte loop.
#include "util/copy_bytes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

constexpr size_t kPage = 4096;
constexpr uint8_t kGuard = 0xEE;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using PageAligned = std::unique_ptr<uint8_t, FreeDeleter>;

PageAligned page_aligned(size_t bytes) {
  return PageAligned(static_cast<uint8_t*>(std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage)));
}

using Copy = void (*)(void*, const void*, size_t);

void expect_exact_copies(Copy copy) {
  constexpr size_t kMax = 70001, kSourceOffset = 128, kRoom = kMax + 2 * kPage;
  PageAligned source = page_aligned(kRoom), target = page_aligned(kRoom);
  for (size_t i = 0; i < kRoom; ++i) source.get()[i] = static_cast<uint8_t>(i * 131 + 7 + i / 251);
  const uint8_t* from = source.get() + kSourceOffset;
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{255}, size_t{256}, size_t{2047}, size_t{2048},
                   size_t{2049}, size_t{4113}, size_t{25603}, kMax}) {
    for (size_t distance : {size_t{0}, size_t{1}, size_t{4}, size_t{31}, size_t{63}, size_t{64},
                            size_t{65}, size_t{2052}, size_t{2061}, kPage - 1}) {
      // (to - from) % 4096 == distance: both buffers start on a page.
      const size_t to_offset = (kSourceOffset + distance) % kPage + kPage;
      std::fill_n(target.get(), kRoom, kGuard);
      copy(target.get() + to_offset, from, n);
      const std::string where = "n=" + std::to_string(n) + " distance=" + std::to_string(distance);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(target.get()[to_offset + i], from[i]) << where << " byte " << i;
      }
      for (size_t i = 0; i < kRoom; ++i) {
        if (i >= to_offset && i < to_offset + n) continue;
        ASSERT_EQ(target.get()[i], kGuard) << where << ": wrote byte " << i << " outside the copy";
      }
    }
  }
}

TEST(CopyBytes, CopiesEveryByteAndNothingElseAtEveryDistance) { expect_exact_copies(&fsdp::copy_bytes); }

TEST(CopyBytes, StreamingCopiesEveryByteAndNothingElseAtEveryDistance) {
  expect_exact_copies(&fsdp::stream_bytes);
}

}  // namespace
