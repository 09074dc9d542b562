// The Gloo communicator (runtime/gloo_communicator) and its rendezvous stores
// (runtime/tcp_store): in-process checks, and jobs of several processes.
//
// A multi-process test re-executes this binary once per process with
// --gtest_filter=GlooChild.Run and FLOWJIT_GLOO_TEST_* variables saying what
// to do; a child's exit status is its verdict (gtest's: 0 when every check
// passed), and its output is shown when it failed. Messages of the errors the
// children expect are echoed as "[caught] ..." lines.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "ir/error.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/tcp_store.h"
#include "tests/cpp/test_util.h"

extern char** environ;

using namespace flowjit;
using namespace flowjit::runtime;
using ir::DType;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

const DType kDTypes[] = {DType::Bool,  DType::Int8,    DType::UInt8,  DType::Int32,
                         DType::Int64, DType::Float32, DType::Float64};
const int64_t kSizes[] = {0, 1, 7, 1000};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

using TempDir = flowjit::testing::TempDir;

// The job token of the stores these tests make (and of their children).
const std::string kToken = "gloo-test-token-0123456789abcdef";

// A port nobody listens on right now (the kernel's pick for port 0).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank `rank`'s input: values of mixed magnitudes, so that float sums depend
// on the order of addition; integers small enough never to overflow a sum.
std::vector<char> make_input(DType dt, int rank, int64_t n, int salt) {
  size_t es = static_cast<size_t>(ir::dtype_bytes(dt));
  std::vector<char> v(static_cast<size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = mix((uint64_t(salt) << 48) ^ (uint64_t(rank) << 32) ^ uint64_t(i));
    double f = (double(h >> 11) * 0x1p-53 - 0.5) * std::ldexp(1.0, int(h % 24) - 8);
    char* p = v.data() + i * es;
    switch (dt) {
      case DType::Bool:
        *p = (h % 3 == 0) ? 1 : 0;
        break;
      case DType::Int8:
        *p = static_cast<char>(h);
        break;
      case DType::UInt8:
        *p = static_cast<char>(h >> 8);
        break;
      case DType::Int32: {
        int32_t x = static_cast<int32_t>(h % 2000001) - 1000000;
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::Int64: {
        int64_t x = static_cast<int64_t>(h % 2000000000000001ull) - 1000000000000000ll;
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::Float32: {
        float x = static_cast<float>(f);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::Float64:
        std::memcpy(p, &f, 8);
        break;
    }
  }
  return v;
}

::testing::AssertionResult same_bytes(const std::vector<char>& got, const std::vector<char>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure()
             << "first difference at byte " << i << " of " << got.size();
  return ::testing::AssertionSuccess();
}

// Every collective, for every dtype and size, as global rank `rank` of `comm`,
// against results computed here in rank order from every rank's input.
void run_collectives(Communicator& comm, int rank) {
  const int R = comm.size();
  for (DType dt : kDTypes) {
    const size_t es = static_cast<size_t>(ir::dtype_bytes(dt));
    for (int64_t n : kSizes) {
      SCOPED_TRACE(::testing::Message() << ir::dtype_name(dt) << " n=" << n << " rank=" << rank);
      // all_reduce, out of place and in place.
      std::vector<char> want = make_input(dt, 0, n, 1);
      for (int q = 1; q < R; ++q) accumulate(want.data(), make_input(dt, q, n, 1).data(), n, dt);
      std::vector<char> in = make_input(dt, rank, n, 1), out(in.size(), 0x5a);
      comm.all_reduce(rank, in.data(), out.data(), n, dt);
      EXPECT_TRUE(same_bytes(out, want)) << "all_reduce";
      comm.all_reduce(rank, in.data(), in.data(), n, dt);
      EXPECT_TRUE(same_bytes(in, want)) << "in-place all_reduce";

      for (int64_t outer : {int64_t{1}, int64_t{3}}) {
        // all_gather: out[o][q] = in_q[o].
        const size_t row = static_cast<size_t>(n) * es;
        std::vector<char> gwant(static_cast<size_t>(outer) * R * row);
        for (int q = 0; q < R; ++q) {
          std::vector<char> x = make_input(dt, q, outer * n, 2);
          for (int64_t o = 0; o < outer && row > 0; ++o)  // (empty vectors' data() is null)
            std::memcpy(gwant.data() + (o * R + q) * row, x.data() + o * row, row);
        }
        std::vector<char> gin = make_input(dt, rank, outer * n, 2), gout(gwant.size(), 0x5a);
        comm.all_gather(rank, gin.data(), gout.data(), outer, static_cast<int64_t>(row));
        EXPECT_TRUE(same_bytes(gout, gwant)) << "all_gather outer=" << outer;

        // reduce_scatter: out[o] = sum over q of in_q[o][rank].
        std::vector<char> rwant(static_cast<size_t>(outer) * row);
        for (int q = 0; q < R; ++q) {
          std::vector<char> x = make_input(dt, q, outer * R * n, 3);
          for (int64_t o = 0; o < outer && row > 0; ++o) {
            char* dst = rwant.data() + o * row;
            const char* src = x.data() + (o * R + rank) * row;
            if (q == 0)
              std::memcpy(dst, src, row);
            else
              accumulate(dst, src, n, dt);
          }
        }
        std::vector<char> rin = make_input(dt, rank, outer * R * n, 3), rout(rwant.size(), 0x5a);
        comm.reduce_scatter(rank, rin.data(), rout.data(), outer, n, dt);
        EXPECT_TRUE(same_bytes(rout, rwant)) << "reduce_scatter outer=" << outer;
      }
    }
  }
  comm.barrier(rank);
}

// run_collectives on every local device of this process, one thread each.
void run_collectives_on_all_devices(Communicator& comm, int process_rank, int local_devices) {
  std::vector<std::thread> threads;
  for (int l = 0; l < local_devices; ++l)
    threads.emplace_back([&, l] {
      try {
        run_collectives(comm, process_rank * local_devices + l);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "device " << l << " threw: " << e.what();
      }
    });
  for (auto& t : threads) t.join();
}

// ---------------------------------------------------------------------------
// Spawning a job of child processes

struct ChildResult {
  int status = -1;  // waitpid's; -1: killed for running past the limit
  std::string log;
};

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "/proc/self/exe";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `n` children, child i with the variables env_for(i) ("NAME=value"),
// and waits for all of them, killing any still running after limit_s.
std::vector<ChildResult> run_job(int n, const std::function<std::vector<std::string>(int)>& env_for,
                                 double limit_s) {
  TempDir logs;
  const std::string exe = self_exe();
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  std::vector<ChildResult> results(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    // The parent's gtest settings (filters, sharding, output files) must not
    // reach the children.
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "GTEST_", 6) != 0 && std::strncmp(*e, "FLOWJIT_GLOO_TEST_", 18) != 0)
        env.push_back(*e);
    for (auto& kv : env_for(i)) env.push_back(kv);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=GlooChild.Run";
    std::vector<char*> argv{const_cast<char*>(exe.c_str()), filter.data(), nullptr};
    std::string log = logs.path + "/child" + std::to_string(i) + ".log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rv = posix_spawn(&pids[static_cast<size_t>(i)], exe.c_str(), &fa, nullptr, argv.data(),
                         envp.data());
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rv, 0) << "posix_spawn: " << std::strerror(rv);
  }
  auto t0 = Clock::now();
  int left = n;
  for (int i = 0; i < n; ++i)
    if (pids[static_cast<size_t>(i)] < 0) --left;
  while (left > 0) {
    for (int i = 0; i < n; ++i) {
      pid_t& pid = pids[static_cast<size_t>(i)];
      if (pid < 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        results[static_cast<size_t>(i)].status = status;
        pid = -1;
        --left;
      }
    }
    if (left > 0 && seconds_since(t0) > limit_s) {
      for (int i = 0; i < n; ++i) {
        pid_t& pid = pids[static_cast<size_t>(i)];
        if (pid < 0) continue;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        results[static_cast<size_t>(i)].status = -1;
        pid = -1;
      }
      left = 0;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  for (int i = 0; i < n; ++i)
    results[static_cast<size_t>(i)].log =
        read_file(logs.path + "/child" + std::to_string(i) + ".log");
  return results;
}

std::string status_text(int status) {
  if (status == -1) return "killed after running past its time limit";
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Expects every child to have passed; shows the output of those that did not
// and the [caught] lines of all.
void expect_all_passed(const std::vector<ChildResult>& results) {
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    bool ok = r.status != -1 && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
    EXPECT_TRUE(ok) << "process " << i << " " << status_text(r.status) << "; its output:\n"
                    << r.log;
    std::istringstream lines(r.log);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("[caught]", 0) == 0) std::cout << "  process " << i << " " << line << "\n";
  }
}

std::vector<std::string> child_env(const std::string& scenario, int rank, int nproc, int local,
                                   int port, const std::string& dir, double timeout_s) {
  std::ostringstream t;
  t << timeout_s;
  return {"FLOWJIT_GLOO_TEST_SCENARIO=" + scenario,
          "FLOWJIT_GLOO_TEST_RANK=" + std::to_string(rank),
          "FLOWJIT_GLOO_TEST_NPROC=" + std::to_string(nproc),
          "FLOWJIT_GLOO_TEST_LOCAL=" + std::to_string(local),
          "FLOWJIT_GLOO_TEST_PORT=" + std::to_string(port),
          "FLOWJIT_GLOO_TEST_DIR=" + dir,
          "FLOWJIT_GLOO_TEST_TIMEOUT=" + t.str(),
          std::string(kStoreTokenEnv) + "=" + kToken};
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// ---------------------------------------------------------------------------
// What the children do

GlooOptions options_from_env() {
  GlooOptions o;
  o.process_rank = std::stoi(env_or("FLOWJIT_GLOO_TEST_RANK", "0"));
  o.num_processes = std::stoi(env_or("FLOWJIT_GLOO_TEST_NPROC", "1"));
  o.local_devices = std::stoi(env_or("FLOWJIT_GLOO_TEST_LOCAL", "1"));
  o.port = std::stoi(env_or("FLOWJIT_GLOO_TEST_PORT", "0"));
  o.timeout_seconds = std::stod(env_or("FLOWJIT_GLOO_TEST_TIMEOUT", "20"));
  // With a port the rendezvous is over TCP; the directory then only holds
  // the stall test's flag file.
  if (o.port == 0) o.file_store_dir = env_or("FLOWJIT_GLOO_TEST_DIR", "");
  return o;
}

void child_collectives(const GlooOptions& o) {
  auto comm = make_gloo_communicator(o);
  EXPECT_EQ(comm->size(), o.num_processes * o.local_devices);
  std::string want = "gloo: " + std::to_string(o.num_processes) +
                     (o.num_processes == 1 ? " process" : " processes") + " x " +
                     std::to_string(o.local_devices) +
                     (o.local_devices == 1 ? " device" : " devices");
  EXPECT_EQ(comm->describe(), want);
  run_collectives_on_all_devices(*comm, o.process_rank, o.local_devices);
  comm.reset();
  // A second communicator on the same store and tag, made right after the
  // first: it must not see the first one's keys.
  auto again = make_gloo_communicator(o);
  std::vector<std::thread> threads;
  for (int l = 0; l < o.local_devices; ++l)
    threads.emplace_back([&, l] {
      int rank = o.process_rank * o.local_devices + l;
      int64_t x = rank + 1, sum = 0;
      again->all_reduce(rank, &x, &sum, 1, DType::Int64);
      int64_t r = again->size();
      EXPECT_EQ(sum, r * (r + 1) / 2);
    });
  for (auto& t : threads) t.join();
}

// The last process leaves right after the rendezvous; the others' next
// collective must fail, promptly, and so must everything after it.
void child_peer_exit(const GlooOptions& o) {
  auto comm = make_gloo_communicator(o);
  if (o.process_rank == o.num_processes - 1) {
    std::fflush(nullptr);
    ::_exit(0);  // no goodbye: the kernel closes the sockets
  }
  std::vector<float> x(100, 1.0f), y(100);
  auto t0 = Clock::now();
  try {
    comm->all_reduce(o.process_rank, x.data(), y.data(), 100, DType::Float32);
    ADD_FAILURE() << "all_reduce succeeded without the last process";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(contains(e.what(), "gloo: ")) << e.what();
    std::cout << "[caught] " << e.what() << " (after " << seconds_since(t0) << " s)" << std::endl;
  }
  EXPECT_LT(seconds_since(t0), o.timeout_seconds);
  auto t1 = Clock::now();
  try {
    comm->barrier(o.process_rank);
    ADD_FAILURE() << "barrier succeeded on an aborted communicator";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "aborted")) << e.what();
  }
  EXPECT_LT(seconds_since(t1), 0.5);
}

// The last process dies in the middle of a large all_reduce (while the
// others are writing to it: the SIGPIPE path); the others' collectives fail
// within the timeout rather than hang, and the process survives.
void child_peer_dies(const GlooOptions& o) {
  auto comm = make_gloo_communicator(o);
  const int64_t n = int64_t{1} << 22;
  std::vector<float> x(static_cast<size_t>(n), 1.0f);
  if (o.process_rank == o.num_processes - 1) {
    std::thread([&] {
      try {
        comm->all_reduce(o.process_rank, x.data(), x.data(), n, DType::Float32);
      } catch (const std::exception&) {
      }
    }).detach();
    std::this_thread::sleep_for(milliseconds(3));
    std::fflush(nullptr);
    ::_exit(0);
  }
  auto t0 = Clock::now();
  bool failed = false;
  // The dying process may finish one all_reduce first; it never finishes two.
  for (int i = 0; i < 2 && !failed; ++i) {
    try {
      comm->all_reduce(o.process_rank, x.data(), x.data(), n, DType::Float32);
    } catch (const UserError& e) {
      failed = true;
      EXPECT_EQ(e.kind(), ErrorKind::Runtime);
      std::cout << "[caught] " << e.what() << " (after " << seconds_since(t0) << " s)" << std::endl;
    }
  }
  EXPECT_TRUE(failed) << "two all_reduces succeeded although a process died";
  EXPECT_LT(seconds_since(t0), 2 * o.timeout_seconds);
}

// Process 1 is alive but never calls: process 0's collective times out.
void child_stall(const GlooOptions& o, const std::string& dir) {
  auto comm = make_gloo_communicator(o);
  std::string flag = dir + "/process0-done";
  if (o.process_rank == 1) {
    auto t0 = Clock::now();
    while (!fs::exists(flag) && seconds_since(t0) < 20)
      std::this_thread::sleep_for(milliseconds(10));
    return;
  }
  std::vector<double> x(10, 1.0);
  auto t0 = Clock::now();
  try {
    comm->all_reduce(0, x.data(), x.data(), 10, DType::Float64);
    ADD_FAILURE() << "all_reduce succeeded with a stalled peer";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(contains(e.what(), "timed out")) << e.what();
    std::cout << "[caught] " << e.what() << " (after " << seconds_since(t0) << " s)" << std::endl;
  }
  double took = seconds_since(t0);
  EXPECT_GE(took, o.timeout_seconds * 0.9);
  EXPECT_LT(took, o.timeout_seconds + 2);
  std::ofstream(flag) << "done";
}

// The processes disagree on the job's shape: every one must say so.
void child_mismatch(const GlooOptions& o) {
  auto t0 = Clock::now();
  try {
    make_gloo_communicator(o);
    ADD_FAILURE() << "the rendezvous succeeded despite the mismatch";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(contains(e.what(), "world size mismatch")) << e.what();
    std::cout << "[caught] " << e.what() << std::endl;
  }
  EXPECT_LT(seconds_since(t0), o.timeout_seconds);
}

}  // namespace

// The body of every child process; skipped when run as a plain test.
TEST(GlooChild, Run) {
  if (!std::getenv("FLOWJIT_GLOO_TEST_RANK"))
    GTEST_SKIP() << "runs only as a child process of the GlooMultiProcess tests";
  GlooOptions o = options_from_env();
  std::string scenario = env_or("FLOWJIT_GLOO_TEST_SCENARIO", "");
  if (scenario == "collectives")
    child_collectives(o);
  else if (scenario == "peer_exit")
    child_peer_exit(o);
  else if (scenario == "peer_dies")
    child_peer_dies(o);
  else if (scenario == "stall")
    child_stall(o, env_or("FLOWJIT_GLOO_TEST_DIR", "/tmp"));
  else if (scenario == "mismatch")
    child_mismatch(o);
  else
    FAIL() << "unknown scenario '" << scenario << "'";
}

// ---------------------------------------------------------------------------
// Stores

TEST(GlooStore, TcpSetGetWait) {
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken);
  ASSERT_GT(host.port(), 0);
  TcpStore client("127.0.0.1", host.port(), false, milliseconds(2000), kToken);
  host.set("a/b", {'x', 'y', 'z'});
  EXPECT_EQ(client.get("a/b"), (std::vector<char>{'x', 'y', 'z'}));
  client.set("empty", {});
  EXPECT_TRUE(host.get("empty").empty());
  client.set("a/b", {'w'});  // overwrites
  EXPECT_EQ(host.get("a/b"), std::vector<char>{'w'});
  std::vector<char> v;
  EXPECT_FALSE(client.try_get("missing", &v));
  EXPECT_FALSE(client.check({"a/b", "missing"}));
  EXPECT_TRUE(client.check({"a/b", "empty"}));
  std::vector<char> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(mix(i));
  client.set("big", big);
  EXPECT_EQ(host.get("big"), big);

  // wait returns when another process sets the key...
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    host.set("late", {'1'});
  });
  client.wait({"late"});
  later.join();
  // ...and gives up at its timeout.
  auto t0 = Clock::now();
  try {
    client.wait({"never"}, milliseconds(200));
    ADD_FAILURE() << "wait for a key nobody sets returned";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(contains(e.what(), "timed out after 0.2 s waiting for never at 127.0.0.1:"))
        << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.2);
  EXPECT_LT(seconds_since(t0), 1.5);
}

TEST(GlooStore, TcpClientWaitsForTheServerAndSurvivesARestart) {
  int port = free_port();
  std::unique_ptr<TcpStore> client;
  std::thread connect([&] {
    client = std::make_unique<TcpStore>("127.0.0.1", port, false, milliseconds(3000), kToken);
  });
  std::this_thread::sleep_for(milliseconds(100));
  auto first = std::make_unique<TcpStore>("127.0.0.1", port, true, milliseconds(3000), kToken);
  connect.join();
  ASSERT_TRUE(client);
  client->set("mine", {'m'});
  EXPECT_EQ(first->get("mine"), std::vector<char>{'m'});
  // The host goes and a new one comes on the same port: the client
  // reconnects and sets its keys again.
  first.reset();
  TcpStore second("127.0.0.1", port, true, milliseconds(3000), kToken);
  std::vector<char> v;
  EXPECT_FALSE(client->try_get("theirs", &v));
  EXPECT_EQ(second.get("mine"), std::vector<char>{'m'});
}

TEST(GlooStore, TcpErrors) {
  int port = free_port();
  auto t0 = Clock::now();
  try {
    TcpStore client("127.0.0.1", port, false, milliseconds(300), kToken);
    ADD_FAILURE() << "connected to nothing";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "could not reach the rendezvous store at 127.0.0.1:" +
                                       std::to_string(port) + " within 0.3 s"))
        << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_LT(seconds_since(t0), 2.0);

  // A lost host that does not come back.
  auto host = std::make_unique<TcpStore>("127.0.0.1", 0, true, milliseconds(300), kToken);
  TcpStore client("127.0.0.1", host->port(), false, milliseconds(300), kToken);
  host.reset();
  std::vector<char> v;
  try {
    client.try_get("k", &v);
    ADD_FAILURE() << "a get without a server succeeded";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "lost the connection to the rendezvous store")) << e.what();
  }

  // Two hosts on one port in one process share the server.
  int shared = free_port();
  TcpStore a("127.0.0.1", shared, true, milliseconds(1000), kToken);
  TcpStore b("127.0.0.1", shared, true, milliseconds(1000), kToken);
  a.set("k", {'a'});
  EXPECT_EQ(b.get("k"), std::vector<char>{'a'});
}

TEST(GlooStore, FileStore) {
  TempDir dir;
  FileStore a(dir.path + "/sub/dir", milliseconds(1000));
  FileStore b(dir.path + "/sub/dir", milliseconds(1000));
  a.set("flowjit/tag with spaces/0/info/0", {'x'});
  EXPECT_EQ(b.get("flowjit/tag with spaces/0/info/0"), std::vector<char>{'x'});
  a.set("empty", {});
  EXPECT_TRUE(b.get("empty").empty());
  std::string long_key(500, 'k');
  b.set(long_key, {'l'});
  EXPECT_EQ(a.get(long_key), std::vector<char>{'l'});
  std::vector<char> v;
  EXPECT_FALSE(a.try_get("flowjit/tag with spaces/0/info/1", &v));
  auto t0 = Clock::now();
  EXPECT_THROW(a.wait({"never"}, milliseconds(100)), UserError);
  EXPECT_LT(seconds_since(t0), 1.0);
}

// ---------------------------------------------------------------------------
// One process

TEST(GlooCommunicator, OneProcessManyDevices) {
  GlooOptions o;
  o.local_devices = 3;
  auto comm = make_gloo_communicator(o);
  EXPECT_EQ(comm->size(), 3);
  EXPECT_EQ(comm->describe(), "gloo: 1 process x 3 devices");
  run_collectives_on_all_devices(*comm, 0, 3);
}

TEST(GlooCommunicator, BadOptions) {
  auto kind_of = [](const GlooOptions& o) {
    try {
      make_gloo_communicator(o);
    } catch (const UserError& e) {
      return e.kind();
    }
    return ErrorKind::Type;  // "no error"
  };
  GlooOptions o;
  o.num_processes = 0;
  EXPECT_EQ(kind_of(o), ErrorKind::Value);
  o = {};
  o.num_processes = 2;
  o.process_rank = 2;
  o.port = 1234;
  EXPECT_EQ(kind_of(o), ErrorKind::Value);
  o.process_rank = 1;
  o.port = 0;  // neither a port nor a directory
  EXPECT_EQ(kind_of(o), ErrorKind::Value);
  o = {};
  o.timeout_seconds = 0;
  EXPECT_EQ(kind_of(o), ErrorKind::Value);
  o = {};
  o.local_devices = 0;
  EXPECT_EQ(kind_of(o), ErrorKind::Value);

  auto comm = make_gloo_communicator(GlooOptions{});
  float x = 1;
  try {
    comm->all_reduce(1, &x, &x, 1, DType::Float32);
    ADD_FAILURE() << "rank 1 of a one-rank communicator was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
  }
}

TEST(GlooCommunicator, AbortWakesTheLocalDevices) {
  GlooOptions o;
  o.local_devices = 2;
  auto comm = make_gloo_communicator(o);
  std::string caught;
  std::thread device0([&] {
    float x = 1;
    try {
      comm->all_reduce(0, &x, &x, 1, DType::Float32);  // device 1 never comes
    } catch (const UserError& e) {
      caught = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(50));
  comm->abort("device 1 failed");
  device0.join();
  EXPECT_TRUE(contains(caught, "device 1 failed")) << caught;
  EXPECT_THROW(comm->barrier(1), UserError);
}

TEST(GlooCommunicator, ProcessDoesNotJoin) {
  GlooOptions o;
  o.num_processes = 2;
  o.port = free_port();
  o.timeout_seconds = 0.5;
  o.store_token = kToken;
  auto t0 = Clock::now();
  try {
    make_gloo_communicator(o);
    ADD_FAILURE() << "a job of 2 started with 1 process";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(contains(e.what(), "gloo: process 1 of 2 did not join within 0.5 s at 127.0.0.1:" +
                                       std::to_string(o.port)))
        << e.what();
  }
  EXPECT_LT(seconds_since(t0), 2.0);

  o.process_rank = 1;  // nobody hosts the store
  try {
    make_gloo_communicator(o);
    ADD_FAILURE() << "process 1 started without process 0";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "gloo: process 1 of 2: could not reach the rendezvous store"))
        << e.what();
  }

  TempDir dir;
  o.file_store_dir = dir.path;
  try {
    make_gloo_communicator(o);
    ADD_FAILURE() << "process 1 started without process 0";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "gloo: process 0 of 2 did not join within 0.5 s at file store"))
        << e.what();
  }
}

// ---------------------------------------------------------------------------
// Several processes

TEST(GlooMultiProcess, TwoProcesses) {
  int port = free_port();
  expect_all_passed(
      run_job(2, [&](int i) { return child_env("collectives", i, 2, 1, port, "", 20); }, 30));
}

TEST(GlooMultiProcess, FourProcesses) {
  int port = free_port();
  expect_all_passed(
      run_job(4, [&](int i) { return child_env("collectives", i, 4, 1, port, "", 20); }, 30));
}

TEST(GlooMultiProcess, TwoProcessesTwoDevicesEach) {
  int port = free_port();
  expect_all_passed(
      run_job(2, [&](int i) { return child_env("collectives", i, 2, 2, port, "", 20); }, 30));
}

TEST(GlooMultiProcess, FileStore) {
  TempDir dir;
  expect_all_passed(
      run_job(3, [&](int i) { return child_env("collectives", i, 3, 1, 0, dir.path, 20); }, 30));
  // Each process's gloo addresses (2 x 136 bytes) carry nothing past the
  // sockaddr_in: no bytes of gloo's stack (ScrubbedAddressStore).
  for (int p = 0; p < 3; ++p) {
    std::ifstream f(dir.path + "/k_flowjit%2F%2F0%2Fgloo%2F" + std::to_string(p), std::ios::binary);
    std::vector<char> a((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_EQ(a.size(), 272u) << "process " << p;
    for (size_t at = 0; at < a.size(); at += 136)
      for (size_t i = 8; i < 128; ++i) EXPECT_EQ(a[at + i], 0) << "process " << p << " byte " << i;
  }
}

TEST(GlooMultiProcess, PeerExitsBeforeACollective) {
  int port = free_port();
  auto t0 = Clock::now();
  expect_all_passed(
      run_job(3, [&](int i) { return child_env("peer_exit", i, 3, 1, port, "", 5); }, 20));
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(GlooMultiProcess, PeerDiesDuringACollective) {
  int port = free_port();
  expect_all_passed(
      run_job(3, [&](int i) { return child_env("peer_dies", i, 3, 1, port, "", 5); }, 20));
}

TEST(GlooMultiProcess, StalledPeerTimesOut) {
  TempDir dir;
  int port = free_port();
  expect_all_passed(
      run_job(2, [&](int i) { return child_env("stall", i, 2, 1, port, dir.path, 2); }, 20));
}

TEST(GlooMultiProcess, MismatchedWorldSize) {
  int port = free_port();
  // Process 0 thinks the job has 2 processes, process 1 thinks 3.
  expect_all_passed(run_job(
      2, [&](int i) { return child_env("mismatch", i, i == 0 ? 2 : 3, 1, port, "", 5); }, 20));
  // Both think 2 processes, but disagree on the devices per process.
  port = free_port();
  expect_all_passed(run_job(
      2, [&](int i) { return child_env("mismatch", i, 2, i == 0 ? 1 : 2, port, "", 5); }, 20));
}
