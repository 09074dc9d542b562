// The diagnostics sink (ir/diag.h): the default writes "[flowjit] ..." lines
// to stderr; an installed sink gets each message and its level instead.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "ir/diag.h"

namespace flowjit::ir {
namespace {

std::vector<std::pair<int, std::string>> g_said;
void keep(int level, std::string_view msg) { g_said.emplace_back(level, std::string(msg)); }

TEST(Diag, DefaultSinkWritesPrefixedLinesToStderr) {
  testing::internal::CaptureStderr();
  diag(1, "job: pass simplify  0.010 ms\n");
  diag(0, "two\nlines");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "[flowjit] job: pass simplify  0.010 ms\n[flowjit] two\nlines\n");
}

TEST(Diag, AnInstalledSinkGetsLevelAndMessageUntilReset) {
  g_said.clear();
  DiagSink before = set_diag_sink(&keep);
  EXPECT_EQ(before, &diag_to_stderr);
  testing::internal::CaptureStderr();
  diag(2, "fusion plan:\nk0\n\n");
  diag(1, "");
  EXPECT_EQ(set_diag_sink(nullptr), &keep);  // nullptr: back to stderr
  diag(1, "after");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "[flowjit] after\n");
  ASSERT_EQ(g_said.size(), 2u);
  EXPECT_EQ(g_said[0], std::make_pair(2, std::string("fusion plan:\nk0")));
  EXPECT_EQ(g_said[1], std::make_pair(1, std::string()));
}

}  // namespace
}  // namespace flowjit::ir
