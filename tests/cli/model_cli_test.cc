// `dray init-model`, `dray edit`, `dray parity` and `dray --version`, run as
// a user would run them.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference.h"
#include "tests/runtime/test_util.h"
#include "workers/image/image_codec.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// RunDray runs `dray args` and returns {exit code, stdout and stderr}.
std::pair<int, std::string> RunDray(const std::string& args) {
  FILE* pipe = popen(absl::StrCat(RunfilePath("cli/dray"), " ", args, " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string Reference() { return ReferencePath(""); }

TEST(ModelCliTest, InitModelWritesADiffusersDirectory) {
  const fs::path out = fs::path(std::getenv("TEST_TMPDIR")) / "tiny";
  const auto [code, output] =
      RunDray(absl::StrCat("init-model --preset tiny --out ", out.string(), " --seed 3"));
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("wrote a random tiny Qwen-Image-Edit model (seed 3)"));
  for (const char* file :
       {"model_index.json", "scheduler/scheduler_config.json", "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors", "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors", "text_encoder/config.json",
        "text_encoder/model.safetensors", "tokenizer/tokenizer.json",
        "processor/preprocessor_config.json"}) {
    EXPECT_TRUE(fs::exists(out / file)) << file;
  }
  EXPECT_NE(RunDray("init-model --preset enormous --out /tmp/x").first, 0);
}

// WriteTestImage writes a 50x30 gradient PNG.
std::string WriteTestImage(const std::string& name) {
  const std::string path = (fs::path(std::getenv("TEST_TMPDIR")) / name).string();
  const at::Tensor image =
      at::arange(50 * 30 * 3, at::kLong).remainder(256).to(at::kByte).view({30, 50, 3});
  EXPECT_TRUE(WritePngFile(path, image).ok());
  return path;
}

TEST(ModelCliTest, EditRunsTheEmbeddedDefaultWithProgress) {
  const std::string in = WriteTestImage("in.png");
  const std::string out = (fs::path(std::getenv("TEST_TMPDIR")) / "out.png").string();
  const std::string args = absl::StrCat("edit --image ", in, " --instruction 'make it blue' --out ",
                                        out, " --steps 3 --image-size 64 --seed 5");
  const auto [code, output] = RunDray(args);
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output,
              HasSubstr("model embedded (the default), 1 picture, 3 steps at 64^2, no true CFG (no "
                        "negative_prompt), seed 5"));
  EXPECT_THAT(output, HasSubstr("step 3/3"));
  absl::StatusOr<at::Tensor> edited = ReadImageFile(out);
  ASSERT_TRUE(edited.ok()) << edited.status();
  // 4096 pixels at 50:30 -> CalculateDimensions gives 96 x 64... floored to multiples of 8.
  EXPECT_EQ(edited->size(2), 3);
  EXPECT_EQ(edited->size(1) % 8, 0);
  EXPECT_GT(edited->size(1), edited->size(0));
  // The same seed gives the same image.
  const at::Tensor first = *edited;
  ASSERT_EQ(RunDray(args).first, 0);
  EXPECT_TRUE(ReadImageFile(out)->equal(first));
}

// TopRowsColour: the mean colour of an HWC byte image's top `rows` rows.
at::Tensor TopRowsColour(const at::Tensor& image, int64_t rows) {
  return image.narrow(0, 0, rows).to(at::kFloat).mean(at::IntArrayRef{0, 1});
}

TEST(ModelCliTest, EditGivesTheEmbeddedDefaultTwoPictures) {
  const std::string out = (fs::path(std::getenv("TEST_TMPDIR")) / "sky.png").string();
  const std::string scene = RunfilePath("docs/scene.png"), donor = RunfilePath("docs/sky.png");
  const auto [code, output] =
      RunDray(absl::StrCat("edit --image ", scene, " --image ", donor,
                           " --instruction 'give picture 1 the sky of picture 2' --out ", out));
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("2 pictures"));
  absl::StatusOr<at::Tensor> edited = ReadImageFile(out);
  ASSERT_TRUE(edited.ok()) << edited.status();
  // The top rows, sky in both pictures, now take the donor's colours.
  const at::Tensor sky = TopRowsColour(*edited, 12);
  const double to_donor = (sky - TopRowsColour(*ReadImageFile(donor), 12)).norm().item<double>();
  const double to_own = (sky - TopRowsColour(*ReadImageFile(scene), 12)).norm().item<double>();
  EXPECT_LT(to_donor, to_own / 2) << "top rows' colour: " << sky;
}

TEST(ModelCliTest, EditRejectsBadInputClearly) {
  const auto [code, output] =
      RunDray("edit --image /nonexistent.png --instruction x --out /tmp/never.png");
  EXPECT_EQ(code, 1);
  EXPECT_THAT(output, HasSubstr("cannot read /nonexistent.png"));
  const std::string text = (fs::path(std::getenv("TEST_TMPDIR")) / "not_an_image.png").string();
  std::FILE* file = std::fopen(text.c_str(), "w");
  std::fputs("hello", file);
  std::fclose(file);
  const auto [bad_code, bad_output] =
      RunDray(absl::StrCat("edit --image ", text, " --instruction x --out /tmp/never.png"));
  EXPECT_EQ(bad_code, 1);
  EXPECT_THAT(bad_output, HasSubstr("neither PNG nor JPEG"));
  EXPECT_NE(RunDray("edit --instruction x --out y.png").first, 0);  // --image is required
  const auto [key_code, key_output] = RunDray(
      absl::StrCat("edit --image ", WriteTestImage("ok.png"),
                   " --instruction x --out /tmp/never.png", " worker.image_edit.batchsize=2"));
  EXPECT_EQ(key_code, 1);
  EXPECT_THAT(key_output,
              HasSubstr("unknown key worker.image_edit.batchsize; valid keys: model_path"));
  const auto [server_code, server_output] = RunDray(absl::StrCat(
      "edit --image ", WriteTestImage("ok.png"), " --instruction x --out /tmp/never.png",
      " --server 127.0.0.1:1 --model /models/x"));
  EXPECT_EQ(server_code, 1);
  EXPECT_THAT(server_output, HasSubstr("with --server the server's configuration applies"));
}

TEST(ModelCliTest, ParityPassesOnTheDiffusersReference) {
  const auto [code, output] = RunDray(absl::StrCat("parity --reference ", Reference()));
  EXPECT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("25 cases: 84 outputs within tolerance, 0 not"));
  EXPECT_THAT(output, HasSubstr("transformer_tiny     case_zero_cond_t"));
}

TEST(ModelCliTest, VersionNamesTheLibTorchAndTheCudaBuild) {
  const auto [code, output] = RunDray("--version");
  EXPECT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr(absl::StrCat("dray, built with LibTorch ", TORCH_VERSION, "\n")));
  EXPECT_THAT(output, HasSubstr("CUDA: "));
}

TEST(ModelCliTest, ParityFailsOnATamperedReferenceNamingTheCase) {
  const fs::path copy = fs::path(std::getenv("TEST_TMPDIR")) / "reference";
  fs::remove_all(copy);
  fs::create_directories(copy);
  fs::copy(fs::path(Reference()) / "transformer_tiny", copy / "transformer_tiny",
           fs::copy_options::recursive);
  // Nudge one expected output by 1e-3.
  const std::string case_a = (copy / "transformer_tiny" / "case_a.safetensors").string();
  auto file = SafetensorsFile::Open(case_a).value();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : file->names()) {
    at::Tensor tensor = file->Get(name).value().clone();
    if (name == "sample") tensor[0][0][0] += 1e-3;
    tensors.emplace_back(name, tensor);
  }
  const std::map<std::string, std::string> metadata = file->metadata();
  file.reset();
  ASSERT_TRUE(WriteSafetensors(case_a, tensors, metadata).ok());

  const auto [code, output] = RunDray(absl::StrCat("parity --reference ", copy.string()));
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output,
              ::testing::ContainsRegex("transformer_tiny +case_a +sample .*BEYOND TOLERANCE"));
  EXPECT_THAT(output, HasSubstr("5 cases: 9 outputs within tolerance, 1 not"));

  const fs::path empty = fs::path(std::getenv("TEST_TMPDIR")) / "empty";
  fs::create_directories(empty);
  const auto [empty_code, empty_output] =
      RunDray(absl::StrCat("parity --reference ", empty.string()));
  EXPECT_EQ(empty_code, 1);
  EXPECT_THAT(empty_output, HasSubstr("holds no reference cases"));
}

}  // namespace
}  // namespace dray
