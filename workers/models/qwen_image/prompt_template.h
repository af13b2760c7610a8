// The chat template Qwen-Image-Edit wraps every instruction in before the
// text encoder sees it (diffusers' QwenImageEditPipeline): a system turn
// asking to describe the image and the change, then the user turn holding
// the image placeholder and the instruction. The encoder's hidden states of
// the system turn and the user header are dropped (diffusers'
// prompt_template_encode_start_idx, 64 tokens with Qwen2's vocabulary).
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_PROMPT_TEMPLATE_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_PROMPT_TEMPLATE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dray::qwen_image {

// kEditPromptPrefix: everything before the instruction; its tokens up to
// kEditPromptDroppedUpTo (the user header's end) are dropped.
inline constexpr char kEditPromptPrefix[] =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. "
    "Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original "
    "input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>";
inline constexpr char kEditPromptSuffix[] = "<|im_end|>\n<|im_start|>assistant\n";
inline constexpr char kEditPromptDroppedUpTo[] = "<|im_start|>user\n";

inline std::string FormatEditPrompt(absl::string_view instruction) {
  return std::string(kEditPromptPrefix) + std::string(instruction) + kEditPromptSuffix;
}

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_PROMPT_TEMPLATE_H_
