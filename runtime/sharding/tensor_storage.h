// Releasing and re-allocating a tensor's storage while keeping the tensor
// (and every view of it) intact: how sharded units free their gathered
// parameters between uses, and how layers build parameters shape-only.
#ifndef DRAY_RUNTIME_SHARDING_TENSOR_STORAGE_H_
#define DRAY_RUNTIME_SHARDING_TENSOR_STORAGE_H_

#include <ATen/core/Tensor.h>

namespace dray {

// ReleaseStorage frees `tensor`'s memory; its shape and views remain, but
// must not be read until AllocateStorage.
void ReleaseStorage(const at::Tensor& tensor);

// AllocateStorage gives a released tensor memory again (uninitialized).
void AllocateStorage(const at::Tensor& tensor);

// HasStorage is false for a tensor whose storage is released.
bool HasStorage(const at::Tensor& tensor);

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_TENSOR_STORAGE_H_
