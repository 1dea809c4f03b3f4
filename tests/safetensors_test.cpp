// safetensors files and the boxes a flat shard is saved as: round trips, positioned reads, and the
// named errors of files that lie (truncated, offsets that overlap or leave holes, a dtype or shape
// that disagrees with the bytes). Python's own readers check the same files in
// tests/dcp_interop_e2e.py.
#include "io/tensor_boxes.h"

#include <fsdp/safetensors.h>

#include <gtest/gtest.h>

#include "temp_dir.h"
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

using fsdp_test::TempDir;

// Writes a safetensors file by hand: the header text as given, then `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
}

void expect_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    fsdp::SafetensorsReader reader(path);
    ADD_FAILURE() << path << " opened without an error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(Safetensors, RoundTripKeepsEveryTensorBitwiseAndTheMetadata) {
  TempDir tmp;
  torch::manual_seed(0);
  const fsdp::NamedTensors tensors = {
      {"a.weight", torch::randn({3, 5})},
      {"b", torch::randn({7}).to(torch::kBFloat16)},
      {"ids", torch::arange(11, torch::kLong)},
      {"step", torch::scalar_tensor(4.0)},
      {"empty", torch::zeros({0, 3})}};
  const auto written = fsdp::save_safetensors(tmp / "x.safetensors", tensors, {{"k", "v"}});
  fsdp::SafetensorsReader reader(tmp / "x.safetensors");
  EXPECT_EQ(reader.file_bytes(), written.bytes);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(tmp / "x.safetensors")), written.bytes);
  EXPECT_EQ(reader.metadata().at("k"), "v");
  ASSERT_EQ(reader.entries().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const auto back = reader.read(name);
    EXPECT_EQ(back.sizes(), tensor.sizes()) << name;
    EXPECT_TRUE(torch::equal(back, tensor)) << name;
  }
  // A positioned read of elements [4, 9) of a matrix.
  EXPECT_TRUE(torch::equal(reader.read_range("a.weight", 4, 9),
                           tensors[0].second.reshape({-1}).slice(0, 4, 9)));
  EXPECT_THROW(reader.read_range("a.weight", 10, 16), c10::Error);  // past its 15 elements
  EXPECT_THROW(reader.entry("absent"), c10::Error);
}

TEST(Safetensors, FilesThatLieGiveNamedErrors) {
  TempDir tmp;
  fsdp::save_safetensors(tmp / "good.safetensors", {{"w", torch::ones({4, 4})}});
  const auto size = fs::file_size(tmp / "good.safetensors");

  fs::copy_file(tmp / "good.safetensors", tmp / "truncated.safetensors");
  fs::resize_file(tmp / "truncated.safetensors", size - 5);
  expect_error(tmp / "truncated.safetensors", {"truncated.safetensors", "truncated"});
  fs::copy_file(tmp / "good.safetensors", tmp / "stub.safetensors");
  fs::resize_file(tmp / "stub.safetensors", 20);  // inside the header
  expect_error(tmp / "stub.safetensors", {"stub.safetensors", "header length", "past the end"});
  write_raw(tmp / "tiny.safetensors", "", 0);
  fs::resize_file(tmp / "tiny.safetensors", 3);
  expect_error(tmp / "tiny.safetensors", {"3 bytes"});

  write_raw(tmp / "shape.safetensors",
            R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,60]}})", 60);
  expect_error(tmp / "shape.safetensors", {"'w'", "need 64 bytes"});
  write_raw(tmp / "dtype.safetensors",
            R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4);
  expect_error(tmp / "dtype.safetensors", {"'w'", "F8_E4M3"});
  write_raw(tmp / "overlap.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  expect_error(tmp / "overlap.safetensors", {"overlap", "'b'"});
  write_raw(tmp / "hole.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20);
  expect_error(tmp / "hole.safetensors", {"hole", "'b'"});
  write_raw(tmp / "past.safetensors",
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_error(tmp / "past.safetensors", {"describes 16 bytes", "holds 8", "truncated"});
  write_raw(tmp / "json.safetensors", R"({"a": {"dtype": )", 0);
  expect_error(tmp / "json.safetensors", {"not JSON"});
}

// A header may claim any shape: one whose bytes wrap around int64 must not pass for the small span
// it claims (2^62 + 96 floats are 2^64 + 384 bytes, 384 modulo 2^64), or read_range would hand
// out the bytes of the tensors after it.
TEST(Safetensors, ShapesWhoseBytesOverflowAreRefusedNamingTheTensor) {
  TempDir tmp;
  write_raw(tmp / "wrap.safetensors",
            R"({"w":{"dtype":"F32","shape":[4611686018427388000],"data_offsets":[0,384]}})", 384);
  expect_error(tmp / "wrap.safetensors", {"wrap.safetensors", "'w'", "more bytes than int64"});
  // The elements alone overflow, in the middle of the shape: 2^32 * 2^32 * 2 wraps to the 0 bytes
  // of the span [0, 0) that it claims.
  write_raw(tmp / "numel.safetensors",
            R"({"v":{"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}})", 0);
  expect_error(tmp / "numel.safetensors", {"'v'", "more bytes than int64"});
  write_raw(tmp / "inverted.safetensors",
            R"({"u":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", 8);
  expect_error(tmp / "inverted.safetensors", {"'u'", "[8, 4)", "not a range"});
}

TEST(Safetensors, AFifoIsRefusedWithoutBlocking) {
  TempDir tmp;
  ASSERT_EQ(::mkfifo((tmp / "fifo.safetensors").c_str(), 0600), 0);
  expect_error(tmp / "fifo.safetensors", {"fifo.safetensors", "is a FIFO", "regular file"});
}

// Every range of every small tensor: the boxes tile it exactly, in order, each box being the
// elements [begin, end) (checked by indexing the tensor, not by the decomposition's arithmetic),
// with at most 2n - 1 boxes for n dimensions.
TEST(TensorBoxes, TileEveryRangeOfAFlatShardExactly) {
  const std::vector<std::vector<int64_t>> shapes = {{}, {7}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}, {5, 1}};
  for (const auto& shape : shapes) {
    const auto index = torch::arange(c10::multiply_integers(shape), torch::kLong).view(shape);
    const int64_t numel = index.numel();
    for (int64_t begin = 0; begin <= numel; ++begin) {
      for (int64_t end = begin; end <= numel; ++end) {
        const auto boxes = fsdp::boxes_of_range(shape, begin, end);
        EXPECT_LE(boxes.size(), std::max<size_t>(1, 2 * shape.size() - 1));
        int64_t next = begin;
        for (const auto& box : boxes) {
          ASSERT_EQ(box.offsets.size(), shape.size());
          torch::Tensor part = index;
          for (size_t d = 0; d < shape.size(); ++d) {
            part = part.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
          }
          EXPECT_EQ(box.begin, next);
          EXPECT_TRUE(torch::equal(part.reshape({-1}), torch::arange(box.begin, box.end, torch::kLong)))
              << "range [" << begin << ", " << end << ") of a " << shape.size() << "-d tensor";
          next = box.end;
        }
        EXPECT_EQ(next, end);
      }
    }
  }
}

}  // namespace
