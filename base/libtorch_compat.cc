#include "base/libtorch_compat.h"

#include <ATen/ATen.h>

#include <type_traits>
#include <utility>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace dray {
namespace {

template <typename Options, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename Options>
struct HasUseLibUV<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>>
    : std::true_type {};

template <typename Options>
void DisableLibUV(Options& options) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = false;
}

}  // namespace

at::Tensor FusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& allowed) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(
      q, k, v, allowed.defined() ? std::optional<at::Tensor>(allowed) : std::nullopt);
#else
  TORCH_CHECK(false, "at::scaled_dot_product_attention needs LibTorch 2; this is ",
              kLibTorchVersion);
#endif
}

OptimizerStateKeyType OptimizerStateKey(const at::Tensor& parameter) {
#if TORCH_VERSION_MAJOR >= 2
  return parameter.unsafeGetTensorImpl();
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

void UseClassicTcpStore(c10d::TCPStoreOptions& options) { DisableLibUV(options); }

}  // namespace dray
