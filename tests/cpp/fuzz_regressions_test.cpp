// Inputs the fuzzers (tests/fuzz) found, kept as plain tests so that the
// fixes stay fixed without running a fuzzer.
#include <gtest/gtest.h>

#include <string>

#include "ir/error.h"
#include "ir/printer.h"
#include "jit/cache.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"
#include "runtime/sha256.h"
#include "tests/cpp/test_util.h"

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

// ir_parser (ASan): text ending inside a number (an attribute list cut
// short) read one byte past the end; digits past 64 bits wrapped silently.
TEST(FuzzRegressions, IrNumbersCutShortOrTooLongAreUserErrors) {
  const std::string head = "graph g {\n  %0 = variable() {dtype=f32, name=\"w\", shape=[4,";
  // (The fuzzer passes a string_view with nothing past its end; here the
  // message shows the end is now checked.)
  std::string msg = parse_error(head);
  EXPECT_NE(msg.find("expected a number, found the end of the text"), std::string::npos) << msg;
  msg = parse_error(head + "99999999999999999999]} : f32[4]\n  return %0\n}\n");
  EXPECT_NE(msg.find("integer 99999999999999999999 does not fit in 64 bits"), std::string::npos)
      << msg;
  msg = parse_error(head + "-]} : f32[4]\n  return %0\n}\n");
  EXPECT_NE(msg.find("expected a number"), std::string::npos) << msg;
}

// cache_entry (UBSan): hashing an empty file passed memcpy a null pointer
// (an empty vector's data()), which memcpy's contract forbids.
TEST(FuzzRegressions, HashingNothingIsDefined) {
  EXPECT_EQ(runtime::sha256_hex(std::string_view()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  std::vector<char> empty;
  runtime::Sha256 h;
  h.update(empty.data(), empty.size());
  EXPECT_EQ(h.hex_digest(), runtime::sha256_hex(""));
}

// cache_entry: store() published a plan that was not UTF-8, which lookup()
// then called damaged and removed: every run recompiled and rewrote it.
TEST(FuzzRegressions, TheCacheDoesNotStoreWhatItWouldCallDamaged) {
  flowjit::testing::TempDir dir;
  jit::DiskCache cache(dir.path + "/cache", 1 << 20);
  jit::CacheEntry e;
  e.key = std::string(64, 'b');
  e.plan = "flowjit-plan 2\njob \xff\xfe\n";
  std::string why;
  EXPECT_EQ(cache.store(e, why), jit::DiskCache::Stored::Failed);
  EXPECT_EQ(why, "plan.txt is not UTF-8 text; not stored");
  e.plan = "flowjit-plan 2\njob caf\xc3\xa9\n";  // UTF-8 is stored and found
  ASSERT_EQ(cache.store(e, why), jit::DiskCache::Stored::Published) << why;
  jit::CacheHit hit;
  EXPECT_EQ(cache.lookup(e.key, false, hit, why), jit::DiskCache::Found::Hit) << why;
  EXPECT_EQ(hit.plan, e.plan);
}

// programs: pad of an int64 tensor with a constant beyond 2^53 rounded it
// (the pad value was a double in the attribute, the view and the kernel).
TEST(FuzzRegressions, AnInt64PadValueIsExactThroughFusion) {
  auto pad_graph = [](const std::string& dtype, const std::string& value) {
    return "graph g {\n  %x = parameter() {dtype=" + dtype +
           ", index=0, name=\"x\", shape=[2]} : " + dtype +
           "[2]\n  %0 = pad(%x) {pads_hi=[1], pads_lo=[1], pad_value=" + value + "} : " + dtype +
           "[4]\n  return %0\n}\n";
  };
  ir::Graph g = ir::parse_graph(pad_graph("i64", "9223372036854775807"));
  EXPECT_NE(ir::print_graph(g).find("pad_value=9223372036854775807"), std::string::npos)
      << ir::print_graph(g);
  jit::PassLog log;
  jit::FusedProgram p = jit::fuse(jit::optimize(g, log), "g");
  bool found = false;
  for (const codegen::Kernel& k : p.kernels)
    for (const codegen::Access& a : k.loads)
      if (!a.coords.empty()) {
        EXPECT_EQ(a.ipad, INT64_MAX);
        found = true;
      }
  EXPECT_TRUE(found) << p.description;
  // A float pad value of an integer tensor becomes its int (toward zero);
  // one the dtype cannot hold is a user error.
  EXPECT_NE(ir::print_graph(ir::parse_graph(pad_graph("i32", "-2.5"))).find("pad_value=-2,"),
            std::string::npos);
  std::string msg = parse_error(pad_graph("i8", "300"));
  EXPECT_NE(msg.find("pad: pad_value 300 is out of range for int8 (-128..127)"), std::string::npos)
      << msg;
  msg = parse_error(pad_graph("i64", "1e30"));
  EXPECT_NE(msg.find("pad: pad_value 1e+30 is not a value of int64"), std::string::npos) << msg;
}
