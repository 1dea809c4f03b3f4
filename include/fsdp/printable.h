#pragma once
// What a one-line message may echo of a user's text (a path, a line read from a file).

#include <cstddef>
#include <cstdio>
#include <string>

namespace fsdp {

/// The longest part of a user's text that a message shows, by default.
constexpr size_t kMaxShownBytes = 512;

/// `text` as a one-line message can show it: a byte outside printable ASCII (a newline, a
/// terminal's escape, a byte of UTF-8) as \xNN, at most `max_bytes` of it, then "..." when cut.
/// A path with a newline or a lock line with an escape sequence can then neither split the
/// message nor drive the terminal.
///
/// Example:
///   TORCH_CHECK(ok, "--checkpoint-dir ", fsdp::printable(dir), " is ...");
inline std::string printable(const std::string& text, size_t max_bytes = kMaxShownBytes) {
  std::string out;
  for (unsigned char c : text.substr(0, max_bytes)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    }
  }
  return text.size() > max_bytes ? out + "..." : out;
}

}  // namespace fsdp
