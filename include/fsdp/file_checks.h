#pragma once
/// Files named inside folders (a checkpoint's metadata.json and shards, its `latest` pointer, a
/// Hugging Face model's config.json, index and shards), read so that a damaged or hostile folder
/// fails at once with a message naming the file and the rule broken:
/// - never blocking: a FIFO or a device in place of a file is refused before any read (a FIFO
///   without a writer would block forever, a device never ends);
/// - bounded: a file of a format with a natural size is refused by its size, unread;
/// - inside its folder: a name read from one file (a shard named by metadata.json, a step folder
///   named by `latest`) cannot lead out of the folder that file describes.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

/// Opens `path` read-only and close-on-exec without blocking (O_NONBLOCK: a FIFO with no writer
/// opens at once), checks that it is a regular file, then makes reads blocking again. Returns the
/// descriptor, which the caller closes, and the file's size in `*bytes`. Throws naming `what`
/// (e.g. "a safetensors file"), the path and the cause (missing, a FIFO, a folder, a device).
int open_regular_file(const std::string& path, const std::string& what, int64_t* bytes);

/// The whole of the regular file `path` (open_regular_file), refused unread when it holds more
/// than `max_bytes`: `what` names what the file should be ("a checkpoint's metadata.json").
///
/// Example:
///   const std::vector<char> text = fsdp::read_regular_file("run/config.json", 1 << 20,
///                                                          "a model's config.json");
std::vector<char> read_regular_file(const std::string& path, int64_t max_bytes,
                                    const std::string& what);

/// Throws unless `name`, read from the file `source`, is a relative path with no ".." component:
/// a name of a file inside the folder that `source` describes. Follows no link: for folders whose
/// files may be links elsewhere by design (a Hugging Face cache snapshot links to ../../blobs).
void check_relative_name(const std::string& name, const std::string& source);

/// check_relative_name, and `folder`/`name`, with every link in it resolved, lies inside `folder`
/// (itself resolved): for folders that one writer fills with plain files (a checkpoint).
void check_name_inside(const std::string& folder, const std::string& name,
                       const std::string& source);

}  // namespace fsdp
