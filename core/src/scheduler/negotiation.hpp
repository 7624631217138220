// negotiation.hpp — which named tensors are ready on every rank, validated, in one order.
//
// Every rank runs the coordinator's logic on the same inputs (the requests every rank gathered,
// the same bit vector), so every rank reaches the same verdicts in the same order without a
// broadcast: Horovod's gather-then-broadcast in one collective. The response cache turns a tensor
// seen before into a bit: in steady state a cycle costs one small allreduce.
#ifndef HVD_CORE_SCHEDULER_NEGOTIATION_HPP
#define HVD_CORE_SCHEDULER_NEGOTIATION_HPP

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "hvd/sdk/result.hpp"
#include "hvd/types.h"

namespace hvd::core {

// The name a join is negotiated under (one per communicator in flight on each rank).
constexpr const char* kJoinName = "hvd.join";
const char* op_type_name(hvd_collective type);  // "ALLREDUCE", as Horovod's messages say

// A tensor's dimensions, held inline up to 6 (a submission then allocates nothing for its shape).
using Shape = boost::container::small_vector<int64_t, 6>;

// What every rank must agree on for one named tensor.
struct TensorSpec {
  hvd_collective type = HVD_COLLECTIVE_ALLREDUCE;
  hvd_dtype dtype = HVD_FLOAT32;
  Shape shape;
  hvd_reduce_op op = HVD_SUM;  // allreduce, reduce-scatter
  int32_t root = 0;            // broadcast
  hvd_memory_type memory = HVD_MEMORY_HOST;
  int32_t device = -1;
  // CUDA memory on a backend that takes it: run by hvd's device executor, or (where it cannot
  // drive the device) handed to the backend as it is. Ranks must agree: the two batch apart.
  bool device_executor = false;
  double prescale = 1;  // allreduce
  double postscale = 1;
  uint64_t group = 0;  // 0: none; else a hash of the group's member names (alike on every rank)
  uint32_t group_size = 0;
  // Allgather: how many elements this rank's output holds (kAllocated: hvd allocates it once the
  // ranks' first dimensions are known). A rank's own business, so never a mismatch; but every
  // rank must be able to take the result, or none runs it.
  uint64_t output_capacity = 0;
  static constexpr uint64_t kAllocated = UINT64_MAX;
  // Alltoall: the rows this rank sends each rank (as many as ranks, summing to shape[0]); the
  // ranks may differ in them as in the first dimension.
  Shape splits;

  uint64_t elements() const;
  bool operator==(const TensorSpec& other) const;
  bool operator!=(const TensorSpec& other) const { return !(*this == other); }
};

struct Request {
  std::string name;
  TensorSpec spec;
  // Set when this rank could not submit the tensor (its arguments failed its own checks): the
  // tensor then fails on every rank with this message, whatever the others sent.
  std::string error;
  hvd_status error_code = HVD_SUCCESS;
};

// Requests as bytes, for the gather.
std::vector<char> serialize(const std::vector<Request>& requests);
Result<std::vector<Request>> deserialize(const char* data, size_t size);

// What the ranks' tensors look like where they may differ: an allgather's first dimension of
// each rank, in rank order; an alltoall's splits of every rank, size x size, row r = rank r's
// (so column r is what rank r receives); empty for the other collectives.
using FirstDims = std::vector<int64_t>;

// A verdict on one tensor: run it (error empty) or fail it with `error` on every rank. `spec` is
// this rank's own.
//
// Joined ranks (hvd_join_async) take part in the allreduces the others submit with zeros: a
// response then may have no tensor of this rank's behind it (`stand_in`), and `spec` is the
// first rank's that submitted it. A join's response comes once every rank has joined, with the
// rank that joined last as its only first dimension.
struct Response {
  std::string name;
  TensorSpec spec;
  std::string error;
  FirstDims first_dims;
  hvd_status error_code = HVD_ERR_MISMATCH;  // with error
  bool stand_in = false;
};

// The replicated coordinator: a message table of partly submitted tensors, and the cache.
class Negotiator {
 public:
  using Clock = std::chrono::steady_clock;
  Negotiator(int rank, int size, size_t cache_capacity);

  // The cache bit of a tensor this rank submitted before with exactly this spec, if it is cached.
  std::optional<uint32_t> cached_bit(const std::string& name, const TensorSpec& spec) const;
  // The first dimensions by rank that a cached allgather was negotiated with.
  const FirstDims& cached_first_dims(uint32_t bit) const { return slots_[bit]->first_dims; }
  // The spec and name a cached tensor was negotiated with (a joined rank stands in with them).
  const TensorSpec& cached_spec(uint32_t bit) const { return slots_[bit]->spec; }
  const std::string& cached_name(uint32_t bit) const { return slots_[bit]->name; }

  // Whether `rank` has joined (its join negotiated, and not every rank's yet).
  bool joined(int rank) const { return joined_[static_cast<size_t>(rank)] != 0; }
  // Why a tensor cannot run with the joined ranks standing in (only host-memory allreduces
  // can), or empty: the same on every rank.
  std::string stand_in_refusal(const std::string& name, const TensorSpec& spec) const;
  // How many bits a cycle's vector has (the cache's slots, in use or free: the same on every
  // rank).
  size_t bit_count() const { return slots_.size(); }

  // What a cycle found ready: tensors every rank voted for by cache bit, in the order they
  // entered the cache, then tensors whose requests completed in the message table, in the order
  // they completed. So cached tensors keep the order they were first negotiated in, whatever
  // bits they hold: tensors that lie end to end in memory stay end to end in the fused batch.
  struct Ready {
    std::vector<uint32_t> cached;
    std::vector<Response> negotiated;
  };
  // One cycle, the same calls in the same order on every rank:
  //  1. bits_ready: the AND over ranks of the cache bits (one byte per cache entry);
  //  2. requests: every rank's uncached requests, in rank order (empty when nobody sent any).
  Ready cycle(const std::vector<uint8_t>& bits_ready,
              const std::vector<std::vector<Request>>& requests, Clock::time_point now);

  // Tensors some ranks submitted and others not, for longer than `after`: name, waiting time and
  // the missing ranks.
  struct Stall {
    std::string name;
    std::chrono::duration<double> waited;
    std::vector<int> missing;
  };
  std::vector<Stall> stalled(Clock::time_point now, std::chrono::duration<double> after) const;

 private:
  struct Partial {
    std::vector<std::optional<TensorSpec>> by_rank;
    int count = 0;
    Clock::time_point first_seen;
    std::string error;  // the first rank's that could not submit it
    hvd_status error_code = HVD_SUCCESS;
  };
  struct CacheEntry {
    std::string name;
    TensorSpec spec;  // this rank's
    FirstDims first_dims;
  };

  // The first disagreement between two ranks' specs, in Horovod's words; empty if none.
  static std::string mismatch(const std::string& name, const TensorSpec& a, const TensorSpec& b);
  // An allgather's first dimensions by rank, or why the ranks cannot gather them.
  static std::string first_dims_of(const std::string& name,
                                   const std::vector<std::optional<TensorSpec>>& by_rank,
                                   FirstDims* first_dims);
  // An alltoall's splits of every rank, or why the ranks cannot exchange them.
  static std::string splits_of(const std::string& name,
                               const std::vector<std::optional<TensorSpec>>& by_rank,
                               FirstDims* matrix);
  std::optional<Response> add(int rank, const Request& request, Clock::time_point now);
  // Whether every rank submitted the tensor or has joined; then its verdict.
  bool complete(const Partial& partial) const;
  Response respond(const std::string& name, Partial& partial) const;
  // After a join: the tensors it completed, in name order, removed from the table.
  void complete_joined(std::vector<Response>* out);
  void cache_insert(const Response& response);
  void cache_erase(const std::string& name);

  int rank_;
  int size_;
  size_t capacity_;
  std::map<std::string, Partial> table_;
  // Cache: a fixed slot per entry (its bit) and least-recently-used order for eviction.
  std::vector<std::optional<CacheEntry>> slots_;
  std::unordered_map<std::string, uint32_t> slot_of_;
  std::list<uint32_t> cache_order_;                       // front: least recently used
  std::vector<std::list<uint32_t>::iterator> order_pos_;  // by slot: where it is in that order
  std::list<uint32_t> entry_order_;                       // front: longest in the cache
  std::vector<std::list<uint32_t>::iterator> entry_pos_;  // by slot: where it is in that order
  std::vector<uint32_t> free_slots_;
  std::vector<uint8_t> joined_;  // by rank
  int last_joined_ = -1;
};

}  // namespace hvd::core

#endif  // HVD_CORE_SCHEDULER_NEGOTIATION_HPP
