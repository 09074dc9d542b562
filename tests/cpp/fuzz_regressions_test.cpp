// Inputs the fuzzers (tests/fuzz) found, kept as plain tests so that the
// fixes stay fixed without running a fuzzer.
#include <gtest/gtest.h>

#include <string>

#include "ir/error.h"
#include "ir/printer.h"

using namespace flowjit;

namespace {

std::string parse_error(const std::string& text) {
  try {
    ir::parse_graph(text);
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UserError: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "parsed";
  return "";
}

}  // namespace

// ir_parser: an assign whose first operand is not a variable reached the
// factory's internal invariant check (InternalError: "a bug in flowjit").
TEST(FuzzRegressions, IrTextBreakingAFactoryInvariantIsAUserError) {
  std::string msg = parse_error(
      "graph g {\n"
      "  %0 = fill() {dtype=f32, shape=[], value=0.0} : f32[]\n"
      "  %1 = assign(%0, %0) : f32[]\n"
      "  return %1\n"
      "}\n");
  EXPECT_NE(msg.find("invalid node: assign: first operand must be a variable"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("internal error"), std::string::npos) << msg;
}
