#pragma once
// A file gpt_train writes (--metrics, --trace, --save-full, --dump-batches, --eval-out,
// --export-hf) that cannot be written (a full disk, an I/O error) ends the run with one line
// naming the flag, the path, the cause and the fix: never a C++ backtrace, never an exit 0 with
// the output lost.

#include <fsdp/error_text.h>

#include <c10/util/Exception.h>

#include <string>

namespace gpt {

/// The one-line error of an output that could not be written.
inline std::string output_failed(const std::string& flag, const std::string& path,
                                 const std::string& cause) {
  return flag + " " + path + ": cannot write it (" + cause + "); free space there or pass " +
         "another " + flag;
}

/// Runs `write` (which writes `path`); any error it throws becomes output_failed's line.
template <class Write>
void write_output(const std::string& flag, const std::string& path, Write&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, output_failed(flag, path, fsdp::message_of(e)));
  }
}

}  // namespace gpt
