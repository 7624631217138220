// store.cpp — the rendezvous store's wire protocol, the in-memory store, and the client.
#include "bootstrap/store.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/log.hpp"
#include "common/status_text.hpp"

namespace hvd::core {

using std::chrono::milliseconds;
namespace {

std::string mib(uint64_t bytes) {
  return bytes % (1u << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                 : std::to_string(bytes) + " bytes";
}

// Builds one frame: room for the length first, patched in by finish().
class FrameWriter {
 public:
  explicit FrameWriter(size_t payload_hint) {
    out_.reserve(4 + payload_hint);
    out_.resize(4);
  }
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void raw(const char* data, size_t size) { out_.insert(out_.end(), data, data + size); }
  void bytes(const char* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    raw(data, size);
  }
  Bytes finish() {
    const auto size = static_cast<uint32_t>(out_.size() - 4);
    for (int i = 0; i < 4; ++i) out_[i] = static_cast<char>((size >> (8 * i)) & 0xff);
    return std::move(out_);
  }

 private:
  Bytes out_;
};

// Bounds-checked reading of a received payload.
class Cursor {
 public:
  explicit Cursor(const Bytes& data) : data_(data) {}
  size_t pos() const { return pos_; }
  size_t left() const { return data_.size() - pos_; }
  bool u8(uint8_t* v) {
    if (left() < 1) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool u32(uint32_t* v) {
    if (left() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t(static_cast<uint8_t>(data_[pos_++])) << (8 * i);
    return true;
  }
  bool i64(int64_t* v) {
    if (left() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t(static_cast<uint8_t>(data_[pos_++])) << (8 * i);
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool string(std::string* v) {
    uint32_t size = 0;
    if (!u32(&size) || left() < size) return false;
    v->assign(data_.data() + pos_, size);
    pos_ += size;
    return true;
  }

 private:
  const Bytes& data_;
  size_t pos_ = 0;
};

}  // namespace

// ---- Wire protocol --------------------------------------------------------------------------

Bytes encode_hello(const std::string& secret) {
  FrameWriter w(5 + secret.size());
  w.u8(static_cast<uint8_t>(StoreOp::kHello));
  w.bytes(secret.data(), secret.size());
  return w.finish();
}

Bytes encode_set(const std::string& key, const char* value, size_t size) {
  FrameWriter w(9 + key.size() + size);
  w.u8(static_cast<uint8_t>(StoreOp::kSet));
  w.bytes(key.data(), key.size());
  w.bytes(value, size);
  return w.finish();
}

Bytes encode_get(const std::string& key, int64_t timeout_ms) {
  FrameWriter w(13 + key.size());
  w.u8(static_cast<uint8_t>(StoreOp::kGet));
  w.bytes(key.data(), key.size());
  w.i64(timeout_ms);
  return w.finish();
}

Bytes encode_reply(hvd_status code, const char* body, size_t size) {
  FrameWriter w(1 + size);
  w.u8(static_cast<uint8_t>(code));
  if (size > 0) w.raw(body, size);
  return w.finish();
}

Result<StoreRequest> parse_store_request(Bytes payload) {
  Cursor in(payload);
  uint8_t op = 0;
  StoreRequest request;
  auto malformed = [&](const char* what) {
    return error(HVD_ERR_INVALID_ARGUMENT,
                 std::string("malformed rendezvous request (") + what + "); is this an hvd peer?");
  };
  if (!in.u8(&op)) return malformed("empty");
  switch (static_cast<StoreOp>(op)) {
    case StoreOp::kHello:
      if (!in.string(&request.key) || in.left() != 0) return malformed("hello");
      break;
    case StoreOp::kGet:
      if (!in.string(&request.key) || !in.i64(&request.timeout_ms) || in.left() != 0) {
        return malformed("get");
      }
      break;
    case StoreOp::kSet: {
      uint32_t size = 0;
      if (!in.string(&request.key) || !in.u32(&size) || in.left() != size) return malformed("set");
      // The value is the payload's tail: move it down rather than copy a value of many MiB.
      payload.erase(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(in.pos()));
      request.value = std::move(payload);
      break;
    }
    default:
      return malformed(("opcode " + std::to_string(op)).c_str());
  }
  request.op = static_cast<StoreOp>(op);
  return request;
}

size_t FrameDecoder::wanted() const {
  if (failed_) return 0;
  if (header_have_ < 4) return 4 - header_have_;
  return size_ - payload_.size();
}

Result<size_t> FrameDecoder::feed(const char* data, size_t size) {
  if (failed_) {
    return error(HVD_ERR_INVALID_ARGUMENT, "the rendezvous stream failed earlier");
  }
  if (complete() || size == 0) return size_t{0};
  size_t taken = 0;
  if (header_have_ < 4) {
    taken = std::min(size, 4 - header_have_);
    std::memcpy(header_ + header_have_, data, taken);
    header_have_ += taken;
    if (header_have_ < 4) return taken;
    size_ = uint32_t(header_[0]) | uint32_t(header_[1]) << 8 | uint32_t(header_[2]) << 16 |
            uint32_t(header_[3]) << 24;
    if (size_ > max_frame_) {
      failed_ = true;
      return error(HVD_ERR_INVALID_ARGUMENT, "a rendezvous message of " + std::to_string(size_) +
                                                 " bytes is over the limit of " + mib(max_frame_));
    }
  }
  const size_t n = std::min(size - taken, size_t{size_} - payload_.size());
  if (n == 0) return taken;
  // Grow with what arrived, at most doubling: the buffer stays within twice the bytes received
  // and within the announced size.
  const size_t need = payload_.size() + n;
  if (need > payload_.capacity()) {
    payload_.reserve(std::min<size_t>(size_, std::max(need, 2 * payload_.size())));
  }
  payload_.insert(payload_.end(), data + taken, data + taken + n);
  return taken + n;
}

Bytes FrameDecoder::take() {
  Bytes out = std::move(payload_);
  payload_ = Bytes();
  header_have_ = 0;
  size_ = 0;
  return out;
}
Bytes encode_error(const Status& status) {
  return encode_reply(status.code(), status.message().data(), status.message().size());
}

Status not_published(const std::string& key, int64_t timeout_ms) {
  return error(HVD_ERR_TIMEOUT, "rendezvous key '" + key + "' was not published within " +
                                    std::to_string(timeout_ms) + " ms");
}

// ---- InMemoryStore ------------------------------------------------------------------------

Status InMemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return error(HVD_ERR_STATE, "the rendezvous store is shutting down");
    values_[key] = value;
  }
  changed_.notify_all();
  return Status::success();
}

Result<Bytes> InMemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool present =
      changed_.wait_for(lock, timeout, [&] { return closed_ || values_.count(key) != 0; });
  if (closed_) return error(HVD_ERR_STATE, "the rendezvous store is shutting down");
  if (!present) {
    return not_published(key, timeout.count());
  }
  return values_[key];
}

void InMemoryStore::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}
// ---- TcpStoreClient -----------------------------------------------------------------------

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(const HostPort& server,
                                                                const std::string& secret,
                                                                std::chrono::milliseconds timeout) {
  if (secret.size() > kStoreMaxSecret) {
    return error(HVD_ERR_INVALID_ARGUMENT, "the job's secret (HVD_SECRET) has " +
                                               std::to_string(secret.size()) +
                                               " bytes; the rendezvous store takes at most " +
                                               std::to_string(kStoreMaxSecret));
  }
  const Deadline deadline = deadline_after(timeout);
  const Bytes hello = encode_hello(secret);
  auto backoff = milliseconds(10);
  for (;;) {
    HVD_ASSIGN_OR_RETURN(Fd fd, connect_tcp(server, deadline));
    std::unique_ptr<TcpStoreClient> client(new TcpStoreClient(std::move(fd), server, timeout));
    Result<Bytes> answer = client->call(hello, deadline);
    if (answer.ok()) return client;
    // A reply is the server's verdict. A connection closed without one was dropped unheard (a
    // server evicts its oldest unauthenticated connection under a flood): try again.
    const bool replied = client->fd_.valid();
    if (replied || Clock::now() + backoff >= deadline) {
      return answer.status().with_context("the rendezvous server at " + server.to_string() +
                                          " refused this process");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

TcpStoreClient::TcpStoreClient(Fd fd, HostPort server, std::chrono::milliseconds io_timeout)
    : fd_(std::move(fd)),
      server_(std::move(server)),
      io_timeout_(io_timeout),
      local_address_(local_address_of(fd_.get())) {}

Result<Bytes> TcpStoreClient::receive_frame(Deadline deadline) {
  FrameDecoder decoder(kStoreMaxFrame);
  if (scratch_.empty()) scratch_.resize(size_t{64} << 10);
  while (!decoder.complete()) {
    HVD_ASSIGN_OR_RETURN(const size_t n,
                         recv_some(fd_.get(), scratch_.data(),
                                   std::min(scratch_.size(), decoder.wanted()), deadline));
    HVD_RETURN_IF_ERROR(decoder.feed(scratch_.data(), n).status());
  }
  return decoder.take();
}

Result<Bytes> TcpStoreClient::call(const Bytes& frame, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!fd_.valid()) {
    return error(HVD_ERR_REMOTE, "the connection to the rendezvous server " + server_.to_string() +
                                     " was lost earlier");
  }
  Status sent = send_all(fd_.get(), frame.data(), frame.size(), deadline);
  Result<Bytes> got = sent.ok() ? receive_frame(deadline) : Result<Bytes>(sent);
  if (!got.ok()) {
    fd_.reset();  // the stream is out of step now: never reuse it
    return got.status().with_context("rendezvous server " + server_.to_string());
  }
  Bytes payload = std::move(got).value();
  if (payload.empty()) return error(HVD_ERR_REMOTE, "empty reply from the rendezvous server");
  const auto code = static_cast<uint8_t>(payload[0]);
  payload.erase(payload.begin());
  if (code != HVD_SUCCESS) {
    return error(known_error(code, HVD_ERR_REMOTE), std::string(payload.begin(), payload.end()));
  }
  return payload;
}

Status TcpStoreClient::set(const std::string& key, const Bytes& value) {
  if (9 + key.size() + value.size() > kStoreMaxFrame) {
    return error(HVD_ERR_INVALID_ARGUMENT, "rendezvous value of " + std::to_string(value.size()) +
                                               " bytes under key '" + key +
                                               "' is over the store's limit of " +
                                               mib(kStoreMaxFrame) + " per message");
  }
  return call(encode_set(key, value.data(), value.size()), deadline_after(io_timeout_)).status();
}

Result<Bytes> TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  if (13 + key.size() > kStoreMaxFrame) {
    return error(HVD_ERR_INVALID_ARGUMENT, "rendezvous key of " + std::to_string(key.size()) +
                                               " bytes is over the store's limit");
  }
  return call(encode_get(key, timeout.count()), deadline_after(timeout + io_timeout_));
}

}  // namespace hvd::core
