// mpi_transport.hpp — the point-to-point transport hvd's algorithms (plugins/common/algorithms.hpp)
// run on in HVD_MPI_ALGORITHMS=hvd: MPI_Isend, and MPI_Improbe then MPI_Imrecv, on the plugin's
// communicator, tested (MPI_Testsome) against the call's deadline and the abort flag.
//
// A call's messages all carry its collective's tag: MPI matches the messages of one pair and tag
// in the order they were posted, which the algorithms keep on both sides, so `index` is not sent.
// Ranks in different collectives then time out rather than take each other's messages. A receive
// learns its message's length before it takes the message (MPI_Improbe, then MPI_Imrecv), and one
// of another length is HVD_ERR_MISMATCH, never received: Open MPI's shared-memory single-copy path
// writes a longer message's whole length into the receive buffer, past its end, before it reports
// MPI_ERR_TRUNCATE (seen under AddressSanitizer, Open MPI 4.1). A message above MPI's int count
// goes as several pieces of at most `max_bytes`, in order, its last piece on a tag of its own
// (tag + kLastPieceTag), so that a sender with more pieces than its receiver meets the receiver's
// last piece with one of another length, a mismatch, rather than leaving pieces for a later call.
//
// A call that fails (timeout, abort, mismatch) abandons what it started: a receive whose message
// has not come was never posted, and is dropped; sends and receives under way cannot be
// cancelled, and stay with MPI (a message of another length stays unreceived, so its sender
// waits until its own deadline). The transport is then done with: `abandoned()` holds, and every
// later call on the communicator is refused.
#ifndef HVD_MPI_TRANSPORT_HPP
#define HVD_MPI_TRANSPORT_HPP

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "algorithms.hpp"
#include "hvd/sdk/deadline.hpp"
#include "hvd/sdk/result.hpp"

namespace hvd::mpi {

// The words of the plugin's errors, alike whichever way a call moved its data.
std::string error_text(int code);
// A call named `name` that did not end within HVD_TIMEOUT (`timeout`), waiting on `waiting_on`.
Status timed_out(const char* name, std::chrono::milliseconds timeout,
                 const std::string& waiting_on);
// A call named `name`, begun at `start`, ended by abort().
Status aborted(const char* name, std::chrono::steady_clock::time_point start);

class Transport {
 public:
  static constexpr int kLastPieceTag = 64;  // above every collective's tag; MPI_TAG_UB >= 32767

  struct Op {
    bool done = false;
    bool is_send = false;
    int peer = -1;
    int pending = 0;  // its requests not yet complete
  };

  // `max_bytes`: the largest count one MPI call takes; `timeout`: HVD_TIMEOUT, for messages.
  Transport(MPI_Comm comm, int rank, int size, uint64_t max_bytes,
            std::chrono::milliseconds timeout, const std::atomic<bool>& aborted)
      : comm_(comm),
        rank_(rank),
        size_(size),
        max_bytes_(max_bytes),
        timeout_(timeout),
        aborted_(aborted) {}
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // A call named `name` ("allreduce") whose messages carry `tag`, ending by `deadline`.
  void begin(const char* name, int tag, const sdk::Deadline& deadline) {
    ops_.clear();
    requests_.clear();
    pieces_.clear();
    name_ = name;
    tag_ = tag;
    deadline_ = deadline;
    start_ = std::chrono::steady_clock::now();
  }
  // The call's end. A failure abandons what the call posted (its peers are somewhere else in it),
  // and the communicator takes no more calls; so does a call that returned with messages in flight,
  // which the algorithms never do.
  Status end(Status status) {
    if (status.ok() && !requests_.empty()) {
      status = Status(HVD_ERR_INTERNAL,
                      std::string(name_) + ": the algorithm returned with messages in flight");
    }
    if (!status.ok()) abandon();
    return status;
  }
  bool abandoned() const { return abandoned_; }

  Result<Op*> try_send(int peer, uint32_t, const void* buffer, size_t bytes) {
    return post(true, peer, const_cast<void*>(buffer), bytes);
  }
  Result<Op*> try_recv(int peer, uint32_t, void* buffer, size_t bytes) {
    return post(false, peer, buffer, bytes);
  }
  Result<Op*> send(int peer, uint32_t index, const void* buffer, size_t bytes) {
    return try_send(peer, index, buffer, bytes);
  }
  Result<Op*> recv(int peer, uint32_t index, void* buffer, size_t bytes) {
    return try_recv(peer, index, buffer, bytes);
  }
  Status exchange(int peer, uint32_t index, const void* send_buf, void* recv_buf, size_t bytes) {
    return algorithms::exchange_by_posts(*this, peer, index, send_buf, recv_buf, bytes);
  }

  template <typename Done, typename WaitingFor>
  Status wait_until(Done&& done, WaitingFor&& waiting_for) {
    Status failure;
    const sdk::WaitEnd end = sdk::wait_until(
        [&] {
          if (done()) return true;
          failure = progress();
          return !failure.ok() || done();
        },
        deadline_, aborted_);
    if (end == sdk::WaitEnd::kReady) return failure;
    if (end == sdk::WaitEnd::kAborted) return aborted(name_, start_);
    const int peer = waiting_for();
    return timed_out(name_, timeout_,
                     peer < 0 ? "the other ranks" : "rank " + std::to_string(peer));
  }
  Status wait(const Op* op) {
    return wait_until([op] { return op->done; }, [op] { return op->peer; });
  }
  Status wait_all() {
    return wait_until([this] { return requests_.empty(); },
                      [this] { return requests_.empty() ? -1 : pieces_.front().op->peer; });
  }

 private:
  // One MPI request: a whole message, or a piece of one.
  struct Piece {
    Op* op;
    int expected;  // bytes it moves
    void* buffer;  // where a receive lands
    int tag;       // the call's tag, or the last piece's
    bool posted;   // a receive is posted only once its message's length is known
  };

  Result<Op*> post(bool is_send, int peer, void* buffer, size_t bytes);
  // Tests the requests in flight once; an error for a failed or mismatched message.
  Status progress();
  // Posts the receives whose messages have come and have their lengths; a mismatch for one that
  // does not.
  Status match_receives();
  // Lets go of every request in flight.
  void abandon();
  Status mismatch(int peer, const std::string& what) const;
  // `mpi_call` ("MPI_Isend") returned `code`.
  Status failed(const char* mpi_call, int code) const;

  MPI_Comm comm_;
  int rank_, size_;
  uint64_t max_bytes_;
  std::chrono::milliseconds timeout_;
  const std::atomic<bool>& aborted_;

  const char* name_ = "";
  int tag_ = 0;
  sdk::Deadline deadline_ = sdk::Deadline::none();
  std::chrono::steady_clock::time_point start_;
  std::deque<Op> ops_;                 // stable addresses until the next call
  std::vector<MPI_Request> requests_;  // in flight (or a receive not yet posted), compacted
  std::vector<Piece> pieces_;          // pieces_[i] is what requests_[i] moves
  std::vector<std::pair<int, int>> unmatched_;  // match_receives' (peer, tag) without a message
  std::vector<int> indices_;                    // MPI_Testsome's
  std::vector<MPI_Status> statuses_;            // MPI_Testsome's
  bool abandoned_ = false;
};

}  // namespace hvd::mpi

#endif  // HVD_MPI_TRANSPORT_HPP
