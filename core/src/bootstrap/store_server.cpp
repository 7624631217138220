// store_server.cpp — TcpStoreServer: the rendezvous store's server, one thread on epoll.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iterator>
#include <list>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "bootstrap/store.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"

namespace hvd::core {
namespace {

using std::chrono::milliseconds;

// A get parks for at most this long whatever it asks: deadlines must not overflow the clock.
constexpr int64_t kMaxWaitMs = int64_t{30} * 24 * 3600 * 1000;
bool equal_constant_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// A reason to a connection about to be closed, and the end of the stream: one attempt, never a
// wait (it is a few bytes, and a fresh socket's buffer takes them).
void tell(int fd, const Status& status) {
  const Bytes frame = encode_error(status);
  (void)send_nonblocking(fd, frame.data(), frame.size());
  ::shutdown(fd, SHUT_WR);
}

// Closing a socket with unread input makes the kernel reset the connection, and the reset can
// destroy a reason before the peer reads it (a newcomer's hello is often unread when it is turned
// away). A refused connection therefore lingers, its input discarded, until the peer closes or
// this long has passed; at most kMaxLingering at once, beyond which they close at once.
constexpr auto kLinger = std::chrono::seconds(1);
constexpr size_t kMaxLingering = 64;

Status auth_failed() {
  return error(HVD_ERR_INVALID_ARGUMENT,
               "authentication failed: the connection did not present this job's secret "
               "(HVD_SECRET)");
}

}  // namespace
// ---- TcpStoreServer: the event loop --------------------------------------------------------
//
// One thread serves every connection: non-blocking sockets on epoll, each connection a small
// state machine (its frame decoder, its unsent reply, the key it waits for). A get for a key not
// yet published parks the connection under that key with a deadline; a set answers every
// connection parked on its key; the deadline answers HVD_ERR_TIMEOUT. A connection is read only
// while it has no reply pending and waits for nothing, so a client that pipelines requests or
// never reads its replies holds at most one reply in the server.

class TcpStoreServer::Loop {
 public:
  Loop(Fd listener, Fd epoll, Fd wake, std::string secret, TcpStoreLimits limits, std::string name)
      : listener_(std::move(listener)),
        epoll_(std::move(epoll)),
        wake_(std::move(wake)),
        reserve_(::open("/dev/null", O_RDONLY | O_CLOEXEC)),
        secret_(std::move(secret)),
        limits_(limits),
        name_(std::move(name)),
        scratch_(size_t{256} << 10) {}

  void run();
  // Any thread: ask run() to return.
  void stop() {
    stopping_.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
  TcpStoreStats stats() const;

  static constexpr uint64_t kListenerId = 0;
  static constexpr uint64_t kWakeId = 1;

 private:
  enum class Timer { kNone, kAuth, kWait, kWrite, kLinger };
  struct Connection {
    uint64_t id = 0;
    Fd fd;
    bool authenticated = false;
    bool lingering = false;  // refused: told why, input discarded until the peer closes
    FrameDecoder decoder{kStoreMaxHelloFrame};
    Bytes out;  // the reply being sent
    size_t out_sent = 0;
    bool parked = false;  // a get waits for `waiting_for`
    std::string waiting_for;
    int64_t wait_ms = 0;  // what the get asked for, for its timeout message
    Timer timer = Timer::kNone;
    Deadline deadline = Deadline::max();
    bool listed = false;  // in unauthenticated_: a newcomer, first to go when room is needed
    std::list<uint64_t>::iterator unauthenticated;
    uint32_t events = 0;  // what epoll watches for; 0 until it is in the epoll set
  };

  struct Counter {
    std::atomic<uint64_t> value{0};
    uint64_t reported = 0;  // at the last log line (loop thread only)
  };

  bool wants_read(const Connection& c) const { return c.lingering || (!c.parked && c.out.empty()); }
  Connection* find(uint64_t id) {
    const auto it = connections_.find(id);
    return it == connections_.end() ? nullptr : it->second.get();
  }

  void accept_pending();
  // Out of descriptors: takes the next newcomer with the spare one, and drops it, admits it in
  // an evicted connection's place, or turns it away. False when there is no spare.
  bool accept_with_reserve();
  void admit(Fd fd);
  Connection* add(Fd fd);
  void turn_away(Fd fd, const Status& why);
  void on_event(uint64_t id, uint32_t events);
  bool read(Connection& c);
  bool handle(Connection& c, Bytes payload);
  bool reply(Connection& c, Bytes frame);
  bool flush(Connection& c);
  void park(Connection& c, const std::string& key, Deadline deadline);
  void unpark(Connection& c);
  void wake(const std::string& key, const Bytes& value);
  void refuse(Connection& c, const Status& why);
  bool evict_unauthenticated(bool authentication_will_do);
  void unlist(Connection& c);
  void close(Connection& c);
  void arm(Connection& c, Timer timer, Deadline deadline);
  void watch(Connection& c);
  void expire(Deadline now);
  void pause_accepting(Deadline until);
  int wait_ms(Deadline now) const;
  void note(Counter& counter) {
    counter.value.fetch_add(1, std::memory_order_relaxed);
    log_pending_ = true;
  }
  void report(Deadline now);
  void shut_down();

  Fd listener_;
  Fd epoll_;
  Fd wake_;
  Fd reserve_;  // a spare descriptor, given up to turn a connection away when there is none
  const std::string secret_;
  const TcpStoreLimits limits_;
  const std::string name_;
  std::atomic<bool> stopping_{false};

  Bytes scratch_;  // every read lands here first
  uint64_t next_id_ = kWakeId + 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::list<uint64_t> unauthenticated_;  // oldest first
  size_t lingering_ = 0;
  std::set<std::pair<Deadline, uint64_t>> timers_;  // one per connection at most
  std::unordered_map<std::string, Bytes> values_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;
  Deadline accept_paused_until_ = Deadline::min();

  Counter accepted_, authenticated_, wrong_secret_, bad_frame_, evicted_, auth_timeouts_,
      over_capacity_, fd_exhausted_, write_timeouts_;
  std::atomic<uint64_t> open_{0}, unauthenticated_count_{0};
  bool log_pending_ = false;
  Deadline next_log_ = Deadline::min();
};

TcpStoreStats TcpStoreServer::Loop::stats() const {
  TcpStoreStats s;
  s.accepted = accepted_.value.load();
  s.authenticated = authenticated_.value.load();
  s.wrong_secret = wrong_secret_.value.load();
  s.bad_frame = bad_frame_.value.load();
  s.evicted = evicted_.value.load();
  s.auth_timeouts = auth_timeouts_.value.load();
  s.over_capacity = over_capacity_.value.load();
  s.fd_exhausted = fd_exhausted_.value.load();
  s.write_timeouts = write_timeouts_.value.load();
  s.open = open_.load();
  s.unauthenticated = unauthenticated_count_.load();
  return s;
}

void TcpStoreServer::Loop::run() {
  epoll_event events[64];
  while (!stopping_.load()) {
    const int n = ::epoll_wait(epoll_.get(), events, 64, wait_ms(Clock::now()));
    if (n < 0) {
      if (errno == EINTR) continue;
      log(HVD_LOG_ERROR, "rendezvous store " + name_ + ": epoll_wait: " + std::strerror(errno));
      break;
    }
    for (int i = 0; i < n && !stopping_.load(); ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) continue;  // stopping_ says why
      if (id == kListenerId) {
        accept_pending();
      } else {
        on_event(id, events[i].events);
      }
    }
    const Deadline now = Clock::now();
    expire(now);
    if (accept_paused_until_ != Deadline::min() && now >= accept_paused_until_) {
      accept_paused_until_ = Deadline::min();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenerId;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &ev);
    }
    report(now);
  }
  shut_down();
}

int TcpStoreServer::Loop::wait_ms(Deadline now) const {
  Deadline next = Deadline::max();
  if (!timers_.empty()) next = timers_.begin()->first;
  if (accept_paused_until_ != Deadline::min()) next = std::min(next, accept_paused_until_);
  if (log_pending_) next = std::min(next, next_log_);
  if (next == Deadline::max()) return -1;
  if (next <= now) return 0;
  // Round up: waking a little early would only spin until the deadline.
  const auto left = std::chrono::ceil<milliseconds>(next - now).count();
  return static_cast<int>(std::min<int64_t>(left, INT_MAX));
}

void TcpStoreServer::Loop::accept_pending() {
  // A bounded batch, so that a flood of connections cannot starve the established ones.
  for (int i = 0; i < 256; ++i) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      admit(Fd(fd));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      // accept() fails so whether or not a connection is pending: nobody is evicted for an empty
      // queue (a rank whose hello is still on its way would be).
      pollfd pending{listener_.get(), POLLIN, 0};
      if (::poll(&pending, 1, 0) <= 0 || (pending.revents & POLLIN) == 0) return;
      // The pending connection stays in the backlog and keeps the listener readable: take it
      // with the spare descriptor, then drop it if it hung up already, or free a descriptor for
      // it, or turn it away; or stop watching for a while, but never spin.
      note(fd_exhausted_);
      if (accept_with_reserve()) continue;
      if (evict_unauthenticated(/*authentication_will_do=*/false)) continue;
      pause_accepting(Clock::now() + milliseconds(100));
      return;
    }
    log(HVD_LOG_ERROR, "rendezvous store " + name_ + ": accept: " + std::strerror(errno));
    pause_accepting(Clock::now() + milliseconds(100));
    return;
  }
}

bool TcpStoreServer::Loop::accept_with_reserve() {
  if (!reserve_.valid()) return false;
  reserve_.reset();
  Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) {
    const bool none_pending = errno == EAGAIN || errno == EWOULDBLOCK;
    reserve_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return none_pending;  // the queue emptied meanwhile: accept_pending sees so
  }
  // A newcomer that hung up already (a client that gave up waiting in the backlog, a scanner)
  // costs no connection its place.
  char byte;
  if (::recv(fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
    accepted_.value.fetch_add(1, std::memory_order_relaxed);
    fd.reset();
    reserve_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return true;
  }
  // Room for it: closing the oldest unauthenticated connection takes the reserve back.
  if (evict_unauthenticated(/*authentication_will_do=*/false)) {
    admit(std::move(fd));
    return true;
  }
  accepted_.value.fetch_add(1, std::memory_order_relaxed);
  note(over_capacity_);
  // It lingers in the reserve's place; close() takes the reserve back after it.
  turn_away(std::move(fd),
            error(HVD_ERR_SYSTEM, "the rendezvous store has no file descriptor left"));
  return true;
}

void TcpStoreServer::Loop::pause_accepting(Deadline until) {
  accept_paused_until_ = until;
  epoll_event ev{};
  ev.data.u64 = kListenerId;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &ev);
}

void TcpStoreServer::Loop::admit(Fd fd) {
  accepted_.value.fetch_add(1, std::memory_order_relaxed);
  if (connections_.size() - lingering_ >= limits_.max_connections &&
      !evict_unauthenticated(/*authentication_will_do=*/false)) {
    note(over_capacity_);
    turn_away(std::move(fd), error(HVD_ERR_STATE, "the rendezvous store has its limit of " +
                                                      std::to_string(limits_.max_connections) +
                                                      " connections open"));
    return;
  }
  if (unauthenticated_.size() >= limits_.max_unauthenticated) {
    (void)evict_unauthenticated(/*authentication_will_do=*/true);
  }
  Connection* c = add(std::move(fd));
  c->unauthenticated = unauthenticated_.insert(unauthenticated_.end(), c->id);
  c->listed = true;
  unauthenticated_count_.store(unauthenticated_.size());
  arm(*c, Timer::kAuth, Clock::now() + limits_.auth_timeout);
  // Its hello, or its hang-up, is often there already: look before asking epoll. A flood of
  // connect-and-close then costs no epoll calls, and a rank's hello no extra turn of the loop.
  read(*c);
}

TcpStoreServer::Loop::Connection* TcpStoreServer::Loop::add(Fd fd) {
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto c = std::make_unique<Connection>();
  c->id = next_id_++;
  c->fd = std::move(fd);
  Connection* added = c.get();
  connections_.emplace(added->id, std::move(c));
  open_.store(connections_.size());
  return added;
}

void TcpStoreServer::Loop::turn_away(Fd fd, const Status& why) {
  tell(fd.get(), why);
  if (lingering_ >= kMaxLingering) return;  // closes now, reason or not
  Connection* c = add(std::move(fd));
  c->lingering = true;
  ++lingering_;
  arm(*c, Timer::kLinger, Clock::now() + kLinger);
  watch(*c);
}

void TcpStoreServer::Loop::on_event(uint64_t id, uint32_t events) {
  Connection* c = find(id);
  if (c == nullptr) return;  // closed earlier in this batch
  if ((events & (EPOLLERR | EPOLLHUP)) != 0) {
    close(*c);
    return;
  }
  if ((events & EPOLLOUT) != 0 && !flush(*c)) return;
  if ((events & EPOLLIN) != 0 && wants_read(*c)) {
    read(*c);
  } else if ((events & EPOLLRDHUP) != 0 && !wants_read(*c)) {
    // The client hung up while it waited for a key or its reply: nobody is left to answer.
    close(*c);
  }
}

bool TcpStoreServer::Loop::read(Connection& c) {
  // A bounded number of reads per event keeps one busy connection from starving the others.
  for (int round = 0; round < 16 && wants_read(c); ++round) {
    if (c.lingering) {
      const ssize_t n = ::recv(c.fd.get(), scratch_.data(), scratch_.size(), 0);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      close(c);  // the peer has read the reason and closed, or is gone
      return false;
    }
    // Never past the frame in progress: what is read is always the decoder's to keep.
    const size_t want = std::min(scratch_.size(), c.decoder.wanted());
    const ssize_t n = ::recv(c.fd.get(), scratch_.data(), want, 0);
    if (n == 0) {
      close(c);
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close(c);
      return false;
    }
    Result<size_t> took = c.decoder.feed(scratch_.data(), static_cast<size_t>(n));
    if (!took.ok()) {
      note(bad_frame_);
      refuse(c, took.status().with_context(c.authenticated ? "refused"
                                                           : "refused before authentication"));
      return false;
    }
    if (c.decoder.complete() && !handle(c, c.decoder.take())) return false;
  }
  watch(c);
  return true;
}

bool TcpStoreServer::Loop::handle(Connection& c, Bytes payload) {
  Result<StoreRequest> parsed = parse_store_request(std::move(payload));
  if (!c.authenticated) {
    if (!parsed.ok() || parsed->op != StoreOp::kHello ||
        !equal_constant_time(parsed->key, secret_)) {
      note(wrong_secret_);
      refuse(c, auth_failed());
      return false;
    }
    c.authenticated = true;
    unlist(c);
    authenticated_.value.fetch_add(1, std::memory_order_relaxed);
    c.decoder.set_max_frame(kStoreMaxFrame);
    arm(c, Timer::kNone, Deadline::max());
    return reply(c, encode_reply(HVD_SUCCESS, nullptr, 0));
  }
  if (!parsed.ok() || parsed->op == StoreOp::kHello) {
    note(bad_frame_);
    refuse(c, parsed.ok() ? error(HVD_ERR_INVALID_ARGUMENT, "a second hello on one connection")
                          : parsed.status());
    return false;
  }
  StoreRequest& request = parsed.value();
  if (request.op == StoreOp::kSet) {
    auto& slot = values_[request.key];
    slot = std::move(request.value);
    wake(request.key, slot);  // first: the waiters' answers do not depend on this connection
    return reply(c, encode_reply(HVD_SUCCESS, nullptr, 0));
  }
  const auto it = values_.find(request.key);
  if (it != values_.end()) {
    return reply(c, encode_reply(HVD_SUCCESS, it->second.data(), it->second.size()));
  }
  const int64_t timeout_ms = std::clamp<int64_t>(request.timeout_ms, 0, kMaxWaitMs);
  if (timeout_ms == 0) return reply(c, encode_error(not_published(request.key, 0)));
  c.wait_ms = timeout_ms;
  park(c, request.key, Clock::now() + milliseconds(timeout_ms));
  return true;
}

bool TcpStoreServer::Loop::reply(Connection& c, Bytes frame) {
  if (c.out.empty()) {
    c.out = std::move(frame);
    c.out_sent = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  return flush(c);
}

bool TcpStoreServer::Loop::flush(Connection& c) {
  while (c.out_sent < c.out.size()) {
    Result<size_t> sent =
        send_nonblocking(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent);
    if (!sent.ok()) {
      close(c);
      return false;
    }
    if (*sent == 0) {  // the socket's buffer is full: EPOLLOUT says when to go on
      if (c.timer == Timer::kNone) arm(c, Timer::kWrite, Clock::now() + limits_.write_timeout);
      watch(c);
      return true;
    }
    c.out_sent += *sent;
  }
  // A large value's reply is gone: give its memory back rather than keep it per connection.
  if (c.out.capacity() > scratch_.size()) {
    Bytes().swap(c.out);
  } else {
    c.out.clear();
  }
  c.out_sent = 0;
  if (c.timer == Timer::kWrite) arm(c, Timer::kNone, Deadline::max());
  watch(c);
  return true;
}

void TcpStoreServer::Loop::park(Connection& c, const std::string& key, Deadline deadline) {
  c.parked = true;
  c.waiting_for = key;
  waiters_[key].push_back(c.id);
  arm(c, Timer::kWait, deadline);
  watch(c);
}

void TcpStoreServer::Loop::unpark(Connection& c) {
  const auto it = waiters_.find(c.waiting_for);
  if (it != waiters_.end()) {
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
    if (ids.empty()) waiters_.erase(it);
  }
  c.parked = false;
  c.waiting_for.clear();
  if (c.timer == Timer::kWait) arm(c, Timer::kNone, Deadline::max());
}

void TcpStoreServer::Loop::wake(const std::string& key, const Bytes& value) {
  const auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    Connection* c = find(id);
    if (c == nullptr) continue;
    c->parked = false;
    c->waiting_for.clear();
    arm(*c, Timer::kNone, Deadline::max());
    (void)reply(*c, encode_reply(HVD_SUCCESS, value.data(), value.size()));
  }
}

void TcpStoreServer::Loop::refuse(Connection& c, const Status& why) {
  tell(c.fd.get(), why);
  if (lingering_ >= kMaxLingering) {
    close(c);
    return;
  }
  unlist(c);  // it is no newcomer to evict now
  if (c.parked) unpark(c);
  c.lingering = true;
  ++lingering_;
  arm(c, Timer::kLinger, Clock::now() + kLinger);
  watch(c);
}

// Room for a newcomer: close the oldest connection that has not authenticated. Each candidate gets
// a last read first, since its hello may be there unread (in a flood, accepts run ahead of the
// reads): a rank that spoke in time is never the one dropped. Its authentication is room enough
// for the cap on unauthenticated connections, not for a descriptor or a connection slot. False
// when there is nobody left to close.
bool TcpStoreServer::Loop::evict_unauthenticated(bool authentication_will_do) {
  constexpr int kLastReads = 4;  // bounds the work one newcomer can cause
  for (int tries = 0; !unauthenticated_.empty(); ++tries) {
    const uint64_t id = unauthenticated_.front();
    Connection* c = find(id);
    if (c == nullptr) {  // cannot happen: close() unlists; never loop on it all the same
      unauthenticated_.pop_front();
      continue;
    }
    if (tries < kLastReads) {
      read(*c);
      c = find(id);
      if (c == nullptr) return true;  // it had hung up: its room is free
      if (!c->listed) {               // authenticated (or refused, and lingering)
        if (authentication_will_do) return true;
        continue;
      }
    }
    note(evicted_);
    // Closed without a reason: a rank dropped in a flood takes that as its cue to reconnect.
    close(*c);
    return true;
  }
  return false;
}

void TcpStoreServer::Loop::unlist(Connection& c) {
  if (!c.listed) return;
  unauthenticated_.erase(c.unauthenticated);
  c.listed = false;
  unauthenticated_count_.store(unauthenticated_.size());
}

void TcpStoreServer::Loop::close(Connection& c) {
  unlist(c);
  if (c.lingering) --lingering_;
  if (c.parked) unpark(c);
  arm(c, Timer::kNone, Deadline::max());
  connections_.erase(c.id);  // closes the socket, which leaves the epoll set with it
  open_.store(connections_.size());
  // A descriptor is free now: take the reserve back if it was spent.
  if (!reserve_.valid()) reserve_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

void TcpStoreServer::Loop::arm(Connection& c, Timer timer, Deadline deadline) {
  if (c.deadline != Deadline::max()) timers_.erase({c.deadline, c.id});
  c.timer = timer;
  c.deadline = timer == Timer::kNone ? Deadline::max() : deadline;
  if (c.deadline != Deadline::max()) timers_.emplace(c.deadline, c.id);
}

void TcpStoreServer::Loop::watch(Connection& c) {
  uint32_t events = EPOLLRDHUP;
  if (wants_read(c)) events |= EPOLLIN;
  if (c.out_sent < c.out.size()) events |= EPOLLOUT;
  if (events == c.events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  const bool added = c.events == 0;  // a connection joins the epoll set on its first watch
  if (::epoll_ctl(epoll_.get(), added ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd.get(), &ev) == 0) {
    c.events = events;
  } else if (added) {
    // Unwatched, it would wait forever: close it at once, through its timer.
    log(HVD_LOG_ERROR, "rendezvous store " + name_ + ": epoll_ctl: " + std::strerror(errno));
    arm(c, Timer::kLinger, Clock::now());
  }
}

void TcpStoreServer::Loop::expire(Deadline now) {
  while (!timers_.empty() && timers_.begin()->first <= now) {
    Connection* c = find(timers_.begin()->second);
    if (c == nullptr) {  // cannot happen: close() disarms; never spin on it all the same
      timers_.erase(timers_.begin());
      continue;
    }
    switch (c->timer) {
      case Timer::kAuth:
        note(auth_timeouts_);
        refuse(*c, error(HVD_ERR_TIMEOUT, "authentication timed out: no hello within " +
                                              std::to_string(limits_.auth_timeout.count()) +
                                              " ms of connecting"));
        break;
      case Timer::kWrite:
        note(write_timeouts_);
        close(*c);
        break;
      case Timer::kLinger:
        close(*c);
        break;
      case Timer::kWait: {
        const Status timed_out = not_published(c->waiting_for, c->wait_ms);
        unpark(*c);
        (void)reply(*c, encode_error(timed_out));
        break;
      }
      case Timer::kNone:
        timers_.erase(timers_.begin());
        break;
    }
  }
}

void TcpStoreServer::Loop::report(Deadline now) {
  if (!log_pending_ || (now < next_log_ && !stopping_.load())) return;
  struct Line {
    Counter* counter;
    const char* what;
  };
  const Line lines[] = {{&wrong_secret_, "without this job's secret"},
                        {&bad_frame_, "with an oversized or malformed message"},
                        {&auth_timeouts_, "silent past the authentication deadline"},
                        {&evicted_, "evicted unauthenticated for newer connections"},
                        {&over_capacity_, "turned away at the connection limit"},
                        {&write_timeouts_, "not reading their replies"},
                        {&fd_exhausted_, "accept calls that found no file descriptor"}};
  std::string text;
  for (const Line& line : lines) {
    const uint64_t value = line.counter->value.load(std::memory_order_relaxed);
    if (value == line.counter->reported) continue;
    text += (text.empty() ? "" : ", ") + std::to_string(value - line.counter->reported) + " " +
            line.what;
    line.counter->reported = value;
  }
  if (!text.empty()) {
    log(HVD_LOG_WARNING,
        "rendezvous store " + name_ + " closed connections: " + text +
            " (at most one such "
            "report every 10 s; its peers are not this job's ranks, or this job is misconfigured)");
  }
  log_pending_ = false;
  next_log_ = now + std::chrono::seconds(10);
}

void TcpStoreServer::Loop::shut_down() {
  report(Clock::now());  // what the rate limit held back
  for (auto& [id, c] : connections_) {
    if (c->parked) tell(c->fd.get(), error(HVD_ERR_STATE, "the rendezvous store is shutting down"));
  }
  connections_.clear();
  unauthenticated_.clear();
  timers_.clear();
  waiters_.clear();
  open_.store(0);
  unauthenticated_count_.store(0);
}

// ---- TcpStoreServer -----------------------------------------------------------------------

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const HostPort& where,
                                                              std::string secret,
                                                              const TcpStoreLimits& limits) {
  if (secret.size() > kStoreMaxSecret) {
    return error(HVD_ERR_INVALID_ARGUMENT, "the job's secret (HVD_SECRET) has " +
                                               std::to_string(secret.size()) +
                                               " bytes; the rendezvous store takes at most " +
                                               std::to_string(kStoreMaxSecret));
  }
  if (limits.max_connections == 0 || limits.max_unauthenticated == 0) {
    return error(HVD_ERR_INVALID_ARGUMENT, "the rendezvous store needs room for a connection");
  }
  HostPort bound;
  HVD_ASSIGN_OR_RETURN(Fd listener, listen_tcp(where, &bound));
  if (!where.host.empty() && where.host != "0.0.0.0" && where.host != "::") bound.host = where.host;
  HVD_RETURN_IF_ERROR(set_nonblocking(listener.get()));
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll.valid() || !wake.valid()) {
    return error(HVD_ERR_SYSTEM,
                 std::string("rendezvous store: epoll or eventfd: ") + std::strerror(errno));
  }
  for (auto [fd, id] :
       {std::pair{listener.get(), Loop::kListenerId}, std::pair{wake.get(), Loop::kWakeId}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return error(HVD_ERR_SYSTEM,
                   std::string("rendezvous store: epoll_ctl: ") + std::strerror(errno));
    }
  }
  auto loop = std::make_unique<Loop>(std::move(listener), std::move(epoll), std::move(wake),
                                     std::move(secret), limits, bound.to_string());
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(std::move(loop), bound));
  try {
    server->thread_ = std::thread([l = server->loop_.get()] { l->run(); });
  } catch (const std::system_error& e) {
    return error(HVD_ERR_SYSTEM, std::string("rendezvous store: no thread: ") + e.what());
  }
  return server;
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Loop> loop, HostPort address)
    : loop_(std::move(loop)), address_(std::move(address)) {}

TcpStoreServer::~TcpStoreServer() {
  loop_->stop();
  if (thread_.joinable()) thread_.join();
}

TcpStoreStats TcpStoreServer::stats() const { return loop_->stats(); }
}  // namespace hvd::core
