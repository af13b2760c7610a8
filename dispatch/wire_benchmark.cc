// Cost of the DataProto wire codec: the fixed cost per call (tiny batches),
// the per-byte cost (image batches), and what detached encoding saves. Run: bazel run -c opt
// //dispatch:wire_benchmark
#include <ATen/ops/zeros.h>

#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "dispatch/wire.h"

namespace dray {
namespace {

DataProto Tiny() { return DataProto::Make({{"x", at::zeros({1}, at::kLong)}}).value(); }

DataProto Images(int count) {
  std::vector<Image> images(
      count, Image{Image::Format::kRaw, 512, 512, 3, std::string(512 * 512 * 3, 'p')});
  return DataProto::Make({}, {{"images", images}}).value();
}

void BM_EncodeTiny(benchmark::State& state) {
  const DataProto data = Tiny();
  for (auto _ : state) benchmark::DoNotOptimize(ToWire(data));
}
BENCHMARK(BM_EncodeTiny);

void BM_DecodeTiny(benchmark::State& state) {
  const v1::DataProto message = ToWire(Tiny()).value();
  for (auto _ : state) benchmark::DoNotOptimize(FromWire(message));
}
BENCHMARK(BM_DecodeTiny);

void BM_RoundTripImages(benchmark::State& state) {
  const DataProto data = Images(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(FromWire(ToWire(data).value()));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 512 * 512 * 3);
}
BENCHMARK(BM_RoundTripImages)->Arg(16);

// Encoding for the Session stream: the baseline is ToWire of the same batch.
void BM_EncodeImages(benchmark::State& state) {
  const DataProto data = Images(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ToWire(data));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 512 * 512 * 3);
}
BENCHMARK(BM_EncodeImages)->Arg(16);

void BM_EncodeImagesDetached(benchmark::State& state) {
  const DataProto data = Images(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ToDetachedWire(data));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 512 * 512 * 3);
}
BENCHMARK(BM_EncodeImagesDetached)->Arg(16);

}  // namespace
}  // namespace dray

BENCHMARK_MAIN();
