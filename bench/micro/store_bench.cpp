// The rendezvous store: one set or get over loopback TCP to hvd's store server (what every
// bootstrap step and out-of-band exchange costs), and the in-process store beneath it.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bootstrap/store.hpp"

namespace {

using namespace hvd::core;
using namespace std::chrono_literals;

void BM_store_in_memory_set_get(benchmark::State& state) {
  InMemoryStore store;
  const Bytes value(static_cast<size_t>(state.range(0)), 'x');
  for (auto _ : state) {
    (void)store.set("key", value);
    benchmark::DoNotOptimize(store.get("key", 1s));
  }
}
BENCHMARK(BM_store_in_memory_set_get)->Arg(8)->Arg(4096);

void BM_store_tcp_set_get(benchmark::State& state) {
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "secret");
  if (!server.ok()) {
    state.SkipWithError(server.status().message().c_str());
    return;
  }
  auto client = TcpStoreClient::connect((*server)->address(), "secret", 10s);
  if (!client.ok()) {
    state.SkipWithError(client.status().message().c_str());
    return;
  }
  const Bytes value(static_cast<size_t>(state.range(0)), 'x');
  for (auto _ : state) {
    if (!(*client)->set("key", value).ok() || !(*client)->get("key", 1s).ok()) {
      state.SkipWithError("store call failed");
      break;
    }
  }
  state.counters["round_trips"] =
      benchmark::Counter(2, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_store_tcp_set_get)->Arg(8)->Arg(4096)->UseRealTime();

}  // namespace
