#include "mpi_transport.hpp"

#include <algorithm>

namespace hvd::mpi {

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error " + std::to_string(code);
  }
  return std::string(text, static_cast<size_t>(length));
}

Status timed_out(const char* name, std::chrono::milliseconds timeout,
                 const std::string& waiting_on) {
  return Status(HVD_ERR_TIMEOUT, std::string(name) + " did not complete within " +
                                     std::to_string(timeout.count()) +
                                     " ms (HVD_TIMEOUT); waiting on " + waiting_on +
                                     ": stopped, dead, or in a different collective");
}

Status aborted(const char* name, std::chrono::steady_clock::time_point start) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  return Status(HVD_ERR_STATE, std::string(name) + " aborted after " + std::to_string(ms) + " ms");
}

Status Transport::failed(const char* mpi_call, int code) const {
  return Status(HVD_ERR_REMOTE, std::string(name_) + ": " + mpi_call + ": " + error_text(code));
}

Status Transport::mismatch(int peer, const std::string& what) const {
  return Status(HVD_ERR_MISMATCH, std::string(name_) + ": rank " + std::to_string(rank_) +
                                      " was sent a message by rank " + std::to_string(peer) +
                                      " of " + what + ": the ranks called " + name_ +
                                      " with different counts");
}

Result<Transport::Op*> Transport::post(bool is_send, int peer, void* buffer, size_t bytes) {
  ops_.emplace_back();
  Op* op = &ops_.back();
  op->is_send = is_send;
  op->peer = peer;
  // A message of 0 bytes is still one message: its receive proves the peer is in this call.
  size_t offset = 0;
  do {
    const int n = static_cast<int>(std::min<uint64_t>(max_bytes_, bytes - offset));
    char* at = static_cast<char*>(buffer) + offset;
    const bool last = offset + static_cast<size_t>(n) >= bytes;
    const int tag = last ? tag_ + kLastPieceTag : tag_;
    MPI_Request request = MPI_REQUEST_NULL;
    if (is_send) {
      const int code = MPI_Isend(at, n, MPI_BYTE, peer, tag, comm_, &request);
      if (code != MPI_SUCCESS) return failed("MPI_Isend", code);
    }
    requests_.push_back(request);
    pieces_.push_back(Piece{op, n, at, tag, is_send});
    ++op->pending;
    offset += static_cast<size_t>(n);
  } while (offset < bytes);
  return op;
}

Status Transport::match_receives() {
  unmatched_.clear();
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& piece = pieces_[i];
    if (piece.posted) continue;
    const std::pair<int, int> source{piece.op->peer, piece.tag};
    // A later piece from the same peer and tag may only take the message after this one's.
    if (std::find(unmatched_.begin(), unmatched_.end(), source) != unmatched_.end()) continue;
    int arrived = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    int code = MPI_Improbe(piece.op->peer, piece.tag, comm_, &arrived, &message, &status);
    if (code != MPI_SUCCESS) return failed("MPI_Improbe", code);
    if (!arrived) {
      unmatched_.push_back(source);
      continue;
    }
    int length = 0;
    MPI_Get_count(&status, MPI_BYTE, &length);
    if (length != piece.expected) {
      // Left with MPI, unreceived: the call fails and the communicator takes no more.
      return mismatch(piece.op->peer, std::to_string(length) + " bytes where it expected " +
                                          std::to_string(piece.expected) + " (not received)");
    }
    code = MPI_Imrecv(piece.buffer, piece.expected, MPI_BYTE, &message, &requests_[i]);
    if (code != MPI_SUCCESS) return failed("MPI_Imrecv", code);
    piece.posted = true;
  }
  return Status::success();
}

Status Transport::progress() {
  if (requests_.empty()) return Status::success();
  if (Status matched = match_receives(); !matched.ok()) return matched;
  indices_.resize(requests_.size());
  statuses_.resize(requests_.size());
  int completed = 0;
  const int code = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &completed,
                                indices_.data(), statuses_.data());
  if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) return failed("MPI_Testsome", code);
  if (completed == MPI_UNDEFINED || completed == 0) return Status::success();
  Status failure;
  for (int k = 0; k < completed; ++k) {
    const Piece& piece = pieces_[static_cast<size_t>(indices_[static_cast<size_t>(k)])];
    const MPI_Status& status = statuses_[static_cast<size_t>(k)];
    Op* op = piece.op;
    if (code == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS && failure.ok()) {
      failure =
          Status(HVD_ERR_REMOTE,
                 std::string(name_) + ": a message " + (op->is_send ? "to" : "from") + " rank " +
                     std::to_string(op->peer) + " failed: " + error_text(status.MPI_ERROR));
    }
    if (--op->pending == 0) op->done = true;
  }
  // Completed requests are MPI_REQUEST_NULL now: keep the rest (and the receives not yet posted),
  // in order.
  size_t kept = 0;
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL && pieces_[i].posted) continue;
    requests_[kept] = requests_[i];
    pieces_[kept] = pieces_[i];
    ++kept;
  }
  requests_.resize(kept);
  pieces_.resize(kept);
  return failure;
}

void Transport::abandon() {
  // Every posted receive has its message matched already (match_receives), and a send or receive
  // under way cannot be cancelled: MPI keeps them.
  for (MPI_Request& request : requests_) {
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  }
  requests_.clear();
  pieces_.clear();
  abandoned_ = true;
}

}  // namespace hvd::mpi
