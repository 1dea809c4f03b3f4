#include "util/hash64.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace fsdp {

namespace {

// XXH64's primes and round: each 8-byte word is mixed into one of four lanes, so the lanes'
// multiplications overlap (several GB/s on one core).
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL,
                   kP3 = 0x165667B19E3779F9ULL, kP4 = 0x85EBCA77C2B2AE63ULL,
                   kP5 = 0x27D4EB2F165667C5ULL;

uint64_t xx_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t xx_round(uint64_t acc, uint64_t word) { return xx_rotl(acc + word * kP2, 31) * kP1; }

uint64_t xx_merge(uint64_t h, uint64_t lane) { return (h ^ xx_round(0, lane)) * kP1 + kP4; }

uint64_t xx_avalanche(uint64_t h) {
  h = (h ^ (h >> 33)) * kP2;
  h = (h ^ (h >> 29)) * kP3;
  return h ^ (h >> 32);
}

uint64_t xx_word_at(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// One chunk: four lanes over 32-byte stripes, then the tail word by word and byte by byte.
uint64_t hash_chunk(const unsigned char* p, size_t size) {
  const unsigned char* end = p + size;
  uint64_t h = kP5;
  if (size >= 32) {
    uint64_t lanes[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
    for (; p + 32 <= end; p += 32) {
      for (int k = 0; k < 4; ++k) lanes[k] = xx_round(lanes[k], xx_word_at(p + 8 * k));
    }
    h = xx_rotl(lanes[0], 1) + xx_rotl(lanes[1], 7) + xx_rotl(lanes[2], 12) + xx_rotl(lanes[3], 18);
    for (uint64_t lane : lanes) h = xx_merge(h, lane);
  }
  h += size;
  for (; p + 8 <= end; p += 8) h = xx_rotl(h ^ xx_round(0, xx_word_at(p)), 27) * kP1 + kP4;
  for (; p < end; ++p) h = xx_rotl(h ^ (*p * kP5), 11) * kP1;
  return xx_avalanche(h);
}

}  // namespace

void hash_chunks(const void* data, size_t size, std::vector<uint64_t>& out) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const size_t first = out.size(), count = (size + kHashChunkBytes - 1) / kHashChunkBytes;
  out.resize(first + count);
  at::parallel_for(0, static_cast<int64_t>(count), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t offset = static_cast<size_t>(c) * kHashChunkBytes;
      out[first + c] = hash_chunk(bytes + offset, std::min(kHashChunkBytes, size - offset));
    }
  });
}

uint64_t combine_chunk_hashes(const std::vector<uint64_t>& chunks, uint64_t total) {
  uint64_t h = kP5 + total;
  for (uint64_t chunk : chunks) h = xx_rotl(h ^ xx_round(0, chunk), 27) * kP1 + kP4;  // in order
  return xx_avalanche(h);
}

uint64_t hash64(const void* data, size_t size) {
  std::vector<uint64_t> chunks;
  hash_chunks(data, size, chunks);
  return combine_chunk_hashes(chunks, size);
}

}  // namespace fsdp
