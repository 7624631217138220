// The host services a plugin gets at init (its keys in the store, the out-of-band allgather,
// logging, its error message), called through the C table as a plugin calls them, and the
// message a failed backend call ends up with.
#include "comm/host_services.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"

namespace hvd::core {
namespace {

using namespace std::chrono_literals;

World world_of(int rank, int size) {
  World w;
  w.rank = rank;
  w.size = size;
  return w;
}

// What a plugin's kv_get returned: its status and the value.
struct Got {
  hvd_status status;
  std::string value;
};

Got kv_get(const hvd_host_services* t, const char* key, int64_t timeout_ms) {
  void* value = nullptr;
  size_t size = 0;
  const hvd_status status = t->kv_get(t->ctx, key, timeout_ms, &value, &size);
  Got got{status, status == HVD_SUCCESS ? std::string(static_cast<char*>(value), size) : ""};
  if (status == HVD_SUCCESS) t->free_value(t->ctx, value);
  return got;
}

TEST(HostServices, APluginsKeysLiveUnderItsCommunicatorsPrefix) {
  InMemoryStore store;
  HostServices services(&store, "hvd/0/comm-1/", world_of(0, 1));
  const hvd_host_services* t = services.table();
  EXPECT_EQ(t->struct_size, sizeof(hvd_host_services));
  ASSERT_EQ(t->kv_set(t->ctx, "addr", "1.2.3.4", 7), HVD_SUCCESS);
  EXPECT_EQ(store.get("hvd/0/comm-1/addr", 0ms).value(),
            Bytes({'1', '.', '2', '.', '3', '.', '4'}));
  const Got got = kv_get(t, "addr", 1000);
  EXPECT_EQ(got.status, HVD_SUCCESS);
  EXPECT_EQ(got.value, "1.2.3.4");
  ASSERT_EQ(t->kv_set(t->ctx, "empty", nullptr, 0), HVD_SUCCESS);
  EXPECT_EQ(kv_get(t, "empty", 1000).value, "");
}

TEST(HostServices, AKeyNeverPublishedTimesOutAndTheCallsMessageSaysWhich) {
  InMemoryStore store;
  HostServices services(&store, "p/", world_of(0, 1));
  const hvd_host_services* t = services.table();
  begin_backend_call();
  EXPECT_EQ(kv_get(t, "missing", 120).status, HVD_ERR_TIMEOUT);
  EXPECT_EQ(backend_call_message(HVD_ERR_TIMEOUT),
            "it returned 'timeout' without a message (rendezvous key 'p/missing' was not "
            "published within 120 ms)");
  // The plugin's own words come first; the service's are added once.
  t->set_error(t->ctx, "kvs: no peer");
  EXPECT_EQ(backend_call_message(HVD_ERR_TIMEOUT),
            "kvs: no peer (rendezvous key 'p/missing' was not published within 120 ms)");
  t->set_error(t->ctx, "kvs: rendezvous key 'p/missing' was not published within 120 ms");
  EXPECT_EQ(backend_call_message(HVD_ERR_TIMEOUT),
            "kvs: rendezvous key 'p/missing' was not published within 120 ms");
  // A new call starts with nothing reported.
  begin_backend_call();
  EXPECT_EQ(backend_call_message(HVD_ERR_REMOTE), "it returned 'remote failure' without a message");
}

TEST(HostServices, AfterAnAbortAWaitingGetEndsAndEveryCallIsRefused) {
  InMemoryStore store;
  HostServices services(&store, "p/", world_of(0, 1));
  const hvd_host_services* t = services.table();
  Got waited{HVD_SUCCESS, ""};
  // Bounded without the abort too: the get gives up after its own 20 s.
  std::thread plugin([&] { waited = kv_get(t, "never", 20000); });
  std::this_thread::sleep_for(100ms);
  services.abort();
  plugin.join();
  EXPECT_EQ(waited.status, HVD_ERR_STATE);
  begin_backend_call();
  EXPECT_EQ(t->kv_set(t->ctx, "k", "v", 1), HVD_ERR_STATE);
  EXPECT_EQ(backend_call_message(HVD_ERR_STATE),
            "it returned 'invalid state' without a message (the communicator was aborted (its "
            "host services refuse))");
  char out[4];
  EXPECT_EQ(t->oob_allgather(t->ctx, "abcd", 4, out, 1000), HVD_ERR_STATE);
}

TEST(HostServices, WithoutAStoreTheKeyServicesSaySo) {
  HostServices services(nullptr, "p/", world_of(0, 1));
  const hvd_host_services* t = services.table();
  begin_backend_call();
  EXPECT_EQ(t->kv_set(t->ctx, "k", "v", 1), HVD_ERR_STATE);
  EXPECT_EQ(backend_call_message(HVD_ERR_STATE),
            "it returned 'invalid state' without a message (this job has no rendezvous store "
            "(HVD_RENDEZVOUS_ADDR))");
  EXPECT_EQ(kv_get(t, "k", 10).status, HVD_ERR_STATE);
  char out[1];
  EXPECT_EQ(t->oob_allgather(t->ctx, "x", 1, out, 10), HVD_ERR_STATE);
}

// Every rank's services over one store (ranks as threads); each rank's oob_allgather of what
// send(rank) gives, and what it received (or its status).
std::vector<std::string> oob_round(std::vector<std::unique_ptr<HostServices>>& ranks,
                                   const std::function<std::string(int)>& send) {
  std::vector<std::string> got(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      const hvd_host_services* t = ranks[r]->table();
      const std::string mine = send(static_cast<int>(r));
      std::string out(mine.size() * ranks.size(), '?');
      begin_backend_call();
      const hvd_status s = t->oob_allgather(t->ctx, mine.data(), mine.size(), out.data(), 30000);
      got[r] = s == HVD_SUCCESS ? out : backend_call_message(s);
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST(HostServices, TheOutOfBandAllgatherGivesEveryRankEveryRanksBytesInRankOrder) {
  InMemoryStore store;
  std::vector<std::unique_ptr<HostServices>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(std::make_unique<HostServices>(&store, "p/", world_of(r, 3)));
  EXPECT_EQ(oob_round(ranks, [](int r) { return "r" + std::to_string(r) + "a"; }),
            std::vector<std::string>(3, "r0ar1ar2a"));
  // The next call meets under keys of its own: nobody reads the last call's bytes.
  EXPECT_EQ(oob_round(ranks, [](int r) { return "R" + std::to_string(r) + "b"; }),
            std::vector<std::string>(3, "R0bR1bR2b"));
}

TEST(HostServices, RanksThatSendDifferentSizesAllFail) {
  InMemoryStore store;
  std::vector<std::unique_ptr<HostServices>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::make_unique<HostServices>(&store, "p/", world_of(r, 2)));
  const auto got = oob_round(ranks, [](int r) { return std::string(r == 0 ? 4 : 2, 'x'); });
  EXPECT_EQ(got[0],
            "it returned 'mismatch between ranks' without a message (out-of-band allgather: rank "
            "1 sent 2 bytes, this rank 4)");
  EXPECT_EQ(got[1],
            "it returned 'mismatch between ranks' without a message (out-of-band allgather: rank "
            "0 sent 4 bytes, this rank 2)");
}

TEST(HostServices, APluginsLogLinesGoToHvdsLoggerAndUnknownLevelsAreDebug) {
  HostServices services(nullptr, "p/", world_of(0, 1));
  const hvd_host_services* t = services.table();
  set_log_rank(2);
  set_log_level("info");
  ::testing::internal::CaptureStderr();
  t->log(t->ctx, HVD_LOG_WARNING, "kvs: slow peer");
  t->log(t->ctx, static_cast<hvd_log_level>(7), "from a later minor");  // as debug: filtered
  t->log(t->ctx, HVD_LOG_INFO, nullptr);
  const std::string at_info = ::testing::internal::GetCapturedStderr();
  set_log_level("debug");
  ::testing::internal::CaptureStderr();
  t->log(t->ctx, static_cast<hvd_log_level>(-1), "below error");
  const std::string at_debug = ::testing::internal::GetCapturedStderr();
  set_log_level("warning");
  set_log_rank(-1);
  EXPECT_EQ(at_info, "[hvd rank 2] warning: kvs: slow peer\n[hvd rank 2] info: \n");
  EXPECT_EQ(at_debug, "[hvd rank 2] debug: below error\n");
}

TEST(Guarded, AnExceptionOutOfAnEntryIsAnInternalErrorNamingTheBackendAndEntry) {
  begin_backend_call();
  EXPECT_EQ(guarded("kvs", "allreduce", []() -> hvd_status { throw std::runtime_error("boom"); }),
            HVD_ERR_INTERNAL);
  EXPECT_EQ(backend_call_message(HVD_ERR_INTERNAL),
            "backend 'kvs' let a C++ exception out of its allreduce entry (boom): entries must "
            "return a status (the SDK's HVD_BACKEND_PLUGIN catches exceptions for you)");
  begin_backend_call();
  EXPECT_EQ(guarded("gloo", "init", []() -> hvd_status { throw 42; }), HVD_ERR_INTERNAL);
  EXPECT_EQ(backend_call_message(HVD_ERR_INTERNAL),
            "backend 'gloo' let a C++ exception out of its init entry (an exception that is not a "
            "std::exception): entries must return a status (the SDK's HVD_BACKEND_PLUGIN catches "
            "exceptions for you)");
  EXPECT_EQ(guarded("kvs", "barrier", [] { return HVD_ERR_REMOTE; }), HVD_ERR_REMOTE);
}

}  // namespace
}  // namespace hvd::core
