#include "workers/models/qwen2_vl/text_encoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "workers/models/component_weights.h"
#include "workers/models/layers.h"

namespace dray::qwen2_vl {
namespace {

constexpr double kVisionNormEps = 1e-6;
constexpr double kVisionRopeTheta = 10000;

// Bookkeeping keys of transformers configs that change nothing here: the
// model's own, then the generic ones every PretrainedConfig writes out
// (generation, task and output settings; transformers 4 and 5 both).
// kIgnoredConfigKeys: Qwen2.5-VL's config keys that change nothing dray
// computes (with JsonConfig::IgnorePretrainedConfigKeys).
#define DRAY_IGNORED_CONFIG_KEYS                                                            \
  "attention_dropout", "initializer_range", "max_position_embeddings", "max_window_layers", \
      "sliding_window", "use_cache", "layer_types", "pad_token_id", "model_type",           \
      "attention_bias", "name_or_path", "is_decoder"

absl::Status RequireSilu(JsonConfig& json) {
  std::string act = "silu";
  DRAY_RETURN_IF_ERROR(json.Get("hidden_act", &act));
  if (act != "silu")
    return absl::UnimplementedError(
        absl::StrCat("hidden_act '", act, "' is not supported (silu only)"));
  return absl::OkStatus();
}

absl::StatusOr<VisionConfig> ReadVision(JsonConfig json) {
  VisionConfig c;
  // Generic keys that mean nothing to the vision tower (it has no LM head
  // and no tokens).
  json.IgnorePretrainedConfigKeys();
  json.Ignore({DRAY_IGNORED_CONFIG_KEYS, "embed_dim", "spatial_patch_size", "tie_word_embeddings",
               "bos_token_id", "eos_token_id"});
  DRAY_RETURN_IF_ERROR(RequireSilu(json));
  DRAY_RETURN_IF_ERROR(json.Get("depth", &c.depth));
  DRAY_RETURN_IF_ERROR(json.Get("hidden_size", &c.hidden_size));
  DRAY_RETURN_IF_ERROR(json.Get("intermediate_size", &c.intermediate_size));
  DRAY_RETURN_IF_ERROR(json.Get("num_heads", &c.num_heads));
  DRAY_RETURN_IF_ERROR(json.Get("in_chans", &c.in_chans));
  DRAY_RETURN_IF_ERROR(json.Get("in_channels", &c.in_chans));
  DRAY_RETURN_IF_ERROR(json.Get("out_hidden_size", &c.out_hidden_size));
  DRAY_RETURN_IF_ERROR(json.Get("patch_size", &c.patch_size));
  DRAY_RETURN_IF_ERROR(json.Get("spatial_merge_size", &c.spatial_merge_size));
  DRAY_RETURN_IF_ERROR(json.Get("temporal_patch_size", &c.temporal_patch_size));
  DRAY_RETURN_IF_ERROR(json.Get("window_size", &c.window_size));
  DRAY_RETURN_IF_ERROR(json.Get("fullatt_block_indexes", &c.fullatt_block_indexes));
  DRAY_RETURN_IF_ERROR(json.Get("tokens_per_second", &c.tokens_per_second));
  DRAY_RETURN_IF_ERROR(json.Finish());
  const int64_t window_units = c.window_size / c.spatial_merge_size / c.patch_size;
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0 || window_units < 1) {
    return absl::InvalidArgumentError(
        "vision_config: hidden_size must split into heads of a multiple of 4, and "
        "window_size must hold at least one merged patch");
  }
  return c;
}

// ReadRope reads a rope_scaling or rope_parameters object: M-RoPE or plain
// RoPE, nothing scaled.
absl::Status ReadRope(JsonConfig& rope, const char* key, TextEncoderConfig& c) {
  std::string type = "default", rope_type = "default";
  DRAY_RETURN_IF_ERROR(rope.Get("type", &type));
  DRAY_RETURN_IF_ERROR(rope.Get("rope_type", &rope_type));
  DRAY_RETURN_IF_ERROR(rope.Get("mrope_section", &c.mrope_section));
  DRAY_RETURN_IF_ERROR(rope.Get("rope_theta", &c.rope_theta));
  DRAY_RETURN_IF_ERROR(rope.Finish());
  for (const std::string& t : {type, rope_type}) {
    if (t != "default" && t != "mrope")
      return absl::UnimplementedError(absl::StrCat(key, " type '", t, "' is not supported"));
  }
  return absl::OkStatus();
}

// ReadTextFields reads the language model's keys from the top level or from
// `text_config` (newer transformers write both).
absl::Status ReadTextFields(JsonConfig& json, TextEncoderConfig& c) {
  DRAY_RETURN_IF_ERROR(RequireSilu(json));
  DRAY_RETURN_IF_ERROR(json.Unsupported("use_sliding_window"));
  for (auto [key, value] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"vocab_size", &c.vocab_size},
           {"hidden_size", &c.hidden_size},
           {"intermediate_size", &c.intermediate_size},
           {"num_hidden_layers", &c.num_hidden_layers},
           {"num_attention_heads", &c.num_attention_heads},
           {"num_key_value_heads", &c.num_key_value_heads},
           {"image_token_id", &c.image_token_id},
           {"video_token_id", &c.video_token_id},
           {"vision_start_token_id", &c.vision_start_token_id},
           {"vision_end_token_id", &c.vision_end_token_id},
           {"vision_token_id", &c.vision_token_id},
           {"bos_token_id", &c.bos_token_id},
           {"eos_token_id", &c.eos_token_id}}) {
    DRAY_RETURN_IF_ERROR(json.Get(key, value));
  }
  DRAY_RETURN_IF_ERROR(json.Get("rms_norm_eps", &c.rms_norm_eps));
  DRAY_RETURN_IF_ERROR(json.Get("rope_theta", &c.rope_theta));
  DRAY_RETURN_IF_ERROR(json.Get("tie_word_embeddings", &c.tie_word_embeddings));
  // transformers < 5 writes `rope_scaling`, 5 `rope_parameters` (with rope_theta).
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    DRAY_ASSIGN_OR_RETURN(JsonConfig rope, json.Object(key));
    DRAY_RETURN_IF_ERROR(ReadRope(rope, key, c));
  }
  return absl::OkStatus();
}

absl::Status Validate(const TextEncoderConfig& c) {
  if (c.hidden_size % c.num_attention_heads != 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        "hidden_size must divide into num_attention_heads, and those into num_key_value_heads");
  }
  if (c.mrope_section.size() != 3 ||
      std::accumulate(c.mrope_section.begin(), c.mrope_section.end(), int64_t{0}) * 2 !=
          c.head_dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling.mrope_section [", absl::StrJoin(c.mrope_section, ", "),
                     "] must be 3 numbers summing to head_dim / 2 = ", c.head_dim() / 2));
  }
  if (c.vision.out_hidden_size != c.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("vision_config.out_hidden_size ",
                                                   c.vision.out_hidden_size,
                                                   " must equal hidden_size ", c.hidden_size));
  }
  return absl::OkStatus();
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// InverseFrequencies: 1 / theta^(2i / dim) for i < dim / 2, in float32 as transformers computes
// them.
at::Tensor InverseFrequencies(int64_t dim, double theta) {
  return 1.0 /
         at::pow(theta, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
}

// TextRotary: cos and sin [B, S, head_dim] for positions [3, B, S], each
// frequency band taking its axis from mrope_section.
std::pair<at::Tensor, at::Tensor> TextRotary(const at::Tensor& positions,
                                             const TextEncoderConfig& config,
                                             at::ScalarType dtype) {
  const at::Tensor inv_freq =
      InverseFrequencies(config.head_dim(), config.rope_theta).to(positions.device());
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [3, B, S, D/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                          // [3, B, S, D]
  std::vector<int64_t> sections = config.mrope_section;
  sections.insert(sections.end(), config.mrope_section.begin(), config.mrope_section.end());
  std::vector<at::Tensor> cos_parts, sin_parts;
  int64_t offset = 0;
  for (size_t i = 0; i < sections.size(); ++i) {
    const at::Tensor band = emb[i % 3].narrow(-1, offset, sections[i]);
    cos_parts.push_back(band.cos());
    sin_parts.push_back(band.sin());
    offset += sections[i];
  }
  return {at::cat(cos_parts, -1).to(dtype), at::cat(sin_parts, -1).to(dtype)};
}

// PatchPositions lists (row, column) of every patch of `grid` in the image
// processor's order (2x2 merge groups together), repeated per frame.
std::vector<std::array<int64_t, 2>> PatchPositions(const ImageGrid& grid, int64_t merge) {
  std::vector<std::array<int64_t, 2>> positions;
  for (int64_t t = 0; t < grid[0]; ++t) {
    for (int64_t hb = 0; hb < grid[1] / merge; ++hb) {
      for (int64_t wb = 0; wb < grid[2] / merge; ++wb) {
        for (int64_t i = 0; i < merge; ++i) {
          for (int64_t j = 0; j < merge; ++j) positions.push_back({hb * merge + i, wb * merge + j});
        }
      }
    }
  }
  return positions;
}

}  // namespace

absl::StatusOr<TextEncoderConfig> TextEncoderConfig::FromJson(JsonConfig json) {
  TextEncoderConfig c;
  std::string model_type = "qwen2_5_vl";
  DRAY_RETURN_IF_ERROR(json.Get("model_type", &model_type));
  if (model_type != "qwen2_5_vl") {
    return absl::UnimplementedError(
        absl::StrCat("model_type '", model_type, "' is not supported (qwen2_5_vl only)"));
  }
  json.IgnorePretrainedConfigKeys();
  json.Ignore({DRAY_IGNORED_CONFIG_KEYS});
  DRAY_RETURN_IF_ERROR(ReadTextFields(json, c));
  DRAY_ASSIGN_OR_RETURN(JsonConfig text, json.Object("text_config"));
  text.IgnorePretrainedConfigKeys();
  text.Ignore({DRAY_IGNORED_CONFIG_KEYS});
  DRAY_RETURN_IF_ERROR(ReadTextFields(text, c));
  DRAY_RETURN_IF_ERROR(text.Finish());
  DRAY_ASSIGN_OR_RETURN(JsonConfig vision, json.Object("vision_config"));
  DRAY_ASSIGN_OR_RETURN(c.vision, ReadVision(std::move(vision)));
  DRAY_RETURN_IF_ERROR(json.Finish());
  DRAY_RETURN_IF_ERROR(Validate(c));
  return c;
}

absl::StatusOr<TextEncoderConfig> TextEncoderConfig::FromFile(const std::string& path) {
  return ReadConfigFile<TextEncoderConfig>(path);
}

std::string TextEncoderConfig::ToJson() const {
  const nlohmann::json vision_json = {{"depth", vision.depth},
                                      {"hidden_act", "silu"},
                                      {"hidden_size", vision.hidden_size},
                                      {"intermediate_size", vision.intermediate_size},
                                      {"num_heads", vision.num_heads},
                                      {"in_chans", vision.in_chans},
                                      {"out_hidden_size", vision.out_hidden_size},
                                      {"patch_size", vision.patch_size},
                                      {"spatial_merge_size", vision.spatial_merge_size},
                                      {"spatial_patch_size", vision.patch_size},
                                      {"temporal_patch_size", vision.temporal_patch_size},
                                      {"window_size", vision.window_size},
                                      {"fullatt_block_indexes", vision.fullatt_block_indexes},
                                      {"tokens_per_second", vision.tokens_per_second},
                                      {"model_type", "qwen2_5_vl"}};
  const nlohmann::json json = {
      {"architectures", {"Qwen2_5_VLForConditionalGeneration"}},
      {"model_type", "qwen2_5_vl"},
      {"hidden_act", "silu"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"rope_scaling", {{"type", "mrope"}, {"mrope_section", mrope_section}}},
      {"tie_word_embeddings", tie_word_embeddings},
      {"use_sliding_window", false},
      {"image_token_id", image_token_id},
      {"video_token_id", video_token_id},
      {"vision_start_token_id", vision_start_token_id},
      {"vision_end_token_id", vision_end_token_id},
      {"vision_token_id", vision_token_id},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
      {"torch_dtype", "float32"},
      {"vision_config", vision_json}};
  return json.dump(2);
}

absl::StatusOr<at::Tensor> MultimodalPositions(const at::Tensor& input_ids,
                                               const at::Tensor& attention_mask,
                                               const std::vector<ImageGrid>& grids,
                                               const TextEncoderConfig& config) {
  const at::Tensor ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor mask = attention_mask.to(at::kCPU, at::kLong).contiguous();
  const int64_t batch = ids.size(0), length = ids.size(1);
  const int64_t merge = config.vision.spatial_merge_size;
  at::Tensor positions = at::ones({3, batch, length}, at::kLong);
  auto out = positions.accessor<int64_t, 3>();
  const auto id = ids.accessor<int64_t, 2>();
  const auto real = mask.accessor<int64_t, 2>();
  size_t image = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> tokens, columns;  // the sample's real tokens and where they sit
    for (int64_t s = 0; s < length; ++s) {
      if (real[b][s] != 0) {
        tokens.push_back(id[b][s]);
        columns.push_back(s);
      }
    }
    int64_t next = 0;  // the next text position
    size_t done = 0;   // tokens placed
    auto place_text = [&](size_t end) {
      for (; done < end; ++done, ++next) {
        for (int axis = 0; axis < 3; ++axis) out[axis][b][columns[done]] = next;
      }
    };
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      if (tokens[i] != config.vision_start_token_id || tokens[i + 1] != config.image_token_id)
        continue;
      if (image >= grids.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the prompts hold more images than the ", grids.size(), " given"));
      }
      const ImageGrid& grid = grids[image++];
      const int64_t h = grid[1] / merge, w = grid[2] / merge, count = grid[0] * h * w;
      const size_t first =
          std::find(tokens.begin() + done, tokens.end(), config.image_token_id) - tokens.begin();
      place_text(first);
      if (first + count > tokens.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", b, ": image ", image - 1, " needs ", count,
                         " <|image_pad|> tokens; the prompt ends first"));
      }
      for (int64_t k = 0; k < count; ++k, ++done) {
        const int64_t column = columns[done];
        out[0][b][column] = next;  // images sit at time 0
        out[1][b][column] = next + (k % (h * w)) / w;
        out[2][b][column] = next + k % w;
      }
      next += std::max(h, w);
      i = done - 1;
    }
    place_text(tokens.size());
  }
  if (image != grids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(grids.size(), " images were given; the prompts place ", image));
  }
  return positions.to(input_ids.device());
}

VisionWindowLayout VisionWindows(const std::vector<ImageGrid>& grids, const VisionConfig& config) {
  const int64_t merge = config.spatial_merge_size;
  const int64_t units = config.window_size / merge / config.patch_size;
  VisionWindowLayout layout;
  int64_t offset = 0;
  for (const ImageGrid& grid : grids) {
    const int64_t h = grid[1] / merge, w = grid[2] / merge;
    for (int64_t t = 0; t < grid[0]; ++t) {
      for (int64_t r0 = 0; r0 < h; r0 += units) {
        for (int64_t c0 = 0; c0 < w; c0 += units) {
          int64_t count = 0;
          for (int64_t r = r0; r < std::min(h, r0 + units); ++r) {
            for (int64_t c = c0; c < std::min(w, c0 + units); ++c, ++count)
              layout.order.push_back(offset + (t * h + r) * w + c);
          }
          layout.lengths.push_back(count * merge * merge);
        }
      }
    }
    offset += grid[0] * h * w;
  }
  return layout;
}

at::Tensor VisionRotaryAngles(const std::vector<ImageGrid>& grids, const VisionConfig& config) {
  std::vector<int64_t> rows, columns;
  int64_t largest = 0;
  for (const ImageGrid& grid : grids) {
    for (const auto& [r, c] : PatchPositions(grid, config.spatial_merge_size)) {
      rows.push_back(r);
      columns.push_back(c);
    }
    largest = std::max({largest, grid[1], grid[2]});
  }
  const at::Tensor table = at::arange(largest, at::kFloat).unsqueeze(1) *
                           InverseFrequencies(config.head_dim() / 2, kVisionRopeTheta).unsqueeze(0);
  return at::cat({table.index_select(0, at::tensor(rows, at::kLong)),
                  table.index_select(0, at::tensor(columns, at::kLong))},
                 1);
}

// ---- modules -----------------------------------------------------------------

GatedMlpImpl::GatedMlpImpl(int64_t dim, int64_t hidden, bool bias, at::TensorOptions options) {
  gate_ = register_module("gate_proj", Linear(Linear::Impl::Options{dim, hidden, bias, options}));
  up_ = register_module("up_proj", Linear(Linear::Impl::Options{dim, hidden, bias, options}));
  down_ = register_module("down_proj", Linear(Linear::Impl::Options{hidden, dim, bias, options}));
}

at::Tensor GatedMlpImpl::forward(const at::Tensor& x) {
  return down_->forward(at::silu(gate_->forward(x)) * up_->forward(x));
}

DecoderLayerImpl::DecoderLayerImpl(const TextEncoderConfig& config, at::TensorOptions options)
    : heads_(config.num_attention_heads), kv_heads_(config.num_key_value_heads) {
  const int64_t dim = config.hidden_size, head_dim = config.head_dim();
  input_norm_ = RegisterAt(*this, "input_layernorm", RMSNorm(dim, config.rms_norm_eps, options));
  q_ = RegisterAt(*this, "self_attn.q_proj",
                  Linear(Linear::Impl::Options{dim, heads_ * head_dim, true, options}));
  k_ = RegisterAt(*this, "self_attn.k_proj",
                  Linear(Linear::Impl::Options{dim, kv_heads_ * head_dim, true, options}));
  v_ = RegisterAt(*this, "self_attn.v_proj",
                  Linear(Linear::Impl::Options{dim, kv_heads_ * head_dim, true, options}));
  o_ = RegisterAt(*this, "self_attn.o_proj",
                  Linear(Linear::Impl::Options{heads_ * head_dim, dim, false, options}));
  post_attention_norm_ =
      RegisterAt(*this, "post_attention_layernorm", RMSNorm(dim, config.rms_norm_eps, options));
  mlp_ = RegisterAt(*this, "mlp", GatedMlp(dim, config.intermediate_size, /*bias=*/false, options));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                     const at::Tensor& sin, const at::Tensor& allowed) {
  const at::Tensor h = input_norm_->forward(x);
  auto heads = [](const at::Tensor& t, int64_t n) {
    return t.unflatten(-1, {n, -1}).transpose(1, 2);
  };  // [B, n, S, D]
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  at::Tensor q = heads(q_->forward(h), heads_), k = heads(k_->forward(h), kv_heads_);
  q = q * c + RotateHalf(q) * s;
  k = k * c + RotateHalf(k) * s;
  const int64_t repeat = heads_ / kv_heads_;
  k = k.repeat_interleave(repeat, 1);
  const at::Tensor v = heads(v_->forward(h), kv_heads_).repeat_interleave(repeat, 1);
  const at::Tensor attention = DotProductAttention(q, k, v, allowed).transpose(1, 2).flatten(2);
  const at::Tensor y = x + o_->forward(attention);
  return y + mlp_->forward(post_attention_norm_->forward(y));
}

VisionBlockImpl::VisionBlockImpl(const VisionConfig& config, at::TensorOptions options)
    : heads_(config.num_heads) {
  const int64_t dim = config.hidden_size;
  norm1_ = RegisterAt(*this, "norm1", RMSNorm(dim, kVisionNormEps, options));
  norm2_ = RegisterAt(*this, "norm2", RMSNorm(dim, kVisionNormEps, options));
  qkv_ = RegisterAt(*this, "attn.qkv", Linear(Linear::Impl::Options{dim, 3 * dim, true, options}));
  proj_ = RegisterAt(*this, "attn.proj", Linear(Linear::Impl::Options{dim, dim, true, options}));
  mlp_ = RegisterAt(*this, "mlp", GatedMlp(dim, config.intermediate_size, /*bias=*/true, options));
}

at::Tensor VisionBlockImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                    const at::Tensor& sin, const std::vector<int64_t>& segments) {
  const int64_t n = x.size(0);
  const std::vector<at::Tensor> qkv =
      qkv_->forward(norm1_->forward(x)).reshape({n, 3, heads_, -1}).unbind(1);
  // Rotary in float32, as transformers applies it to the vision tower.
  auto rotate = [&](const at::Tensor& t) {
    const at::Tensor f = AtLeastFloat32(t);
    return (f * cos.unsqueeze(1) + RotateHalf(f) * sin.unsqueeze(1))
        .to(t.scalar_type())
        .transpose(0, 1);
  };
  const at::Tensor q = rotate(qkv[0]), k = rotate(qkv[1]),
                   v = qkv[2].transpose(0, 1);  // [heads, N, D]
  std::vector<at::Tensor> outputs;
  int64_t start = 0;
  for (int64_t length : segments) {
    outputs.push_back(DotProductAttention(q.narrow(1, start, length), k.narrow(1, start, length),
                                          v.narrow(1, start, length), at::Tensor()));
    start += length;
  }
  const at::Tensor attention = at::cat(outputs, 1).transpose(0, 1).reshape({n, -1});
  const at::Tensor y = x + proj_->forward(attention);
  return y + mlp_->forward(norm2_->forward(y));
}

Qwen25VLTextEncoderImpl::Qwen25VLTextEncoderImpl(TextEncoderConfig config,
                                                 at::TensorOptions options, WeightLayout layout)
    : config_(std::move(config)) {
  const std::string lm = layout == WeightLayout::kLegacy ? "model." : "model.language_model.";
  const std::string visual = layout == WeightLayout::kLegacy ? "visual." : "model.visual.";
  const VisionConfig& vision = config_.vision;
  embed_tokens_ = RegisterAt(*this, lm + "embed_tokens",
                             Embedding(config_.vocab_size, config_.hidden_size, options));
  layers_ = RegisterAt(*this, lm + "layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
    layers_->push_back(DecoderLayer(config_, options));
  norm_ =
      RegisterAt(*this, lm + "norm", RMSNorm(config_.hidden_size, config_.rms_norm_eps, options));
  if (!config_.tie_word_embeddings) {
    lm_head_ = RegisterAt(
        *this, "lm_head",
        Linear(Linear::Impl::Options{config_.hidden_size, config_.vocab_size, false, options}));
  }
  auto patch_embed = std::make_shared<torch::nn::Module>();
  patch_embed_ = patch_embed->register_parameter(
      "weight", NewParameter({vision.hidden_size, vision.in_chans, vision.temporal_patch_size,
                              vision.patch_size, vision.patch_size},
                             options));
  RegisterModuleAt(*this, visual + "patch_embed.proj", patch_embed);
  vision_blocks_ = RegisterAt(*this, visual + "blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < vision.depth; ++i)
    vision_blocks_->push_back(VisionBlock(vision, options));
  const int64_t merged = vision.hidden_size * vision.spatial_merge_size * vision.spatial_merge_size;
  merger_norm_ = RegisterAt(*this, visual + "merger.ln_q",
                            RMSNorm(vision.hidden_size, kVisionNormEps, options));
  merger_fc1_ = RegisterAt(*this, visual + "merger.mlp.0",
                           Linear(Linear::Impl::Options{merged, merged, true, options}));
  merger_fc2_ =
      RegisterAt(*this, visual + "merger.mlp.2",
                 Linear(Linear::Impl::Options{merged, vision.out_hidden_size, true, options}));
}

std::vector<std::shared_ptr<torch::nn::Module>> Qwen25VLTextEncoderImpl::blocks() const {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& block : *vision_blocks_) units.push_back(block);
  for (const auto& layer : *layers_) units.push_back(layer);
  return units;
}

at::Tensor Qwen25VLTextEncoderImpl::RunUnit(size_t index, const std::function<at::Tensor()>& run) {
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeUnit(index);
  at::Tensor out = run();
  if (unit_hooks_ != nullptr) unit_hooks_->AfterUnit(index, {out});
  return out;
}

absl::StatusOr<at::Tensor> Qwen25VLTextEncoderImpl::EncodeImages(
    const at::Tensor& patches, const std::vector<ImageGrid>& grids) {
  const VisionConfig& vision = config_.vision;
  const int64_t merge = vision.spatial_merge_size, unit = merge * merge;
  int64_t total = 0;
  for (const ImageGrid& grid : grids) {
    if (grid[0] < 1 || grid[1] % merge != 0 || grid[2] % merge != 0 || grid[1] < merge ||
        grid[2] < merge) {
      return absl::InvalidArgumentError(
          absl::StrCat("image grid (", absl::StrJoin(grid, ", "),
                       ") must be positive with height and width multiples of ", merge));
    }
    total += grid[0] * grid[1] * grid[2];
  }
  if (patches.dim() != 2 || patches.size(0) != total || patches.size(1) != vision.patch_dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("image patches must be [", total, ", ", vision.patch_dim(),
                     "] for the given grids, got ", ShapeString(patches.sizes())));
  }
  const at::Device device = patch_embed_.device();
  at::Tensor x = at::conv3d(patches.to(device, patch_embed_.scalar_type())
                                .view({-1, vision.in_chans, vision.temporal_patch_size,
                                       vision.patch_size, vision.patch_size}),
                            patch_embed_, {},
                            {vision.temporal_patch_size, vision.patch_size, vision.patch_size})
                     .view({total, vision.hidden_size});

  // Window order: merged groups of patches regrouped window by window, with
  // their rotary angles.
  const VisionWindowLayout windows = VisionWindows(grids, vision);
  const at::Tensor window_index = at::tensor(windows.order, at::kLong);
  at::Tensor angles = VisionRotaryAngles(grids, vision);
  x = x.view({total / unit, unit, -1})
          .index_select(0, window_index.to(device))
          .reshape({total, -1});
  angles = angles.view({total / unit, unit, -1}).index_select(0, window_index).reshape({total, -1});
  const at::Tensor emb = at::cat({angles, angles}, -1).to(device);
  const at::Tensor cos = emb.cos(), sin = emb.sin();
  std::vector<int64_t> image_lengths;
  for (const ImageGrid& grid : grids)
    image_lengths.insert(image_lengths.end(), grid[0], grid[1] * grid[2]);
  const std::vector<int64_t>& full = vision.fullatt_block_indexes;
  for (int64_t i = 0; i < vision.depth; ++i) {
    const bool whole_images = std::find(full.begin(), full.end(), i) != full.end();
    auto block = vision_blocks_->ptr<VisionBlockImpl>(i);
    x = RunUnit(i, [&] {
      return block->forward(x, cos, sin, whole_images ? image_lengths : windows.lengths);
    });
  }
  const at::Tensor merged = merger_fc2_->forward(
      at::gelu(merger_fc1_->forward(merger_norm_->forward(x).view({total / unit, -1}))));
  return merged.index_select(0, at::argsort(window_index).to(device));
}

absl::StatusOr<at::Tensor> Qwen25VLTextEncoderImpl::EmbedInputs(
    const at::Tensor& input_ids, const at::Tensor& patches, const std::vector<ImageGrid>& grids) {
  if (input_ids.numel() > 0 && (input_ids.min().item<int64_t>() < 0 ||
                                input_ids.max().item<int64_t>() >= config_.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("text encoder: token ids must lie in [0, ", config_.vocab_size, ")"));
  }
  const at::Tensor ids = input_ids.to(embed_tokens_->weight.device(), at::kLong);
  const at::Tensor x = embed_tokens_->forward(ids);
  const at::Tensor is_image = ids.eq(config_.image_token_id);
  const int64_t image_tokens = is_image.sum().item<int64_t>();
  int64_t expected = 0;
  for (const ImageGrid& grid : grids)
    expected += grid[0] * grid[1] * grid[2] /
                (config_.vision.spatial_merge_size * config_.vision.spatial_merge_size);
  if (image_tokens != expected) {
    return absl::InvalidArgumentError(absl::StrCat("text encoder: the prompts hold ", image_tokens,
                                                   " <|image_pad|> tokens; the images make ",
                                                   expected));
  }
  if (grids.empty()) return x;
  DRAY_ASSIGN_OR_RETURN(at::Tensor image_embeds, EncodeImages(patches, grids));
  return x.masked_scatter(is_image.unsqueeze(-1).expand_as(x), image_embeds.to(x.scalar_type()));
}

absl::StatusOr<at::Tensor> Qwen25VLTextEncoderImpl::forward(const at::Tensor& input_ids,
                                                            const at::Tensor& attention_mask,
                                                            const at::Tensor& patches,
                                                            const std::vector<ImageGrid>& grids) {
  if (input_ids.dim() != 2 || attention_mask.sizes() != input_ids.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text encoder: input_ids [B, S] and an attention_mask of the same "
                     "shape expected, got ",
                     ShapeString(input_ids.sizes()), " and ", ShapeString(attention_mask.sizes())));
  }
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeForward();
  DRAY_ASSIGN_OR_RETURN(at::Tensor x, EmbedInputs(input_ids, patches, grids));
  const at::Device device = x.device();
  DRAY_ASSIGN_OR_RETURN(at::Tensor positions,
                        MultimodalPositions(input_ids, attention_mask, grids, config_));
  const auto [cos, sin] = TextRotary(positions.to(device), config_, x.scalar_type());
  const int64_t length = input_ids.size(1);
  const at::Tensor causal =
      at::ones({length, length}, at::TensorOptions(at::kBool).device(device)).tril();
  const at::Tensor keys = attention_mask.to(device).ne(0).view({input_ids.size(0), 1, 1, length});
  // A query may always see itself, so padding rows never go all -inf.
  const at::Tensor allowed =
      (causal & keys) | at::eye(length, at::TensorOptions(at::kBool).device(device));
  const size_t first = static_cast<size_t>(config_.vision.depth);
  for (size_t i = 0; i < layers_->size(); ++i) {
    auto layer = layers_->ptr<DecoderLayerImpl>(i);
    x = RunUnit(first + i, [&] { return layer->forward(x, cos, sin, allowed); });
  }
  return norm_->forward(x);
}

at::Tensor Qwen25VLTextEncoderImpl::Logits(const at::Tensor& hidden) {
  return config_.tie_word_embeddings ? at::linear(hidden, embed_tokens_->weight)
                                     : lm_head_->forward(hidden);
}

absl::StatusOr<Qwen25VLTextEncoder> LoadTextEncoder(const std::string& dir,
                                                    at::TensorOptions options, Weights weights) {
  DRAY_ASSIGN_OR_RETURN(TextEncoderConfig config,
                        TextEncoderConfig::FromFile(dir + "/config.json"));
  DRAY_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenComponentWeights(dir));
  const WeightLayout layout = checkpoint.contains("model.language_model.embed_tokens.weight")
                                  ? WeightLayout::kLanguageModel
                                  : WeightLayout::kLegacy;
  if (weights == Weights::kShapeOnly) {
    DeferredAllocation deferred;
    return Qwen25VLTextEncoder(std::move(config), options, layout);
  }
  // A tied LM head is the embedding table; a copy stored beside it is unused.
  const std::set<std::string> derived = {"lm_head.weight"};
  const bool tied = config.tie_word_embeddings;
  Qwen25VLTextEncoder encoder(std::move(config), options, layout);
  absl::Status loaded =
      LoadStateDict(*encoder, checkpoint, "", tied ? derived : std::set<std::string>{});
  if (!loaded.ok()) return absl::Status(loaded.code(), absl::StrCat(dir, ": ", loaded.message()));
  return encoder;
}

}  // namespace dray::qwen2_vl
