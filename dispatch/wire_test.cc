#include "dispatch/wire.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <limits>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "dispatch/payload_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// RoundTrip sends `data` through the wire format, as bytes, and back.
absl::StatusOr<DataProto> RoundTrip(const DataProto& data) {
  absl::StatusOr<v1::DataProto> message = ToWire(data);
  if (!message.ok()) return message.status();
  v1::DataProto received;
  if (!received.ParseFromString(message->SerializeAsString())) {
    return absl::InternalError("serialized DataProto does not parse");
  }
  return FromWire(std::move(received));
}

v1::DataProto Encoded(const DataProto& data) { return ToWire(data).value(); }

DataProto OneColumn(at::Tensor tensor) { return DataProto::Make({{"x", tensor}}).value(); }

at::Tensor RandomOf(at::ScalarType dtype, at::IntArrayRef shape) {
  if (dtype == at::kBool) return at::randint(0, 2, shape, at::kLong).to(at::kBool);
  if (at::isFloatingType(dtype)) return at::randn(shape, at::kDouble).to(dtype);
  return at::randint(-100, 100, shape, at::kLong).to(dtype);
}

class EveryDTypeTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(EveryDTypeTest, RoundTripsBitExactly) {
  const at::Tensor tensor = RandomOf(GetParam(), {3, 5, 2});
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, RoundTrip(OneColumn(tensor)));
  const at::Tensor result = decoded.GetTensor("x").value();
  EXPECT_TRUE(SameTensor(result, tensor)) << c10::toString(GetParam());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(result.data_ptr()) % result.element_size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Wire, EveryDTypeTest,
                         ::testing::Values(at::kBool, at::kByte, at::kChar, at::kShort, at::kInt,
                                           at::kLong, at::kHalf, at::kBFloat16, at::kFloat,
                                           at::kDouble));

TEST(WireTest, SpecialFloatValuesKeepTheirBits) {
  const float values[] = {
      std::numeric_limits<float>::quiet_NaN(),  -0.0f,
      std::numeric_limits<float>::infinity(),   -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
  const at::Tensor tensor = at::from_blob(const_cast<float*>(values), {6}, at::kFloat).clone();
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, RoundTrip(OneColumn(tensor)));
  EXPECT_TRUE(SameTensor(decoded.GetTensor("x").value(), tensor));
}

TEST(WireTest, NonContiguousTensorsArriveWithTheirValues) {
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  for (const at::Tensor& view :
       {base.t(), base.slice(1, 0, 6, 2), base.select(1, 3).unsqueeze(1), base.expand({2, 4, 6})}) {
    ASSERT_TRUE(!view.is_contiguous() || view.data_ptr() != base.data_ptr() || view.dim() == 2);
    DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, RoundTrip(OneColumn(view)));
    EXPECT_TRUE(SameTensor(decoded.GetTensor("x").value(), view.contiguous()));
  }
}

TEST(WireTest, ZeroDimAndZeroSizeTensors) {
  std::string payload;
  DRAY_ASSERT_OK_AND_ASSIGN(v1::Tensor scalar,
                            EncodeTensor(at::full({}, 2.5, at::kDouble), &payload));
  DRAY_ASSERT_OK_AND_ASSIGN(v1::Tensor empty,
                            EncodeTensor(at::zeros({2, 0, 3}, at::kHalf), &payload));
  const Bytes shared(payload);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor scalar_back, DecodeTensor(scalar, shared, "scalar"));
  EXPECT_EQ(scalar_back.dim(), 0);
  EXPECT_EQ(scalar_back.item<double>(), 2.5);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor empty_back, DecodeTensor(empty, shared, "empty"));
  EXPECT_TRUE(SameTensor(empty_back, at::zeros({2, 0, 3}, at::kHalf)));
}

TEST(WireTest, EmptyBatchesKeepTheirColumns) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto empty,
      DataProto::Make({{"latents", at::zeros({0, 4, 8}, at::kBFloat16)}},
                      {{"images", std::vector<Image>{}}, {"text", std::vector<std::string>{}}},
                      {{"note", std::string("nothing here")}}));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, RoundTrip(empty));
  EXPECT_TRUE(SameDataProto(decoded, empty));
  EXPECT_EQ(decoded.size(), 0);

  DRAY_ASSERT_OK_AND_ASSIGN(DataProto nothing, RoundTrip(DataProto()));
  EXPECT_TRUE(SameDataProto(nothing, DataProto()));
}

TEST(WireTest, NonTensorColumnsAndMetaRoundTrip) {
  const std::string binary("\0\xff\x01 with a NUL", 14);
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto data,
      DataProto::Make(
          {{"reward", at::randn({3})}},
          {{"instructions", std::vector<std::string>{"make the sky purple", "把天空变成紫色",
                                                     std::string("a\0b", 3)}},
           {"images", std::vector<Image>{{Image::Format::kRaw, 2, 1, 3, "abcdef"},
                                         {Image::Format::kPng, 640, 480, 3, "\x89PNG\r\n\x1a\n..."},
                                         {Image::Format::kJpeg, 0, 0, 0, "\xff\xd8\xff"}}},
           {"blobs", std::vector<Bytes>{{binary}, {""}, {std::string(100000, 'x')}}},
           {"ids", std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 0, 42}},
           {"scores", std::vector<double>{-0.0, 1e308, std::numeric_limits<double>::infinity()}},
           {"extra", std::vector<Json>{{"{}"}, {"[1,2]"}, {"{\"k\":\"v\"}"}}}},
          {{"flag", true},
           {"steps", int64_t{-3}},
           {"temperature", 0.7},
           {"name", std::string("grpo")},
           {"config", Json{"{\"lr\":1e-5}"}}}));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, RoundTrip(data));
  EXPECT_TRUE(SameDataProto(decoded, data));
}

TEST(WireTest, PayloadBuffersAreAligned) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto data, DataProto::Make({{"a", at::zeros({3}, at::kByte)}, {"b", at::zeros({3})}},
                                      {{"blobs", std::vector<Bytes>{{"x"}, {"yy"}, {"zzz"}}}}));
  const v1::DataProto message = Encoded(data);
  EXPECT_EQ(message.payload_size(), message.payload().size());
  for (const auto& column : message.tensors()) EXPECT_EQ(column.tensor().data().offset() % 64, 0u);
  for (const auto& ref : message.non_tensors(0).bytes().values()) EXPECT_EQ(ref.offset() % 64, 0u);
}

TEST(WireTest, MisalignedForeignBuffersAreCopied) {
  v1::DataProto message = Encoded(OneColumn(at::arange(4, at::kDouble)));
  // A foreign encoder may place buffers anywhere: shift this one by one byte.
  std::string payload = std::string(1, '\0') + message.payload();
  message.mutable_tensors(0)->mutable_tensor()->mutable_data()->set_offset(
      message.tensors(0).tensor().data().offset() + 1);
  message.set_payload(payload);
  message.set_payload_size(payload.size());
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, FromWire(message));
  EXPECT_TRUE(SameTensor(decoded.GetTensor("x").value(), at::arange(4, at::kDouble)));
}

TEST(WireTest, DecodedTensorsOutliveTheirMessage) {
  at::Tensor kept;
  {
    DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded,
                              RoundTrip(OneColumn(at::arange(1000, at::kFloat))));
    kept = decoded.GetTensor("x").value();
  }
  EXPECT_TRUE(SameTensor(kept, at::arange(1000, at::kFloat)));
}

TEST(WireTest, EncodingRejectsDTypesTheWireCannotCarry) {
  EXPECT_THAT(ToWire(OneColumn(at::zeros({2}, at::kComplexFloat))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor column 'x': tensor has dtype ComplexFloat")));
}

TEST(WireTest, DecodingNamesWhatIsWrong) {
  const v1::DataProto good = Encoded(DataProto::Make({{"x", at::zeros({2, 3})}}).value());
  struct Case {
    const char* what;
    std::function<void(v1::DataProto*)> corrupt;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"unknown dtype",
       [](v1::DataProto* m) {
         m->mutable_tensors(0)->mutable_tensor()->set_dtype(static_cast<v1::DType>(99));
       },
       "tensor column 'x' has unknown dtype 99"},
      {"unspecified dtype",
       [](v1::DataProto* m) {
         m->mutable_tensors(0)->mutable_tensor()->set_dtype(v1::DTYPE_UNSPECIFIED);
       },
       "unknown dtype 0"},
      {"shape does not match bytes",
       [](v1::DataProto* m) { m->mutable_tensors(0)->mutable_tensor()->set_shape(1, 4); },
       "shape [2, 4] of Float needs 32 bytes, got 24"},
      {"negative dimension",
       [](v1::DataProto* m) { m->mutable_tensors(0)->mutable_tensor()->set_shape(0, -2); },
       "negative dimension -2"},
      {"overflowing shape",
       [](v1::DataProto* m) {
         m->mutable_tensors(0)->mutable_tensor()->set_shape(0, int64_t{1} << 62);
       },
       "too large"},
      {"truncated payload",
       [](v1::DataProto* m) {
         m->mutable_payload()->resize(10);
         m->set_payload_size(10);
       },
       "needs payload bytes [0, +24) but the payload has 10 bytes (truncated?)"},
      {"buffer past the end",
       [](v1::DataProto* m) {
         m->mutable_tensors(0)->mutable_tensor()->mutable_data()->set_offset(~uint64_t{0});
       },
       "but the payload has"},
      {"payload_size mismatch", [](v1::DataProto* m) { m->set_payload_size(1000); },
       "payload has 24 bytes but payload_size is 1000"},
      {"duplicate column", [](v1::DataProto* m) { *m->add_tensors() = m->tensors(0); },
       "duplicate column 'x'"},
      {"0-d column",
       [](v1::DataProto* m) {
         auto* t = m->mutable_tensors(0)->mutable_tensor();
         t->clear_shape();
         t->mutable_data()->set_size(4);
       },
       "'x' is 0-d"},
      {"inconsistent batch",
       [](v1::DataProto* m) {
         m->add_non_tensors()->mutable_ints()->add_values(1);
         m->mutable_non_tensors(0)->set_name("n");
       },
       "inconsistent batch sizes: non-tensor column 'n' has 1 rows, the batch has 2"},
      {"non-tensor column without rows",
       [](v1::DataProto* m) { m->add_non_tensors()->set_name("n"); },
       "non-tensor column 'n' has no rows"},
      {"meta without value", [](v1::DataProto* m) { (*m->mutable_meta_info())["k"]; },
       "meta key 'k' has no value"},
  };
  for (const Case& c : cases) {
    v1::DataProto message = good;
    c.corrupt(&message);
    EXPECT_THAT(FromWire(message), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.what;
  }
}

TEST(WireTest, DecodingRejectsBadBoolsAndRawImages) {
  v1::DataProto bools = Encoded(OneColumn(at::zeros({4}, at::kBool)));
  (*bools.mutable_payload())[bools.tensors(0).tensor().data().offset() + 2] = 7;
  EXPECT_THAT(FromWire(bools), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("bool element 2 is 7, not 0 or 1")));

  const DataProto images =
      DataProto::Make(
          {},
          {{"images", std::vector<Image>{{Image::Format::kRaw, 2, 2, 3, std::string(12, 'p')}}}})
          .value();
  v1::DataProto short_image = Encoded(images);
  short_image.mutable_non_tensors(0)->mutable_images()->mutable_values(0)->set_height(3);
  EXPECT_THAT(
      FromWire(short_image),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("non-tensor column 'images' row 0: raw image 2x3x3 needs 18 bytes, got 12")));
  v1::DataProto no_format = Encoded(images);
  no_format.mutable_non_tensors(0)->mutable_images()->mutable_values(0)->set_format(
      v1::Image::FORMAT_UNSPECIFIED);
  EXPECT_THAT(FromWire(no_format), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("row 0 has unknown image format 0")));
  v1::DataProto five_channels = Encoded(images);
  five_channels.mutable_non_tensors(0)->mutable_images()->mutable_values(0)->set_channels(5);
  EXPECT_THAT(FromWire(five_channels),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1-4 channels")));
}

// StreamAndReassemble sends `batches` through the chunked path: detached
// headers, then every payload in chunks of `chunk_bytes`, reassembled.
absl::StatusOr<std::vector<v1::DataProto>> StreamAndReassemble(
    const std::vector<DataProto>& batches, size_t chunk_bytes) {
  std::vector<v1::DataProto> headers;
  std::vector<ScatteredPayload> payloads;
  for (const DataProto& batch : batches) {
    DRAY_ASSIGN_OR_RETURN(DetachedWire wire, ToDetachedWire(batch));
    v1::DataProto header;
    header.ParseFromString(wire.header.SerializeAsString());
    headers.push_back(std::move(header));
    payloads.push_back(std::move(wire.payload));
  }
  std::vector<v1::DataProto*> header_pointers;
  for (v1::DataProto& header : headers) header_pointers.push_back(&header);
  PayloadAssembler assembler(header_pointers);
  for (const ScatteredPayload& payload : payloads) {
    for (const Bytes& piece : payload.pieces) {
      for (size_t offset = 0; offset < piece.size(); offset += chunk_bytes) {
        DRAY_RETURN_IF_ERROR(assembler.Add(piece.view().substr(offset, chunk_bytes)));
      }
    }
  }
  DRAY_RETURN_IF_ERROR(assembler.Finish());
  return headers;
}

// MixedBatch: a tensor, small and large images, small and large byte rows, strings.
DataProto MixedBatch() {
  const std::string large(kReferencedRowBytes + 5, 'L');
  return DataProto::Make(
             {{"latents", at::arange(12, at::kFloat).reshape({3, 4})}},
             {{"images", std::vector<Image>{{Image::Format::kRaw, 2, 1, 3, Bytes("rgbrgb")},
                                            {Image::Format::kPng, 0, 0, 0, Bytes(large)},
                                            {Image::Format::kJpeg, 0, 0, 0, Bytes("jpg")}}},
              {"blobs", std::vector<Bytes>{Bytes(large + "b"), Bytes("x"), Bytes("")}},
              {"text", std::vector<std::string>{"a", "bc", "def"}}},
             {{"step", int64_t{7}}})
      .value();
}

TEST(WireTest, DetachedWireIsToWireWithItsPayloadInPieces) {
  const DataProto batch = MixedBatch();
  const v1::DataProto contiguous = Encoded(batch);
  DRAY_ASSERT_OK_AND_ASSIGN(DetachedWire detached, ToDetachedWire(batch));
  EXPECT_TRUE(detached.header.payload().empty());
  EXPECT_EQ(detached.header.payload_size(), contiguous.payload().size());
  EXPECT_EQ(detached.payload.size, contiguous.payload().size());
  EXPECT_EQ(detached.payload.Flatten(), contiguous.payload());
  v1::DataProto header_only = contiguous;
  header_only.clear_payload();
  EXPECT_EQ(detached.header.SerializeAsString(), header_only.SerializeAsString());
}

TEST(WireTest, DetachedWireReferencesLargeRowsAndCopiesTheRest) {
  const DataProto batch = MixedBatch();
  DRAY_ASSERT_OK_AND_ASSIGN(DetachedWire detached, ToDetachedWire(batch));
  const std::vector<Image>& images = *batch.GetRows<Image>("images").value();
  const std::vector<Bytes>& blobs = *batch.GetRows<Bytes>("blobs").value();
  const at::Tensor latents = batch.GetTensor("latents").value();
  auto referenced = [&](const char* data) {
    for (const Bytes& piece : detached.payload.pieces) {
      if (piece.data() == data) return true;
    }
    return false;
  };
  EXPECT_TRUE(referenced(images[1].bytes.data()));
  EXPECT_TRUE(referenced(blobs[0].data()));
  EXPECT_FALSE(referenced(images[0].bytes.data()));                        // small: copied
  EXPECT_FALSE(referenced(static_cast<const char*>(latents.data_ptr())));  // tensors: always copied
  // Copied bytes between the large rows coalesce: copied, image, copied, blob, copied.
  EXPECT_EQ(detached.payload.pieces.size(), 5u);
}

TEST(WireTest, APayloadInPiecesDecodesInPlaceAndNoBufferMayStraddleTwo) {
  const DataProto batch = MixedBatch();
  DRAY_ASSERT_OK_AND_ASSIGN(DetachedWire detached, ToDetachedWire(batch));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, FromWire(detached.header, detached.payload));
  EXPECT_TRUE(decoded.GetTensor("latents").value().equal(batch.GetTensor("latents").value()));
  const std::vector<Image>& images = *batch.GetRows<Image>("images").value();
  EXPECT_EQ(*decoded.GetRows<Image>("images").value(), images);
  EXPECT_EQ(decoded.GetRows<Image>("images").value()->at(1).bytes.data(), images[1].bytes.data())
      << "a row aliases the piece it lies in";

  // Cut the large image's piece in two: its buffer now straddles them.
  ScatteredPayload cut;
  for (const Bytes& piece : detached.payload.pieces) {
    if (piece.data() != images[1].bytes.data()) {
      cut.pieces.push_back(piece);
      continue;
    }
    cut.pieces.push_back(piece.Part(piece.view().substr(0, 10)));
    cut.pieces.push_back(piece.Part(piece.view().substr(10)));
  }
  cut.size = detached.payload.size;
  EXPECT_THAT(FromWire(detached.header, cut).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("straddle")));
}

TEST(WireTest, DetachedPiecesOutliveTheBatch) {
  DetachedWire detached;
  std::string expected;
  {
    const DataProto batch = MixedBatch();
    expected = Encoded(batch).payload();
    detached = ToDetachedWire(batch).value();
  }
  EXPECT_EQ(detached.payload.Flatten(), expected);
}

TEST(PayloadStreamTest, ChunkedTransferReassemblesEveryMessage) {
  const DataProto big =
      DataProto::Make({{"latents", at::randn({64, 4, 64, 64})}},
                      {{"images", std::vector<Image>(64, Image{Image::Format::kRaw, 32, 32, 3,
                                                               std::string(32 * 32 * 3, 'q')})}})
          .value();
  const DataProto small = OneColumn(at::arange(3, at::kInt));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<v1::DataProto> messages,
                            StreamAndReassemble({big, DataProto(), small}, 1 << 20));
  EXPECT_TRUE(SameDataProto(FromWire(std::move(messages[0])).value(), big));
  EXPECT_TRUE(SameDataProto(FromWire(std::move(messages[1])).value(), DataProto()));
  EXPECT_TRUE(SameDataProto(FromWire(std::move(messages[2])).value(), small));
}

TEST(PayloadStreamTest, DetachedPayloadMustBeAttachedBeforeDecoding) {
  const v1::DataProto message = ToDetachedWire(OneColumn(at::arange(3, at::kInt))).value().header;
  EXPECT_THAT(FromWire(message), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("must be attached before decoding")));
}

TEST(PayloadStreamTest, AssemblerRejectsExtraAndMissingBytes) {
  v1::DataProto header;
  header.set_payload_size(10);
  PayloadAssembler assembler({&header});
  DRAY_ASSERT_OK(assembler.Add("0123"));
  EXPECT_THAT(assembler.Finish(), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("stream ended after 4 of 10")));
  DRAY_ASSERT_OK(assembler.Add("456789"));
  DRAY_ASSERT_OK(assembler.Finish());
  EXPECT_EQ(header.payload(), "0123456789");
  EXPECT_THAT(assembler.Add("!"), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("more payload bytes than the 10")));
}

// The point of streaming: a batch larger than gRPC's 2 GiB message limit.
TEST(PayloadStreamTest, StreamsBatchesLargerThanTwoGiB) {
  const int64_t rows = 33, row_elements = int64_t{1} << 23;  // 33 x 64 MiB of int64 = 2.06 GiB
  const at::Tensor big = at::arange(rows * row_elements, at::kLong).reshape({rows, row_elements});
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<v1::DataProto> messages,
                            StreamAndReassemble({OneColumn(big)}, kDefaultChunkBytes));
  ASSERT_GT(messages[0].payload_size(), uint64_t{2} << 30);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto decoded, FromWire(std::move(messages[0])));
  EXPECT_TRUE(SameTensor(decoded.GetTensor("x").value(), big));
}

}  // namespace
}  // namespace dray
