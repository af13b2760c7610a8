#include "runtime/sharding/tensor_storage.h"

#include <c10/core/StorageImpl.h>

namespace dray {

void ReleaseStorage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

void AllocateStorage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t bytes = (tensor.storage_offset() + tensor.numel()) * tensor.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

bool HasStorage(const at::Tensor& tensor) {
  return tensor.numel() == 0 || tensor.storage().nbytes() > 0;
}

}  // namespace dray
