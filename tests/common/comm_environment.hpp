// The job's communicator for a GoogleTest program that every rank runs (under hvdrun or
// mpirun): made before the first test, finalized, and checked, after the last.
#ifndef HVD_TESTS_COMM_ENVIRONMENT_HPP
#define HVD_TESTS_COMM_ENVIRONMENT_HPP

#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "hvd/hvd.hpp"

namespace hvd_test {

inline hvd::Comm* g_comm = nullptr;

class CommEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto comm = hvd::Comm::init();
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    comm_ = std::make_unique<hvd::Comm>(std::move(comm).value());
    g_comm = comm_.get();
  }
  void TearDown() override {
    if (comm_) {
      EXPECT_TRUE(comm_->finalize().ok());
    }
    g_comm = nullptr;
  }

 private:
  std::unique_ptr<hvd::Comm> comm_;
};

}  // namespace hvd_test

#endif  // HVD_TESTS_COMM_ENVIRONMENT_HPP
