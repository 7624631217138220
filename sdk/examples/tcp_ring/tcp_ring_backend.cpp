// tcpring: a real multi-rank backend in one file: a ring of TCP connections, written with the
// SDK's C++ helper. It teaches the parts every transport plugin needs and is easy to get wrong:
// finding peers through the host's services, bounding every wait by the job's timeout, naming
// the peer when something fails, being interruptible from another thread (abort), and producing
// the same bits on every rank.
//
// The topology is the simplest one that moves data at link speed for large messages: rank r
// connects to its right neighbour (r + 1) % n and accepts from its left one, so each rank has
// one socket it only sends on and one it only receives on. Every collective is a sequence of
// steps that send one piece to the right while receiving another from the left.
//
// Build out of tree against an installed hvd (CMakeLists.txt beside this file), then check it
//   hvd-plugin-check build/libhvd-backend-tcpring.so
// and run it
//   hvdrun -np 4 --backend $PWD/build/libhvd-backend-tcpring.so my_app
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hvd/reduce.h"
#include "hvd/sdk/backend.hpp"

namespace {

using hvd::Status;
using Clock = std::chrono::steady_clock;

// Owns one file descriptor, so that the destructor (= finalize) closes every socket, on every
// path out of create() too.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

Status system_error(const std::string& what) {
  return Status(HVD_ERR_SYSTEM, what + ": " + std::strerror(errno));
}

// The first thing a connection carries. A port is only a number: a stray client, or a rank of
// another communicator (or an earlier job) that got the same port, must not become our
// neighbour. comm_id is the same on every member and differs between communicators.
struct Hello {
  uint64_t magic = 0x31474E4952504354ull;  // "TCPRING1"
  uint64_t comm_id = 0;
  int32_t rank = 0;
  int32_t size = 0;
  bool operator==(const Hello& o) const {
    return magic == o.magic && comm_id == o.comm_id && rank == o.rank && size == o.size;
  }
};

// One published address: fixed size, because oob_allgather takes the same size from every rank.
struct AddressRecord {
  char text[128] = {};  // "host:port"; the port follows the last ':', so IPv6 hosts work too
};

}  // namespace

class TcpRingBackend {
 public:
  static hvd::Result<std::unique_ptr<TcpRingBackend>> create(const hvd::sdk::InitContext& ctx) {
    auto self = std::make_unique<TcpRingBackend>(ctx);
    if (self->abort_fd_.get() < 0) return system_error("eventfd");
    if (ctx.size > 1) HVD_RETURN_IF_ERROR(self->connect_ring(ctx));
    return hvd::Result<std::unique_ptr<TcpRingBackend>>(std::move(self));
  }

  explicit TcpRingBackend(const hvd::sdk::InitContext& ctx)
      : rank_(ctx.rank),
        size_(ctx.size),
        timeout_(ctx.timeout),
        comm_id_(ctx.comm_id),
        members_(ctx.members),
        abort_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  // Reduce-scatter then allgather, over n blocks of the buffer. Every block's final value is
  // computed once, by the one rank that completes it, and then only copied: so the result is
  // the same bits everywhere although each block adds the ranks up in a different order.
  Status allreduce(const hvd_collective_args& a) {
    return call([&]() -> Status {
      const size_t es = hvd_dtype_size(a.dtype);
      char* buf = static_cast<char*>(a.recvbuf);
      if (a.count == 0) return Status::success();
      if (a.sendbuf != a.recvbuf) std::memcpy(buf, a.sendbuf, a.count * es);
      // Blocks differ by at most one element, so any count works with any rank count.
      const uint64_t q = a.count / size_, r = a.count % size_;
      std::vector<size_t> off(size_ + 1);
      for (int b = 0; b <= size_; ++b) off[b] = (b * q + std::min<uint64_t>(b, r)) * es;
      if (scratch_.size() < (q + 1) * es) scratch_.resize((q + 1) * es);
      HVD_RETURN_IF_ERROR(ring_pass(buf, off, rank_, &a));
      // hvd_reduce reduced AVERAGE as a sum. Dividing the one complete block here, before it
      // is copied around, gives every rank the bits that dividing the whole buffer on each
      // rank would, for 1/n of the work.
      const int mine = wrap(rank_ + 1);
      if (a.op == HVD_AVERAGE) {
        const hvd_status rc =
            hvd_divide(buf + off[mine], (off[mine + 1] - off[mine]) / es, a.dtype, size_);
        if (rc != HVD_SUCCESS) return Status(rc, "hvd_divide refused the dtype");
      }
      return ring_pass(buf, off, rank_ + 1, nullptr);
    });
  }

  // Rank r's block travels n - 1 hops to the right. With recv_counts (HVD_CAP_ALLGATHERV) the
  // blocks just have different sizes: the same loop serves allgatherv.
  Status allgather(const hvd_collective_args& a) {
    return call([&]() -> Status {
      const size_t es = hvd_dtype_size(a.dtype);
      std::vector<size_t> off(size_ + 1, 0);
      for (int r = 0; r < size_; ++r) {
        off[r + 1] = off[r] + (a.recv_counts != nullptr ? a.recv_counts[r] : a.count) * es;
      }
      if (off[size_] == 0) return Status::success();
      char* buf = static_cast<char*>(a.recvbuf);
      const size_t mine = off[rank_ + 1] - off[rank_];
      if (mine > 0 && a.sendbuf != buf + off[rank_]) std::memcpy(buf + off[rank_], a.sendbuf, mine);
      return ring_pass(buf, off, rank_, nullptr);
    });
  }

  // A chain from the root around the ring, cut into chunks so that every hop works at once:
  // while a rank forwards chunk k - 1 it already receives chunk k.
  Status broadcast(const hvd_collective_args& a) {
    return call([&]() -> Status {
      const size_t bytes = a.count * hvd_dtype_size(a.dtype);
      char* buf = static_cast<char*>(a.recvbuf);
      const bool root = rank_ == a.root;
      if (root && bytes > 0 && a.sendbuf != a.recvbuf) std::memcpy(buf, a.sendbuf, bytes);
      const bool forwards = wrap(rank_ + 1) != a.root;
      const size_t chunks = (bytes + kChunk - 1) / kChunk;
      auto length = [&](size_t k) { return std::min(kChunk, bytes - k * kChunk); };
      for (size_t k = 0; k <= chunks; ++k) {
        const bool sends = forwards && (root ? k < chunks : k > 0);
        const size_t out = root ? k : k - 1;
        const bool receives = !root && k < chunks;
        HVD_RETURN_IF_ERROR(pump(sends ? buf + out * kChunk : nullptr, sends ? length(out) : 0,
                                 receives ? buf + k * kChunk : nullptr, receives ? length(k) : 0));
      }
      return Status::success();
    });
  }

  // An allgather of one byte per rank: a rank has every byte only once every rank has sent its
  // own, that is, entered the barrier. n - 1 small steps, not a token's two laps (2n).
  Status barrier() {
    return call([&]() -> Status {
      std::vector<char> tokens(size_, 1);
      std::vector<size_t> off(size_ + 1);
      for (int r = 0; r <= size_; ++r) off[r] = r;
      return ring_pass(tokens.data(), off, rank_, nullptr);
    });
  }

  // Called from another thread. It only writes to the eventfd that every poll() below also
  // watches, so a wait in progress wakes at once; the counter is never read back, so every
  // later wait fails at once too. Nothing here waits or touches the sockets.
  Status abort() {
    aborted_.store(true);
    const uint64_t one = 1;
    const ssize_t written = ::write(abort_fd_.get(), &one, sizeof one);
    (void)written;  // it can only fail when the counter is already huge: already woken
    return Status::success();
  }

  // The destructor is finalize: the Fd members close the sockets.

 private:
  // Large enough to amortize a poll() per chunk, small enough to keep every hop busy.
  static constexpr size_t kChunk = 256 * 1024;

  struct Link {
    Fd fd;
    std::string name;  // "rank 1 (job rank 3) at 10.0.0.2:41234", for messages
  };

  int wrap(int r) const { return ((r % size_) + size_) % size_; }

  // Every collective: refuse after an abort or a failure, then bound the call as a whole (the
  // host's watchdog gives up at timeout + 1 s; we end first, with a better message).
  template <typename Fn>
  Status call(Fn&& body) {
    if (aborted_.load()) return Status(HVD_ERR_STATE, "the communicator was aborted");
    // A failure in the middle of a message leaves the byte streams out of step with the peers:
    // nothing sent later could be framed correctly, so the communicator is done.
    if (!broken_.empty()) return Status(HVD_ERR_STATE, "an earlier call failed: " + broken_);
    deadline_ = Clock::now() + timeout_;
    Status status = body();
    if (!status.ok()) broken_ = status.message();
    return status;
  }

  // n - 1 steps around the ring over the blocks [off[b], off[b + 1]) of buf: at step s send
  // block first - s and receive block first - s - 1; with `reduce`, combine what arrives into
  // that block instead of overwriting it.
  Status ring_pass(char* buf, const std::vector<size_t>& off, int first,
                   const hvd_collective_args* reduce) {
    for (int s = 0; s + 1 < size_; ++s) {
      const int out = wrap(first - s), in = wrap(first - s - 1);
      char* const block = buf + off[in];
      const size_t in_len = off[in + 1] - off[in];
      HVD_RETURN_IF_ERROR(pump(buf + off[out], off[out + 1] - off[out],
                               reduce != nullptr ? scratch_.data() : block, in_len));
      if (reduce != nullptr && in_len > 0) {
        const hvd_status rc =
            hvd_reduce(block, block, scratch_.data(), in_len / hvd_dtype_size(reduce->dtype),
                       reduce->dtype, reduce->op);
        if (rc != HVD_SUCCESS) return Status(rc, "hvd_reduce refused the dtype or op");
      }
    }
    return Status::success();
  }

  int remaining_ms() const {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
  }

  // The heart of the plugin: send out_len bytes to the right while receiving in_len bytes from
  // the left, in one poll() loop. Doing both at once is what keeps a ring from deadlocking:
  // if every rank first sent a block larger than the socket buffers, and only then received,
  // every rank would wait for its right neighbour to read, and none would.
  Status pump(const char* out, size_t out_len, char* in, size_t in_len) {
    while (out_len > 0 || in_len > 0) {
      pollfd fds[3] = {{abort_fd_.get(), POLLIN, 0},
                       {out_len > 0 ? right_.fd.get() : -1, POLLOUT, 0},  // poll skips fd -1
                       {in_len > 0 ? left_.fd.get() : -1, POLLIN, 0}};
      const int ready = ::poll(fds, 3, remaining_ms());
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return system_error("poll");
      if (fds[0].revents != 0) {
        return Status(HVD_ERR_STATE, "aborted while exchanging data with " +
                                         (in_len > 0 ? left_.name : right_.name));
      }
      // Past the deadline, even with bytes still trickling in: the timeout bounds the call.
      if (ready == 0 || Clock::now() >= deadline_) {
        // Blame the side we still wait for: a peer that never entered the collective first
        // shows as silence from the left; a full send buffer as a right that takes nothing.
        const bool receiving = in_len > 0;
        return Status(HVD_ERR_TIMEOUT,
                      std::string(receiving ? "still waiting for " : "could not send to ") +
                          (receiving ? left_.name : right_.name) + " after " +
                          std::to_string(timeout_.count()) + " ms (" +
                          std::to_string(receiving ? in_len : out_len) +
                          " bytes left): it is stuck, or not in the same collective");
      }
      // POLLERR/POLLHUP wake us too; the send() or recv() then reports what happened.
      if (fds[1].revents != 0) {
        // MSG_NOSIGNAL: a peer that died must be an error here, not a SIGPIPE that kills the
        // application.
        const ssize_t n = ::send(right_.fd.get(), out, out_len, MSG_NOSIGNAL);
        if (n >= 0) {
          out += n;
          out_len -= static_cast<size_t>(n);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return Status(HVD_ERR_REMOTE,
                        "lost the connection to " + right_.name + ": " + std::strerror(errno));
        }
      }
      if (fds[2].revents != 0) {
        const ssize_t n = ::recv(left_.fd.get(), in, in_len, 0);
        if (n > 0) {
          in += n;
          in_len -= static_cast<size_t>(n);
        } else if (n == 0) {
          return Status(HVD_ERR_REMOTE, left_.name + " closed the connection (" +
                                            std::to_string(in_len) + " bytes still expected)");
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return Status(HVD_ERR_REMOTE,
                        "lost the connection to " + left_.name + ": " + std::strerror(errno));
        }
      }
    }
    return Status::success();
  }

  // Wait for one socket within the deadline (connect: writable; listen: readable), or abort.
  Status wait(int fd, short events, const std::string& what) {
    for (;;) {
      pollfd fds[2] = {{abort_fd_.get(), POLLIN, 0}, {fd, events, 0}};
      const int ready = ::poll(fds, 2, remaining_ms());
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return system_error("poll");
      if (fds[0].revents != 0) return Status(HVD_ERR_STATE, "aborted waiting for " + what);
      if (ready == 0) {
        return Status(HVD_ERR_TIMEOUT,
                      "waited " + std::to_string(timeout_.count()) + " ms for " + what);
      }
      return Status::success();
    }
  }

  std::string describe(int r, const std::string& address) const {
    const int job_rank = members_[r];
    return "rank " + std::to_string(r) +
           (job_rank != r ? " (job rank " + std::to_string(job_rank) + ")" : "") + " at " + address;
  }

  Status connect_ring(const hvd::sdk::InitContext& ctx) {
    // The host tells us the address on our route to the rendezvous server, which peers can
    // reach; a multi-homed host may want another (HVD_TCPRING_ADDR).
    std::string host = hvd::sdk::env_or("HVD_TCPRING_ADDR", ctx.local_address);
    if (host.empty() && ctx.member_local_size == size_) host = "127.0.0.1";  // all on this host
    if (host.empty()) {
      return Status(HVD_ERR_UNSUPPORTED,
                    "the host gave no address for peers to reach; set HVD_TCPRING_ADDR");
    }

    // Port 0: the kernel picks a free port, so jobs and communicators never collide.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found); rc != 0) {
      return Status(HVD_ERR_SYSTEM, "cannot resolve '" + host + "': " + gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> bind_to(found, &freeaddrinfo);
    Fd listener(::socket(bind_to->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (listener.get() < 0) return system_error("socket");
    if (::bind(listener.get(), bind_to->ai_addr, bind_to->ai_addrlen) != 0) {
      return system_error("cannot listen on " + host);
    }
    if (::listen(listener.get(), 16) != 0) return system_error("listen");
    sockaddr_storage bound{};
    socklen_t bound_len = sizeof bound;
    ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len);
    const int port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

    // We listen before we publish, so a peer that reads our address can connect at once: the
    // kernel completes the connection into the backlog even before we call accept().
    AddressRecord mine;
    if (std::snprintf(mine.text, sizeof mine.text, "%s:%d", host.c_str(), port) >=
        static_cast<int>(sizeof mine.text)) {
      return Status(HVD_ERR_UNSUPPORTED, "address too long to publish: " + host);
    }
    std::vector<AddressRecord> all(size_);
    HVD_RETURN_IF_ERROR(ctx.host.oob_allgather(&mine, sizeof mine, all.data(), ctx.timeout));
    // What other processes sent is checked before it is used: a C string must end in the record.
    for (int r = 0; r < size_; ++r) {
      if (::strnlen(all[r].text, sizeof all[r].text) == sizeof all[r].text) {
        return Status(HVD_ERR_REMOTE, "rank " + std::to_string(r) + " sent a malformed address");
      }
    }
    // Everyone has arrived, so every listener is up: connecting is a fresh wait of its own.
    deadline_ = Clock::now() + timeout_;
    const int right = wrap(rank_ + 1), left = wrap(rank_ - 1);
    right_.name = describe(right, all[right].text);
    left_.name = describe(left, all[left].text);

    // Connect to the right first, on every rank: no rank waits in accept() for a connect that
    // its neighbour would only make after its own accept().
    HVD_RETURN_IF_ERROR(connect_right(all[right].text));
    Hello hello;
    hello.comm_id = comm_id_;
    hello.rank = rank_;
    hello.size = size_;
    HVD_RETURN_IF_ERROR(pump(reinterpret_cast<const char*>(&hello), sizeof hello, nullptr, 0));

    Hello expected = hello;
    expected.rank = left;
    for (;;) {
      HVD_RETURN_IF_ERROR(wait(listener.get(), POLLIN, left_.name + " to connect"));
      left_.fd = Fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (left_.fd.get() < 0) {
        // A client that went away before we took it is no error: wait for the next one.
        if (errno == ECONNABORTED || errno == EAGAIN || errno == EINTR) continue;
        return system_error("accept");
      }
      // The neighbour sends its hello as soon as it is connected; a client silent for a few
      // seconds is a stray, and the neighbour may be waiting in the backlog behind it.
      Hello got;
      const Clock::time_point call_deadline = deadline_;
      deadline_ = std::min(call_deadline, Clock::now() + std::chrono::seconds(5));
      const Status s = pump(nullptr, 0, reinterpret_cast<char*>(&got), sizeof got);
      deadline_ = call_deadline;
      if (s.code() == HVD_ERR_STATE) return s;
      if (s.code() == HVD_ERR_TIMEOUT && Clock::now() >= call_deadline) return s;
      if (s.ok() && got == expected) break;
      ctx.host.log(HVD_LOG_WARNING, "tcpring: refused a stray connection while waiting for " +
                                        left_.name + " of this communicator");
      left_.fd.reset();
    }
    return Status::success();  // the listener closes here: the ring is complete
  }

  Status connect_right(const std::string& address) {
    const size_t colon = address.rfind(':');
    const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return Status(HVD_ERR_SYSTEM, "cannot resolve " + right_.name + ": " + gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> peer(found, &freeaddrinfo);
    right_.fd = Fd(::socket(peer->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (right_.fd.get() < 0) return system_error("socket");
    // Non-blocking connect, so that an unreachable host costs the timeout, not the kernel's
    // SYN retries (minutes).
    if (::connect(right_.fd.get(), peer->ai_addr, peer->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) return system_error("cannot connect to " + right_.name);
      HVD_RETURN_IF_ERROR(wait(right_.fd.get(), POLLOUT, "a connection to " + right_.name));
      int error = 0;
      socklen_t length = sizeof error;
      ::getsockopt(right_.fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        errno = error;
        return system_error("cannot connect to " + right_.name);
      }
    }
    // Data flows one way on each connection, so the receiver never has a reply to piggyback
    // its ACK on; with Nagle's algorithm a small message (a barrier's byte) would then wait for
    // the delayed ACK, 40 ms. Only the sending side needs the option.
    const int one = 1;
    ::setsockopt(right_.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return Status::success();
  }

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const uint64_t comm_id_;
  const std::vector<int> members_;  // for messages: a child communicator's ranks are not the job's
  Fd abort_fd_;                     // the eventfd abort() writes to
  Link right_;                      // we send on it
  Link left_;                       // we receive on it
  std::atomic<bool> aborted_{false};
  std::string broken_;            // the first error; later calls fail with it
  Clock::time_point deadline_{};  // of the call in progress
  std::vector<char> scratch_;     // one incoming block of an allreduce, kept between calls
};

HVD_BACKEND_PLUGIN(TcpRingBackend, "tcpring", "1.0.0",
                   "ring allreduce over TCP sockets (SDK teaching example)",
                   HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV)
