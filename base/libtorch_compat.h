// What differs between the LibTorch versions dray builds against (Debian
// 12's 1.13, Debian 13's 2.6, a GPU machine's CUDA 2.x), in one place: the
// rest of dray asks here and never tests a version itself.
#ifndef DRAY_BASE_LIBTORCH_COMPAT_H_
#define DRAY_BASE_LIBTORCH_COMPAT_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace c10d {
struct TCPStoreOptions;
}  // namespace c10d

namespace dray {

// kLibTorchVersion: "MAJOR.MINOR.PATCH" of the LibTorch dray was built with.
inline const std::string kLibTorchVersion = TORCH_VERSION;

// kLibTorch2: LibTorch 2 or later, for code that models what the version
// does (the memory plan: zero_grad frees gradients, products keep less).
inline constexpr bool kLibTorch2 = TORCH_VERSION_MAJOR >= 2;

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

namespace compat_internal {

// ConstAllocate: whether c10::Allocator::allocate is const (it is not from
// LibTorch 2.3 on, which also asks allocators for copy_data).
template <typename Allocator, typename = void>
struct ConstAllocate : std::false_type {};
template <typename Allocator>
struct ConstAllocate<Allocator,
                     std::void_t<decltype(std::declval<const Allocator&>().allocate(size_t{0}))>>
    : std::true_type {};

template <typename Allocator, bool = ConstAllocate<Allocator>::value>
class CpuAllocatorBase : public Allocator {
 public:
  virtual c10::DataPtr Allocate(size_t bytes) const = 0;
  c10::DataPtr allocate(size_t bytes) const override { return Allocate(bytes); }
};

template <typename Allocator>
class CpuAllocatorBase<Allocator, false> : public Allocator {
 public:
  virtual c10::DataPtr Allocate(size_t bytes) const = 0;
  c10::DataPtr allocate(size_t bytes) override { return Allocate(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    this->default_copy_data(dest, src, count);  // memcpy
  }
};

}  // namespace compat_internal

// CpuAllocator: a c10::Allocator of CPU memory written once for every
// LibTorch: a subclass defines `c10::DataPtr Allocate(size_t) const`.
using CpuAllocator = compat_internal::CpuAllocatorBase<c10::Allocator>;

}  // namespace dray

#endif  // DRAY_BASE_LIBTORCH_COMPAT_H_
