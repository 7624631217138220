// The SDK's C++ helper (hvd/sdk/backend.hpp): every optional 1.1 entry a class has fills its
// slot, the declared dtypes and ops reach the table, and init arguments are read by their
// struct_size.
#include "hvd/sdk/backend.hpp"
#include "hvd/sdk/call_shape.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using hvd::Status;

std::string g_error;  // what the helper reported through set_error
void set_error(void*, const char* message) { g_error = message; }
hvd_host_services services() {
  hvd_host_services s{};
  s.struct_size = sizeof s;
  s.set_error = set_error;
  return s;
}

// Only the required members.
class Minimal {
 public:
  static hvd::Result<std::unique_ptr<Minimal>> create(const hvd::sdk::InitContext&) {
    return std::make_unique<Minimal>();
  }
  Status allreduce(const hvd_collective_args&) { return Status::success(); }
  Status allgather(const hvd_collective_args&) { return Status::success(); }
  Status broadcast(const hvd_collective_args&) { return Status::success(); }
  Status barrier() { return Status::success(); }
};

// Every optional member.
class Complete {
 public:
  static constexpr uint64_t dtypes = HVD_DTYPE_BIT(HVD_FLOAT32) | HVD_DTYPE_BIT(HVD_INT32);
  static constexpr uint64_t reduce_ops = HVD_REDUCE_OP_BIT(HVD_SUM);
  static hvd::sdk::InitContext last_context;
  static int aborts;

  static hvd::Result<std::unique_ptr<Complete>> create(const hvd::sdk::InitContext& ctx) {
    last_context = ctx;
    return std::make_unique<Complete>();
  }
  Status allreduce(const hvd_collective_args&) { return Status::success(); }
  Status allgather(const hvd_collective_args&) { return Status::success(); }
  Status broadcast(const hvd_collective_args&) { return Status::success(); }
  Status barrier() { return Status::success(); }
  Status reduce_scatter(const hvd_collective_args&) { return Status::success(); }
  Status alltoall(const hvd_collective_args& a) {
    return a.send_counts != nullptr ? Status::success()
                                    : Status(HVD_ERR_INVALID_ARGUMENT, "alltoall without counts");
  }
  hvd::Result<std::unique_ptr<Complete>> split(const hvd::sdk::InitContext* child) {
    if (child == nullptr) return std::unique_ptr<Complete>();
    last_context = *child;
    return std::make_unique<Complete>();
  }
  Status abort() {
    ++aborts;
    return Status::success();
  }
};
hvd::sdk::InitContext Complete::last_context{0, 1, 0, 1, {}, "", hvd::sdk::Host(nullptr)};
int Complete::aborts = 0;

TEST(SdkTypes, EveryCollectiveKindHasItsName) {
  const std::vector<std::string> names = {"allreduce", "allgather", "broadcast", "reduce_scatter",
                                          "alltoall",  "barrier",   "join"};
  ASSERT_EQ(names.size(), size_t{HVD_COLLECTIVE_COUNT});
  for (int c = 0; c < HVD_COLLECTIVE_COUNT; ++c) EXPECT_EQ(hvd_collective_name(c), names[c]);
  EXPECT_EQ(hvd_collective_name(HVD_COLLECTIVE_JOIN), std::string("join"));
  EXPECT_STREQ(hvd_collective_name(-1), "?");
  EXPECT_STREQ(hvd_collective_name(HVD_COLLECTIVE_COUNT), "?");
}

TEST(SdkCallShape, TakesTheFieldsEachCollectiveReadsAndDescribesThem) {
  const uint64_t counts[3] = {1, 2, 3};
  const uint64_t other_counts[3] = {1, 3, 2};
  hvd_collective_args a{};
  a.struct_size = sizeof a;
  a.count = 7;
  a.dtype = HVD_FLOAT32;
  a.op = HVD_MAX;
  a.root = 2;
  using hvd::sdk::CallShape;
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_ALLREDUCE, &a, 3).describe(),
            "allreduce of 7 float32 (max)");
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_REDUCE_SCATTER, &a, 3).describe(),
            "reduce_scatter of 7 float32 (max)");
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_BROADCAST, &a, 3).describe(),
            "broadcast of 7 float32 from root 2");
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_ALLGATHER, &a, 3).describe(), "allgather of 7 float32");
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_ALLTOALL, &a, 3).describe(), "alltoall of float32");
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_BARRIER, nullptr, 3).describe(), "barrier");
  // A field the collective does not read never makes two calls differ.
  hvd_collective_args b = a;
  b.op = HVD_SUM;
  b.root = 0;
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_ALLGATHER, &a, 3),
            CallShape::of(HVD_COLLECTIVE_ALLGATHER, &b, 3));
  EXPECT_NE(CallShape::of(HVD_COLLECTIVE_ALLREDUCE, &a, 3),
            CallShape::of(HVD_COLLECTIVE_ALLREDUCE, &b, 3));
  EXPECT_NE(CallShape::of(HVD_COLLECTIVE_BROADCAST, &a, 3),
            CallShape::of(HVD_COLLECTIVE_BROADCAST, &b, 3));
  // Allgather with recv_counts: each rank's count is its own, the counts every rank's alike.
  hvd_collective_args v = a;
  v.recv_counts = counts;
  hvd_collective_args w = v;
  w.count = 3;
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_ALLGATHER, &v, 3),
            CallShape::of(HVD_COLLECTIVE_ALLGATHER, &w, 3));
  w.recv_counts = other_counts;
  EXPECT_NE(CallShape::of(HVD_COLLECTIVE_ALLGATHER, &v, 3),
            CallShape::of(HVD_COLLECTIVE_ALLGATHER, &w, 3));
  const std::string text = CallShape::of(HVD_COLLECTIVE_ALLGATHER, &v, 3).describe();
  EXPECT_EQ(text.rfind("allgather of float32 with recv_counts #", 0), 0u) << text;
  // CUDA memory, and bytes that are no record (a peer's, of another kind).
  hvd_collective_args cuda = a;
  cuda.memory_type = HVD_MEMORY_CUDA;
  EXPECT_EQ(CallShape::of(HVD_COLLECTIVE_ALLREDUCE, &cuda, 3).describe(),
            "allreduce of 7 float32 (max) in CUDA memory");
  std::vector<unsigned char> noise(sizeof(CallShape), 0xff);
  EXPECT_EQ(CallShape::from_bytes(noise.data()).describe(), "another kind of message");
  CallShape odd = CallShape::of(HVD_COLLECTIVE_ALLREDUCE, &a, 3);
  odd.collective = 99;
  odd.dtype = -5;
  odd.op = 1000;
  EXPECT_EQ(odd.describe(), "? of 7 ?");
}

// The core and the plugins read whole numbers from the environment with it: digits alone.
TEST(SdkEnv, ParseWholeTakesDigitsAloneWithinTheMaximum) {
  EXPECT_EQ(hvd::sdk::parse_whole("0"), 0u);
  EXPECT_EQ(hvd::sdk::parse_whole("007"), 7u);
  EXPECT_EQ(hvd::sdk::parse_whole("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(hvd::sdk::parse_whole("65535", 65535), 65535u);
  for (const char* bad : {"", "+1", "-1", "-0", " 1", "1 ", "0x10", "1e3", "1.0", "1k",
                          "18446744073709551616", "99999999999999999999"}) {
    EXPECT_EQ(hvd::sdk::parse_whole(bad), std::nullopt) << "'" << bad << "'";
  }
  EXPECT_EQ(hvd::sdk::parse_whole("65536", 65535), std::nullopt);
  EXPECT_EQ(hvd::sdk::parse_whole("1", 0), std::nullopt);
}

TEST(SdkBackend, AClassWithOnlyTheRequiredMembersDeclaresAllOf10AndNoOptionalEntry) {
  const hvd_backend_v1* t =
      hvd::sdk::backend_table<Minimal>("minimal", "1", "", HVD_CAP_HOST_MEMORY);
  EXPECT_EQ(t->struct_size, sizeof(hvd_backend_v1));
  EXPECT_EQ(t->abi_minor, static_cast<uint32_t>(HVD_BACKEND_ABI_MINOR));
  EXPECT_EQ(t->dtypes, HVD_DTYPES_1_0);
  EXPECT_EQ(t->reduce_ops, HVD_REDUCE_OPS_1_0);
  EXPECT_EQ(t->reduce_scatter, nullptr);
  EXPECT_EQ(t->split, nullptr);
  EXPECT_EQ(t->abort, nullptr);
  EXPECT_EQ(t->alltoall, nullptr);
  EXPECT_EQ(t->capabilities, HVD_CAP_HOST_MEMORY);
}

TEST(SdkBackend, EveryOptionalMemberFillsItsSlot) {
  const hvd_backend_v1* t =
      hvd::sdk::backend_table<Complete>("complete", "1", "", HVD_CAP_HOST_MEMORY);
  EXPECT_EQ(t->dtypes, HVD_DTYPE_BIT(HVD_FLOAT32) | HVD_DTYPE_BIT(HVD_INT32));
  EXPECT_EQ(t->reduce_ops, HVD_REDUCE_OP_BIT(HVD_SUM));
  ASSERT_NE(t->reduce_scatter, nullptr);
  ASSERT_NE(t->split, nullptr);
  ASSERT_NE(t->abort, nullptr);
  ASSERT_NE(t->alltoall, nullptr);
  EXPECT_NE(t->capabilities & HVD_CAP_REDUCE_SCATTER, 0u);

  // Through the C entries, as the host calls them.
  const hvd_host_services host = services();
  const int32_t world[3] = {0, 1, 2};
  hvd_backend_init_args args{};
  args.struct_size = sizeof args;
  args.rank = 1;
  args.size = 3;
  args.local_rank = 1;
  args.local_size = 2;
  args.host = &host;
  args.members = world;
  args.member_count = 3;
  args.comm_id = 7;
  args.member_local_rank = 1;
  args.member_local_size = 2;
  hvd_backend_comm* parent = nullptr;
  ASSERT_EQ(t->init(&args, &parent), HVD_SUCCESS);

  const int32_t members[2] = {0, 2};  // a child of ranks 0 and 2: this is rank 1 of it
  hvd_backend_init_args child_args = args;
  child_args.rank = 1;
  child_args.size = 2;
  child_args.members = members;
  child_args.member_count = 2;
  child_args.comm_id = 99;
  child_args.member_local_rank = 0;
  child_args.member_local_size = 1;
  hvd_backend_comm* child = nullptr;
  ASSERT_EQ(t->split(parent, &child_args, &child), HVD_SUCCESS);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(Complete::last_context.members, (std::vector<int>{0, 2}));
  EXPECT_EQ(Complete::last_context.comm_id, 99u);
  EXPECT_EQ(Complete::last_context.member_local_size, 1);
  hvd_backend_comm* none = reinterpret_cast<hvd_backend_comm*>(&none);
  EXPECT_EQ(t->split(parent, nullptr, &none), HVD_SUCCESS);  // color < 0: no child
  EXPECT_EQ(none, nullptr);

  EXPECT_EQ(t->abort(child), HVD_SUCCESS);
  EXPECT_EQ(Complete::aborts, 1);
  hvd_collective_args a{};
  a.struct_size = sizeof a;
  EXPECT_EQ(t->alltoall(child, &a), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g_error, "alltoall without counts");
  EXPECT_EQ(t->finalize(child), HVD_SUCCESS);
  EXPECT_EQ(t->finalize(parent), HVD_SUCCESS);
}

// A split that answers the wrong question (a child where the rank joins none, or none where it
// joins one) is an error through the C entry, never a dangling or missing child.
class WrongSplit {
 public:
  static bool make_child;
  static hvd::Result<std::unique_ptr<WrongSplit>> create(const hvd::sdk::InitContext&) {
    return std::make_unique<WrongSplit>();
  }
  Status allreduce(const hvd_collective_args&) { return Status::success(); }
  Status allgather(const hvd_collective_args&) { return Status::success(); }
  Status broadcast(const hvd_collective_args&) { return Status::success(); }
  Status barrier() { return Status::success(); }
  hvd::Result<std::unique_ptr<WrongSplit>> split(const hvd::sdk::InitContext*) {
    if (!make_child) return std::unique_ptr<WrongSplit>();
    return std::make_unique<WrongSplit>();
  }
};
bool WrongSplit::make_child = false;

TEST(SdkBackend, ASplitThatMakesTheWrongChildIsAnError) {
  const hvd_backend_v1* t = hvd::sdk::backend_table<WrongSplit>("wrong", "1", "", 0);
  const hvd_host_services host = services();
  hvd_backend_init_args args{};
  args.struct_size = sizeof args;
  args.size = 1;
  args.local_size = 1;
  args.host = &host;
  hvd_backend_comm* parent = nullptr;
  ASSERT_EQ(t->init(&args, &parent), HVD_SUCCESS);
  hvd_backend_comm* child = nullptr;
  WrongSplit::make_child = false;
  EXPECT_EQ(t->split(parent, &args, &child), HVD_ERR_INTERNAL);
  EXPECT_EQ(g_error, "split made no child for a rank that joins one");
  EXPECT_EQ(child, nullptr);
  WrongSplit::make_child = true;
  EXPECT_EQ(t->split(parent, nullptr, &child), HVD_ERR_INTERNAL);
  EXPECT_EQ(g_error, "split made a child for a rank that joins none");
  EXPECT_EQ(child, nullptr);
  EXPECT_EQ(t->finalize(parent), HVD_SUCCESS);
}

// A host of ABI 1.0 passes init arguments of 1.0's size: the helper fills the 1.1 fields with
// their defaults, never reading what lies beyond struct_size.
TEST(SdkBackend, InitArgumentsOfAbi10GetTheDefaultsOfLaterFields) {
  const hvd_host_services host = services();
  alignas(hvd_backend_init_args) unsigned char bytes[sizeof(hvd_backend_init_args)];
  std::memset(bytes, 0xa5, sizeof bytes);  // what a 1.0 host never wrote
  hvd_backend_init_args v10{};
  v10.struct_size = HVD_BACKEND_INIT_ARGS_SIZE_1_0;
  v10.rank = 2;
  v10.size = 4;
  v10.local_rank = 0;
  v10.local_size = 2;
  v10.timeout_ms = 5000;
  v10.local_address = "10.0.0.2";
  v10.host = &host;
  std::memcpy(bytes, &v10, HVD_BACKEND_INIT_ARGS_SIZE_1_0);
  const auto& args = *reinterpret_cast<const hvd_backend_init_args*>(bytes);
  const hvd::sdk::InitContext c = hvd::sdk::InitContext::from(args);
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.size, 4);
  EXPECT_EQ(c.members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(c.comm_id, 0u);
  EXPECT_EQ(c.member_local_rank, 0);
  EXPECT_EQ(c.member_local_size, 2);
  EXPECT_EQ(c.timeout.count(), 5000);
  EXPECT_EQ(c.local_address, "10.0.0.2");
}

}  // namespace
