// [Note: boxes of a tensor-parallel part] (src/io/global_boxes.h): the boxes of the whole
// parameter that a range of a tp rank's flattened part holds. The part is made as DTensor's
// Shard(dim) lays a tensor out (torch.chunk of the whole; a fused parameter's slices each
// chunked), and each box checked by indexing the whole, not by the mapping's arithmetic.
#include "io/global_boxes.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

struct Case {
  std::vector<int64_t> shape;
  int64_t dim;
  int64_t chunks;
  int64_t ranks;
};

// Rank `rank`'s part of `whole`: each of its `chunks` slices along `dim` split over `ranks`.
torch::Tensor part_of(const torch::Tensor& whole, const Case& c, int64_t rank) {
  std::vector<torch::Tensor> slices;
  for (const auto& slice : whole.chunk(c.chunks, c.dim)) slices.push_back(slice.chunk(c.ranks, c.dim)[rank]);
  return torch::cat(slices, c.dim);
}

}  // namespace

TEST(GlobalBoxes, EveryRangeOfEveryRanksPartLiesWhereItsBoxesSay) {
  const std::vector<Case> cases = {{{12, 4}, 0, 3, 2},  // GPT-2's c_attn weight: q, k, v, each split
                                   {{12}, 0, 3, 2},     // its bias
                                   {{4, 6}, 1, 1, 2},   // a row-wise weight: a column block
                                   {{4, 6}, 1, 1, 3},
                                   {{6}, 0, 1, 3},      // a column-wise bias
                                   {{2, 4, 3}, 1, 2, 2}};
  for (const Case& c : cases) {
    const auto whole = torch::arange(c10::multiply_integers(c.shape), torch::kLong).view(c.shape);
    for (int64_t rank = 0; rank < c.ranks; ++rank) {
      const torch::Tensor part = part_of(whole, c, rank).contiguous();
      const fsdp::detail::PartInWhole placement{c.dim, c.chunks, rank, c.shape};
      const torch::Tensor flat = part.reshape({-1});
      for (int64_t begin = 0; begin <= flat.numel(); ++begin) {
        for (int64_t end = begin; end <= flat.numel(); ++end) {
          const torch::Tensor piece = flat.narrow(0, begin, end - begin);
          std::vector<torch::Tensor> held;
          for (const auto& box : fsdp::detail::boxes_in_whole(part.sizes().vec(), begin, end, placement)) {
            torch::Tensor in_whole = whole;
            for (size_t d = 0; d < c.shape.size(); ++d) {
              in_whole = in_whole.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
            }
            EXPECT_TRUE(torch::equal(box.view_in(piece, begin), in_whole))
                << "rank " << rank << " of " << c.ranks << ", range [" << begin << ", " << end << ")";
            held.push_back(in_whole.reshape({-1}));
          }
          // Together the boxes hold the range's elements, each once.
          const torch::Tensor all = held.empty() ? torch::empty({0}, torch::kLong) : torch::cat(held);
          EXPECT_TRUE(torch::equal(std::get<0>(all.sort()), std::get<0>(piece.sort())))
              << "rank " << rank << ", range [" << begin << ", " << end << ")";
        }
      }
    }
  }
}

TEST(GlobalBoxes, ABoxIsARangeOnlyWhenItsElementsFollowEachOther) {
  int64_t begin = 0, end = 0;
  EXPECT_TRUE(fsdp::detail::box_is_range({4, 6}, {1, 0}, {2, 6}, begin, end));
  EXPECT_EQ(begin, 6);
  EXPECT_EQ(end, 18);
  EXPECT_TRUE(fsdp::detail::box_is_range({4, 6}, {1, 2}, {1, 3}, begin, end));
  EXPECT_EQ(begin, 8);
  EXPECT_EQ(end, 11);
  EXPECT_FALSE(fsdp::detail::box_is_range({4, 6}, {0, 3}, {4, 3}, begin, end));  // a column block
}
