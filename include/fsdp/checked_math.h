#pragma once
/// Sizes multiplied and added with overflow checks. A file or a flag may claim any size (a
/// safetensors header's shape, a model description's parameter, a config.json's vocab_size), and
/// a product that wraps around int64 reads as a small or negative one: a shape of 2^32 x 2^32
/// would count 0 elements. Each returns nothing where the exact result does not fit int64.
///
/// Example:
///   const auto numel = fsdp::checked_product(shape);   // std::nullopt: too many to count
///   TORCH_CHECK(numel, "shape ", ..., " has more elements than int64 counts");

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

namespace fsdp {

inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// `start` times every factor (a tensor's bytes: its element size times its shape).
inline std::optional<int64_t> checked_product(const std::vector<int64_t>& factors, int64_t start = 1) {
  std::optional<int64_t> out = start;
  for (int64_t f : factors) {
    if (!(out = checked_mul(*out, f))) return std::nullopt;
  }
  return out;
}

inline std::optional<int64_t> checked_sum(std::initializer_list<int64_t> terms) {
  std::optional<int64_t> out = 0;
  for (int64_t t : terms) {
    if (!(out = checked_add(*out, t))) return std::nullopt;
  }
  return out;
}

}  // namespace fsdp
