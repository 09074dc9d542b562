// All-reduce between processes on this machine: flowjit's Gloo communicator
// against Gloo's own algorithms (ring, chunked ring, halving-doubling), the
// same buffers, measured alternately in one run.
//
//   build/dev/flowjit_bench_collectives [processes=2] [reps=30] [bytes...]
//
// Without byte sizes: 4 KB, 64 KB, 1.6 MB (the seed's gradient bucket) and
// 6.4 MB. The parent forks the processes; rank 0 prints one JSON line per
// size: {"bytes": n, "ours_ms": .., "ours_min_ms": .., "ring_ms": .., ...}
// (median and best of the repetitions).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "runtime/comm/gloo_communicator.h"

namespace {

using flowjit::runtime::Communicator;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int child(int rank, int world, const std::string& dir, int reps,
          const std::vector<int64_t>& sizes) {
  flowjit::runtime::GlooOptions o;
  o.process_rank = rank;
  o.num_processes = world;
  o.file_store_dir = dir + "/ours";
  o.tag = "bench";
  std::shared_ptr<Communicator> ours = flowjit::runtime::make_gloo_communicator(o);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  gloo::rendezvous::FileStore store(dir + "/gloo");
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  context->connectFullMesh(store, device);
  gloo::BarrierAllToAll barrier(context);
  uint32_t tag = 1000;
  for (int64_t bytes : sizes) {
    const int count = static_cast<int>(bytes / 4);
    std::vector<float> buf(static_cast<size_t>(count)), want(buf.size());
    auto fill = [&] {
      for (int i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 97) + rank);
    };
    for (int i = 0; i < count; ++i)
      want[i] = static_cast<float>(world * (i % 97) + world * (world - 1) / 2);
    std::vector<float*> ptrs{buf.data()};
    gloo::AllreduceRing<float> ring(context, ptrs, count);
    gloo::AllreduceRingChunked<float> chunked(context, ptrs, count);
    gloo::AllreduceHalvingDoubling<float> hd(context, ptrs, count);
    std::vector<std::pair<std::string, std::function<void()>>> algos = {
        {"ours",
         [&] {
           ours->all_reduce(rank, buf.data(), buf.data(), count, flowjit::ir::DType::Float32);
         }},
        {"ring", [&] { ring.run(); }},
        {"new_api_ring",
         [&] {  // gloo::allreduce, the call flowjit makes for large buffers
           gloo::AllreduceOptions o(context);
           o.setOutput(buf.data(), static_cast<size_t>(count));
           o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
           o.setReduceFunction(
               static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
           o.setTag(tag++);
           gloo::allreduce(o);
         }},
        {"ring_chunked", [&] { chunked.run(); }},
        {"halving_doubling", [&] { hd.run(); }}};
    std::vector<std::vector<double>> ms(algos.size());
    for (int r = 0; r < reps + 3; ++r)
      for (size_t k = 0; k < algos.size(); ++k) {
        // A different algorithm goes first in each round: the first one after
        // the barrier also absorbs how late the peer left it.
        size_t a = (k + static_cast<size_t>(r)) % algos.size();
        fill();
        barrier.run();
        auto t0 = std::chrono::steady_clock::now();
        algos[a].second();
        double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count();
        if (r >= 3) ms[a].push_back(t);  // the first runs warm up connections and buffers
        if (buf != want) {
          std::fprintf(stderr, "%s gave wrong sums at %lld bytes\n", algos[a].first.c_str(),
                       static_cast<long long>(bytes));
          return 1;
        }
      }
    if (rank == 0) {
      std::printf("{\"bytes\": %lld", static_cast<long long>(bytes));
      for (size_t a = 0; a < algos.size(); ++a)
        std::printf(", \"%s_ms\": %.4f, \"%s_min_ms\": %.4f", algos[a].first.c_str(), median(ms[a]),
                    algos[a].first.c_str(), *std::min_element(ms[a].begin(), ms[a].end()));
      std::printf("}\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int world = argc > 1 ? std::atoi(argv[1]) : 2;
  int reps = argc > 2 ? std::atoi(argv[2]) : 30;
  std::vector<int64_t> sizes;
  for (int i = 3; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  if (sizes.empty()) sizes = {4 << 10, 64 << 10, 1607680, 4 * 1607680};
  if (world < 2 || reps < 1) {
    std::fprintf(stderr, "usage: %s [processes>=2] [reps>=1] [bytes...]\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/flowjit_bench_collectives.XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  std::string dir = tmpl;
  std::filesystem::create_directories(dir + "/ours");
  std::filesystem::create_directories(dir + "/gloo");
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = child(r, world, dir, reps, sizes);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(dir);
  return failed;
}
