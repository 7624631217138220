#include "bootstrap/store.hpp"

#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>

namespace hvd::core {
namespace {

// Wire format: every message is a u32 length and a payload. Requests start with an opcode;
// replies with a status byte followed by the value (success) or a message (error).
enum class Op : uint8_t { kHello = 1, kSet = 2, kGet = 3 };
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr auto kHandshakeTimeout = std::chrono::seconds(30);

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_i64(Bytes& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void put_bytes(Bytes& out, const char* data, size_t size) {
  put_u32(out, static_cast<uint32_t>(size));
  out.insert(out.end(), data, data + size);
}
void put_string(Bytes& out, const std::string& s) { put_bytes(out, s.data(), s.size()); }

// Bounds-checked reading of a received payload.
class Reader {
 public:
  explicit Reader(const Bytes& data) : data_(data) {}
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
  bool bytes(Bytes* v) {
    uint32_t size = 0;
    if (!u32(&size) || left() < size) return false;
    v->assign(data_.begin() + static_cast<std::ptrdiff_t>(pos_),
              data_.begin() + static_cast<std::ptrdiff_t>(pos_ + size));
    pos_ += size;
    return true;
  }
  bool string(std::string* v) {
    Bytes b;
    if (!bytes(&b)) return false;
    v->assign(b.begin(), b.end());
    return true;
  }
  Bytes rest() const {
    return Bytes(data_.begin() + static_cast<std::ptrdiff_t>(pos_), data_.end());
  }

 private:
  size_t left() const { return data_.size() - pos_; }
  const Bytes& data_;
  size_t pos_ = 0;
};

Status send_frame(int fd, const Bytes& payload, Deadline deadline) {
  Bytes frame;
  frame.reserve(payload.size() + 4);
  put_u32(frame, static_cast<uint32_t>(payload.size()));
  frame.insert(frame.end(), payload.begin(), payload.end());
  return send_all(fd, frame.data(), frame.size(), deadline);
}

Result<Bytes> recv_frame(int fd, Deadline deadline) {
  unsigned char header[4];
  HVD_RETURN_IF_ERROR(recv_all(fd, header, sizeof header, deadline));
  const uint32_t size = uint32_t(header[0]) | uint32_t(header[1]) << 8 | uint32_t(header[2]) << 16 |
                        uint32_t(header[3]) << 24;
  if (size > kMaxFrame) {
    return error(HVD_ERR_REMOTE, "rendezvous message of " + std::to_string(size) +
                                     " bytes exceeds the limit; is this an hvd peer?");
  }
  Bytes payload(size);
  HVD_RETURN_IF_ERROR(recv_all(fd, payload.data(), size, deadline));
  return payload;
}

Bytes reply(hvd_status code, const Bytes& body) {
  Bytes out(1 + body.size());
  out[0] = static_cast<char>(code);
  if (!body.empty()) std::memcpy(out.data() + 1, body.data(), body.size());
  return out;
}
Bytes reply_error(const Status& status) {
  return reply(status.code(), Bytes(status.message().begin(), status.message().end()));
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

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
    return error(HVD_ERR_TIMEOUT, "rendezvous key '" + key + "' was not published within " +
                                      std::to_string(timeout.count()) + " ms");
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

// ---- TcpStoreServer -----------------------------------------------------------------------

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const HostPort& where,
                                                              std::string secret) {
  HostPort bound;
  HVD_ASSIGN_OR_RETURN(Fd listener, listen_tcp(where, &bound));
  if (!where.host.empty() && where.host != "0.0.0.0" && where.host != "::") bound.host = where.host;
  std::unique_ptr<TcpStoreServer> server(
      new TcpStoreServer(std::move(listener), bound, std::move(secret)));
  server->acceptor_ = std::thread([s = server.get()] { s->accept_loop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(Fd listener, HostPort address, std::string secret)
    : listener_(std::move(listener)), address_(std::move(address)), secret_(std::move(secret)) {}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    ::shutdown(listener_.get(), SHUT_RDWR);             // wakes accept()
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);  // wakes every serve()
  }
  store_.close();  // wakes every waiting get
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : threads_) t.join();
}

void TcpStoreServer::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;
    }
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  bool authenticated = false;
  for (;;) {
    const Deadline deadline = authenticated ? Deadline::max() : deadline_after(kHandshakeTimeout);
    Result<Bytes> request = recv_frame(fd, deadline);
    if (!request.ok()) break;
    Reader in(request.value());
    uint8_t op = 0;
    Bytes response;
    std::string key;
    if (!in.u8(&op)) break;
    if (!authenticated) {
      std::string secret;
      if (op != static_cast<uint8_t>(Op::kHello) || !in.string(&secret) ||
          !equal_constant_time(secret, secret_)) {
        // Refused: say why, then hang up.
        (void)send_frame(fd,
                         reply_error(error(HVD_ERR_INVALID_ARGUMENT,
                                           "authentication failed: the connection did not "
                                           "present this job's secret (HVD_SECRET)")),
                         deadline_after(std::chrono::seconds(1)));
        break;
      }
      authenticated = true;
      response = reply(HVD_SUCCESS, {});
    } else if (op == static_cast<uint8_t>(Op::kSet)) {
      Bytes value;
      if (!in.string(&key) || !in.bytes(&value)) break;
      const Status s = store_.set(key, value);
      response = s.ok() ? reply(HVD_SUCCESS, {}) : reply_error(s);
    } else if (op == static_cast<uint8_t>(Op::kGet)) {
      int64_t timeout_ms = 0;
      if (!in.string(&key) || !in.i64(&timeout_ms)) break;
      Result<Bytes> value =
          store_.get(key, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
      response = value.ok() ? reply(HVD_SUCCESS, value.value()) : reply_error(value.status());
    } else {
      break;  // not an hvd client
    }
    if (!send_frame(fd, response, deadline_after(kHandshakeTimeout)).ok()) break;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  clients_.erase(std::find(clients_.begin(), clients_.end(), fd));
  ::close(fd);
}

// ---- TcpStoreClient -----------------------------------------------------------------------

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(const HostPort& server,
                                                                const std::string& secret,
                                                                std::chrono::milliseconds timeout) {
  HVD_ASSIGN_OR_RETURN(Fd fd, connect_tcp(server, deadline_after(timeout)));
  std::unique_ptr<TcpStoreClient> client(new TcpStoreClient(std::move(fd), server, timeout));
  Bytes hello;
  hello.push_back(static_cast<char>(Op::kHello));
  put_string(hello, secret);
  Result<Bytes> answer = client->call(hello, std::chrono::milliseconds(0));
  if (!answer.ok()) {
    return answer.status().with_context("the rendezvous server at " + server.to_string() +
                                        " refused this process");
  }
  return client;
}

TcpStoreClient::TcpStoreClient(Fd fd, HostPort server, std::chrono::milliseconds io_timeout)
    : fd_(std::move(fd)),
      server_(std::move(server)),
      io_timeout_(io_timeout),
      local_address_(local_address_of(fd_.get())) {}

Result<Bytes> TcpStoreClient::call(const Bytes& request, std::chrono::milliseconds wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!fd_.valid()) {
    return error(HVD_ERR_REMOTE, "the connection to the rendezvous server " + server_.to_string() +
                                     " was lost earlier");
  }
  const Deadline deadline = deadline_after(wait + io_timeout_);
  Status sent = send_frame(fd_.get(), request, deadline);
  Result<Bytes> frame = sent.ok() ? recv_frame(fd_.get(), deadline) : Result<Bytes>(sent);
  if (!frame.ok()) {
    fd_.reset();  // the stream is out of step now: never reuse it
    return frame.status().with_context("rendezvous server " + server_.to_string());
  }
  Reader in(frame.value());
  uint8_t code = 0;
  if (!in.u8(&code)) return error(HVD_ERR_REMOTE, "empty reply from the rendezvous server");
  Bytes body = in.rest();
  if (code != HVD_SUCCESS) {
    return error(static_cast<hvd_status>(code), std::string(body.begin(), body.end()));
  }
  return body;
}

Status TcpStoreClient::set(const std::string& key, const Bytes& value) {
  Bytes request;
  request.push_back(static_cast<char>(Op::kSet));
  put_string(request, key);
  put_bytes(request, value.data(), value.size());
  return call(request, std::chrono::milliseconds(0)).status();
}

Result<Bytes> TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  Bytes request;
  request.push_back(static_cast<char>(Op::kGet));
  put_string(request, key);
  put_i64(request, timeout.count());
  return call(request, timeout);
}

}  // namespace hvd::core
