#pragma once
/// Where the tensors are in what a unit's forward (or a method run through Unit::call) returns.
///
/// A unit hooks its backward onto the tensors its forward returns, so it must find them. Known
/// out of the box: a tensor; std::vector, std::deque, std::array, std::tuple, std::pair,
/// std::optional, std::map and std::unordered_map of known types; torch::nn's PackedSequence;
/// types that hold no tensor (numbers, strings, void); and a struct whose public members are all
/// of those (an aggregate of up to 16 members: `struct VAEOutput { torch::Tensor recon, mu,
/// logvar; };`). Any other type is a compile error naming it; declare its tensors once, at global
/// scope, and it is known too:
///
///   class AgentOutput { ... public: torch::Tensor logits() const; torch::Tensor value() const; };
///   FSDP_OUTPUT_TENSORS(AgentOutput, logits(), value());   // members or getters
///   FSDP_OUTPUT_TENSORS(Timings);                          // a type that holds no tensor
///
/// (A struct with a C array among its members needs the line too: its members cannot be counted.)

#include <ATen/core/Tensor.h>
#include <torch/nn/utils/rnn.h>

#include <array>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdp {

/// The customisation point: specialise it (FSDP_OUTPUT_TENSORS writes the specialisation) with a
/// static `template <class F> void visit(const T& value, F&& f)` that calls `f` on each member
/// that holds tensors.
template <class T, class = void>
struct OutputTensors {
  static constexpr bool declared = false;
};

namespace detail {

/// Converts to any member type: counts an aggregate's members by brace-initialising it.
struct AnyMember {
  template <class T>
  operator T&() const;
};

template <class T, size_t... I>
constexpr auto brace_initialisable(std::index_sequence<I...>)
    -> decltype(T{(static_cast<void>(I), AnyMember{})...}, true) {
  return true;
}
template <class T>
constexpr bool brace_initialisable(...) {
  return false;
}

constexpr size_t kMaxMembers = 16;

/// The number of members of the aggregate T: the most AnyMembers it takes.
template <class T, size_t N = kMaxMembers>
constexpr size_t member_count() {
  if constexpr (N == 0) {
    return 0;
  } else if constexpr (brace_initialisable<T>(std::make_index_sequence<N>{})) {
    return N;
  } else {
    return member_count<T, N - 1>();
  }
}

template <class T>
inline constexpr bool is_plain_struct_v =
    std::is_class_v<T> && std::is_aggregate_v<T> && !std::is_polymorphic_v<T>;

#define FSDP_DETAIL_BIND(N, ...)                   \
  if constexpr (member_count<T>() == N) {          \
    const auto& [__VA_ARGS__] = value;             \
    visit_all(f, __VA_ARGS__);                     \
  }

template <class F, class... M>
void visit_all(F& f, const M&... members) {
  (f(members), ...);
}

/// Calls f on each member of the aggregate `value` (structured bindings, by count).
template <class T, class F>
void visit_members(const T& value, F& f) {
  FSDP_DETAIL_BIND(1, a)
  FSDP_DETAIL_BIND(2, a, b)
  FSDP_DETAIL_BIND(3, a, b, c)
  FSDP_DETAIL_BIND(4, a, b, c, d)
  FSDP_DETAIL_BIND(5, a, b, c, d, e)
  FSDP_DETAIL_BIND(6, a, b, c, d, e, g)
  FSDP_DETAIL_BIND(7, a, b, c, d, e, g, h)
  FSDP_DETAIL_BIND(8, a, b, c, d, e, g, h, i)
  FSDP_DETAIL_BIND(9, a, b, c, d, e, g, h, i, j)
  FSDP_DETAIL_BIND(10, a, b, c, d, e, g, h, i, j, k)
  FSDP_DETAIL_BIND(11, a, b, c, d, e, g, h, i, j, k, l)
  FSDP_DETAIL_BIND(12, a, b, c, d, e, g, h, i, j, k, l, m)
  FSDP_DETAIL_BIND(13, a, b, c, d, e, g, h, i, j, k, l, m, n)
  FSDP_DETAIL_BIND(14, a, b, c, d, e, g, h, i, j, k, l, m, n, o)
  FSDP_DETAIL_BIND(15, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p)
  FSDP_DETAIL_BIND(16, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q)
}
#undef FSDP_DETAIL_BIND

template <class T>
struct is_container : std::false_type {};
template <class T, class A>
struct is_container<std::vector<T, A>> : std::true_type {};
template <class T, class A>
struct is_container<std::deque<T, A>> : std::true_type {};
template <class T, size_t N>
struct is_container<std::array<T, N>> : std::true_type {};

template <class T>
struct is_map : std::false_type {};
template <class K, class V, class C, class A>
struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};

template <class T>
struct is_tuple_like : std::false_type {};
template <class... T>
struct is_tuple_like<std::tuple<T...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

/// Types that hold no tensor.
template <class T>
inline constexpr bool holds_no_tensor_v = std::is_arithmetic_v<T> || std::is_enum_v<T> ||
                                          std::is_same_v<T, std::string> || std::is_void_v<T> ||
                                          std::is_same_v<T, std::nullptr_t>;

// The compile error for an output type fsdp cannot see into; its name is in the instantiation.
template <class Output>
struct UnitOutputWithUnknownTensors {
  static_assert(sizeof(Output) == 0,
                "fsdp: a unit's forward (or a method run through Unit::call) returns a type whose "
                "tensors fsdp cannot find (named in 'UnitOutputWithUnknownTensors<...>' above); the "
                "unit's backward would never run. Declare them once at global scope: "
                "FSDP_OUTPUT_TENSORS(YourType, member1, member2, ...); or, for a type holding no "
                "tensor, FSDP_OUTPUT_TENSORS(YourType); (see <fsdp/output_tensors.h>)");
  static constexpr bool value = false;
};

/// Appends every tensor `value` holds to `out`.
template <class T>
void collect_tensors(const T& value, std::vector<at::Tensor>& out) {
  auto recurse = [&out](const auto& member) { collect_tensors(member, out); };
  if constexpr (std::is_same_v<T, at::Tensor>) {
    out.push_back(value);
  } else if constexpr (OutputTensors<T>::declared) {
    OutputTensors<T>::visit(value, recurse);
  } else if constexpr (holds_no_tensor_v<T>) {
  } else if constexpr (std::is_same_v<T, torch::nn::utils::rnn::PackedSequence>) {
    out.push_back(value.data());
  } else if constexpr (is_container<T>::value) {
    for (const auto& item : value) recurse(item);
  } else if constexpr (is_map<T>::value) {
    for (const auto& item : value) recurse(item.second);
  } else if constexpr (is_tuple_like<T>::value) {
    std::apply([&](const auto&... item) { (recurse(item), ...); }, value);
  } else if constexpr (is_optional<T>::value) {
    if (value) recurse(*value);
  } else if constexpr (is_plain_struct_v<T> && member_count<T>() > 0) {
    visit_members(value, recurse);
  } else {
    static_assert(UnitOutputWithUnknownTensors<T>::value);
  }
}

}  // namespace detail
}  // namespace fsdp

#define FSDP_DETAIL_VISIT_MEMBER(member) f(value.member);
#define FSDP_DETAIL_FOR_EACH_0(...)
#define FSDP_DETAIL_FOR_EACH_1(m) FSDP_DETAIL_VISIT_MEMBER(m)
#define FSDP_DETAIL_FOR_EACH_2(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_1(__VA_ARGS__)
#define FSDP_DETAIL_FOR_EACH_3(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_2(__VA_ARGS__)
#define FSDP_DETAIL_FOR_EACH_4(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_3(__VA_ARGS__)
#define FSDP_DETAIL_FOR_EACH_5(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_4(__VA_ARGS__)
#define FSDP_DETAIL_FOR_EACH_6(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_5(__VA_ARGS__)
#define FSDP_DETAIL_FOR_EACH_7(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_6(__VA_ARGS__)
#define FSDP_DETAIL_FOR_EACH_8(m, ...) FSDP_DETAIL_VISIT_MEMBER(m) FSDP_DETAIL_FOR_EACH_7(__VA_ARGS__)
#define FSDP_DETAIL_PICK(_0, _1, _2, _3, _4, _5, _6, _7, _8, NAME, ...) NAME
#define FSDP_DETAIL_FOR_EACH(...)                                                              \
  FSDP_DETAIL_PICK(_0 __VA_OPT__(,) __VA_ARGS__, FSDP_DETAIL_FOR_EACH_8, FSDP_DETAIL_FOR_EACH_7,            \
                   FSDP_DETAIL_FOR_EACH_6, FSDP_DETAIL_FOR_EACH_5, FSDP_DETAIL_FOR_EACH_4,       \
                   FSDP_DETAIL_FOR_EACH_3, FSDP_DETAIL_FOR_EACH_2, FSDP_DETAIL_FOR_EACH_1,       \
                   FSDP_DETAIL_FOR_EACH_0)                                                     \
  (__VA_ARGS__)

/// Declares where the tensors of TYPE are (up to 8 members or getters; none for a type that holds
/// no tensor). At global scope, once per type.
#define FSDP_OUTPUT_TENSORS(TYPE, ...)                                   \
  template <>                                                            \
  struct fsdp::OutputTensors<TYPE> {                                     \
    static constexpr bool declared = true;                               \
    template <class F>                                                   \
    static void visit([[maybe_unused]] const TYPE& value, [[maybe_unused]] F&& f) { \
      FSDP_DETAIL_FOR_EACH(__VA_ARGS__)                                  \
    }                                                                    \
  }
