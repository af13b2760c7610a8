#include "runtime/io/safetensors.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "dispatch/data_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

// WriteRaw writes a file with the given header text and data bytes.
void WriteRaw(const std::string& path, const std::string& header, const std::string& data,
              uint64_t header_size_field) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_size_field), 8);
  out << header << data;
}

TEST(SafetensorsTest, RoundTripsEveryDTypeAndMetadata) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (at::ScalarType dtype : {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt, at::kLong,
                               at::kHalf, at::kBFloat16, at::kFloat, at::kDouble}) {
    at::Tensor t = at::isFloatingType(dtype) ? at::randn({3, 5}).to(dtype)
                                             : at::randint(0, 2, {3, 5}, at::kLong).to(dtype);
    tensors.emplace_back(absl::StrCat("t.", c10::toString(dtype)), t);
  }
  tensors.emplace_back("scalar", at::randn({}));
  tensors.emplace_back("empty", at::randn({0, 7}));
  const std::string path = TempPath("all.safetensors");
  DRAY_ASSERT_OK(WriteSafetensors(path, tensors, {{"format", "pt"}}));
  DRAY_ASSERT_OK_AND_ASSIGN(auto file, SafetensorsFile::Open(path));
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->names().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor read, file->Get(name));
    EXPECT_TRUE(SameTensor(read, tensor)) << name;
  }
}

TEST(SafetensorsTest, TensorsOutliveTheirFileAndWritesStayPrivate) {
  const std::string path = TempPath("cow.safetensors");
  DRAY_ASSERT_OK(WriteSafetensors(path, {{"x", at::arange(4, at::kFloat)}}));
  at::Tensor x;
  {
    DRAY_ASSERT_OK_AND_ASSIGN(auto file, SafetensorsFile::Open(path));
    x = file->Get("x").value();
  }
  x.add_(1);  // copy-on-write: the file is untouched
  EXPECT_EQ(x[3].item<float>(), 4.0f);
  DRAY_ASSERT_OK_AND_ASSIGN(auto again, SafetensorsFile::Open(path));
  EXPECT_EQ(again->Get("x").value()[3].item<float>(), 3.0f);
}

TEST(SafetensorsTest, MisalignedTensorsAreCopied) {
  // A U8 tensor of 3 bytes puts the F32 after it at offset 3.
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}})";
  std::string data = "xyz";
  const float b[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(b), 8);
  const std::string path = TempPath("misaligned.safetensors");
  WriteRaw(path, header, data, header.size());
  DRAY_ASSERT_OK_AND_ASSIGN(auto file, SafetensorsFile::Open(path));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor read, file->Get("b"));
  EXPECT_EQ(read[0].item<float>(), 1.5f);
  EXPECT_EQ(read[1].item<float>(), -2.0f);
}

TEST(SafetensorsTest, ShardedCheckpointsLoadThroughTheirIndex) {
  const std::string dir = TempPath("sharded");
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int i = 0; i < 6; ++i)
    tensors.emplace_back(absl::StrCat("layer", i, ".weight"), at::randn({64, 64}));
  DRAY_ASSERT_OK(WriteShardedSafetensors(dir, "diffusion_pytorch_model", tensors, 40000));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "diffusion_pytorch_model-00001-of-00003.safetensors"));
  DRAY_ASSERT_OK_AND_ASSIGN(
      Checkpoint checkpoint,
      Checkpoint::Open(dir + "/diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_EQ(checkpoint.names().size(), 6u);
  for (const auto& [name, tensor] : tensors) {
    EXPECT_TRUE(SameTensor(checkpoint.Get(name).value(), tensor)) << name;
  }
}

TEST(SafetensorsTest, ErrorsNameTheFileAndTheProblem) {
  const std::string path = TempPath("good.safetensors");
  DRAY_ASSERT_OK(WriteSafetensors(path, {{"w", at::randn({4, 4})}}));
  DRAY_ASSERT_OK_AND_ASSIGN(Checkpoint checkpoint, Checkpoint::Open(path));
  EXPECT_THAT(checkpoint.Get("v"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no tensor 'v'")));
  EXPECT_THAT(checkpoint.Load("w", {4, 5}, at::kFloat),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'w' has shape [4, 4], the model expects [4, 5]")));
  EXPECT_THAT(Checkpoint::Open(std::getenv("TEST_TMPDIR")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
  EXPECT_THAT(SafetensorsFile::Open(TempPath("missing.safetensors")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.safetensors")));

  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string truncated = TempPath("truncated.safetensors");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  EXPECT_THAT(
      SafetensorsFile::Open(truncated),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 'w' has bytes [0, 64)")));
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, 5);
  EXPECT_THAT(SafetensorsFile::Open(truncated),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));

  const std::string bad = TempPath("bad.safetensors");
  WriteRaw(bad, "{not json", "", 9);
  EXPECT_THAT(SafetensorsFile::Open(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("header is not a JSON object")));
  WriteRaw(bad, "{}", "", 1 << 30);
  EXPECT_THAT(SafetensorsFile::Open(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("header length 1073741824")));
  const std::string wrong_size = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})";
  WriteRaw(bad, wrong_size, "abcd", wrong_size.size());
  EXPECT_THAT(SafetensorsFile::Open(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("needs 8 bytes, the header gives 4")));
  const std::string unknown = R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})";
  WriteRaw(bad, unknown, "abcdefgh", unknown.size());
  EXPECT_THAT(SafetensorsFile::Open(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unsupported dtype C64")));
  const std::string negative = R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})";
  WriteRaw(bad, negative, "abcd", negative.size());
  EXPECT_THAT(SafetensorsFile::Open(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("not a non-negative integer")));
}

}  // namespace
}  // namespace dray
