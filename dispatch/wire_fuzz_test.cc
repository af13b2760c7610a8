// Feeds random, truncated and mutated bytes to the DataProto decoder: every
// input must give either a valid DataProto or a clear error, never a crash or
// a hang. Deterministic (fixed seeds), so a failure reproduces.
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>

#include <random>
#include <string>
#include <vector>

#include "dispatch/payload_stream.h"
#include "dispatch/wire.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

// Decode parses `bytes` as a DataProto message and decodes it. It checks the
// contract: an error has a message; a success is internally consistent.
void Decode(const std::string& bytes) {
  v1::DataProto message;
  if (!message.ParseFromString(bytes)) return;  // not a message at all: protobuf said so
  absl::StatusOr<DataProto> decoded = FromWire(std::move(message));
  if (!decoded.ok()) {
    EXPECT_FALSE(decoded.status().message().empty());
    return;
  }
  for (const auto& [name, tensor] : decoded->tensors()) {
    ASSERT_EQ(tensor.size(0), decoded->size()) << name;
    // Touch every byte: a tensor that claims memory it does not own fails here.
    volatile char sink = 0;
    const char* data = static_cast<const char*>(tensor.data_ptr());
    for (size_t i = 0; i < tensor.nbytes(); ++i) sink ^= data[i];
  }
}

std::string ValidMessage() {
  const DataProto data =
      DataProto::Make({{"latents", at::randn({3, 2, 4})},
                       {"ids", at::arange(3, at::kLong)},
                       {"mask", at::arange(3, at::kLong).remainder(2).to(at::kBool)}},
                      {{"instructions", std::vector<std::string>{"a", "bb", "ccc"}},
                       {"images", std::vector<Image>{{Image::Format::kRaw, 2, 2, 1, "abcd"},
                                                     {Image::Format::kPng, 0, 0, 0, "png"},
                                                     {Image::Format::kJpeg, 1, 1, 3, "jpg"}}},
                       {"blobs", std::vector<Bytes>{{"x"}, {"yz"}, {""}}},
                       {"scores", std::vector<double>{1, 2, 3}}},
                      {{"step", int64_t{3}}, {"name", std::string("fuzz")}})
          .value();
  return ToWire(data).value().SerializeAsString();
}

TEST(WireFuzzTest, RandomBytes) {
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 256, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Decode(bytes);
  }
}

TEST(WireFuzzTest, EveryTruncation) {
  const std::string valid = ValidMessage();
  for (size_t length = 0; length <= valid.size(); ++length) Decode(valid.substr(0, length));
}

TEST(WireFuzzTest, ByteMutations) {
  const std::string valid = ValidMessage();
  std::mt19937 rng(2);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = valid;
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    Decode(bytes);
  }
}

// Field mutations reach deeper than byte flips: they keep the message
// parseable and change exactly the numbers the decoder must distrust.
TEST(WireFuzzTest, FieldMutations) {
  v1::DataProto valid;
  ASSERT_TRUE(valid.ParseFromString(ValidMessage()));
  std::mt19937_64 rng(3);
  const int64_t interesting[] = {0, 1, -1, 2, 3, 7, 64, 1 << 20, INT32_MAX, INT64_MAX, INT64_MIN};
  auto pick = [&] {
    return rng() % 2 ? interesting[rng() % std::size(interesting)] : static_cast<int64_t>(rng());
  };
  for (int i = 0; i < 20000; ++i) {
    v1::DataProto message = valid;
    v1::Tensor* tensor = message.mutable_tensors(rng() % message.tensors_size())->mutable_tensor();
    v1::Image* image = message.mutable_non_tensors(1)->mutable_images()->mutable_values(rng() % 3);
    switch (rng() % 8) {
      case 0:
        tensor->set_dtype(static_cast<v1::DType>(pick() % 16));
        break;
      case 1:
        tensor->set_shape(rng() % tensor->shape_size(), pick());
        break;
      case 2:
        tensor->mutable_data()->set_offset(pick());
        break;
      case 3:
        tensor->mutable_data()->set_size(pick());
        break;
      case 4:
        image->set_width(static_cast<int32_t>(pick()));
        break;
      case 5:
        image->set_format(static_cast<v1::Image::Format>(pick() % 6));
        break;
      case 6:
        image->mutable_data()->set_offset(pick());
        break;
      case 7:
        tensor->add_shape(pick());
        break;
    }
    Decode(message.SerializeAsString());
  }
}

TEST(WireFuzzTest, StreamedChunksOfAnySize) {
  v1::DataProto valid;
  ASSERT_TRUE(valid.ParseFromString(ValidMessage()));
  std::mt19937 rng(4);
  for (int i = 0; i < 2000; ++i) {
    const absl::string_view payload = valid.payload();
    v1::DataProto header = valid;
    header.clear_payload();
    // Lie about the size now and then: the assembler must notice.
    const bool lie = rng() % 4 == 0;
    if (lie) header.set_payload_size(header.payload_size() + (rng() % 3) - 1);
    PayloadAssembler assembler({&header});
    absl::Status status;
    const size_t chunk_bytes = 1 + rng() % 700;
    for (size_t offset = 0; offset < payload.size() && status.ok(); offset += chunk_bytes) {
      status = assembler.Add(payload.substr(offset, chunk_bytes));
    }
    if (status.ok()) status = assembler.Finish();
    if (header.payload_size() == valid.payload_size()) {
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_TRUE(FromWire(header).ok());
    } else {
      EXPECT_FALSE(status.ok());
    }
  }
}

}  // namespace
}  // namespace dray
