// The staging arena of an asynchronous save (src/io/staging_arena.h).
#include "io/staging_arena.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace fsdp::detail {

namespace {

// Each copy starts 64-byte aligned: any dtype's view of the arena's bytes is then valid.
constexpr int64_t kAlignment = 64;

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

int64_t staged_bytes(const ShardFileContents& file) {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : file.tensors) bytes += aligned(static_cast<int64_t>(tensor.nbytes()));
  return bytes;
}

std::vector<std::pair<size_t, size_t>> plan_waves(const std::vector<ShardFileContents>& files, int64_t budget) {
  std::vector<std::pair<size_t, size_t>> waves;
  int64_t used = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    const int64_t bytes = staged_bytes(files[k]);
    TORCH_CHECK(bytes <= budget, "save_checkpoint_async: shard file ", k, " of this rank stages ", bytes,
                " bytes, more than the staging budget of ", budget, " bytes; raise "
                "AsyncSaveOptions::staging_budget_bytes to at least ", bytes, " (or leave it 0: one rank's shards)");
    if (waves.empty() || used + bytes > budget) {
      waves.emplace_back(k, k);
      used = 0;
    }
    waves.back().second = k + 1;
    used += bytes;
  }
  return waves;
}

StagingArena::StagingArena(int64_t bytes, bool pinned)
    : memory_(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned))), pinned_(pinned) {}

void StagingArena::fault_in() {
  if (!pinned_) std::memset(memory_.data_ptr(), 0, static_cast<size_t>(memory_.numel()));
}

void StagingArena::stage(std::vector<ShardFileContents>& files, size_t first, size_t last) {
  int64_t used = 0;
  for (size_t k = first; k < last; ++k) {
    for (auto& [name, tensor] : files[k].tensors) {
      const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
      TORCH_CHECK(used + bytes <= memory_.numel(), "save_checkpoint_async: the staging arena of ",
                  memory_.numel(), " bytes cannot hold ", name, " (", bytes, " bytes after ", used, ")");
      at::Tensor copy = memory_.narrow(0, used, bytes).view(tensor.scalar_type()).view(tensor.sizes());
      copy.copy_(tensor);  // blocking: training may change `tensor` as soon as staging returns
      tensor = copy;
      used += aligned(bytes);
    }
  }
}

}  // namespace fsdp::detail
