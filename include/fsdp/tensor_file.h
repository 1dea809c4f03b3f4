#pragma once
/// Files of named tensors that Python reads with torch.load (a dict of name to tensor) and that
/// C++ reads back; written atomically, so a crash mid-write leaves the previous file intact.

#include <fsdp/named_tensors.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp {

/// Writes `tensors` as a dict in torch.save's format: to a temporary file beside `path`, fsync,
/// then rename over `path`. Throws naming the path on failure.
///
/// Example:
///   fsdp::save_tensor_dict("weights.pt", {{"w", torch::ones({2, 2})}});
///   // python: torch.load("weights.pt")["w"]
void save_tensor_dict(const std::string& path, const NamedTensors& tensors);

/// Reads a dict of name to tensor written by save_tensor_dict or Python's torch.save, in the
/// file's order. Throws naming the file and the cause (missing, truncated, not a dict of tensors).
NamedTensors load_tensor_dict(const std::string& path);

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the folder).
void write_file_atomically(const std::string& path, const std::vector<char>& bytes);

}  // namespace fsdp
