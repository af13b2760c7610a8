// Shapes for per-sample arithmetic on [B, ...] tensors, as the RL numerics
// reduce and broadcast them:
//
//   x.mean(SampleDims(x))        // [B]: a mean over each sample's elements
//   t.view(PerSampleShape(x))    // [B] -> [B, 1, ...], to broadcast against x
#ifndef DRAY_WORKERS_RL_PER_SAMPLE_H_
#define DRAY_WORKERS_RL_PER_SAMPLE_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dray::rl {

// SampleDims: every dimension of `x` but the first.
inline std::vector<int64_t> SampleDims(const at::Tensor& x) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// PerSampleShape: [-1, 1, ...] with as many dimensions as `x`.
inline std::vector<int64_t> PerSampleShape(const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = -1;
  return shape;
}

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_PER_SAMPLE_H_
