#include <fsdp/bounded_json.h>

#include <c10/util/Exception.h>

namespace fsdp {

namespace {

// The byte at which `text` first nests deeper than `limit` (brackets inside strings do not
// count), or npos. One pass, no recursion: it runs before the parser sees the text.
size_t too_deep_at(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

nlohmann::json parse_json_bounded(std::string_view text, const std::string& source) {
  const size_t at = too_deep_at(text, kMaxJsonDepth);
  TORCH_CHECK(at == std::string_view::npos, source, " nests arrays and objects more than ",
              kMaxJsonDepth, " deep (at byte ", at, "): no file of its kind does, and it was not "
              "parsed; replace it with the file its writer wrote");
  return nlohmann::json::parse(text);
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() <= max_chars) return text;
  const size_t keep = max_chars > 3 ? max_chars - 3 : 0;
  return text.substr(0, keep) + "...";
}

}  // namespace fsdp
