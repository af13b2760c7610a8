#include "workers/models/joint_attention.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dray {
namespace {

// kNormEps: the q/k RMS norms' epsilon.
constexpr double kNormEps = 1e-6;

// CheckCollective: inside a module's forward there is no status to return:
// a failed collective fails the pass (the worker answers with its message).
void CheckCollective(const absl::Status& status) {
  if (!status.ok())
    throw std::runtime_error(absl::StrCat("sequence parallelism: ", status.message()));
}

LinearImpl::Options LinearOptions(int64_t in, int64_t out, at::TensorOptions options) {
  return {in, out, /*bias=*/true, options};
}

}  // namespace

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& freqs) {
  std::vector<int64_t> pairs(x.sizes().begin(), x.sizes().end() - 1);
  pairs.push_back(-1);
  pairs.push_back(2);
  const at::Tensor rotated =
      at::view_as_complex(AtLeastFloat32(x).reshape(pairs)) * freqs.unsqueeze(1);
  return at::view_as_real(rotated).flatten(3).to(x.scalar_type());
}

FeedForwardImpl::FeedForwardImpl(int64_t dim, at::TensorOptions options) {
  in_ = RegisterAt(*this, "net.0.proj", Linear(LinearOptions(dim, 4 * dim, options)));
  out_ = RegisterAt(*this, "net.2", Linear(LinearOptions(4 * dim, dim, options)));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return out_->forward(at::gelu(in_->forward(x), "tanh"));
}

JointAttentionImpl::JointAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim,
                                       at::TensorOptions options)
    : heads_(heads) {
  const int64_t inner = heads * head_dim;
  to_q_ = RegisterAt(*this, "to_q", Linear(LinearOptions(dim, inner, options)));
  to_k_ = RegisterAt(*this, "to_k", Linear(LinearOptions(dim, inner, options)));
  to_v_ = RegisterAt(*this, "to_v", Linear(LinearOptions(dim, inner, options)));
  add_q_proj_ = RegisterAt(*this, "add_q_proj", Linear(LinearOptions(dim, inner, options)));
  add_k_proj_ = RegisterAt(*this, "add_k_proj", Linear(LinearOptions(dim, inner, options)));
  add_v_proj_ = RegisterAt(*this, "add_v_proj", Linear(LinearOptions(dim, inner, options)));
  to_out_ = RegisterAt(*this, "to_out.0", Linear(LinearOptions(inner, dim, options)));
  to_add_out_ = RegisterAt(*this, "to_add_out", Linear(LinearOptions(inner, dim, options)));
  norm_q_ = RegisterAt(*this, "norm_q", RMSNorm(head_dim, kNormEps, options));
  norm_k_ = RegisterAt(*this, "norm_k", RMSNorm(head_dim, kNormEps, options));
  norm_added_q_ = RegisterAt(*this, "norm_added_q", RMSNorm(head_dim, kNormEps, options));
  norm_added_k_ = RegisterAt(*this, "norm_added_k", RMSNorm(head_dim, kNormEps, options));
}

std::pair<at::Tensor, at::Tensor> JointAttentionImpl::forward(const at::Tensor& image,
                                                              const at::Tensor& text,
                                                              const at::Tensor& image_freqs,
                                                              const at::Tensor& text_freqs,
                                                              const at::Tensor& mask) {
  auto heads = [this](const at::Tensor& x) { return x.unflatten(-1, {heads_, -1}); };
  const at::Tensor img_q = ApplyRope(norm_q_->forward(heads(to_q_->forward(image))), image_freqs);
  const at::Tensor img_k = ApplyRope(norm_k_->forward(heads(to_k_->forward(image))), image_freqs);
  const at::Tensor img_v = heads(to_v_->forward(image));
  const at::Tensor txt_q =
      ApplyRope(norm_added_q_->forward(heads(add_q_proj_->forward(text))), text_freqs);
  const at::Tensor txt_k =
      ApplyRope(norm_added_k_->forward(heads(add_k_proj_->forward(text))), text_freqs);
  const at::Tensor txt_v = heads(add_v_proj_->forward(text));
  if (sequence_group_ != nullptr) {
    const auto [img_out, txt_out] =
        UlyssesAttention(img_q, img_k, img_v, txt_q, txt_k, txt_v, mask);
    return {to_out_->forward(img_out), to_add_out_->forward(txt_out)};
  }

  // Joint attention over [text, image]: [B, H, S, D].
  const at::Tensor q = at::cat({txt_q, img_q}, 1).permute({0, 2, 1, 3});
  const at::Tensor k = at::cat({txt_k, img_k}, 1).permute({0, 2, 1, 3});
  const at::Tensor v = at::cat({txt_v, img_v}, 1).permute({0, 2, 1, 3});
  const at::Tensor allowed =
      mask.defined() ? mask.view({mask.size(0), 1, 1, mask.size(1)}) : at::Tensor();
  const at::Tensor joint =
      DotProductAttention(q, k, v, allowed).permute({0, 2, 1, 3}).flatten(2, 3).to(q.scalar_type());
  const int64_t text_length = text.size(1);
  return {to_out_->forward(joint.slice(1, text_length)),
          to_add_out_->forward(joint.slice(1, 0, text_length))};
}

std::pair<at::Tensor, at::Tensor> JointAttentionImpl::UlyssesAttention(
    const at::Tensor& img_q, const at::Tensor& img_k, const at::Tensor& img_v,
    const at::Tensor& txt_q, const at::Tensor& txt_k, const at::Tensor& txt_v,
    const at::Tensor& mask) {
  Communicator& group = *sequence_group_;
  const int64_t ranks = group.world_size(), local_heads = heads_ / ranks;
  const int64_t batch = img_q.size(0), part = img_q.size(1), depth = img_q.size(3);
  const int64_t text_length = txt_q.size(1), image_length = ranks * part;
  // This rank's image tokens for every rank's heads, in one exchange:
  // [P (to), 3, B, part, H / P, D] out, [P (from), ...] in.
  const at::Tensor sent = at::stack({img_q, img_k, img_v})
                              .view({3, batch, part, ranks, local_heads, depth})
                              .permute({3, 0, 1, 2, 4, 5})
                              .contiguous();
  at::Tensor received = at::empty_like(sent);
  CheckCollective(group.AllToAll(sent, received));
  const at::Tensor image =
      received.permute({1, 2, 0, 3, 4, 5}).reshape({3, batch, image_length, local_heads, depth});
  // The text is on every rank: this rank's heads of it, then its image.
  const int64_t first_head = group.rank() * local_heads;
  auto joint = [&](const at::Tensor& text, int64_t which) {
    return at::cat({text.narrow(2, first_head, local_heads), image[which]}, 1)
        .permute({0, 2, 1, 3});
  };
  const at::Tensor q = joint(txt_q, 0);
  const at::Tensor allowed =
      mask.defined() ? mask.view({mask.size(0), 1, 1, mask.size(1)}) : at::Tensor();
  const at::Tensor out = DotProductAttention(q, joint(txt_k, 1), joint(txt_v, 2), allowed)
                             .permute({0, 2, 1, 3})
                             .to(q.scalar_type());  // [B, S_txt + P x part, H / P, D]
  // The image outputs back to their tokens' ranks, every rank's heads.
  const at::Tensor image_sent = out.narrow(1, text_length, image_length)
                                    .reshape({batch, ranks, part, local_heads, depth})
                                    .permute({1, 0, 2, 3, 4})
                                    .contiguous();
  at::Tensor image_received = at::empty_like(image_sent);
  CheckCollective(group.AllToAll(image_sent, image_received));
  // The text outputs of every rank's heads.
  const at::Tensor text_mine = out.narrow(1, 0, text_length).contiguous();
  at::Tensor text_all = at::empty({ranks, batch, text_length, local_heads, depth}, out.options());
  CheckCollective(group.AllGather(text_mine, text_all));
  auto heads_last = [&](const at::Tensor& t, int64_t length) {
    return t.permute({1, 2, 0, 3, 4}).reshape({batch, length, heads_ * depth});
  };
  return {heads_last(image_received, part), heads_last(text_all, text_length)};
}

}  // namespace dray
