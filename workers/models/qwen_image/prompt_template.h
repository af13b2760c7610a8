// The chat template Qwen-Image-Edit wraps every instruction in before the
// text encoder sees it (diffusers' QwenImageEditPipeline and
// QwenImageEditPlusPipeline): a system turn asking to describe the image and
// the change, then the user turn holding the images' placeholders and the
// instruction. Edit-Plus names each image ("Picture 1: ", "Picture 2: ",
// ...) before its placeholder. The encoder's hidden states of the first
// tokens are dropped (diffusers' prompt_template_encode_start_idx: 64, the
// system turn and user header with Qwen2's vocabulary).
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_PROMPT_TEMPLATE_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_PROMPT_TEMPLATE_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dray::qwen_image {

// kEditSystemTurn: the system turn and the user header.
inline constexpr char kEditSystemTurn[] =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. "
    "Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original "
    "input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n";
inline constexpr char kImagePlaceholder[] = "<|vision_start|><|image_pad|><|vision_end|>";
inline constexpr char kEditPromptSuffix[] = "<|im_end|>\n<|im_start|>assistant\n";
// kDroppedTemplateTokens: diffusers' prompt_template_encode_start_idx.
inline constexpr int64_t kDroppedTemplateTokens = 64;

// EditPromptPrefix: everything before the instruction, for `images` input
// images, each named "Picture N: " when `name_pictures` (Edit-Plus).
inline std::string EditPromptPrefix(int images, bool name_pictures) {
  std::string prefix = kEditSystemTurn;
  for (int i = 1; i <= images; ++i) {
    if (name_pictures) absl::StrAppend(&prefix, "Picture ", i, ": ");
    absl::StrAppend(&prefix, kImagePlaceholder);
  }
  return prefix;
}

// FormatEditPrompt: Qwen-Image-Edit's whole prompt for one image.
inline std::string FormatEditPrompt(absl::string_view instruction) {
  return absl::StrCat(EditPromptPrefix(1, /*name_pictures=*/false), instruction, kEditPromptSuffix);
}

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_PROMPT_TEMPLATE_H_
