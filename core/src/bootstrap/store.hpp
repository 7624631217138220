// store.hpp — the rendezvous key-value store: how ranks find each other before any backend runs.
//
// KvStore is the interface every consumer uses (bootstrap, the host services handed to plugins).
// InMemoryStore serves single-process jobs and backs the TCP server. TcpStoreServer is what
// hvdrun (or rank 0) hosts at HVD_RENDEZVOUS_ADDR; TcpStoreClient is how ranks reach it. Every
// connection must present the job's secret first; every wait is bounded.
#ifndef HVD_CORE_BOOTSTRAP_STORE_HPP
#define HVD_CORE_BOOTSTRAP_STORE_HPP

#include <chrono>
#include <condition_variable>
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

class TcpStoreServer {
 public:
  // Listen on `where` (port 0: any free port) for clients presenting `secret`.
  static Result<std::unique_ptr<TcpStoreServer>> start(const HostPort& where, std::string secret);
  ~TcpStoreServer();  // stops accepting, disconnects every client, joins every thread
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const HostPort& address() const { return address_; }

 private:
  TcpStoreServer(Fd listener, HostPort address, std::string secret);
  void accept_loop();
  void serve(int fd);

  Fd listener_;
  HostPort address_;
  std::string secret_;
  InMemoryStore store_;
  std::mutex mutex_;
  bool stopping_ = false;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

class TcpStoreClient final : public KvStore {
 public:
  // Connect (retrying until `timeout` while the server comes up) and authenticate.
  static Result<std::unique_ptr<TcpStoreClient>> connect(const HostPort& server,
                                                         const std::string& secret,
                                                         std::chrono::milliseconds timeout);
  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override;

  // This host's address on the route to the server: a good address to advertise to peers.
  const std::string& local_address() const { return local_address_; }

 private:
  TcpStoreClient(Fd fd, HostPort server, std::chrono::milliseconds io_timeout);
  Result<Bytes> call(const Bytes& request, std::chrono::milliseconds wait);

  std::mutex mutex_;  // one request in flight per connection
  Fd fd_;
  HostPort server_;
  std::chrono::milliseconds io_timeout_;
  std::string local_address_;
};

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_STORE_HPP
