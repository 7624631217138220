#include "comm/agreement.hpp"

#include <gtest/gtest.h>

namespace hvd::core {
namespace {

TEST(BackendAgreement, SameChoiceEverywhereAgrees) {
  EXPECT_TRUE(check_backend_agreement({"ok\ngloo 1 (ABI 1.0)", "ok\ngloo 1 (ABI 1.0)"}).ok());
}

TEST(BackendAgreement, DifferentChoicesNameEveryGroup) {
  Status s = check_backend_agreement({"ok\ngloo 1 (ABI 1.0)", "ok\nkvs 1 (ABI 1.0)",
                                      "ok\ngloo 1 (ABI 1.0)", "ok\ngloo 2 (ABI 1.1)"});
  EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
  EXPECT_EQ(s.message(),
            "ranks chose different backends: ranks 0, 2 use gloo 1 (ABI 1.0); rank 1 uses kvs 1 "
            "(ABI 1.0); rank 3 uses gloo 2 (ABI 1.1). Every rank must load the same backend, "
            "plugin version and ABI version (set the same HVD_BACKEND and HVD_PLUGIN_PATH on "
            "every rank).");
}

TEST(BackendAgreement, ALoadFailureAnywhereFailsEveryRankWithItsMessage) {
  const std::string failed =
      describe_backend_choice(Status(HVD_ERR_NOT_FOUND, "unknown backend 'x'"));
  Status s = check_backend_agreement({"ok\ngloo 1 (ABI 1.0)", failed, failed});
  EXPECT_EQ(s.code(), HVD_ERR_NOT_FOUND);
  EXPECT_EQ(s.message(), "no backend on ranks 1, 2: unknown backend 'x'");
}

}  // namespace
}  // namespace hvd::core
