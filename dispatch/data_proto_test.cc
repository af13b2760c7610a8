#include "dispatch/data_proto.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <sstream>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Batch returns `rows` rows: "ids" = row index, "features" = [rows, 3] floats,
// "text" = "row<i>", "images" = 1x1 raw RGB pixels of value i, meta step=7.
DataProto Batch(int64_t rows) {
  std::vector<std::string> text;
  std::vector<Image> images;
  for (int64_t i = 0; i < rows; ++i) {
    text.push_back("row" + std::to_string(i));
    images.push_back(Image{Image::Format::kRaw, 1, 1, 3, std::string(3, static_cast<char>(i))});
  }
  return DataProto::Make({{"ids", at::arange(rows, at::kLong)},
                          {"features", at::arange(rows * 3, at::kFloat).reshape({rows, 3})}},
                         {{"text", text}, {"images", images}}, {{"step", int64_t{7}}})
      .value();
}

// Ids returns the "ids" column, which Batch() fills with the original row numbers.
std::vector<int64_t> Ids(const DataProto& data) {
  const at::Tensor ids = data.GetTensor("ids").value().contiguous();
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

std::vector<std::string> Text(const DataProto& data) {
  return *data.GetRows<std::string>("text").value();
}

// ExpectRowsConsistent checks that every column of a Batch()-derived
// DataProto still describes the same original row.
void ExpectRowsConsistent(const DataProto& data) {
  const std::vector<int64_t> ids = Ids(data);
  const std::vector<std::string> text = Text(data);
  const at::Tensor features = data.GetTensor("features").value();
  ASSERT_EQ(text.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(text[i], "row" + std::to_string(ids[i]));
    EXPECT_EQ(features[i][0].item<float>(), ids[i] * 3.0f);
  }
}

TEST(DataProtoTest, MakeChecksColumns) {
  EXPECT_EQ(Batch(5).size(), 5);
  EXPECT_EQ(DataProto().size(), 0);
  EXPECT_THAT(DataProto::Make({{"a", at::zeros({3})}, {"b", at::zeros({4})}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("inconsistent batch sizes: tensor column 'b' has 4 rows")));
  EXPECT_THAT(DataProto::Make({{"a", at::zeros({3})}}, {{"t", std::vector<int64_t>{1, 2}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("column 't' has 2 rows")));
  EXPECT_THAT(DataProto::Make({{"a", at::zeros({3})}}, {{"a", std::vector<int64_t>{1, 2, 3}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate column 'a'")));
  EXPECT_THAT(DataProto::Make({{"scalar", at::zeros({})}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'scalar' is 0-d")));
  EXPECT_THAT(DataProto::Make({{"none", at::Tensor()}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'none' is undefined")));
}

TEST(DataProtoTest, PrintsItsColumnsNotItsValues) {
  std::ostringstream out;
  out << Batch(2);
  EXPECT_EQ(out.str(),
            "DataProto(2 rows; ids [2] Long, features [2, 3] Float, text, images; meta step)");
}

TEST(DataProtoTest, AccessorsNameWhatIsMissing) {
  const DataProto data = Batch(2);
  EXPECT_THAT(data.GetTensor("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));
  EXPECT_THAT(data.GetRows<double>("text"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("column 'text' holds strings, not doubles")));
  EXPECT_EQ(data.GetMeta<int64_t>("step").value(), 7);
  EXPECT_THAT(data.GetMeta<std::string>("step"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds int, not string")));
  EXPECT_THAT(data.GetMeta<bool>("missing"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(DataProtoTest, SelectKeepsChosenColumns) {
  const DataProto data = Batch(4);
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto selected,
      data.Select({std::vector<std::string>{"ids"}, std::vector<std::string>{}, std::nullopt}));
  EXPECT_EQ(selected.size(), 4);
  EXPECT_EQ(selected.tensors().size(), 1u);
  EXPECT_TRUE(selected.non_tensors().empty());
  EXPECT_EQ(selected.meta_info().size(), 1u);
  EXPECT_THAT(data.Select({std::vector<std::string>{"nope"}, std::nullopt, std::nullopt}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));
  EXPECT_THAT(data.Select({std::nullopt, std::nullopt, std::vector<std::string>{"lr"}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("meta key 'lr'")));
}

TEST(DataProtoTest, PopColumnsMovesColumnsOut) {
  DataProto data = Batch(3);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto popped, data.PopColumns({std::vector<std::string>{"features"},
                                                               std::vector<std::string>{"text"},
                                                               std::vector<std::string>{"step"}}));
  EXPECT_EQ(popped.size(), 3);
  EXPECT_TRUE(popped.HasColumn("features"));
  EXPECT_TRUE(popped.HasColumn("text"));
  EXPECT_FALSE(data.HasColumn("features"));
  EXPECT_FALSE(data.HasColumn("text"));
  EXPECT_TRUE(data.meta_info().empty());
  EXPECT_EQ(data.size(), 3);
  DRAY_ASSERT_OK(data.PopColumns({std::vector<std::string>{"ids"},
                                  std::vector<std::string>{"images"}, std::nullopt})
                     .status());
  EXPECT_EQ(data.size(), 0);
}

TEST(DataProtoTest, RenameLeavesInputAlone) {
  const DataProto data = Batch(2);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto renamed, data.Rename("text", "prompt"));
  EXPECT_TRUE(renamed.HasColumn("prompt"));
  EXPECT_FALSE(renamed.HasColumn("text"));
  EXPECT_TRUE(data.HasColumn("text"));
  EXPECT_THAT(data.Rename("text", "ids"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate column 'ids'")));
  EXPECT_THAT(data.Rename("nope", "x"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(DataProtoTest, UnionJoinsColumnsAndRejectsConflicts) {
  const DataProto data = Batch(3);
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto extra,
      DataProto::Make({{"reward", at::zeros({3})}}, {{"ids", std::vector<int64_t>{9, 9, 9}}}));
  EXPECT_THAT(data.Union(extra),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate column 'ids'")));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rewards, DataProto::Make({{"reward", at::zeros({3})}}));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto joined, data.Union(rewards));
  EXPECT_TRUE(joined.HasColumn("reward"));
  EXPECT_FALSE(data.HasColumn("reward"));
  DRAY_ASSERT_OK(joined.Union(data).status());  // same values under the same names: fine
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto other_ids,
                            DataProto::Make({{"ids", at::zeros({3}, at::kLong)}}));
  EXPECT_THAT(data.Union(other_ids),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'ids' differs")));
  DataProto other_meta = Batch(3);
  other_meta.SetMeta("step", int64_t{8});
  EXPECT_THAT(data.Union(other_meta),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("meta key 'step'")));
  EXPECT_THAT(data.Union(Batch(4).Rename("ids", "other").value()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inconsistent batch sizes")));
}

TEST(DataProtoTest, SelectRowsByIndexMaskAndSlice) {
  const DataProto data = Batch(10);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto picked, data.SelectRows({3, -1, 3}));
  EXPECT_THAT(Ids(picked), ElementsAre(3, 9, 3));
  ExpectRowsConsistent(picked);
  EXPECT_THAT(data.SelectRows({10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row index 10 is out of range for a batch of 10")));

  std::vector<bool> mask(10, false);
  mask[2] = mask[5] = true;
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto masked, data.SelectMask(mask));
  EXPECT_THAT(Ids(masked), ElementsAre(2, 5));
  ExpectRowsConsistent(masked);
  EXPECT_THAT(data.SelectMask({true}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("1 entries for a batch of 10")));

  EXPECT_THAT(Ids(data.Slice(-3, 100).value()), ElementsAre(7, 8, 9));
  EXPECT_THAT(Ids(data.Slice(1, 8, 3).value()), ElementsAre(1, 4, 7));
  EXPECT_EQ(data.Slice(6, 2).value().size(), 0);
  ExpectRowsConsistent(data.Slice(1, 8, 3).value());
  EXPECT_THAT(data.Slice(0, 5, 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataProtoTest, ChunkNeedsDivisibleBatch) {
  const DataProto data = Batch(8);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> chunks, data.Chunk(4));
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_THAT(Ids(chunks[3]), ElementsAre(6, 7));
  ExpectRowsConsistent(chunks[3]);
  EXPECT_EQ(chunks[0].GetMeta<int64_t>("step").value(), 7);
  EXPECT_THAT(Batch(10).Chunk(4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PadToDivisor(4)")));
  EXPECT_THAT(data.Chunk(0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataProtoTest, SplitLeavesShortLastPiece) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> pieces, Batch(10).Split(3));
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_THAT(Ids(pieces[3]), ElementsAre(9));
  EXPECT_EQ(pieces[0].size(), 3);
  EXPECT_THAT(Batch(1).Split(-1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataProtoTest, ConcatJoinsRowsAndMergesMeta) {
  const DataProto data = Batch(10);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> pieces, data.Split(4));
  pieces[1].SetMeta("rank", int64_t{1});
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto joined, DataProto::Concat(pieces));
  EXPECT_EQ(joined.size(), 10);
  ExpectRowsConsistent(joined);
  EXPECT_EQ(Ids(joined), Ids(data));
  EXPECT_EQ(joined.GetMeta<int64_t>("rank").value(), 1);

  pieces[2].SetMeta("rank", int64_t{2});
  EXPECT_THAT(DataProto::Concat(pieces),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("meta key 'rank' has conflicting values (piece 2")));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto half, DataProto::Make({{"ids", at::zeros({2}, at::kHalf)}}));
  EXPECT_THAT(DataProto::Concat({data.Select({std::vector<std::string>{"ids"},
                                              std::vector<std::string>{}, std::nullopt})
                                     .value(),
                                 half}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("piece 1 of the concat: tensor column 'ids' is Half")));
  EXPECT_THAT(
      DataProto::Concat({data, Batch(2).Rename("text", "prompt").value()}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no non-tensor column 'text'")));
  EXPECT_EQ(DataProto::Concat({}).value().size(), 0);
}

TEST(DataProtoTest, RepeatInterleavedOrTiled) {
  const DataProto data = Batch(2);
  EXPECT_THAT(Ids(data.Repeat(3, /*interleave=*/true).value()), ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_THAT(Ids(data.Repeat(2, /*interleave=*/false).value()), ElementsAre(0, 1, 0, 1));
  ExpectRowsConsistent(data.Repeat(3).value());
  EXPECT_THAT(data.Repeat(0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataProtoTest, ReorderNeedsPermutation) {
  const DataProto data = Batch(3);
  EXPECT_THAT(Ids(data.Reorder({2, 0, 1}).value()), ElementsAre(2, 0, 1));
  ExpectRowsConsistent(data.Reorder({2, 0, 1}).value());
  EXPECT_THAT(data.Reorder({0, 0, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a permutation")));
  EXPECT_THAT(data.Reorder({0, 1}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataProtoTest, PadAndUnpadNeverMutateInput) {
  const DataProto data = Batch(10);
  DRAY_ASSERT_OK_AND_ASSIGN(PaddedDataProto padded, data.PadToDivisor(4));
  EXPECT_EQ(padded.pad_size, 2);
  EXPECT_THAT(Ids(padded.data), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1));
  ExpectRowsConsistent(padded.data);
  EXPECT_EQ(data.size(), 10);  // verl pads the caller's batch in place; dray does not
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto unpadded, padded.data.Unpad(padded.pad_size));
  EXPECT_TRUE(SameDataProto(unpadded, data));
  EXPECT_EQ(data.PadToDivisor(5).value().pad_size, 0);
  // A batch smaller than the divisor pads by cycling its rows.
  EXPECT_THAT(Ids(Batch(1).PadToDivisor(3).value().data), ElementsAre(0, 0, 0));
  EXPECT_THAT(data.Unpad(11), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataProtoTest, DataParallelRoundTripIsIdentity) {
  for (int64_t rows : {0, 1, 3, 10, 17}) {
    for (int64_t world : {1, 2, 3, 4}) {
      const DataProto data = Batch(rows);
      DRAY_ASSERT_OK_AND_ASSIGN(PaddedDataProto padded, data.PadToDivisor(world));
      DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> shards, padded.data.Chunk(world));
      ASSERT_EQ(static_cast<int64_t>(shards.size()), world);
      DRAY_ASSERT_OK_AND_ASSIGN(DataProto joined, DataProto::Concat(shards));
      DRAY_ASSERT_OK_AND_ASSIGN(DataProto result, joined.Unpad(padded.pad_size));
      EXPECT_TRUE(SameDataProto(result, data)) << rows << " rows over " << world;
    }
  }
}

TEST(DataProtoTest, SameTensorComparesBytes) {
  const at::Tensor nan = at::full({2}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(SameTensor(nan, nan.clone()));
  EXPECT_FALSE(SameTensor(at::zeros({2}), at::zeros({2}, at::kDouble)));
  EXPECT_FALSE(SameTensor(at::zeros({2}), at::zeros({1, 2})));
  EXPECT_FALSE(SameTensor(at::zeros({1}), -at::zeros({1})));
}

TEST(DataProtoTest, ContentBytesCountsTheRowsOnly) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto batch,
      DataProto::Make(
          {{"latents", at::zeros({2, 3}, at::kFloat)}},
          {{"prompts", std::vector<std::string>{"ab", "cde"}},
           {"seeds", std::vector<int64_t>{1, 2}},
           {"images", std::vector<Image>{Image{Image::Format::kRaw, 1, 2, 3, std::string(6, 'x')},
                                         Image{Image::Format::kRaw, 1, 1, 1, "y"}}}},
          {{"lr", 0.5}}));
  EXPECT_EQ(ContentBytes(batch), 2 * 3 * 4 + 5 + 2 * 8 + 7);
  EXPECT_EQ(ContentBytes(DataProto()), 0);
}

}  // namespace
}  // namespace dray
