// What differs between the LibTorch versions dray builds against (Debian
// 12's 1.13, Debian 13's 2.6, a GPU machine's CUDA 2.x), in one place: the
// rest of dray asks here and never tests a version itself.
#ifndef DRAY_BASE_LIBTORCH_COMPAT_H_
#define DRAY_BASE_LIBTORCH_COMPAT_H_

#include <ATen/core/Tensor.h>
#include <torch/version.h>

#include <string>
#include <type_traits>

namespace c10d {
struct TCPStoreOptions;
}  // namespace c10d

namespace dray {

// kLibTorchVersion: "MAJOR.MINOR.PATCH" of the LibTorch dray was built with.
inline const std::string kLibTorchVersion = TORCH_VERSION;

// kHasFusedAttention: whether at::scaled_dot_product_attention exists
// (LibTorch 2.0 and later): flash, memory-efficient and cuDNN kernels on a
// GPU, a flash kernel on CPU, none of them holding the whole score matrix.
inline constexpr bool kHasFusedAttention = TORCH_VERSION_MAJOR >= 2;

// FusedAttention: at::scaled_dot_product_attention(q, k, v, allowed) with
// the default scale 1/sqrt(D) and a boolean mask (true: may attend), or an
// undefined `allowed` for none. Throws c10::Error where !kHasFusedAttention.
at::Tensor FusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& allowed);

// OptimizerStateKey: how torch::optim keys a parameter's state in its
// state() map: the TensorImpl's address, as a string on LibTorch 1.x.
using OptimizerStateKeyType = std::conditional_t<(TORCH_VERSION_MAJOR >= 2), void*, std::string>;
OptimizerStateKeyType OptimizerStateKey(const at::Tensor& parameter);

// UseClassicTcpStore: c10d's TCPStore on the backend every LibTorch has.
// From 2.4 it defaults to a libuv one, which Debian 13's LibTorch is built
// without ("use_libuv was requested but PyTorch was build without libuv").
void UseClassicTcpStore(c10d::TCPStoreOptions& options);

}  // namespace dray

#endif  // DRAY_BASE_LIBTORCH_COMPAT_H_
