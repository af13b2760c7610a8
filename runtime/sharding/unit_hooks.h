// UnitHooks: what a model calls around each of its sharding units (e.g. its
// transformer blocks), in order, so that sharding is applied from outside
// and the model stays single-device code (see fully_sharded.h).
#ifndef DRAY_RUNTIME_SHARDING_UNIT_HOOKS_H_
#define DRAY_RUNTIME_SHARDING_UNIT_HOOKS_H_

#include <cstddef>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dray {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // BeforeForward runs when the model's forward starts, before any unit.
  virtual void BeforeForward() {}
  // BeforeUnit runs before unit `index`'s forward.
  virtual void BeforeUnit(size_t index) = 0;
  // AfterUnit runs after it, with the unit's outputs.
  virtual void AfterUnit(size_t index, const std::vector<at::Tensor>& outputs) = 0;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_UNIT_HOOKS_H_
