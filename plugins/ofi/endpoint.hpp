// endpoint.hpp — one communicator's libfabric endpoint: tagged messages to its ranks, progressed
// by the calling thread, every wait bounded.
//
// The objects are the usual RDM set (fabric, domain, completion queue, address vector, endpoint),
// opened per communicator. Peers' endpoint names travel through the host's out-of-band allgather.
//
// Every collective call is a Call: its messages carry the call's sequence number in their tags, so
// a late message of one call never matches a receive of the next. Progress is the caller's: it
// reads the completion queue while it waits, spinning briefly, then sleeping on the queue's file
// descriptor over ofi_rxm, or else (shm, net and others) yielding, then napping, so that 3 or 4
// ranks on 2 cores still move. A wait that sees no completion for the timeout fails,
// naming the rank it waits for.
//
// A call that fails (timeout, a peer's error completion, abort, a message of the wrong size)
// breaks the endpoint for good: this rank tells every peer with a short notice (a receive for it
// is always posted), then closes the endpoint, which cancels whatever it had posted, so that no
// transfer touches the caller's buffers after the call returns. Over ofi_rxm, whose close can
// crash once a connection failed, it cancels what it posted and never calls into the endpoint
// again instead: data moves only when the caller progresses it (FI_PROGRESS_MANUAL, which that
// choice requires), so nothing moves, and the endpoint is never freed.
//
// A notice says which rank the sender was waiting for when it gave up (none when it failed on
// its own: aborted, a message of the wrong size), and whether it found that rank failed first
// hand (a transfer with it failed, its process is gone). A peer's notice fails that peer's call
// at once instead of letting it wait out its timeout, and relays the notice of the rank its sender
// waited for, where that came first. A rank that gives up waiting for a peer listens a moment for
// the others' notices and follows who waits for whom from the rank it waited for: the rank at the
// end of that chain, the one that sent no notice (it stopped or died), or the one that failed on
// its own, is the rank its error names. Where the chain ends at a rank that sent no notice, which
// may only be slow, the error also names a rank that another one found failed first hand. An
// abort with no call in progress breaks the endpoint at once, so that peers waiting for this rank
// learn of it from its notice.
//
// On shm the ranks of a call compare what they called (a Shape) before the first message above
// the inject size between them, which a shorter receive would otherwise meet in a copy that never
// ends (see try_send).
#ifndef HVD_OFI_ENDPOINT_HPP
#define HVD_OFI_ENDPOINT_HPP

#include <rdma/fabric.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hvd/sdk/backend.hpp"
#include "hvd/sdk/call_shape.hpp"
#include "hvd/sdk/deadline.hpp"
#include "hvd/sdk/signals.hpp"

namespace hvd::ofi {

// One posted send or receive. `context` comes first: the completion's op_context is this Op.
struct Op {
  fi_context2 context{};
  bool done = false;
  bool is_send = false;
  bool is_shape = false;  // the receive of a peer's Shape (Endpoint::try_send)
  int peer = -1;
  size_t bytes = 0;  // posted length; a receive must get exactly this many
};

// What the ranks of a call agree on when they call alike (the sizes of the call's messages follow
// from it): plain bytes, compared whole and sent as they are.
using Shape = hvd::sdk::CallShape;

class Endpoint {
 public:
  using Op = ofi::Op;  // what the algorithms (plugins/common/algorithms.hpp) post
  // Opens `provider` (a libfabric provider name such as "shm" or "tcp;ofi_rxm") and connects to
  // the communicator's ranks. Collective over them.
  // `message_bytes`: the largest message the collectives send as one (a ring segment); over
  // ofi_rxm, the eager limit.
  // A setting every rank must share ("HVD_OFI_SEGMENT_BYTES" and its value): open() fails on
  // every rank, naming it, when the ranks' values differ.
  struct Shared {
    const char* name;
    uint64_t value;
  };
  static constexpr size_t kMaxShared = 3;
  // `failed_before`: this rank's set-up failed already; it still meets the others, so that they
  // fail at once, naming it, rather than wait for it.
  static Result<std::unique_ptr<Endpoint>> open(const sdk::InitContext& ctx,
                                                const std::string& provider, size_t message_bytes,
                                                const std::vector<Shared>& shared,
                                                const Status& failed_before);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& provider() const { return provider_; }
  // "shm 117.0, inject 4096 B" and the like, for the log.
  const std::string& description() const { return description_; }

  // Fails at once when the endpoint is broken or aborted; otherwise starts a call named `what`
  // ("allreduce"), whose messages are told apart from every other call's. From begin() to end()
  // the call owns the endpoint (abort() uses it only while no call does).
  // `args`: what the ranks must agree on, the call's Shape (see try_send); `args` (or nullptr: a
  // barrier) stays valid until end().
  Status begin(hvd_collective collective, const hvd_collective_args* args) {
    const char* what = hvd_collective_name(collective);
    const uint32_t before = state_.fetch_or(kInCall, std::memory_order_acquire);
    if (before != 0 || broken_ || notice_arrived_) return refuse(before, what);
    if (++sequence_ == 0) ++sequence_;  // 0 marks "never" in the Shape records
    call_ = what;
    call_collective_ = collective;
    call_args_ = args;
    shape_known_ = false;
    // HVD_TIMEOUT bounds the call from its start, the failure's round of notices (blame)
    // included: the host's watchdog ends a call at HVD_TIMEOUT + 1 s; the plugin returns first.
    call_deadline_ = sdk::Deadline::coarse_now() + call_budget_;
    if (args != nullptr) {  // the host's stamp (ABI 1.2) ends a call of several backend calls
      const sdk::Deadline host = sdk::Deadline::stamped(*args);
      if (!host.is_none()) call_deadline_ = std::min(call_deadline_, host.at() - blame_grace());
    }
    return Status::success();
  }
  // The call's end: success, or `failure`, after which the endpoint is broken (see above).
  Status end(Status failure);

  // Post a tagged message of the current call to / from communicator rank `peer`. `index` tells
  // the call's messages between the same two ranks apart. A posted Op stays valid until end().
  // try_* return nullptr when the provider's queue is full (post again after progress()).
  //
  // Where a message longer than the receive it meets would hang the receiver (shm: libfabric
  // 1.17's cross-memory-attach copy loops forever on it), messages above the inject size travel
  // apart from smaller ones (a tag bit), and a rank sends each peer its call's Shape as it posts
  // its first receive of such a message from it; the peer posts its sends of them only once that
  // Shape equals its own (and the first message's length its own), and fails with a mismatch
  // naming both calls otherwise. Until then such a send is deferred: it waits in its Op, and the
  // progress that brings the Shape posts it. The cost: one small message's latency in the first
  // round of such a call (docs/performance.md).
  Result<Op*> try_send(int peer, uint32_t index, const void* buffer, size_t bytes);
  Result<Op*> try_recv(int peer, uint32_t index, void* buffer, size_t bytes);
  // The same, retrying while the queue is full (bounded by the timeout).
  Result<Op*> send(int peer, uint32_t index, const void* buffer, size_t bytes) {
    return post(true, peer, index, const_cast<void*>(buffer), bytes);
  }
  Result<Op*> recv(int peer, uint32_t index, void* buffer, size_t bytes) {
    return post(false, peer, index, buffer, bytes);
  }

  // One message each way with `peer`, `bytes` each, and the wait for both: a round of recursive
  // doubling. When the provider takes both at once (the send inline), straight to it.
  Status exchange(int peer, uint32_t index, const void* send, void* recv, size_t bytes);

  // Waits until `done()` holds, progressing; fails when nothing completes for the timeout (or on
  // abort, or a peer's notice). `waiting_for()` names the rank the caller waits on, for the error.
  template <typename Done, typename WaitingFor>
  Status wait_until(Done&& done, WaitingFor&& waiting_for);

  Status wait(const Op* op) {
    return wait_until([op] { return op->done; }, [op] { return op->peer; });
  }
  // Waits until none of this call's posts is in flight.
  Status wait_all();

  // From any thread: make a call in progress fail soon, and every later call fail at once; with
  // none in progress, break the endpoint now (its notices tell the peers).
  void abort();

  // What the ranks are called in messages: "rank 2" or, in a communicator that is not the
  // world, "rank 1 (job rank 3)".
  std::string name_of(int peer) const;

 private:
  // What a rank that gave up found of the rank it waited for.
  enum class Finding : int32_t {
    kSilent = 0,       // nothing came from it (a timeout), or a notice ended the wait
    kUnreachable = 1,  // a transfer with it failed
    kGone = 2,         // its process exited (shm)
  };
  // A rank's notice that it gave up: who it is, its error, the rank it was waiting for (-1: none,
  // it failed on its own), and what it found of that rank.
  struct Notice {
    int32_t rank = -1;
    int32_t code = 0;
    int32_t waits_for = -1;
    Finding found = Finding::kSilent;
  };
  Endpoint() = default;
  Status open_objects(const sdk::InitContext& ctx, const std::string& provider,
                      size_t message_bytes);
  Status connect(const sdk::InitContext& ctx, const std::vector<Shared>& shared,
                 const Status& opened);
  Status post_notice_receive();
  // Reads what completed, without waiting. True when anything did. A peer's notice, after the
  // rest of what completed, is an error with stopped_by_notice_ set: wait_until makes it
  // notice_failure(the rank it waits for).
  Result<bool> progress();
  // A peer's Shape came (its receive, shape_ops_[peer], completed): compared with this call's;
  // the deferred sends to it ready to post where it matches.
  Status take_shape(int peer);
  // Posts the deferred sends whose peer's Shape matched, as far as the provider takes them.
  Status post_deferred();
  // This call's Shape, worked out the first time a message needs it.
  const Shape& shape();
  bool travels_apart(size_t bytes) const { return shape_checks_ && bytes > inject_size_; }
  // Marks a posted Op done (once), counting it out of pending_.
  void complete(Op* op);
  Result<Op*> post(bool is_send, int peer, uint32_t index, void* buffer, size_t bytes);
  void break_endpoint(hvd_status code);
  void send_notices(hvd_status code);
  Status check_usable() const;
  bool aborted() const { return (state_.load(std::memory_order_relaxed) & kAborted) != 0; }
  // begin() found the endpoint aborted, broken, owned by abort(), or told by a peer's notice that
  // the peer gave up: the error, after telling the peers (of an abort, or that this rank gives
  // up too), unless they were told already.
  Status refuse(uint32_t before, const char* what);
  // Gives the endpoint up after a call; tells the peers of an abort that came during it.
  void release();
  // Breaks an aborted endpoint that no call owns, telling the peers; a no-op otherwise.
  void break_if_aborted_and_free();
  // A peer's notice arrived (notice_, `bytes` long, tagged `tag`): kept in heard_, and the
  // receive posted again. False when it was malformed (and ignored).
  bool take_notice(size_t bytes, uint64_t tag);
  // The notice of the rank this one waited for came after this rank sent its own: its notice
  // goes again, relaying it (once).
  void relay_late_notice();
  // Every peer but one whose transfer failed is to get this rank's notice (resend_notices).
  void notice_everyone();
  // Posts again the notices that the provider had no room for (a peer not yet connected).
  void resend_notices();
  // While failing: reads what completed, keeping notices (take_notice). True when anything did.
  bool drain();
  Status notice_failure(int waiting_for);
  Status timeout_failure(int peer);
  // On shm, where pids mean processes of this host (peer_pids_): the peer's process is gone.
  bool gone(int peer) const;
  // A peer other than `checked` this call has a message in flight with (posted, or waiting for
  // its Shape) whose process is gone; -1 where none.
  int gone_in_flight(int checked);
  std::vector<bool> liveness_checked_;  // by rank: gone_in_flight()'s
  Status peer_died(int peer);
  // Tells the peers this rank gives up waiting for `waiting_for` (-1: none), listens for their
  // notices, and returns `what` with the rank to blame. `by_notice`: a peer's notice ended the
  // wait (`what` names that peer, not the rank waited for).
  Status blame(hvd_status code, const std::string& what, int waiting_for, Finding found,
               bool by_notice = false);
  // How an error ends that names `peer`, found so: "is gone (...)", "failed or is unreachable"...
  std::string verdict(int peer, Finding found) const;
  // ": rank N was aborted" (or failed on its own) where such a notice came; nullopt otherwise.
  std::optional<std::string> origin_heard() const;
  // Whom to blame, following who waits for whom from `start`, after `chain` (see the top of this
  // file); nullopt while the chain ends at a rank not heard from yet, unless `final`.
  std::optional<std::string> chain_from(int start, Finding found, bool final,
                                        std::string chain) const;
  // A notice whose sender found the rank it waited for failed first hand, where that rank sent no
  // notice of its own: the one about `about` if one came, else the first by rank; nullptr if none.
  const Notice* first_hand_report(int about) const;
  static constexpr int kSpinPolls = 64;
  void nap(std::chrono::steady_clock::duration idle) const;
  uint64_t tag(uint32_t index, size_t bytes) const;
  uint64_t shape_tag() const;                          // this call's Shape messages'
  std::string transfer(bool is_send, int peer) const;  // "ofi <call>: sending to rank 2"
  // "... failed: <why>", where posting that transfer returned `code`.
  Status post_failure(bool is_send, int peer, ssize_t code) const;

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> members_;
  std::chrono::milliseconds timeout_{0};
  std::string provider_;
  std::string description_;

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;                  // the completion queue's: over ofi_rxm only
  uint32_t rxm_eager_limit_ = 0;      // what ofi_rxm works out for this endpoint (0: not ofi_rxm)
  std::vector<fi_addr_t> addresses_;  // by communicator rank
  std::vector<pid_t> peer_pids_;      // by communicator rank; empty where pids say nothing here
  bool proc_is_ours_ = false;         // /proc shows this pid namespace (gone() may read it)
  // A wait checks that the rank it waits for lives, every kLivenessPeriod of waiting.
  static constexpr std::chrono::milliseconds kLivenessPeriod{10};
  std::chrono::steady_clock::time_point next_liveness_check_{};

  // What travels: the sender's notice and, where it had heard it, the notice of the rank it waits
  // for. A rank that gave up and exited before its own notice reached a peer it had no connection
  // to yet is thus still heard of by that peer, through the rank that waited for it, and not
  // taken for a rank that died.
  struct NoticeMessage {
    Notice sender;
    Notice relayed;  // rank -1: none
  };
  static_assert(sizeof(NoticeMessage) == 32 && std::is_trivially_copyable_v<NoticeMessage>,
                "a notice travels as these bytes");
  Op notice_op_;
  NoticeMessage notice_{};     // the posted receive's buffer
  std::vector<Notice> heard_;  // by rank: its notice (or one relayed), rank -1 where none came
  Notice first_heard_{};       // the first notice that came, which failed this rank's call
  NoticeMessage sent_{};       // this rank's own notice, once it gave up
  std::vector<bool> unsent_;   // by rank: this rank's notice, for which the provider had no room

  // Shapes (try_send). A Shape message: the sender's call, and its first receive from that peer.
  struct ShapeMessage {
    Shape shape;
    uint64_t bytes = 0;
    uint32_t index = 0;
    uint32_t reserved = 0;
  };
  bool shape_checks_ = false;  // shm
  size_t inject_size_ = 0;
  hvd_collective call_collective_ = HVD_COLLECTIVE_BARRIER;  // begin()'s
  const hvd_collective_args* call_args_ = nullptr;
  bool shape_known_ = false;
  Shape shape_{};                           // this call's, once shape_known_
  std::vector<uint32_t> shape_sent_;        // by rank: the sequence_ it was last sent in
  std::vector<uint32_t> shape_posted_;      // by rank: the sequence_ its receive was posted in
  std::vector<uint32_t> shape_matched_;     // by rank: the sequence_ it last matched in
  std::vector<ShapeMessage> shapes_heard_;  // by rank: the receives' buffers
  std::vector<Op> shape_ops_;               // by rank: the receives
  // A send that waits for its peer's Shape before it is posted.
  struct Deferred {
    Op* op;
    uint32_t index;
    const void* buffer;
  };
  std::vector<Deferred> deferred_;
  size_t deferred_ready_ = 0;  // of them, whose peer's Shape matched

  uint32_t sequence_ = 0;                                // calls begun, identical on every rank
  const char* call_ = "";                                // the call in progress
  std::chrono::steady_clock::time_point call_deadline_;  // its waits end by then (begin())
  std::chrono::steady_clock::duration call_budget_{};    // HVD_TIMEOUT less the blame_grace()
  // How long a failing rank listens for its peers' notices (blame), within the call's timeout.
  std::chrono::milliseconds blame_grace() const {
    return std::min<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(500));
  }
  std::deque<Op> ops_;                // this call's, stable addresses
  size_t pending_ = 0;                // of them, posted and not yet done
  int waits_for_ = -1;                // the rank this endpoint waited for when it failed, if any
  Finding found_ = Finding::kSilent;  // what it found of that rank
  int unreachable_ = -1;              // the rank whose transfer failed, if one did: sent no notice
  bool notices_sent_ = false;
  bool quick_notices_ = false;      // abort(): the notices wait for no peer's connection
  bool notice_arrived_ = false;     // a notice came (first_heard_)
  bool stopped_by_notice_ = false;  // progress() ended a wait for it
  bool broken_ = false;
  // libfabric 1.17's ofi_rxm can crash in fi_close of an endpoint whose connections failed (2 of
  // 26 runs of a mismatch over tcp;ofi_rxm): such an endpoint is left open, broken.
  bool leave_open_when_broken_ = false;
  Status broken_status_;
  // kInCall: a call (or abort(), while no call does) owns the endpoint; kAborted: abort() came.
  static constexpr uint32_t kInCall = 1, kAborted = 2;
  std::atomic<uint32_t> state_{0};
};

// ---- template implementation -------------------------------------------------------------------

template <typename Done, typename WaitingFor>
Status Endpoint::wait_until(Done&& done, WaitingFor&& waiting_for) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point idle_since;
  int polls = 0;  // since the last completion; the clock is read only after a spin of them
  // A notice that came with the data an earlier wait of this call needed fails this one, unless
  // it is done already (done() may post: it is called once per answer).
  if (notice_arrived_) {
    if (done()) return Status::success();
    return notice_failure(waiting_for());
  }
  while (!done()) {
    Result<bool> moved = progress();
    if (!moved.ok()) {
      if (!stopped_by_notice_) return moved.status();
      stopped_by_notice_ = false;
      // A call whose data all came before the notice ends well; the next one fails on it.
      if (done()) break;
      return notice_failure(waiting_for());
    }
    if (*moved) {
      polls = 0;
      continue;
    }
    if (++polls < kSpinPolls) continue;
    const Clock::time_point now = Clock::now();
    if (polls == kSpinPolls) idle_since = now;
    if (aborted()) {
      return Status(HVD_ERR_STATE,
                    std::string("ofi ") + call_ + ": the communicator was aborted during the call");
    }
    if (now >= call_deadline_) return timeout_failure(waiting_for());
    if (!peer_pids_.empty() && now >= next_liveness_check_) {
      next_liveness_check_ = now + kLivenessPeriod;
      // The rank waited for, then every other one this call moves data with: a rank this one
      // waits for only later may be gone already, while the rank waited for may itself wait on
      // this one, so that only the timeout would end the wait.
      const int peer = waiting_for();
      if (gone(peer)) return peer_died(peer);
      if (const int lost = gone_in_flight(peer); lost >= 0) return peer_died(lost);
    }
    nap(now - idle_since);
  }
  return Status::success();
}

}  // namespace hvd::ofi

#endif  // HVD_OFI_ENDPOINT_HPP
