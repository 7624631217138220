// Negotiation: the requests' wire form, and the replicated coordinator that every rank runs on the
// same inputs (verdicts, mismatches, the cache, joins), alone and inside the scheduler.
#include "scheduler/negotiation.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "scheduler_job.hpp"

namespace hvd::core {
namespace {

using namespace std::chrono_literals;
using hvd::testing::allgather;
using hvd::testing::allreduce;
using hvd::testing::fast_options;
using hvd::testing::Job;
using hvd::testing::kWait;
using hvd::testing::rows_of;
using hvd::testing::submit_and_wait;

const Negotiator::Clock::time_point kT0{};

Request request(const std::string& name, hvd_collective type, hvd_dtype dtype, Shape shape) {
  Request r;
  r.name = name;
  r.spec.type = type;
  r.spec.dtype = dtype;
  r.spec.shape = std::move(shape);
  if (type == HVD_COLLECTIVE_ALLGATHER || type == HVD_COLLECTIVE_ALLTOALL) {
    r.spec.output_capacity = TensorSpec::kAllocated;
  }
  return r;
}

// ---- the requests on the wire ----------------------------------------------------------------

TEST(NegotiationWire, RequestsSurviveTheRoundTripFieldByField) {
  Request a = request("layer1/weights", HVD_COLLECTIVE_ALLREDUCE, HVD_BFLOAT16, {3, 0, 7});
  a.spec.op = HVD_MAX;
  a.spec.memory = HVD_MEMORY_CUDA;
  a.spec.device = 5;
  a.spec.device_executor = true;
  a.spec.prescale = 0.25;
  a.spec.postscale = -3;
  a.spec.group = 0x123456789abcdefull;
  a.spec.group_size = 4;
  Request b = request("", HVD_COLLECTIVE_ALLTOALL, HVD_INT64, {});
  b.spec.splits = {1, 0, 9};
  b.spec.root = -2;
  b.error = "it failed here";
  b.error_code = HVD_ERR_UNSUPPORTED;
  for (const std::vector<Request>& sent :
       {std::vector<Request>{}, std::vector<Request>{a}, std::vector<Request>{a, b}}) {
    const std::vector<char> wire = serialize(sent);
    auto got = deserialize(wire.data(), wire.size());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ((*got)[i].name, sent[i].name);
      EXPECT_TRUE((*got)[i].spec == sent[i].spec) << i;
      EXPECT_EQ((*got)[i].error, sent[i].error);
      EXPECT_EQ((*got)[i].error_code, sent[i].error_code);
    }
  }
}

bool corrupt(const std::vector<char>& wire) {
  auto got = deserialize(wire.data(), wire.size());
  return !got.ok() && got.status().code() == HVD_ERR_INTERNAL &&
         got.status().message() == "a rank's tensor requests are corrupt";
}

TEST(NegotiationWire, EveryTruncationIsCorruptNeverACrash) {
  Request a = request("t", HVD_COLLECTIVE_ALLTOALL, HVD_INT32, {2});
  a.spec.splits = {1, 1};
  a.error = "why";
  const std::vector<char> wire = serialize({a, a});
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_TRUE(corrupt(std::vector<char>(wire.begin(), wire.begin() + n))) << n << " bytes";
  }
}

// One request named "n" of shape {2}: where its fields lie in the wire form.
constexpr size_t kType = 4 + 4 + 1, kNdim = kType + 1 + 4, kExecutor = kNdim + 4 + 8 + 4 + 4 + 4;
constexpr size_t kSplits = kExecutor + 1 + 4 + 8 + 8 + 8 + 4 + 8;

template <typename T>
std::vector<char> with(std::vector<char> wire, size_t at, T value) {
  std::memcpy(wire.data() + at, &value, sizeof value);
  return wire;
}

TEST(NegotiationWire, ValuesNoRankSendsAreCorrupt) {
  const std::vector<char> wire =
      serialize({request("n", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {2})});
  ASSERT_TRUE(deserialize(wire.data(), wire.size()).ok());
  // A count the bytes cannot hold is refused before anything is sized by it.
  EXPECT_TRUE(corrupt(with(wire, 0, uint32_t{0xffffffff})));
  EXPECT_TRUE(corrupt(with(wire, 0, uint32_t{2})));
  EXPECT_TRUE(corrupt(with(wire, kType, uint8_t{HVD_COLLECTIVE_BARRIER})));  // never negotiated
  EXPECT_TRUE(corrupt(with(wire, kType, uint8_t{HVD_COLLECTIVE_COUNT})));
  EXPECT_TRUE(corrupt(with(wire, kNdim, uint32_t{65})));
  EXPECT_TRUE(corrupt(with(wire, kExecutor, uint8_t{2})));
  EXPECT_TRUE(corrupt(with(wire, kSplits, uint32_t{(1u << 20) + 1})));
  EXPECT_FALSE(corrupt(with(wire, kExecutor, uint8_t{1})));  // the offsets above are right
}

// ---- the coordinator, on every rank ----------------------------------------------------------

// One Negotiator per rank, fed the same cycles, as the ranks of a job are.
struct Ranks {
  explicit Ranks(int size, size_t cache = 16) {
    at.reserve(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) at.emplace_back(r, size, cache);
  }
  std::vector<Negotiator::Ready> cycle(const std::vector<std::vector<Request>>& requests,
                                       const std::vector<uint8_t>& bits = {},
                                       Negotiator::Clock::time_point now = kT0) {
    std::vector<Negotiator::Ready> out;
    for (Negotiator& n : at) out.push_back(n.cycle(bits, requests, now));
    return out;
  }
  std::vector<Negotiator> at;
};

// What every rank must agree on in a response: the spec is each rank's own, and so is whether
// it stands in for a rank that joined.
std::string verdict(const Response& r) {
  std::string out = r.name;
  if (!r.error.empty()) out += std::string(" (") + hvd_status_name(r.error_code) + ") " + r.error;
  if (!r.first_dims.empty()) out += " dims";
  for (int64_t d : r.first_dims) out += " " + std::to_string(d);
  return out;
}

// The verdicts of the one cycle, checked to be the same on every rank.
std::vector<std::string> agreed(const std::vector<Negotiator::Ready>& by_rank) {
  std::vector<std::string> first;
  for (const Response& r : by_rank[0].negotiated) first.push_back(verdict(r));
  for (size_t rank = 1; rank < by_rank.size(); ++rank) {
    std::vector<std::string> mine;
    for (const Response& r : by_rank[rank].negotiated) mine.push_back(verdict(r));
    EXPECT_EQ(mine, first) << "rank " << rank << " decided otherwise";
  }
  return first;
}

TEST(Negotiator, ATensorIsReadyOnceEveryRankSubmittedItInTheOrderThatCompletedIt) {
  Ranks ranks(3);
  const Request a = request("a", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {4});
  const Request b = request("b", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {4});
  EXPECT_TRUE(agreed(ranks.cycle({{a, b}, {b}, {}})).empty());
  const auto stalls = ranks.at[1].stalled(kT0 + 10s, 5s);
  ASSERT_EQ(stalls.size(), 2u);
  EXPECT_EQ(stalls[0].name, "a");
  EXPECT_EQ(stalls[0].missing, (std::vector<int>{1, 2}));
  EXPECT_EQ(stalls[1].missing, (std::vector<int>{2}));
  EXPECT_TRUE(ranks.at[1].stalled(kT0 + 4s, 5s).empty());  // not long enough yet
  EXPECT_EQ(agreed(ranks.cycle({{}, {a}, {b, a}})), (std::vector<std::string>{"b", "a"}));
  EXPECT_TRUE(ranks.at[0].stalled(kT0 + 10s, 5s).empty());
}

TEST(Negotiator, AMismatchIsTheSameMessageOnEveryRank) {
  Ranks ranks(3);
  Request f = request("x", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {4});
  Request i = f;
  i.spec.dtype = HVD_INT32;
  const auto ready = ranks.cycle({{f}, {i}, {f}});
  EXPECT_EQ(agreed(ready), (std::vector<std::string>{
                               "x (mismatch between ranks) Mismatched ALLREDUCE data types for "
                               "tensor 'x': One rank sent a tensor of type float32, but "
                               "another rank sent a tensor of type int32."}));
  EXPECT_EQ(ready[1].negotiated[0].spec.dtype, HVD_INT32);  // each rank's own spec
  // A failed tensor is not cached: the next time it is negotiated in full again.
  EXPECT_FALSE(ranks.at[0].cached_bit("x", f.spec).has_value());
}

TEST(Negotiator, WhatRanksMustShareIsComparedAndWhatIsTheirOwnIsNot) {
  const Request base = request("x", HVD_COLLECTIVE_BROADCAST, HVD_INT64, {2, 3});
  const std::vector<std::pair<std::function<void(TensorSpec&)>, std::string>> cases = {
      {[](TensorSpec& s) {
         s.shape = {3, 2};
       },
       "Mismatched BROADCAST tensor shapes for tensor 'x': One rank sent a tensor of shape [2, "
       "3], but another rank sent a tensor of shape [3, 2]."},
      {[](TensorSpec& s) { s.root = 1; },
       "Mismatched BROADCAST root ranks for tensor 'x': One rank specified root rank 0, but "
       "another rank specified root rank 1."},
      {[](TensorSpec& s) { s.device_executor = true; },
       "Mismatched BROADCAST CUDA paths for tensor 'x': One rank runs it on hvd's device "
       "executor, but another rank cannot drive its device and hands it to the backend as it is "
       "(that rank's log says why)."},
      {[](TensorSpec& s) {
         s.group = 0xab;
         s.group_size = 2;
       },
       "Mismatched BROADCAST groups for tensor 'x': One rank submitted it alone, but another "
       "rank in a group of 2 tensors (00000000000000ab)."},
  };
  for (const auto& [change, message] : cases) {
    Ranks ranks(2);
    Request other = base;
    change(other.spec);
    EXPECT_EQ(agreed(ranks.cycle({{base}, {other}})),
              std::vector<std::string>{"x (mismatch between ranks) " + message});
  }
  // What the ranks may not share is never a mismatch: a broadcast's op, each rank's device.
  Ranks ranks(2);
  Request other = base;
  other.spec.op = HVD_MAX;
  other.spec.device = 3;
  EXPECT_EQ(agreed(ranks.cycle({{base}, {other}})).at(0), "x");
}

TEST(Negotiator, ARanksOwnFailureFailsTheTensorOnEveryRankWithItsCode) {
  Ranks ranks(2);
  Request good = request("x", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {4});
  Request bad = good;
  bad.error = "ALLREDUCE 'x': a negative dimension";
  bad.error_code = HVD_ERR_INVALID_ARGUMENT;
  EXPECT_EQ(agreed(ranks.cycle({{good}, {bad}})),
            (std::vector<std::string>{"x (invalid argument) Tensor 'x' failed on rank 1: ALLREDUCE "
                                      "'x': a negative dimension"}));
}

TEST(Negotiator, ANameSubmittedTwiceBeforeItCompletedIsADuplicate) {
  Ranks ranks(2);
  const Request a = request("dup", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {1});
  EXPECT_EQ(agreed(ranks.cycle({{a, a}, {}})),
            (std::vector<std::string>{"dup (mismatch between ranks) Duplicate tensor name 'dup': "
                                      "rank 0 submitted it again before it completed."}));
}

TEST(Negotiator, ASeenTensorIsABitAndCachedTensorsComeInTheOrderTheyEnteredTheCache) {
  Ranks ranks(2, /*cache=*/2);
  const Request a = request("a", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {1});
  const Request b = request("b", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {2});
  const Request c = request("c", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {3});
  agreed(ranks.cycle({{a, b}, {a, b}}));
  Negotiator& n = ranks.at[0];
  ASSERT_EQ(n.bit_count(), 2u);
  const auto bit_a = n.cached_bit("a", a.spec), bit_b = n.cached_bit("b", b.spec);
  ASSERT_TRUE(bit_a && bit_b);
  EXPECT_NE(*bit_a, *bit_b);
  EXPECT_FALSE(n.cached_bit("a", b.spec).has_value());  // another spec is another tensor
  EXPECT_EQ(n.cached_name(*bit_b), "b");
  std::vector<uint8_t> bits(2, 1);
  EXPECT_EQ(n.cycle(bits, {}, kT0).cached, (std::vector<uint32_t>{*bit_a, *bit_b}));
  ranks.at[1].cycle(bits, {}, kT0);
  // A third tensor evicts the least recently used, and takes its bit: the vector stays as long.
  bits[*bit_a] = 0;
  EXPECT_EQ(n.cycle(bits, {}, kT0).cached, (std::vector<uint32_t>{*bit_b}));
  ranks.at[1].cycle(bits, {}, kT0);
  agreed(ranks.cycle({{c}, {c}}));
  EXPECT_EQ(n.bit_count(), 2u);
  EXPECT_FALSE(n.cached_bit("a", a.spec).has_value());
  EXPECT_EQ(n.cached_bit("c", c.spec), bit_a);
  EXPECT_EQ(n.cached_bit("b", b.spec), bit_b);
}

TEST(Negotiator, AnAllgathersFirstDimensionsAreEveryRanksInRankOrder) {
  Ranks ranks(3);
  std::vector<std::vector<Request>> requests;
  for (int64_t rows : {2, 0, 5}) {
    requests.push_back({request("g", HVD_COLLECTIVE_ALLGATHER, HVD_INT32, {rows, 3})});
  }
  EXPECT_EQ(agreed(ranks.cycle(requests)), std::vector<std::string>{"g dims 2 0 5"});
  EXPECT_EQ(ranks.at[2].cached_first_dims(*ranks.at[2].cached_bit("g", requests[2][0].spec)),
            (FirstDims{2, 0, 5}));
  // Rows of 2^62 elements: the sum would not fit, whatever the buffers.
  Ranks huge(2);
  const Request big = request("h", HVD_COLLECTIVE_ALLGATHER, HVD_INT8, {1, int64_t{1} << 62});
  EXPECT_EQ(agreed(huge.cycle({{big}, {big}})),
            std::vector<std::string>{"h (mismatch between ranks) Mismatched ALLGATHER first "
                                     "dimensions for tensor 'h': the ranks sent 1, 1 (in rank "
                                     "order), too many elements in all. dims 1 1"});
}

TEST(Negotiator, AnAlltoallsSplitsAreTheMatrixAndWhatARankReceivesMustFit) {
  Ranks ranks(2);
  Request r0 = request("t", HVD_COLLECTIVE_ALLTOALL, HVD_FLOAT32, {3});
  r0.spec.splits = {1, 2};
  Request r1 = request("t", HVD_COLLECTIVE_ALLTOALL, HVD_FLOAT32, {4});
  r1.spec.splits = {4, 0};
  EXPECT_EQ(agreed(ranks.cycle({{r0}, {r1}})), std::vector<std::string>{"t dims 1 2 4 0"});
  r0.spec.output_capacity = 4;  // rank 0 receives 1 + 4
  EXPECT_EQ(agreed(ranks.cycle({{r0}, {r1}})),
            std::vector<std::string>{"t (invalid argument) ALLTOALL for tensor 't': rank 0 "
                                     "receives 5 elements, but its output buffer holds 4 (pass "
                                     "recvbuf NULL and hvd allocates the output). dims 1 2 4 0"});
}

TEST(Negotiator, AJoinedRankCountsAsPresentForHostAllreducesUntilEveryRankJoined) {
  Ranks ranks(3);
  const Request join = request(kJoinName, HVD_COLLECTIVE_JOIN, HVD_UINT8, {});
  const Request a = request("a", HVD_COLLECTIVE_ALLREDUCE, HVD_FLOAT32, {2});
  const Request g = request("g", HVD_COLLECTIVE_ALLGATHER, HVD_FLOAT32, {2});
  EXPECT_TRUE(agreed(ranks.cycle({{a, g}, {join}, {}})).empty());
  EXPECT_TRUE(ranks.at[0].joined(1));
  // Rank 2's submissions complete them; rank 1 stands in for the allreduce only.
  const auto ready = ranks.cycle({{}, {}, {a, g}});
  EXPECT_EQ(agreed(ready),
            (std::vector<std::string>{"a",
                                      "g (unsupported) ALLGATHER 'g' cannot run while rank(s) 1 "
                                      "have joined (hvd_join_async): joined ranks take part "
                                      "in host-memory allreduces only"}));
  EXPECT_FALSE(ready[0].negotiated[0].stand_in);
  EXPECT_TRUE(ready[1].negotiated[0].stand_in);
  // The join completes once every rank joined, naming the last; then nobody counts as joined.
  EXPECT_TRUE(agreed(ranks.cycle({{}, {}, {join}})).empty());
  EXPECT_EQ(agreed(ranks.cycle({{join}, {}, {}})), std::vector<std::string>{"hvd.join dims 0"});
  EXPECT_FALSE(ranks.at[2].joined(1));
}

TEST(Negotiator, OpTypeNamesAreHorovods) {
  EXPECT_STREQ(op_type_name(HVD_COLLECTIVE_ALLREDUCE), "ALLREDUCE");
  EXPECT_STREQ(op_type_name(HVD_COLLECTIVE_REDUCE_SCATTER), "REDUCESCATTER");
  EXPECT_STREQ(op_type_name(HVD_COLLECTIVE_JOIN), "JOIN");
  EXPECT_STREQ(op_type_name(static_cast<hvd_collective>(99)), "?");
}

// ---- inside the scheduler: every rank fails alike ------------------------------------------

// Rank 0 submits `a`, rank 1 `b` under one name; both must fail with the same message, which
// contains `expected`. A later tensor still completes.
void expect_mismatch(const std::function<void(Submission&)>& on_rank1,
                     const std::string& expected) {
  Job job(2, fast_options());
  std::vector<std::string> messages(2);
  job.each([&](int rank) {
    std::vector<float> in(4, 1), out(4, 0);
    Submission s = allreduce("x", in.data(), out.data(), HVD_FLOAT32, {4});
    if (rank == 1) on_rank1(s);
    std::vector<char> big(64 * 8, 0);
    if (rank == 1) s.recv = big.data();  // room for any shape or type the change asks for
    if (rank == 1 && s.send != nullptr) s.send = big.data();
    const Status status = submit_and_wait(job.at(rank), std::move(s));
    EXPECT_EQ(status.code(), HVD_ERR_MISMATCH) << status.to_string();
    messages[static_cast<size_t>(rank)] = status.message();
    // The job goes on.
    std::vector<float> ok_in(2, 1), ok_out(2, 0);
    EXPECT_TRUE(submit_and_wait(job.at(rank),
                                allreduce("after", ok_in.data(), ok_out.data(), HVD_FLOAT32, {2}))
                    .ok());
    EXPECT_EQ(ok_out[0], 2.0f);
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find(expected), std::string::npos) << messages[0];
}

TEST(Scheduler, EveryMismatchIsTheSameErrorOnEveryRank) {
  expect_mismatch([](Submission& s) { s.spec.dtype = HVD_INT32; },
                  "Mismatched ALLREDUCE data types for tensor 'x': One rank sent a tensor of type "
                  "float32, but another rank sent a tensor of type int32.");
  expect_mismatch(
      [](Submission& s) {
        s.spec.shape = {2, 2};
      },
      "Mismatched ALLREDUCE tensor shapes for tensor 'x': One rank sent a tensor of "
      "shape [4], but another rank sent a tensor of shape [2, 2].");
  expect_mismatch([](Submission& s) { s.spec.op = HVD_MAX; },
                  "Mismatched ALLREDUCE reduce ops for tensor 'x'");
  expect_mismatch([](Submission& s) { s.spec.type = HVD_COLLECTIVE_ALLGATHER; },
                  "Mismatched collective operations for tensor 'x': One rank did an ALLREDUCE, "
                  "but another rank did an ALLGATHER.");
  expect_mismatch([](Submission& s) { s.spec.prescale = 0.5; },
                  "Mismatched ALLREDUCE prescale factors for tensor 'x': One rank sent factor 1, "
                  "but another rank sent factor 0.5.");
  expect_mismatch([](Submission& s) { s.spec.postscale = 2; },
                  "Mismatched ALLREDUCE postscale factors");
  expect_mismatch(
      [](Submission& s) {
        s.spec.memory = HVD_MEMORY_CUDA;
        s.spec.device = 0;
      },
      "Mismatched ALLREDUCE memory kinds for tensor 'x': One rank sent a tensor in host memory, "
      "but another rank sent a tensor in CUDA memory.");
}

TEST(Scheduler, MismatchedBroadcastRootsAreTheSameErrorOnEveryRank) {
  Job job(3, fast_options());
  std::vector<std::string> messages(3);
  job.each([&](int rank) {
    std::vector<int32_t> buf(3, rank);
    Submission s;
    s.name = "b";
    s.send = buf.data();
    s.recv = buf.data();
    s.spec.type = HVD_COLLECTIVE_BROADCAST;
    s.spec.dtype = HVD_INT32;
    s.spec.shape = {3};
    s.spec.root = rank == 2 ? 1 : 0;
    const Status status = submit_and_wait(job.at(rank), std::move(s));
    EXPECT_EQ(status.code(), HVD_ERR_MISMATCH);
    messages[static_cast<size_t>(rank)] = status.message();
  });
  EXPECT_EQ(messages[0], messages[2]);
  EXPECT_EQ(messages[0],
            "Mismatched BROADCAST root ranks for tensor 'b': One rank specified root rank 0, but "
            "another rank specified root rank 1.");
}

TEST(Scheduler, AnAllgatherIntoABufferTooSmallIsTheSameErrorOnEveryRank) {
  Job job(2, fast_options());
  std::vector<std::string> messages(2);
  job.each([&](int rank) {
    const int64_t rows = rank + 1;  // 1 and 2 rows of 3
    const std::vector<int64_t> in = rows_of(rank, rows, 3);
    std::vector<int64_t> out(static_cast<size_t>(2 * rows * 3));  // sized for equal shapes
    const Status s =
        submit_and_wait(job.at(rank), allgather("g", in.data(), out.data(), HVD_INT64, {rows, 3}));
    EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
    messages[static_cast<size_t>(rank)] = s.message();
    // The job goes on.
    std::vector<int64_t> ok(2 * 3);
    EXPECT_TRUE(
        submit_and_wait(job.at(rank), allgather("h", in.data(), ok.data(), HVD_INT64, {1, 3}))
            .ok());
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[0],
            "Mismatched ALLGATHER first dimensions for tensor 'g': the ranks sent 1, 2 (in rank "
            "order), 9 elements in all, but rank 0's output buffer holds 6 (an allgather's recvbuf "
            "is sized for equal shapes; pass recvbuf NULL and hvd allocates the output once the "
            "sizes are known).");
}

TEST(Scheduler, AllgatherRanksMustAgreeBeyondTheFirstDimension) {
  const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {1, 4}, {2}, {2, 1}};
  for (size_t k = 0; k < shapes.size(); k += 2) {
    Job job(2, fast_options());
    std::vector<std::string> messages(2);
    job.each([&](int rank) {
      const std::vector<int64_t> in(8, rank);
      const Status s = submit_and_wait(
          job.at(rank), allgather("g", in.data(), nullptr, HVD_INT64, shapes[k + rank]));
      EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
      messages[static_cast<size_t>(rank)] = s.message();
    });
    EXPECT_EQ(messages[0], messages[1]);
    const std::string text = k == 0 ? "[2, 3], but another rank sent a tensor of shape [1, 4]"
                                    : "[2], but another rank sent a tensor of shape [2, 1]";
    EXPECT_EQ(messages[0],
              "Mismatched ALLGATHER tensor shapes for tensor 'g': One rank sent a "
              "tensor of shape " +
                  text + " (only the first dimension may differ).");
  }
}

TEST(Scheduler, GroupedOnOneRankAndAloneOnAnotherIsAMismatchOnEveryRank) {
  Job job(2, fast_options());
  std::vector<std::string> messages(2);
  job.each([&](int rank) {
    std::vector<int64_t> a_in(2, 1), a_out(2), b_in(2, 1), b_out(2);
    std::vector<Submission> members;
    members.push_back(allreduce("a", a_in.data(), a_out.data(), HVD_INT64, {2}));
    members.push_back(allreduce("b", b_in.data(), b_out.data(), HVD_INT64, {2}));
    std::vector<std::shared_ptr<Completion>> done;
    if (rank == 0) {
      auto group = job.at(rank).submit_group(std::move(members));
      ASSERT_TRUE(group.ok());
      done = *group;
    } else {
      for (Submission& m : members) done.push_back(*job.at(rank).submit(std::move(m)));
    }
    const Status a = done[0]->wait(kWait);
    EXPECT_EQ(a.code(), HVD_ERR_MISMATCH) << a.to_string();
    EXPECT_EQ(done[1]->wait(kWait).code(), HVD_ERR_MISMATCH);
    messages[static_cast<size_t>(rank)] = a.message();
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("Mismatched ALLREDUCE groups for tensor 'a': One rank submitted it "
                             "in a group of 2 tensors ("),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("), but another rank alone."), std::string::npos) << messages[0];
}

// ---- join ----------------------------------------------------------------------------------

Submission broadcast_of(const std::string& name, const void* send, void* recv, int64_t count,
                        int root) {
  Submission s = allreduce(name, send, recv, HVD_INT64, {count});
  s.spec.type = HVD_COLLECTIVE_BROADCAST;
  s.spec.root = root;
  return s;
}

// Rank `first` joins at once; the others reduce two tensors (first negotiated in full, then
// again from the cache), then join. The joined rank's zeros count in the average's divisor.
TEST(Scheduler, AJoinedRankServesTheOthersAllreducesWithZerosUntilEveryRankJoins) {
  for (int size : {1, 2, 3, 4}) {
    Job job(size, fast_options());
    for (int first = 0; first < size; ++first) {
      std::vector<int> last(static_cast<size_t>(size), -2);
      job.each([&](int rank) {
        Scheduler& s = job.at(rank);
        if (rank != first) {
          for (int round = 0; round < 2; ++round) {  // the second from the cache
            std::vector<float> a(7), a_out(7);
            std::vector<int32_t> b(5), b_out(5);
            for (size_t i = 0; i < a.size(); ++i) a[i] = float(rank + 1) * float(i + 1);
            for (size_t i = 0; i < b.size(); ++i) b[i] = (rank + 1) * int32_t(i + 3);
            auto ca = s.submit(allreduce("a", a.data(), a_out.data(), HVD_FLOAT32, {7}));
            auto cb = s.submit(allreduce("b", b.data(), b_out.data(), HVD_INT32, {5}, HVD_AVERAGE));
            ASSERT_TRUE(ca.ok() && cb.ok());
            ASSERT_TRUE((*ca)->wait(kWait).ok());
            ASSERT_TRUE((*cb)->wait(kWait).ok());
            int ranks_sum = 0;  // of rank + 1 over the ranks that submitted
            for (int r = 0; r < size; ++r) ranks_sum += r == first ? 0 : r + 1;
            for (size_t i = 0; i < a.size(); ++i) {
              EXPECT_EQ(a_out[i], float(ranks_sum) * float(i + 1)) << "size " << size;
            }
            for (size_t i = 0; i < b.size(); ++i) {
              EXPECT_EQ(b_out[i], ranks_sum * int32_t(i + 3) / size) << "size " << size;
            }
          }
        }
        auto joined = s.join();
        ASSERT_TRUE(joined.ok()) << joined.status().to_string();
        ASSERT_TRUE((*joined)->wait(kWait).ok());
        ASSERT_TRUE((*joined)->last_joined(&last[static_cast<size_t>(rank)]).ok());
      });
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(last[static_cast<size_t>(r)], last[0]) << "every rank learns the same rank";
      }
      EXPECT_GE(last[0], 0);
      if (size > 1) {
        EXPECT_NE(last[0], first) << "the first to join is not the last";
      }
    }
  }
}

// Only host-memory allreduces go on with zeros: an allgather negotiated in full and a broadcast
// answered from the cache fail on every rank that submitted them, with one message.
TEST(Scheduler, OtherCollectivesFailOnEveryRankWhileARankHasJoined) {
  Job job(3, fast_options());
  std::vector<int64_t> in(4, 9);
  job.each([&](int rank) {  // "bc" enters the cache
    std::vector<int64_t> out(4);
    EXPECT_TRUE(
        submit_and_wait(job.at(rank), broadcast_of("bc", in.data(), out.data(), 4, 1)).ok());
  });
  std::vector<std::string> messages(3);
  job.each([&](int rank) {
    Scheduler& s = job.at(rank);
    if (rank == 0) {
      auto joined = s.join();
      ASSERT_TRUE(joined.ok());
      EXPECT_TRUE((*joined)->wait(kWait).ok());
      return;
    }
    std::vector<int64_t> out(12);
    Submission gather = allreduce("g", in.data(), out.data(), HVD_INT64, {4});
    gather.spec.type = HVD_COLLECTIVE_ALLGATHER;
    const Status g = submit_and_wait(s, std::move(gather));
    EXPECT_EQ(g.code(), HVD_ERR_UNSUPPORTED) << g.to_string();
    const Status b = submit_and_wait(s, broadcast_of("bc", in.data(), out.data(), 4, 1));
    EXPECT_EQ(b.code(), HVD_ERR_UNSUPPORTED) << b.to_string();
    messages[static_cast<size_t>(rank)] = g.message() + " | " + b.message();
    auto joined = s.join();
    ASSERT_TRUE(joined.ok());
    EXPECT_TRUE((*joined)->wait(kWait).ok());
  });
  EXPECT_EQ(messages[1], messages[2]);
  EXPECT_NE(messages[1].find("ALLGATHER 'g' cannot run while rank(s) 0 have joined"),
            std::string::npos)
      << messages[1];
  EXPECT_NE(messages[1].find("BROADCAST 'bc' cannot run"), std::string::npos) << messages[1];
}

}  // namespace
}  // namespace hvd::core
