// The disk cache: SHA-256 vectors, key stability, round trips, damage
// detection, concurrent writers, eviction, and compile_job's hit path.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "ir/printer.h"
#include "jit/cache.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"
#include "runtime/sha256.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::jit;
using namespace flowjit::runtime;
namespace fs = std::filesystem;

namespace {

using TempDir = flowjit::testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

CacheEntry sample_entry(const std::string& key, size_t object_bytes = 1000) {
  CacheEntry e;
  e.key = key;
  for (size_t i = 0; i < object_bytes; ++i) e.object.push_back(static_cast<char>(i * 7 + 3));
  e.plan = "flowjit-plan 2\njob t\narena 0\nend\n";
  e.ir_traced = "graph t {\n}\n";
  e.ir_optimized = "graph t {\n}\n";
  e.fusion_plan = "k0: -> out0\n";
  e.kernels = "kernel k0\n";
  e.llvm_ir = "; ModuleID = 't'\n";
  e.job_name = "t \"quoted\"\n\tjob";  // exercises JSON escaping
  e.signature = "Numpy:float32(4,)";
  e.source = "t.py:1";
  e.target = "x86_64;test;+avx";
  e.inputs = {"f32[4]"};
  e.outputs = {"f32[4]"};
  return e;
}

std::string key_of(const std::string& seed) { return sha256_hex(seed); }

size_t count_entries(const std::string& dir) {
  size_t n = 0;
  for (auto& top : fs::directory_iterator(dir)) {
    std::string name = top.path().filename().string();
    if (name.size() != 2 || !top.is_directory()) continue;
    for (auto& e : fs::directory_iterator(top.path())) n += e.is_directory() ? 1 : 0;
  }
  return n;
}

// Recomputes an edited entry's MAC with the cache's own key, as flowjit
// would have written it (for damage that must be caught by later checks).
void reseal(const std::string& cache_dir, const std::string& entry, const std::string& key) {
  std::string meta = slurp(entry + "/meta.json");
  std::string secret = slurp(cache_dir + "/hmac.key");
  std::string msg = "flowjit-cache-mac 1\n" + key + "\n";
  size_t pos = meta.find("\"files\": {");
  ASSERT_NE(pos, std::string::npos);
  while (true) {
    size_t name_at = meta.find("\"", meta.find('\n', pos) + 1);
    size_t brace = meta.find("\": {", name_at);
    if (name_at == std::string::npos || brace == std::string::npos) break;
    std::string name = meta.substr(name_at + 1, brace - name_at - 1);
    size_t b = meta.find("\"bytes\": ", brace) + 9;
    size_t h = meta.find("\"sha256\": \"", brace) + 11;
    msg += name + " " + meta.substr(b, meta.find(',', b) - b) + " " + meta.substr(h, 64) + "\n";
    pos = meta.find('}', h);
  }
  size_t mac = meta.find("\"mac\": \"") + 8;
  meta.replace(mac, 64, hmac_sha256_hex(secret, msg));
  spit(entry + "/meta.json", meta);
}

size_t count_files(const std::string& dir) {
  if (!fs::exists(dir)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace

// ---------------------------------------------------------------- SHA-256

TEST(Sha256, FipsVectors) {
  // FIPS 180-4 examples (NIST CSRC "SHA256.pdf") and the empty message.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // Lengths around the 55/56/64-byte padding edges, hashed whole and in
  // uneven pieces, must agree.
  for (size_t n : {55, 56, 57, 63, 64, 65, 119, 120, 128}) {
    std::string msg(n, 'x');
    for (size_t i = 0; i < n; ++i) msg[i] = static_cast<char>('a' + i % 26);
    Sha256 h;
    for (size_t i = 0; i < n; i += 7) h.update(msg.data() + i, std::min<size_t>(7, n - i));
    EXPECT_EQ(h.hex_digest(), sha256_hex(msg)) << n;
  }
  EXPECT_EQ(sha256_hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

// ---------------------------------------------------------------- keys

TEST(CacheKey, StableAndSensitiveToEveryPart) {
  CacheKeyParts p{"ir", "fusion", "kernels", "plan", "target", "19.1.7", "build", "0.1.0"};
  std::string k = cache_key(p);
  EXPECT_EQ(k.size(), 64u);
  EXPECT_EQ(k, cache_key(p));
  // A golden value (the same as Python's hashlib over the documented
  // construction): the key format must not drift silently, which would
  // orphan every user's cache; bump the "flowjit-cache-key" version instead.
  EXPECT_EQ(k, "d13b60ecd5018fac705f9951517049a9385e6db84368df6acf5fa6a2aa9ea149");
  std::string CacheKeyParts::* fields[] = {
      &CacheKeyParts::ir_optimized, &CacheKeyParts::fusion_plan, &CacheKeyParts::kernels,
      &CacheKeyParts::plan,         &CacheKeyParts::target,      &CacheKeyParts::llvm_version,
      &CacheKeyParts::build_id,     &CacheKeyParts::version};
  for (auto f : fields) {
    CacheKeyParts q = p;
    q.*f += "!";
    EXPECT_NE(cache_key(q), k);
  }
  // Length prefixes: moving text between parts changes the key.
  CacheKeyParts a = p, b = p;
  a.ir_optimized = "ab";
  a.fusion_plan = "c";
  b.ir_optimized = "a";
  b.fusion_plan = "bc";
  EXPECT_NE(cache_key(a), cache_key(b));
}

TEST(CacheKey, SameGraphTracedTwiceGivesSameKey) {
  const char* text =
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[8,5]} : f32[8,5]\n"
      "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[7,5]} : f32[7,5]\n"
      "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : f32[8,7]\n"
      "  %1 = relu(%0) : f32[8,7]\n"
      "  return %1\n"
      "}\n";
  auto key_for = [&](const std::string& src) {
    PassLog log;
    ir::Graph opt = optimize(ir::parse_graph(src), log);
    FusedProgram fp = fuse(opt, "t");
    std::string kernels;
    for (auto& k : fp.kernels) kernels += codegen::describe_kernel(k);
    return cache_key({ir::print_graph(opt), fp.description, kernels, fp.plan.serialize(), "target",
                      "llvm", "build", "v"});
  };
  std::string k1 = key_for(text);
  EXPECT_EQ(k1, key_for(text));
  std::string other = text;
  other.replace(other.find("relu"), 4, "sigmoid");
  EXPECT_NE(k1, key_for(other));
}

TEST(CacheKey, BinaryIdIsTheLinkersBuildId) {
  const std::string& id = loaded_binary_id();
  EXPECT_EQ(id.size(), 16u);
  EXPECT_NE(id, "unknown");
  EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(c); })) << id;
  EXPECT_EQ(&id, &loaded_binary_id());  // computed once
}

TEST(CacheSettings, ByteSizes) {
  EXPECT_EQ(parse_byte_size("1073741824"), 1073741824);
  EXPECT_EQ(parse_byte_size("512M"), 512 << 20);
  EXPECT_EQ(parse_byte_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("64 kb"), 64 << 10);
  EXPECT_EQ(parse_byte_size("1.5k"), 1536);
  EXPECT_EQ(parse_byte_size("lots"), -1);
  EXPECT_EQ(parse_byte_size("12 parsecs"), -1);
}

// ---------------------------------------------------------------- entries

TEST(DiskCache, RoundTripAndHits) {
  TempDir tmp;
  DiskCache cache(tmp.path, 0);
  std::string key = key_of("round trip");
  CacheHit hit;
  std::string why;
  EXPECT_EQ(cache.lookup(key, true, hit, why), DiskCache::Found::Miss);

  CacheEntry e = sample_entry(key);
  ASSERT_EQ(cache.store(e, why), DiskCache::Stored::Published) << why;
  EXPECT_TRUE(fs::is_directory(tmp.path + "/" + key.substr(0, 2) + "/" + key));
  EXPECT_EQ(cache.store(e, why), DiskCache::Stored::AlreadyPresent);

  ASSERT_EQ(cache.lookup(key, true, hit, why), DiskCache::Found::Hit) << why;
  EXPECT_EQ(hit.object, e.object);
  EXPECT_EQ(hit.plan, e.plan);
  EXPECT_EQ(hit.llvm_ir, e.llvm_ir);
  EXPECT_EQ(hit.hits, 0);
  cache.touch(key);
  cache.touch(key);
  CacheHit again;
  ASSERT_EQ(cache.lookup(key, false, again, why), DiskCache::Found::Hit);
  EXPECT_EQ(again.hits, 2);
  EXPECT_TRUE(again.llvm_ir.empty());

  std::string meta = slurp(cache.entry_dir(key) + "/meta.json");
  EXPECT_NE(meta.find("\"job\": \"t \\\"quoted\\\"\\n\\tjob\""), std::string::npos) << meta;
  EXPECT_NE(meta.find("\"hits\": 2"), std::string::npos) << meta;
  EXPECT_NE(meta.find("\"object.o\""), std::string::npos);
  EXPECT_NE(meta.find("\"sha256\": \"" + sha256_hex(e.plan) + "\""), std::string::npos);
  EXPECT_EQ(count_files(tmp.path + "/tmp"), 0u);  // no staging left behind
}

TEST(DiskCache, DamagedEntriesAreDetectedAndRemoved) {
  struct Damage {
    const char* what;
    std::function<void(const std::string& entry)> apply;
    const char* says;
  };
  std::vector<Damage> cases = {
      {"flipped object byte",
       [](const std::string& d) {
         std::string o = slurp(d + "/object.o");
         o[o.size() / 2] ^= 0x5a;
         spit(d + "/object.o", o);
       },
       "object.o fails its SHA-256 checksum"},
      {"truncated plan",
       [](const std::string& d) {
         std::string p = slurp(d + "/plan.txt");
         spit(d + "/plan.txt", p.substr(0, p.size() / 2));
       },
       "plan.txt has"},
      {"missing object", [](const std::string& d) { fs::remove(d + "/object.o"); },
       "object.o is missing"},
      {"garbage metadata", [](const std::string& d) { spit(d + "/meta.json", "{\"format\": 1, "); },
       "meta.json does not parse"},
      {"missing metadata", [](const std::string& d) { fs::remove(d + "/meta.json"); },
       "meta.json is missing"},
      // llvm::json's parser recurses per level: a deep file is damage, not a stack overflow
      {"deeply nested metadata",
       [](const std::string& d) {
         spit(d + "/meta.json", "{\"files\": " + std::string(200000, '[') + "}");
       },
       "meta.json does not parse"},
      {"metadata that is an array", [](const std::string& d) { spit(d + "/meta.json", "[1, 2]"); },
       "meta.json does not parse"},
      {"metadata with the files' sizes as text",
       [](const std::string& d) {
         std::string m = slurp(d + "/meta.json");
         size_t at = m.find("\"bytes\": ");
         ASSERT_NE(at, std::string::npos) << m;
         at += 9;
         size_t end = m.find_first_of(",\n}", at);
         spit(d + "/meta.json",
              m.substr(0, at) + "\"" + m.substr(at, end - at) + "\"" + m.substr(end));
       },
       "not authenticated"},
  };
  for (auto& c : cases) {
    TempDir tmp;
    DiskCache cache(tmp.path, 0);
    std::string key = key_of(c.what);
    std::string why;
    ASSERT_EQ(cache.store(sample_entry(key), why), DiskCache::Stored::Published);
    c.apply(cache.entry_dir(key));
    CacheHit hit;
    EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Damaged) << c.what;
    EXPECT_NE(why.find(c.says), std::string::npos) << c.what << ": " << why;
    EXPECT_FALSE(fs::exists(cache.entry_dir(key))) << c.what;
    EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Miss) << c.what;
  }
}

// The cache tool's view (DiskCache::inspect, read_listed): every problem of
// an entry, not only the first, and nothing removed, touched or made.
TEST(DiskCache, InspectReportsEveryProblemAndChangesNothing) {
  TempDir tmp;
  DiskCache cache(tmp.path, 0);
  const std::string key = key_of("inspect");
  std::string why;
  ASSERT_EQ(cache.store(sample_entry(key), why), DiskCache::Stored::Published);
  const std::string d = cache.entry_dir(key);
  EntryReport good = cache.inspect(key);
  EXPECT_TRUE(good.error.empty()) << good.error;
  EXPECT_TRUE(good.problems.empty()) << good.problems.front();
  EXPECT_TRUE(good.authenticated);
  EXPECT_EQ(good.target, "x86_64;test;+avx");
  EXPECT_NE(good.meta.find("\"files\""), std::string::npos);
  std::string plan;
  ASSERT_TRUE(cache.read_listed(key, "plan.txt", true, plan, why)) << why;
  EXPECT_EQ(plan, sample_entry(key).plan);
  EXPECT_FALSE(cache.read_listed(key, "../hmac.key", false, plan, why));  // never a path out

  const std::string meta_before = slurp(d + "/meta.json");
  std::string o = slurp(d + "/object.o");
  o[0] ^= 1;
  spit(d + "/object.o", o);
  fs::remove(d + "/kernels.txt");
  EntryReport bad = cache.inspect(key, [](const std::string& target) {
    EXPECT_EQ(target, "x86_64;test;+avx");
    return std::vector<std::string>{"kernels.ptx"};
  });
  std::string all;
  for (const std::string& p : bad.problems) all += p + "\n";
  EXPECT_NE(all.find("object.o fails its SHA-256 checksum"), std::string::npos) << all;
  EXPECT_NE(all.find("kernels.txt is missing"), std::string::npos) << all;
  EXPECT_NE(all.find("kernels.ptx is not listed"), std::string::npos) << all;
  EXPECT_FALSE(cache.read_listed(key, "object.o", true, o, why));
  EXPECT_NE(why.find("fails its SHA-256"), std::string::npos) << why;
  EXPECT_TRUE(cache.read_listed(key, "object.o", false, o, why)) << why;  // unchecked: as it is
  EXPECT_TRUE(fs::exists(d));                                             // not removed
  EXPECT_EQ(slurp(d + "/meta.json"), meta_before);                        // not touched

  // Without hmac.key: a problem, and no key is made (lookup() would make one).
  fs::remove(tmp.path + "/hmac.key");
  EntryReport keyless = cache.inspect(key);
  EXPECT_FALSE(keyless.authenticated);
  EXPECT_NE(keyless.problems.front().find("no usable key"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp.path + "/hmac.key"));

  // meta.json whose known field has another type cannot be shown.
  spit(d + "/meta.json", "{\"key\": \"" + key + "\", \"job\": [1], \"files\": {}}");
  EXPECT_EQ(cache.inspect(key).error, "meta.json field 'job' is a list, expected a string");
  EXPECT_EQ(cache.inspect(key_of("absent")).error, "the entry is missing");
  EXPECT_NE(cache.inspect("../" + key.substr(3)).error.find("is not a cache key"),
            std::string::npos);
}

TEST(DiskCache, ConcurrentWritersLeaveOneGoodEntry) {
  TempDir tmp;
  std::string key = key_of("concurrent");
  CacheEntry e = sample_entry(key, 200000);
  constexpr int kThreads = 8;
  std::atomic<int> published{0}, present{0}, failed{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      DiskCache cache(tmp.path, 0);  // one per "process"
      while (!go.load()) std::this_thread::yield();
      std::string why;
      switch (cache.store(e, why)) {
        case DiskCache::Stored::Published:
          ++published;
          break;
        case DiskCache::Stored::AlreadyPresent:
          ++present;
          break;
        case DiskCache::Stored::Failed:
          ++failed;
          break;
      }
      CacheHit hit;
      if (cache.lookup(key, false, hit, why) != DiskCache::Found::Hit || hit.object != e.object)
        ++failed;
      cache.touch(key);
    });
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(published.load(), 1);
  EXPECT_EQ(present.load(), kThreads - 1);
  EXPECT_EQ(count_entries(tmp.path), 1u);
  EXPECT_EQ(count_files(tmp.path + "/tmp"), 0u);
  DiskCache cache(tmp.path, 0);
  CacheHit hit;
  std::string why;
  ASSERT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Hit);
  EXPECT_EQ(hit.hits, kThreads);  // touch() under the entry lock loses no update
}

TEST(DiskCache, EvictsLeastRecentlyUsed) {
  TempDir tmp;
  std::string why;
  std::vector<std::string> keys;
  int64_t one = 0;
  {
    DiskCache unbounded(tmp.path, 0);
    for (int i = 0; i < 4; ++i) {
      keys.push_back(key_of("evict " + std::to_string(i)));
      ASSERT_EQ(unbounded.store(sample_entry(keys.back(), 50000), why),
                DiskCache::Stored::Published);
      usleep(2000);  // distinct last_used times
      if (i == 0) one = unbounded.total_bytes();
    }
    unbounded.touch(keys[0]);  // now the most recently used
    EXPECT_EQ(unbounded.evict(), 0);
  }
  DiskCache bounded(tmp.path, one * 2 + one / 2);  // room for two
  EXPECT_EQ(bounded.evict(keys[1]), 2);
  CacheHit hit;
  EXPECT_EQ(bounded.lookup(keys[0], false, hit, why), DiskCache::Found::Hit);  // touched
  EXPECT_EQ(bounded.lookup(keys[1], false, hit, why), DiskCache::Found::Hit);  // kept
  EXPECT_EQ(bounded.lookup(keys[2], false, hit, why), DiskCache::Found::Miss);
  EXPECT_EQ(bounded.lookup(keys[3], false, hit, why), DiskCache::Found::Miss);
  EXPECT_LE(bounded.total_bytes(), bounded.max_bytes());
}

TEST(DiskCache, UnwritableDirectoryFailsCleanly) {
  TempDir tmp;
  spit(tmp.path + "/file", "not a directory");
  DiskCache cache(tmp.path + "/file/cache", 0);
  std::string why;
  EXPECT_EQ(cache.store(sample_entry(key_of("unwritable")), why), DiskCache::Stored::Failed);
  EXPECT_NE(why.find("cannot create"), std::string::npos) << why;
  CacheHit hit;
  EXPECT_EQ(cache.lookup(key_of("unwritable"), false, hit, why), DiskCache::Found::Miss);
  EXPECT_EQ(cache.evict(), 0);
}

// ---------------------------------------------------------------- compile_job

namespace {

ir::NodeRef param(const std::string& name, int64_t index, ir::Shape s) {
  return ir::make_node(
      ir::OpKind::Parameter, {},
      ir::Attrs{{"name", name}, {"index", index}, {"shape", s}, {"dtype", ir::DType::Float32}});
}

JobDescription small_job() {
  JobDescription job;
  job.name = "cached";
  auto x = param("x", 0, {16});
  auto y = param("y", 1, {16});
  job.graph.params = {x, y};
  job.graph.outputs = {
      ir::make_node(ir::OpKind::Mul, {ir::make_node(ir::OpKind::Add, {x, y}, {}), y}, {})};
  job.signature = "Numpy:float32(16,);Numpy:float32(16,)";
  job.source = "cache_test.cpp:1";
  return job;
}

std::vector<float> run(CompiledJob& cj) {
  std::vector<float> x(16), y(16), out(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i), y[i] = 0.5f * static_cast<float>(i);
  const void* ins[] = {x.data(), y.data()};
  void* outs[] = {out.data()};
  cj.program->run(ins, outs);
  return out;
}

}  // namespace

TEST(CompileJobCache, MissThenHitThenDamagedRecompiles) {
  TempDir tmp;
  CompileSettings s;
  s.cache_dir = tmp.path;
  runtime::VariableStore store;
  CompiledJob cold = compile_job(small_job(), s, store);
  EXPECT_FALSE(cold.from_disk_cache);
  ASSERT_EQ(cold.cache_key.size(), 64u);
  EXPECT_TRUE(cold.warnings.empty());
  EXPECT_TRUE(
      fs::exists(tmp.path + "/" + cold.cache_key.substr(0, 2) + "/" + cold.cache_key + "/llvm.ll"));

  CompiledJob warm = compile_job(small_job(), s, store);
  EXPECT_TRUE(warm.from_disk_cache);
  EXPECT_EQ(warm.cache_key, cold.cache_key);
  EXPECT_EQ(run(warm), run(cold));
  EXPECT_EQ(run(warm)[3], (3.0f + 1.5f) * 1.5f);

  std::string obj = DiskCache(tmp.path, 0).entry_dir(cold.cache_key) + "/object.o";
  std::string bytes = slurp(obj);
  bytes[100] ^= 1;
  spit(obj, bytes);
  CompiledJob again = compile_job(small_job(), s, store);
  EXPECT_FALSE(again.from_disk_cache);
  ASSERT_EQ(again.warnings.size(), 1u);
  EXPECT_NE(again.warnings[0].find("was damaged (object.o fails its SHA-256 checksum)"),
            std::string::npos)
      << again.warnings[0];
  EXPECT_EQ(run(again), run(cold));
  EXPECT_TRUE(compile_job(small_job(), s, store).from_disk_cache);  // stored anew

  CompileSettings off;  // cache_dir "": no key, no files
  CompiledJob nocache = compile_job(small_job(), off, store);
  EXPECT_TRUE(nocache.cache_key.empty());
  EXPECT_FALSE(nocache.from_disk_cache);
}

TEST(CompileJobCache, ObjectThatFailsToLoadIsDamaged) {
  // A consistent checksum over a broken object (not just flipped bits) that
  // passes the backend's check (its ELF magic): the loader refuses it, and
  // that is a damaged entry too.
  TempDir tmp;
  CompileSettings s;
  s.cache_dir = tmp.path;
  runtime::VariableStore store;
  CompiledJob cold = compile_job(small_job(), s, store);
  DiskCache cache(tmp.path, 0);
  std::string dir = cache.entry_dir(cold.cache_key);
  std::string meta = slurp(dir + "/meta.json");
  std::string obj = slurp(dir + "/object.o");
  std::string junk(obj.size(), '\0');
  junk.replace(0, 4,
               "\x7f"
               "ELF");
  spit(dir + "/object.o", junk);
  auto pos = meta.find(sha256_hex(obj));
  ASSERT_NE(pos, std::string::npos);
  meta.replace(pos, 64, sha256_hex(junk));
  spit(dir + "/meta.json", meta);
  reseal(tmp.path, dir, cold.cache_key);
  CompiledJob again = compile_job(small_job(), s, store);
  EXPECT_FALSE(again.from_disk_cache);
  ASSERT_EQ(again.warnings.size(), 1u);
  EXPECT_NE(again.warnings[0].find("cannot load compiled kernels"), std::string::npos)
      << again.warnings[0];
  EXPECT_EQ(run(again), run(cold));
}

// ---------------------------------------------------------------- trust

TEST(Sha256, HmacRfc4231Vectors) {
  // RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
  EXPECT_EQ(hmac_sha256_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac_sha256_hex(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "ab"));
}

TEST(DiskCacheTrust, PrivateModesWhateverTheUmask) {
  TempDir tmp;
  mode_t old = ::umask(0);
  std::string root = tmp.path + "/a/b/cache";
  DiskCache cache(root, 0);
  std::string key = key_of("modes"), why;
  ASSERT_EQ(cache.store(sample_entry(key), why), DiskCache::Stored::Published) << why;
  ::umask(old);
  auto mode = [](const std::string& p) {
    struct stat st;
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 0777;
  };
  for (std::string d :
       {tmp.path + "/a", root, root + "/tmp", root + "/" + key.substr(0, 2), cache.entry_dir(key)})
    EXPECT_EQ(mode(d), 0700u) << d;
  for (const char* f : {"meta.json", "object.o", "plan.txt", "llvm.ll"})
    EXPECT_EQ(mode(cache.entry_dir(key) + "/" + f), 0600u) << f;
  EXPECT_EQ(mode(root + "/hmac.key"), 0600u);
  EXPECT_EQ(slurp(root + "/hmac.key").size(), 64u);
}

TEST(DiskCacheTrust, CopiedOrPlantedEntriesAreRecompiledNotLoaded) {
  TempDir a, b;
  DiskCache mine(a.path, 0), theirs(b.path, 0);
  std::string key = key_of("copied"), why;
  ASSERT_EQ(theirs.store(sample_entry(key), why), DiskCache::Stored::Published) << why;
  CacheHit hit;
  ASSERT_EQ(mine.lookup(key, false, hit, why), DiskCache::Found::Miss);
  // A whole valid entry of another cache (another user's key), copied in.
  std::string why2;
  ASSERT_EQ(mine.store(sample_entry(key_of("other")), why2), DiskCache::Stored::Published);
  fs::create_directories(a.path + "/" + key.substr(0, 2));
  fs::copy(theirs.entry_dir(key), mine.entry_dir(key), fs::copy_options::recursive);
  EXPECT_EQ(mine.lookup(key, false, hit, why), DiskCache::Found::Damaged);
  EXPECT_NE(why.find("not authenticated"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(mine.entry_dir(key)));
  // A planted entry: right checksums, no MAC (as an attacker who knows the
  // key's recipe would write it).
  fs::copy(theirs.entry_dir(key), mine.entry_dir(key), fs::copy_options::recursive);
  std::string meta = slurp(mine.entry_dir(key) + "/meta.json");
  size_t at = meta.find("  \"mac\"");
  ASSERT_NE(at, std::string::npos);
  meta.erase(at, meta.find('\n', at) + 1 - at);
  spit(mine.entry_dir(key) + "/meta.json", meta);
  EXPECT_EQ(mine.lookup(key, false, hit, why), DiskCache::Found::Damaged);
  // Our own entries still load.
  EXPECT_EQ(mine.lookup(key_of("other"), false, hit, why), DiskCache::Found::Hit) << why;
}

TEST(DiskCacheTrust, ForeignOrWritableRootsEntriesAndFilesAreRefused) {
  TempDir tmp;
  DiskCache cache(tmp.path, 0);
  std::string key = key_of("foreign"), why;
  ASSERT_EQ(cache.store(sample_entry(key), why), DiskCache::Stored::Published) << why;
  std::string entry = cache.entry_dir(key);
  CacheHit hit;
  EXPECT_EQ(cache.untrusted_root(), "");
  // Group- or world-writable: the root, the entry, a file.
  ::chmod(tmp.path.c_str(), 0777);
  EXPECT_NE(cache.untrusted_root().find("writable by others"), std::string::npos);
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);
  EXPECT_EQ(cache.store(sample_entry(key_of("x")), why), DiskCache::Stored::Failed);
  ::chmod(tmp.path.c_str(), 0700);
  ::chmod(entry.c_str(), 0770);
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);
  EXPECT_NE(why.find("writable by its group"), std::string::npos) << why;
  ::chmod(entry.c_str(), 0700);
  ::chmod((entry + "/plan.txt").c_str(), 0666);
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);
  EXPECT_NE(why.find("plan.txt"), std::string::npos) << why;
  ::chmod((entry + "/plan.txt").c_str(), 0600);
  ASSERT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Hit) << why;
  // Owned by someone else (needs root to arrange).
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((entry + "/object.o").c_str(), 12345, 12345), 0);
    EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);
    EXPECT_NE(why.find("owned by uid 12345"), std::string::npos) << why;
    EXPECT_TRUE(fs::exists(entry));  // never removed: it is not ours
    ASSERT_EQ(::chown(tmp.path.c_str(), 12345, 12345), 0);
    EXPECT_NE(cache.untrusted_root().find("owned by uid 12345"), std::string::npos);
    ASSERT_EQ(::chown(tmp.path.c_str(), 0, 0), 0);
  }
}

TEST(DiskCacheTrust, LinksFifosAndDevicesAreRefusedWithoutBlocking) {
  TempDir tmp;
  DiskCache cache(tmp.path, 0);
  std::string key = key_of("fifo"), why;
  ASSERT_EQ(cache.store(sample_entry(key), why), DiskCache::Stored::Published) << why;
  std::string entry = cache.entry_dir(key);
  CacheHit hit;
  fs::remove(entry + "/object.o");
  ASSERT_EQ(::mkfifo((entry + "/object.o").c_str(), 0600), 0);
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);  // returns: no hang
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  fs::remove(entry + "/object.o");
  fs::create_symlink("/dev/zero", entry + "/object.o");
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
  fs::remove(entry + "/meta.json");
  ASSERT_EQ(::mkfifo((entry + "/meta.json").c_str(), 0600), 0);
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Untrusted);
  cache.touch(key);  // no hang either
  EXPECT_GE(cache.total_bytes(), 0);
}

TEST(DiskCacheTrust, TextThatIsNotUtf8IsDamage) {
  TempDir tmp;
  DiskCache cache(tmp.path, 0);
  std::string key = key_of("utf8"), why;
  CacheEntry e = sample_entry(key);
  e.plan = "flowjit-plan 1\njob \xff\xfe\nend\n";
  // lookup() would call such an entry damaged, so store() does not write it
  // (it used to, and every run then recompiled and rewrote it).
  EXPECT_EQ(cache.store(e, why), DiskCache::Stored::Failed);
  EXPECT_NE(why.find("plan.txt is not UTF-8"), std::string::npos) << why;
  CacheHit hit;
  EXPECT_EQ(cache.lookup(key, false, hit, why), DiskCache::Found::Miss);
  EXPECT_TRUE(valid_utf8("plain \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));      // overlong
  EXPECT_FALSE(valid_utf8("\xe2\x82"));      // cut short
  EXPECT_EQ(printable_text("a\xff/b\xc3\xa9"), "a\\xff/b\xc3\xa9");
}
