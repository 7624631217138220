// A communicator on the noop backend (one rank, built beside hvd-micro), or exit with why not.
#ifndef HVD_BENCH_MICRO_NOOP_COMM_HPP
#define HVD_BENCH_MICRO_NOOP_COMM_HPP

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "hvd/hvd.hpp"

inline hvd::Comm open_noop_comm() {
  ::setenv("HVD_PLUGIN_PATH", HVD_MICRO_PLUGIN_DIR, 1);
  hvd::Result<hvd::Comm> made = hvd::Comm::init(hvd::Comm::Options{"noop", 0});
  if (!made.ok()) {
    std::fprintf(stderr, "hvd init on noop: %s\n", made.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(made).value();
}

#endif  // HVD_BENCH_MICRO_NOOP_COMM_HPP
