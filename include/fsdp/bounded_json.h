#pragma once
/// JSON read from files a user can edit (a checkpoint's metadata.json, a Hugging Face
/// config.json or index, a safetensors header, a --model-json description, the run lock's line),
/// parsed so that a hostile file fails with one line: nesting is bounded before nlohmann parses
/// anything (a 100,000-deep array in a 200 KB file crashes a recursive dump of it), and a value
/// shown in a message is cut to a length.
///
/// Example:
///   const nlohmann::json j = fsdp::parse_json_bounded(text, "run/config.json");
///   TORCH_CHECK(j["n_layer"].is_number_integer(), "n_layer is ", fsdp::json_excerpt(j["n_layer"]));

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace fsdp {

/// Arrays and objects nested deeper than this are no file this project reads (its own files nest
/// 4 deep; a Hugging Face config.json a few).
constexpr int kMaxJsonDepth = 64;

/// `text` parsed, refused unparsed (a c10::Error naming `source`, the depth and the fix) when its
/// arrays and objects nest deeper than kMaxJsonDepth. Malformed text throws nlohmann's
/// parse_error as nlohmann::json::parse does: callers name their file around it.
nlohmann::json parse_json_bounded(std::string_view text, const std::string& source);

/// `value` as compact JSON, cut to at most `max_chars` characters ("..." marks a cut): how a
/// message shows a value read from a file.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 64);

}  // namespace fsdp
