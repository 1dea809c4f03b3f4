#include "token_file.h"

#include <filesystem>
#include <fstream>

namespace gpt {

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// The token count and the offset of the first id: llm.c's header, or none (nanoGPT).
std::pair<int64_t, int64_t> token_layout(std::ifstream& in, const std::string& path,
                                         const std::string& flag, int64_t file_bytes) {
  int32_t header[3] = {0, 0, 0};
  if (file_bytes >= kLlmcHeaderBytes) {
    in.read(reinterpret_cast<char*>(header), sizeof header);
    in.seekg(0);
  }
  if (header[0] != kLlmcMagic) {
    TORCH_CHECK(file_bytes % 2 == 0, flag, " ", path, " has ", file_bytes,
                " bytes, an odd number: it is not an array of uint16 token ids (nanoGPT's .bin)");
    return {file_bytes / 2, 0};
  }
  TORCH_CHECK(header[1] == 1, flag, " ", path, " is an llm.c token file of version ",
              header[1], "; only version 1 (uint16 ids, GPT-2) is read");
  TORCH_CHECK(header[2] >= 0 && kLlmcHeaderBytes + 2 * int64_t(header[2]) <= file_bytes,
              flag, " ", path, ": its llm.c header promises ", header[2], " tokens but the "
              "file holds ", (file_bytes - kLlmcHeaderBytes) / 2, " (a truncated copy?)");
  return {header[2], kLlmcHeaderBytes};
}

}  // namespace

bool is_token_file(const std::string& path) {
  return std::filesystem::path(path).extension() == ".bin";
}

torch::Tensor read_token_file(const std::string& path, const std::string& flag, int64_t vocab_size,
                              int64_t max_tokens, int64_t min_tokens) {
  std::error_code ec;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  TORCH_CHECK(!ec, flag, " ", path, ": ", ec.message());
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, flag, " ", path, ": cannot open it");
  const auto [count, offset] = token_layout(in, path, flag, file_bytes);
  const int64_t n = std::min(count, max_tokens);
  TORCH_CHECK(n >= min_tokens, flag, " ", path, " holds ", n, " tokens",
              count > n ? " within --max-data-mb" : "", ", fewer than the ", min_tokens,
              " needed for one sequence; use a larger file or a shorter --seq");
  auto tokens = torch::empty({n}, torch::kUInt16);
  auto* ids = static_cast<uint16_t*>(tokens.data_ptr());
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(ids), n * 2);  // little-endian, as this host
  TORCH_CHECK(in.gcount() == n * 2, flag, " ", path, ": cannot read its ", n, " tokens");
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(ids[i] < vocab_size, flag, " ", path, ": token ", i, " is id ", ids[i],
                ", outside the model's vocabulary of ", vocab_size,
                " (tokenized for another model? --init-from-hf or --vocab sets the vocabulary)");
  }
  return tokens;
}

}  // namespace gpt
