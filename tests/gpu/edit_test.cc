// Image editing with device: cuda on the small preset (`dray init-model
// --preset small`), in bfloat16, against the same edits in float32 on the
// CPU: each stage of the edit pipeline as the worker loads it (text
// encoder, VAE encoder, one transformer step, VAE decoder), then whole
// edits through QwenImageEditWorker itself, replicated and sharded (NCCL).
// The tolerances follow bfloat16's rounding (gpu_test_util.h).
//
// One denoising step, at schedule timestep 1000 (sigma 1: the first step of
// every schedule): the transformer rounds t / 1000 to bfloat16 before its
// sinusoidal embedding of 1000 t, and 1 is exact, while rounding the later
// steps' timesteps (by up to 2^-9 for t in [0.5, 1)) turns the embedding's
// fastest frequency by up to 2 radians (bfloat16's behaviour, diffusers'
// too), which no rounding bound covers.
#include <ATen/ATen.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "dispatch/data_proto.h"
#include "gtest/gtest.h"
#include "runtime/worker/worker.h"
#include "tests/gpu/gpu_test_util.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"
#include "workers/pipeline/edit_model.h"

namespace dray {
namespace {

using GpuEditTest = CudaTest;

// SmallConfig: the small preset at 64^2 with one denoising step (guidance
// on: the default), then `overrides` (keys below worker.image_edit).
ImageEditConfig SmallConfig(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"model_path=" + SmallModelDir(), "image_size=64",
                                  "num_inference_steps=1", "batch_size=4"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  for (std::string& key : all) key = std::string(kConfigSection) + "." + key;
  absl::StatusOr<ImageEditConfig> config = ImageEditConfig::Load("", all);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.value_or(ImageEditConfig());
}

// EditedImages decodes a worker's final_edited_images (PNG).
std::vector<at::Tensor> EditedImages(const DataProto& edited) {
  std::vector<at::Tensor> images;
  const absl::StatusOr<const std::vector<Image>*> rows = edited.GetRows<Image>(kEditedColumn);
  EXPECT_TRUE(rows.ok()) << rows.status();
  if (!rows.ok()) return images;
  for (const Image& image : **rows) {
    absl::StatusOr<at::Tensor> decoded = DecodeImage(image.bytes.view());
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    if (decoded.ok()) images.push_back(*std::move(decoded));
  }
  return images;
}

TEST_F(GpuEditTest, EachStageInBfloat16OnCudaMatchesFloat32OnTheCpu) {
  torch::NoGradGuard no_grad;
  std::unique_ptr<Worker> worker = LoneWorker<Worker>();
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<EditModel> cpu,
                            LoadEditModel(SmallConfig({"device=cpu"}), *worker));
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<EditModel> gpu,
      LoadEditModel(SmallConfig({"device=cuda", "torch_dtype=bfloat16"}), *worker));
  EXPECT_TRUE(gpu->device.is_cuda());
  const qwen_image::QwenImageModel& model = gpu->model();
  for (const torch::nn::Module* module : std::vector<const torch::nn::Module*>{
           model.transformer.get(), model.text_encoder.get(), model.vae.get()}) {
    for (const at::Tensor& parameter : module->parameters()) {
      EXPECT_TRUE(parameter.is_cuda());
      EXPECT_EQ(parameter.scalar_type(), at::kBFloat16);
    }
  }

  const qwen_image::EditInput input{{TestImage(40, 56, /*salt=*/0)},
                                    "make the sky green",
                                    /*seed=*/42};
  qwen_image::EditOptions options;  // no negative prompt: no guidance
  options.num_inference_steps = 1;
  options.image_size = 64;
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::PreparedEdit expected,
                            cpu->pipeline->Prepare({&input}, options));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::PreparedEdit actual,
                            gpu->pipeline->Prepare({&input}, options));
  ASSERT_TRUE(actual.noise.is_cuda());
  EXPECT_TRUE(at::equal(actual.noise.cpu(), expected.noise)) << "noise is drawn from the seed";
  EXPECT_TRUE(at::equal(actual.prompt.mask.cpu(), expected.prompt.mask));
  ExpectErrorWithin("text_encoder_error",
                    RelativeError(actual.prompt.embeds, expected.prompt.embeds),
                    Bfloat16Tolerance(kTextEncoderRoundings));
  ExpectErrorWithin("vae_encoder_error",
                    RelativeError(actual.image_latents, expected.image_latents),
                    Bfloat16Tolerance(kVaeEncoderRoundings));

  // The transformer, on conditions that carry the encoders' errors too.
  const at::Tensor timestep = at::full({1}, 1000.0, at::kFloat);
  DRAY_ASSERT_OK_AND_ASSIGN(
      at::Tensor expected_velocity,
      cpu->pipeline->Velocity(expected, expected.noise, timestep, /*true_cfg_scale=*/1));
  DRAY_ASSERT_OK_AND_ASSIGN(
      at::Tensor velocity,
      gpu->pipeline->Velocity(actual, actual.noise, timestep, /*true_cfg_scale=*/1));
  EXPECT_TRUE(velocity.is_cuda());
  ExpectErrorWithin(
      "velocity_error", RelativeError(velocity, expected_velocity),
      Bfloat16Tolerance(kTextEncoderRoundings + kVaeEncoderRoundings + kTransformerRoundings));

  // The decoder alone, on the CPU's edited latents (the step from sigma 1 to 0).
  const at::Tensor latents = expected.noise - expected_velocity;
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> expected_images,
                            cpu->pipeline->Decode(latents, expected.height, expected.width));
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::vector<at::Tensor> images,
      gpu->pipeline->Decode(latents.to(kCuda), expected.height, expected.width));
  ASSERT_EQ(images.size(), 1u);
  ExpectErrorWithin("vae_decoder_error", ImageError(images[0], expected_images[0]),
                    Bfloat16Tolerance(kVaeDecoderRoundings));
}

// Whole edits by the worker, with guidance (true_cfg_scale 4, negative
// prompt " "): the guided velocity n + s (c - n), rescaled to the
// conditional prediction's norm, sums the two predictions' errors with
// weights s and s - 1, so a relative error e of each becomes about
// sqrt(s^2 + (s - 1)^2) e = 5 e (assuming guidance changes the prediction's
// norm little). Every model's roundings pile up, the decoder's last.
TEST_F(GpuEditTest, TheEditWorkerOnCudaEditsAsOnTheCpuWithinBfloat16Tolerance) {
  // Three image sizes: three denoising loops.
  DRAY_ASSERT_OK_AND_ASSIGN(
      const DataProto batch,
      MakeEditBatch({TestPng(40, 56, 0), TestPng(48, 40, 1), TestPng(32, 64, 2)},
                    {"make the sky green", "make the sky purple", "add a red sun"}));
  auto edit = [&batch](const std::vector<std::string>& overrides) {
    std::unique_ptr<QwenImageEditWorker> worker = LoneWorker<QwenImageEditWorker>();
    const ImageEditConfig config = SmallConfig(overrides);
    const DataProto init = DataProto::Make({}, {}, {{"config", config.ToYaml()}}).value();
    const absl::StatusOr<DataProto> ready = worker->InitModel(init);
    EXPECT_TRUE(ready.ok()) << ready.status();
    absl::StatusOr<DataProto> edited = worker->EditImagesBatch(batch);
    EXPECT_TRUE(edited.ok()) << edited.status();
    return edited.ok() ? EditedImages(*edited) : std::vector<at::Tensor>();
  };
  const std::vector<at::Tensor> expected = edit({"device=cpu"});
  ASSERT_EQ(expected.size(), 3u);
  const double guidance_gain = std::sqrt(4.0 * 4.0 + 3.0 * 3.0);
  const double tolerance =
      guidance_gain * Bfloat16Tolerance(kTextEncoderRoundings + kVaeEncoderRoundings +
                                        kTransformerRoundings + kVaeDecoderRoundings);
  for (const std::vector<std::string>& overrides : std::vector<std::vector<std::string>>{
           {"device=cuda", "torch_dtype=bfloat16"},
           {"device=cuda", "torch_dtype=bfloat16", "enable_fsdp=true"}}) {
    SCOPED_TRACE(overrides.back());
    const std::vector<at::Tensor> images = edit(overrides);
    ASSERT_EQ(images.size(), expected.size());
    for (size_t i = 0; i < images.size(); ++i) {
      EXPECT_EQ(images[i].sizes(), expected[i].sizes()) << "row " << i;
      ExpectErrorWithin(
          absl::StrCat(overrides.size() > 2 ? "sharded" : "replicated", "_row_", i, "_error"),
          ImageError(images[i], expected[i]), tolerance);
    }
  }
}

}  // namespace
}  // namespace dray
