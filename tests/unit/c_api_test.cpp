// The C API's translation, through libhvd's exported face alone: handles and NULLs, struct
// sizes, status codes with hvd_last_error's message (per thread), and no exception crossing.
#include "hvd/hvd.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kTestPlugins = HVD_TEST_PLUGIN_DIR;
const std::string kFlawedPlugins = HVD_FLAWED_PLUGIN_DIR;

hvd_comm* init_with(const std::string& backend, hvd_status expected = HVD_SUCCESS) {
  hvd_init_options options{};
  options.struct_size = sizeof options;
  options.backend = backend.c_str();
  hvd_comm* comm = nullptr;
  EXPECT_EQ(hvd_init(&options, &comm), expected) << hvd_last_error();
  return comm;
}

TEST(CApi, NullHandlesAreErrorsOrNeutralValuesNeverACrash) {
  EXPECT_EQ(hvd_rank(nullptr), -1);
  EXPECT_EQ(hvd_size(nullptr), -1);
  EXPECT_EQ(hvd_local_rank(nullptr), -1);
  EXPECT_STREQ(hvd_backend_name(nullptr), "");
  EXPECT_EQ(hvd_backend_capabilities(nullptr), 0u);
  EXPECT_EQ(hvd_finalize(nullptr), HVD_SUCCESS);
  hvd_request_free(nullptr);

  int32_t value = 1;
  EXPECT_EQ(hvd_allreduce(nullptr, &value, &value, 1, HVD_INT32, HVD_SUM, nullptr),
            HVD_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(hvd_last_error(), "comm is NULL");
  EXPECT_EQ(hvd_init(nullptr, nullptr), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hvd_request_wait(nullptr, 1), HVD_ERR_INVALID_ARGUMENT);
  int done = 0;
  EXPECT_EQ(hvd_request_poll(nullptr, &done), HVD_ERR_INVALID_ARGUMENT);
}

TEST(CApi, ASuccessClearsTheLastErrorAndEachThreadHasItsOwn) {
  int32_t value = 1;
  ASSERT_EQ(hvd_barrier(nullptr), HVD_ERR_INVALID_ARGUMENT);
  std::string other;
  std::thread([&] { other = hvd_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_STREQ(hvd_last_error(), "comm is NULL");

  hvd_comm* comm = init_with(kTestPlugins + "/libhvd-backend-kvs.so");
  ASSERT_NE(comm, nullptr);
  EXPECT_STREQ(hvd_last_error(), "");
  EXPECT_EQ(hvd_allreduce(comm, &value, &value, 1, HVD_INT32, HVD_SUM, nullptr), HVD_SUCCESS);
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS);
}

TEST(CApi, AStructSmallerThanItsFirstReleaseIsRefused) {
  hvd_init_options options{};
  options.struct_size = 1;
  hvd_comm* comm = nullptr;
  EXPECT_EQ(hvd_init(&options, &comm), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hvd_last_error()).find("hvd_init_options"), std::string::npos)
      << hvd_last_error();
  EXPECT_EQ(comm, nullptr);
}

TEST(CApi, AnUnknownBackendNamesWhatExistsAndWhereItLooked) {
  init_with("no-such-backend", HVD_ERR_NOT_FOUND);
  const std::string message = hvd_last_error();
  EXPECT_NE(message.find("no-such-backend"), std::string::npos) << message;
  EXPECT_NE(message.find("Searched: "), std::string::npos) << message;
}

TEST(CApi, AFinalizedHandleIsAnErrorNotAUseAfterFree) {
  hvd_comm* comm = init_with(kTestPlugins + "/libhvd-backend-kvs.so");
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(hvd_rank(comm), 0);
  EXPECT_EQ(hvd_size(comm), 1);
  EXPECT_STREQ(hvd_backend_name(comm), "kvs");
  ASSERT_EQ(hvd_finalize(comm), HVD_SUCCESS);
  EXPECT_EQ(hvd_barrier(comm), HVD_ERR_STATE);
  EXPECT_STREQ(hvd_last_error(),
               "comm is not a live communicator (finalized already, or never made)");
  EXPECT_EQ(hvd_rank(comm), -1);
}

TEST(CApi, BlockingAndAsynchronousCallsGiveExactResults) {
  hvd_comm* comm = init_with(kTestPlugins + "/libhvd-backend-kvs.so");
  ASSERT_NE(comm, nullptr);
  const std::vector<int64_t> in{3, -7, 11};
  std::vector<int64_t> out(3, 0);
  ASSERT_EQ(hvd_allreduce(comm, in.data(), out.data(), 3, HVD_INT64, HVD_MAX, nullptr),
            HVD_SUCCESS);
  EXPECT_EQ(out, in);

  hvd_request* request = nullptr;
  std::vector<int64_t> gathered(3, 0);
  const int64_t shape[1] = {3};
  ASSERT_EQ(hvd_allgather_async(comm, "gathered", in.data(), gathered.data(), HVD_INT64, 1, shape,
                                nullptr, &request),
            HVD_SUCCESS)
      << hvd_last_error();
  ASSERT_EQ(hvd_request_wait(request, 30), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(gathered, in);
  hvd_request_free(request);
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS);
}

// The ABI forbids a plugin to throw; one that does gets an error naming it, and the process
// goes on.
TEST(CApi, AnExceptionFromAPluginIsAnInternalErrorNamingIt) {
  hvd_comm* comm = init_with(kFlawedPlugins + "/libhvd-backend-throwing.so");
  ASSERT_NE(comm, nullptr);
  int32_t value = 1;
  EXPECT_EQ(hvd_allreduce(comm, &value, &value, 1, HVD_INT32, HVD_SUM, nullptr), HVD_ERR_INTERNAL);
  const std::string message = hvd_last_error();
  EXPECT_NE(message.find("throwing"), std::string::npos) << message;
  EXPECT_NE(message.find("boom"), std::string::npos) << message;
  (void)hvd_finalize(comm);
}

}  // namespace
