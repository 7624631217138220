// store.hpp — the rendezvous key-value store: how ranks find each other before any backend runs.
//
// KvStore is the interface every consumer uses (bootstrap, the host services handed to plugins).
// InMemoryStore serves single-process jobs. TcpStoreServer is what hvdrun (or rank 0) hosts at
// HVD_RENDEZVOUS_ADDR; TcpStoreClient is how ranks reach it. Every connection must present the
// job's secret first; every wait is bounded. The server listens on a network port anyone may
// reach, so it is written to survive hostile peers: it allocates almost nothing for a connection
// before its secret is checked, caps connections, and serves them all from one thread.
#ifndef HVD_CORE_BOOTSTRAP_STORE_HPP
#define HVD_CORE_BOOTSTRAP_STORE_HPP

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.hpp"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

using Bytes = std::vector<char>;

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Publish `value` under `key`, replacing any earlier value.
  virtual Status set(const std::string& key, const Bytes& value) = 0;
  // Wait up to `timeout` for `key`, then return its value; HVD_ERR_TIMEOUT if it never came.
  virtual Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

class InMemoryStore final : public KvStore {
 public:
  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override;
  // Wake every waiter with an error; later calls fail at once.
  void close();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
  bool closed_ = false;
};

// ---- The wire protocol ----------------------------------------------------------------------
//
// Every message is a frame: a little-endian u32 payload length, then the payload. A request's
// payload is an opcode and its fields (strings and values as a u32 length and bytes, integers
// little-endian); a reply's is a status byte, then the value (success) or a message (error).
//   hello: 1, secret          set: 2, key, value          get: 3, key, i64 timeout in ms
// The first frame of a connection must be a hello with the job's secret.

// Before authentication a frame is a hello, and a hello holds a secret: 1 KiB is plenty.
inline constexpr uint32_t kStoreMaxHelloFrame = 1024;
inline constexpr size_t kStoreMaxSecret = kStoreMaxHelloFrame - 5;  // opcode and length
// After it, a frame holds a key and a value. Backends without a network of their own (the kvs
// test backend) move collective data through the store, a few MiB per value.
inline constexpr uint32_t kStoreMaxFrame = 256u << 20;

enum class StoreOp : uint8_t { kHello = 1, kSet = 2, kGet = 3 };

struct StoreRequest {
  StoreOp op = StoreOp::kHello;
  std::string key;         // the secret, for a hello
  Bytes value;             // set
  int64_t timeout_ms = 0;  // get
};

// Whole frames (length included), ready to send.
Bytes encode_hello(const std::string& secret);
Bytes encode_set(const std::string& key, const char* value, size_t size);
Bytes encode_get(const std::string& key, int64_t timeout_ms);
Bytes encode_reply(hvd_status code, const char* body, size_t size);
Bytes encode_error(const Status& status);

// What a get that outlived its timeout returns, from either store.
Status not_published(const std::string& key, int64_t timeout_ms);

// A request frame's payload as a request; an error for anything the client does not send
// (unknown opcode, a field cut short, bytes left over). Takes the payload so that a set's value
// moves into the request instead of being copied.
Result<StoreRequest> parse_store_request(Bytes payload);

// Cuts a byte stream into frames, one at a time, as the bytes arrive. A header announcing more
// than the limit is refused before anything is allocated for it, and a payload's buffer grows
// with the bytes that actually came (never more than twice them), not with what the header
// announced: a peer must send a GiB before it costs one.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame) : max_frame_(max_frame) {}

  // Applies from the next header on; authentication raises it.
  void set_max_frame(uint32_t max_frame) { max_frame_ = max_frame; }
  // Bytes that complete the frame in progress (the header's rest, or the payload's): reading no
  // more than this from a socket leaves nothing to keep outside the decoder.
  size_t wanted() const;
  // Takes bytes up to the end of the frame in progress and returns how many it took (0 while a
  // complete frame waits to be taken). An error for a header over the limit: it ends the stream.
  Result<size_t> feed(const char* data, size_t size);
  bool complete() const { return header_have_ == 4 && payload_.size() == size_; }
  // The complete frame's payload; the decoder moves on to the next frame.
  Bytes take();

  size_t buffered() const { return payload_.size(); }
  size_t capacity() const { return payload_.capacity(); }

 private:
  uint32_t max_frame_;
  unsigned char header_[4] = {};
  size_t header_have_ = 0;
  uint32_t size_ = 0;
  Bytes payload_;
  bool failed_ = false;
};

// ---- The server -----------------------------------------------------------------------------

struct TcpStoreLimits {
  // Ranks keep one connection each for the job's life: room for very large jobs.
  size_t max_connections = 16384;
  // Connections that have not presented the secret yet. A real rank sends its hello at once; at
  // the cap the oldest is dropped for a newcomer, so a flood cannot keep a real rank out.
  size_t max_unauthenticated = 256;
  // From accept to a correct hello.
  std::chrono::milliseconds auth_timeout = std::chrono::seconds(5);
  // A reply its client does not read; the reply holds a value, so its memory is bounded too.
  std::chrono::milliseconds write_timeout = std::chrono::seconds(30);
};

// What the server refused, counted since it started (also logged, at most every 10 s).
struct TcpStoreStats {
  uint64_t accepted = 0;
  uint64_t authenticated = 0;
  uint64_t wrong_secret = 0;     // a first frame that is not a hello with the secret
  uint64_t bad_frame = 0;        // over the size limit, or malformed
  uint64_t evicted = 0;          // unauthenticated, dropped for a newcomer at a cap
  uint64_t auth_timeouts = 0;    // silent past auth_timeout
  uint64_t over_capacity = 0;    // refused: max_connections authenticated connections open
  uint64_t fd_exhausted = 0;     // accept found no file descriptor (EMFILE, ENFILE)
  uint64_t write_timeouts = 0;   // a reply not read within write_timeout
  uint64_t open = 0;             // connections now
  uint64_t unauthenticated = 0;  // of which not authenticated yet
};

class TcpStoreServer {
 public:
  // Listen on `where` (port 0: any free port) for clients presenting `secret`.
  static Result<std::unique_ptr<TcpStoreServer>> start(const HostPort& where, std::string secret,
                                                       const TcpStoreLimits& limits = {});
  ~TcpStoreServer();  // stops the loop, answers parked gets with an error, closes everything
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const HostPort& address() const { return address_; }
  TcpStoreStats stats() const;

 private:
  class Loop;  // the event loop and every connection's state (store.cpp)
  TcpStoreServer(std::unique_ptr<Loop> loop, HostPort address);

  std::unique_ptr<Loop> loop_;
  HostPort address_;
  std::thread thread_;
};

// ---- The client -----------------------------------------------------------------------------

class TcpStoreClient final : public KvStore {
 public:
  // Connect (retrying until `timeout` while the server comes up, or when it dropped this
  // connection unauthenticated under a flood) and authenticate.
  static Result<std::unique_ptr<TcpStoreClient>> connect(const HostPort& server,
                                                         const std::string& secret,
                                                         std::chrono::milliseconds timeout);
  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override;

  // This host's address on the route to the server: a good address to advertise to peers.
  const std::string& local_address() const { return local_address_; }

 private:
  TcpStoreClient(Fd fd, HostPort server, std::chrono::milliseconds io_timeout);
  // Send a request frame and receive its reply before `deadline`. A failure of the connection
  // itself (not an error the server replied) leaves the client disconnected.
  Result<Bytes> call(const Bytes& frame, Deadline deadline);
  Result<Bytes> receive_frame(Deadline deadline);

  std::mutex mutex_;  // one request in flight per connection
  Fd fd_;
  HostPort server_;
  std::chrono::milliseconds io_timeout_;
  std::string local_address_;
  Bytes scratch_;  // what recv fills, before the decoder takes it
};

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_STORE_HPP
