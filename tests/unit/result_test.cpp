// hvd::Status and hvd::Result (hvd/sdk/result.hpp): copies own their messages, a moved-from
// Status keeps its code, a success carries no message unless given one, and a Result holds
// either its value or an error.
#include "hvd/sdk/result.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace {

using hvd::Result;
using hvd::Status;

TEST(Status, ASuccessHasNoMessageAndAnErrorKeepsItsOwn) {
  const Status ok = Status::success();
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
  EXPECT_EQ(ok.to_string(), "success");
  const Status failed(HVD_ERR_TIMEOUT, "rank 2 did not answer");
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(failed.message(), "rank 2 did not answer");
  EXPECT_EQ(failed.with_context("allreduce").message(), "allreduce: rank 2 did not answer");
  EXPECT_EQ(Status(HVD_SUCCESS, "noted").message(), "noted");
}

TEST(Status, ACopyOwnsItsMessage) {
  Status original(HVD_ERR_REMOTE, "peer gone");
  const Status copy = original;
  original = Status(HVD_ERR_STATE, "replaced");
  EXPECT_EQ(copy.code(), HVD_ERR_REMOTE);
  EXPECT_EQ(copy.message(), "peer gone");
  EXPECT_EQ(original.message(), "replaced");
  Status assigned;
  assigned = copy;
  EXPECT_EQ(assigned.message(), "peer gone");
  EXPECT_EQ(copy.message(), "peer gone");
}

TEST(Status, SelfAssignmentKeepsTheMessage) {
  Status s(HVD_ERR_MISMATCH, "counts differ");
  Status& same = s;
  s = same;
  EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
  EXPECT_EQ(s.message(), "counts differ");
}

TEST(Status, AMoveTakesTheMessageAndLeavesAnEmptyOne) {
  Status from(HVD_ERR_SYSTEM, "no memory");
  const Status to = std::move(from);
  EXPECT_EQ(to.code(), HVD_ERR_SYSTEM);
  EXPECT_EQ(to.message(), "no memory");
  EXPECT_EQ(from.message(), "");  // NOLINT(bugprone-use-after-move): valid, unspecified content
}

TEST(Result, HoldsAValueOrAnError) {
  Result<std::unique_ptr<int>> value = std::make_unique<int>(7);
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(**value, 7);
  EXPECT_TRUE(value.status().ok());
  const std::unique_ptr<int> taken = std::move(value).value();
  EXPECT_EQ(*taken, 7);

  const Result<int> error = Status(HVD_ERR_INVALID_ARGUMENT, "bad count");
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.status().code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(error.status().message(), "bad count");
  EXPECT_THROW((void)error.value(), std::bad_variant_access);
}

Result<int> half(int x) {
  if (x % 2 != 0) return Status(HVD_ERR_INVALID_ARGUMENT, std::to_string(x) + " is odd");
  return x / 2;
}

Status quarter(int x, int* out) {
  HVD_ASSIGN_OR_RETURN(const int h, half(x));
  HVD_ASSIGN_OR_RETURN(*out, half(h));
  return Status::success();
}

TEST(Result, TheMacrosPassTheFirstErrorOn) {
  int out = 0;
  EXPECT_TRUE(quarter(12, &out).ok());
  EXPECT_EQ(out, 3);
  const Status odd = quarter(6, &out);
  EXPECT_EQ(odd.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(odd.message(), "3 is odd");
}

}  // namespace
