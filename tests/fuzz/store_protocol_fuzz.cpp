// libFuzzer target: the rendezvous store's reading of a byte stream from a peer (FrameDecoder and
// parse_store_request in bootstrap/store.hpp), as the server runs it, without sockets.
//
// Input: one byte that picks how the stream is cut into reads, then the stream. Checked beyond
// "no crash": the decoder never takes more than it was given nor stalls, takes all of a read of
// at most wanted() bytes (the server's reads), never holds more than twice the bytes it received
// nor more than the frame announced, and never accepts a frame over its limit; a request it
// parses encodes back to the same frame.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "bootstrap/store.hpp"

namespace {

using hvd::core::Bytes;
using hvd::core::FrameDecoder;
using hvd::core::StoreOp;
using hvd::core::StoreRequest;

// An invariant that failed is a finding: say which, then crash for libFuzzer to keep the input.
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

Bytes encode(const StoreRequest& r) {
  switch (r.op) {
    case StoreOp::kHello:
      return hvd::core::encode_hello(r.key);
    case StoreOp::kSet:
      return hvd::core::encode_set(r.key, r.value.data(), r.value.size());
    case StoreOp::kGet:
      return hvd::core::encode_get(r.key, r.timeout_ms);
  }
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned cut = data[0];  // read sizes cycle through 1 .. cut+1 bytes
  const char* stream = reinterpret_cast<const char*>(data + 1);
  const size_t length = size - 1;

  FrameDecoder decoder(hvd::core::kStoreMaxHelloFrame);
  uint32_t limit = hvd::core::kStoreMaxHelloFrame;
  size_t pos = 0;
  size_t frame_start = 0;  // where the frame in progress began in the stream
  for (unsigned round = 0; pos < length; ++round) {
    const size_t offered = std::min<size_t>(length - pos, 1 + round % (cut + 1));
    const size_t wanted = decoder.wanted();
    hvd::Result<size_t> took = decoder.feed(stream + pos, offered);
    if (!took.ok()) {
      // Only a header over the limit ends a stream: this read completed it, and nothing was
      // allocated for the frame it announced.
      const size_t had = pos - frame_start;
      CHECK(had < 4 && had + offered >= 4);
      uint32_t announced = 0;
      for (int i = 0; i < 4; ++i) {
        announced |= uint32_t(static_cast<uint8_t>(stream[frame_start + i])) << (8 * i);
      }
      CHECK(announced > limit);
      CHECK(decoder.capacity() == 0);
      CHECK(!decoder.feed(stream + pos, offered).ok());  // and the stream stays over
      return 0;
    }
    CHECK(*took <= offered);
    // The server reads no more than wanted(), and the decoder must take all of that.
    if (offered <= wanted) CHECK(*took == offered);
    CHECK(*took > 0 || decoder.complete());
    pos += *took;
    if (decoder.buffered() > 0) CHECK(decoder.capacity() <= 2 * decoder.buffered());
    if (!decoder.complete()) continue;

    const size_t frame_size = pos - frame_start;
    CHECK(frame_size >= 4 && frame_size - 4 <= limit);
    Bytes payload = decoder.take();
    CHECK(payload.size() == frame_size - 4);
    CHECK(std::equal(payload.begin(), payload.end(), stream + frame_start + 4));
    frame_start = pos;

    hvd::Result<StoreRequest> request = hvd::core::parse_store_request(payload);
    if (!request.ok()) continue;
    const Bytes again = encode(*request);
    CHECK(again.size() == frame_size);
    CHECK(std::equal(again.begin(), again.end(), stream + pos - frame_size));
    if (request->op == StoreOp::kHello) {  // as if the secret was right
      limit = hvd::core::kStoreMaxFrame;
      decoder.set_max_frame(limit);
    }
  }
  return 0;
}
