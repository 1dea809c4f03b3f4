#include "data.h"

#include <fsdp/state_dict.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace gpt {

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// Where a token file's ids lie: llm.c's header, or none (nanoGPT).
struct TokenLayout {
  int64_t count = 0;       // ids in the file
  int64_t offset = 0;      // bytes before the first
  int64_t id_bytes = 2;    // uint16 (nanoGPT, llm.c version 1) or uint32 (llm.c version 2)
};

// An llm.c header but for its magic number: a version llm.c writes, then only zeros (506 zero
// ids in a row, which no tokenized text holds). Read as raw ids it would train on the header.
bool near_miss_header(const std::array<int32_t, 256>& header) {
  return header[0] != kLlmcMagic && (header[1] == 1 || header[1] == 2) &&
         std::all_of(header.begin() + 3, header.end(), [](int32_t v) { return v == 0; });
}

TokenLayout token_layout(std::ifstream& in, const std::string& path, const std::string& flag,
                         int64_t file_bytes) {
  std::array<int32_t, 256> header{};
  if (file_bytes >= kLlmcHeaderBytes) {
    in.read(reinterpret_cast<char*>(header.data()), kLlmcHeaderBytes);
    in.seekg(0);
  }
  // A big-endian copy (byte-swapped on another machine): read as ids it would train on noise.
  TORCH_CHECK(__builtin_bswap32(static_cast<uint32_t>(header[0])) != kLlmcMagic, flag, " ", path,
              " starts with llm.c's magic ", kLlmcMagic, " byte-swapped (a big-endian copy): llm.c's "
              "token files are little-endian; swap its bytes back (numpy's byteswap(), header and ids) "
              "or write it again with llm.c's scripts");
  TORCH_CHECK(!near_miss_header(header), flag, " ", path, " starts with an llm.c header (version ",
              header[1], ", ", header[2], " tokens) whose magic number is ", header[0], ", not ",
              kLlmcMagic, "; write llm.c's magic ", kLlmcMagic, " (or, for nanoGPT's layout, no header)");
  if (header[0] != kLlmcMagic) {
    TORCH_CHECK(file_bytes % 2 == 0, flag, " ", path, " has ", file_bytes,
                " bytes, an odd number: it is not an array of uint16 token ids (nanoGPT's .bin)");
    return {file_bytes / 2, 0, 2};
  }
  TORCH_CHECK(header[1] == 1 || header[1] == 2, flag, " ", path, " is an llm.c token file of "
              "version ", header[1], "; versions 1 (uint16 ids, GPT-2) and 2 (uint32 ids, "
              "Llama 3) are read");
  const int64_t id_bytes = header[1] == 1 ? 2 : 4;
  TORCH_CHECK(header[2] >= 0 && kLlmcHeaderBytes + id_bytes * int64_t(header[2]) <= file_bytes,
              flag, " ", path, ": its llm.c header promises ", header[2], " tokens but the "
              "file holds ", (file_bytes - kLlmcHeaderBytes) / id_bytes, " (a truncated copy?)");
  return {header[2], kLlmcHeaderBytes, id_bytes};
}

// Throws naming the first id of `ids` at or above `vocab_size`.
template <class Id>
void check_ids(const Id* ids, int64_t n, int64_t vocab_size, const std::string& path,
               const std::string& flag) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(static_cast<int64_t>(ids[i]) < vocab_size, flag, " ", path, ": token ", i,
                " is id ", static_cast<int64_t>(ids[i]), ", outside the model's vocabulary of ",
                vocab_size, " (tokenized for another model? --init-from-hf or --vocab sets the "
                "vocabulary)");
  }
}

}  // namespace

bool is_token_file(const std::string& path) {
  return std::filesystem::path(path).extension() == ".bin";
}

torch::Tensor read_token_file(const std::string& path, const std::string& flag, int64_t vocab_size,
                              int64_t max_bytes, int64_t min_tokens) {
  std::error_code ec;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  TORCH_CHECK(!ec, flag, " ", path, ": ", ec.message());
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, flag, " ", path, ": cannot open it");
  const TokenLayout layout = token_layout(in, path, flag, file_bytes);
  const int64_t n = std::min(layout.count, max_bytes / layout.id_bytes);
  TORCH_CHECK(n >= min_tokens, flag, " ", path, " holds ", n, " tokens",
              layout.count > n ? " within --max-data-mb" : "", ", fewer than the ", min_tokens,
              " needed for one sequence; use a larger file or a shorter --seq");
  auto tokens = torch::empty({n}, layout.id_bytes == 2 ? torch::kUInt16 : torch::kUInt32);
  in.seekg(layout.offset);
  in.read(static_cast<char*>(tokens.data_ptr()), n * layout.id_bytes);  // little-endian, as this host
  TORCH_CHECK(in.gcount() == n * layout.id_bytes, flag, " ", path, ": cannot read its ", n, " tokens");
  if (layout.id_bytes == 2) {
    check_ids(static_cast<const uint16_t*>(tokens.const_data_ptr()), n, vocab_size, path, flag);
  } else {
    check_ids(static_cast<const uint32_t*>(tokens.const_data_ptr()), n, vocab_size, path, flag);
  }
  return tokens;
}

namespace {

namespace fs = std::filesystem;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// At most `limit` bytes of the regular file `path` (never more: /dev/zero or a huge file cost
// only what is used).
std::string read_file(const fs::path& path, size_t limit, const std::string& data) {
  std::string content;
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "--data ", data, ": cannot read ", path.string(), " (", std::strerror(errno),
              "); make it readable, or move it out of the folder to train without it");
  const size_t chunk = 1 << 20;
  while (content.size() < limit && in) {
    const size_t before = content.size();
    const size_t want = std::min(chunk, limit - before);
    content.resize(before + want);
    in.read(content.data() + before, static_cast<std::streamsize>(want));
    content.resize(before + static_cast<size_t>(in.gcount()));
  }
  return content;
}

bool looks_like_text(const std::string& content) {
  return content.find('\0') == std::string::npos;
}

// Every regular file below `folder`, and every folder below it that cannot be listed (in the
// place its files would take, so that it is named only if reading gets that far), in path order.
// Links to folders are not followed, as recursive_directory_iterator does not.
void collect(const fs::path& folder, std::vector<fs::path>& out) {
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type;
    if (it->is_directory(type) && !it->is_symlink(type)) {
      collect(it->path(), out);
    } else if (it->is_regular_file(type)) {
      out.push_back(it->path());
    }
  }
  if (ec) out.push_back(folder);
}

std::vector<fs::path> files_below(const fs::path& folder) {
  std::vector<fs::path> files;
  collect(folder, files);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

Corpus Corpus::load(const std::string& path, int64_t max_bytes, int64_t min_bytes) {
  TORCH_CHECK(!path.empty(), "no training data: pass --data PATH (a text file or a folder of text files)");
  TORCH_CHECK(max_bytes > 0, "--max-data-mb must be >= 1");
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), "--data ", path, ": no such file or folder");
  TORCH_CHECK(fs::is_regular_file(status) || fs::is_directory(status), "--data ", path,
              " is not a regular file or a folder (a FIFO or a device cannot be read to an end)");
  std::string text;
  auto append = [&](const fs::path& file) {
    std::string content = read_file(file, static_cast<size_t>(max_bytes) - text.size(), path);
    if (!looks_like_text(content)) return;
    text += content;
  };
  if (fs::is_directory(status)) {
    for (const auto& file : files_below(path)) {
      if (static_cast<int64_t>(text.size()) >= max_bytes) break;
      if (fs::is_directory(file, ec)) {  // only folders that could not be listed are entries
        std::error_code unlisted;
        fs::directory_iterator(file, unlisted);
        TORCH_CHECK(false, "--data ", path, ": cannot list ", file.string(), " (",
                    unlisted.message(), "); make it readable, or move it out of the folder");
      }
      append(file);
    }
  } else {
    append(path);
  }
  TORCH_CHECK(static_cast<int64_t>(text.size()) >= min_bytes, "--data ", path, " holds ",
              text.size(), " bytes of text, fewer than the ", min_bytes,
              " needed for one sequence; use a larger text file or folder");
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  return Corpus(bytes);
}

Corpus Corpus::load_tokens(const std::string& path, const std::string& flag, int64_t vocab_size,
                           int64_t max_bytes, int64_t min_tokens) {
  TORCH_CHECK(max_bytes > 0, "--max-data-mb must be >= 1");
  return Corpus(read_token_file(path, flag, vocab_size, max_bytes, min_tokens));
}

namespace {

// Row r of the batch starts at an offset drawn from (seed, step, first_row + r) only.
template <class Token>
void fill_rows(const Token* data, int64_t span, uint64_t seed, int64_t step, int64_t first_row,
               int64_t rows, int64_t seq, int64_t* in, int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t row = static_cast<uint64_t>(first_row + r);
    const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(step)) ^ row);
    const int64_t start = static_cast<int64_t>(h % static_cast<uint64_t>(span));
    for (int64_t t = 0; t < seq; ++t) {
      in[r * seq + t] = data[start + t];
      out[r * seq + t] = data[start + t + 1];
    }
  }
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> Corpus::batch(uint64_t seed, int64_t step,
                                                      int64_t first_row, int64_t rows,
                                                      int64_t seq) const {
  const int64_t span = size() - seq - 1;
  TORCH_CHECK(span > 0, "corpus of ", size(), " tokens is too short for sequences of ", seq);
  auto inputs = torch::empty({rows, seq}, torch::kLong);
  auto targets = torch::empty({rows, seq}, torch::kLong);
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* out = targets.data_ptr<int64_t>();
  if (tokens_.scalar_type() == torch::kUInt16) {
    fill_rows(static_cast<const uint16_t*>(tokens_.const_data_ptr()), span, seed, step, first_row,
              rows, seq, in, out);
  } else if (tokens_.scalar_type() == torch::kUInt32) {
    fill_rows(static_cast<const uint32_t*>(tokens_.const_data_ptr()), span, seed, step, first_row,
              rows, seq, in, out);
  } else {
    fill_rows(tokens_.const_data_ptr<uint8_t>(), span, seed, step, first_row, rows, seq, in, out);
  }
  return {inputs, targets};
}

void dump_batches(const TrainOptions& o, const Corpus& corpus, int world) {
  const int64_t global_rows = o.grad_accum * world * o.batch;
  std::vector<torch::Tensor> inputs, targets;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto [x, y] = corpus.batch(o.seed, step, 0, global_rows, o.model.max_seq);
    inputs.push_back(x);
    targets.push_back(y);
  }
  auto stacked = [&](const std::vector<torch::Tensor>& rows) {
    return rows.empty() ? torch::empty({0, global_rows, o.model.max_seq}, torch::kLong)
                        : torch::stack(rows);
  };
  fsdp::save_tensor_dict(o.dump_batches, {{"inputs", stacked(inputs)}, {"targets", stacked(targets)}});
}

}  // namespace gpt
