// GPU benchmarks of flowjit's generated kernels, built and run by
// tools/gpu_check.sh on a machine with an NVIDIA GPU:
//   matmul      TFLOP/s of the exact FP32 and the TF32 kernels, against cuBLAS
//               (loaded with dlopen) in the same process on the same buffers,
//               and the largest difference between the two results
//   elementwise a fused chain (exp, mul, tanh, sub) in GB/s against a
//               device-to-device copy of the same size
//   train step  the seed's MLP step (100 x 784 -> 512 -> 10, SGD) per second,
//               inputs and loss copied each step, against flowjit on the CPU
// Operands live in variables, so the matmul and elementwise timings are of
// the kernels (plus one event per run), not of host copies.
//
//   gpu_bench [--quick] [--compile-only] [--json FILE]
// --compile-only generates every benchmark kernel (PTX and cubin) and exits;
// it needs no GPU. Without a GPU the benchmark exits with status 2.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "jit/optimizer.h"
#include "jit/pipeline.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"

using namespace flowjit;
using namespace flowjit::ir;
namespace nv = flowjit::codegen::nvptx;
namespace rc = flowjit::runtime::cuda;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

NodeRef param(const std::string& name, int64_t index, Shape s, DType dt = DType::Float32) {
  return make_node(OpKind::Parameter, {},
                   Attrs{{"name", name}, {"index", index}, {"shape", s}, {"dtype", dt}});
}
NodeRef variable(const std::string& name, Shape s, DType dt = DType::Float32) {
  return make_node(OpKind::Variable, {}, Attrs{{"name", name}, {"shape", s}, {"dtype", dt}});
}
NodeRef assign(const NodeRef& var, const NodeRef& v) { return make_node(OpKind::Assign, {var, v}); }

Graph graph(std::vector<NodeRef> params, std::vector<NodeRef> outputs,
            std::vector<NodeRef> effects) {
  Graph g;
  g.name = "bench";
  g.params = std::move(params);
  g.outputs = std::move(outputs);
  g.effects = std::move(effects);
  return g;
}

int codegen_sm(int device_sm) {
  int best = 80;
  for (int s : {70, 72, 75, 80, 86, 87, 89, 90})
    if (s <= device_sm) best = s;
  return best;
}

struct Compiled {
  jit::FusedProgram fp;
  nv::CompiledModule mod;
};

Compiled compile_gpu(const Graph& g, int sm, bool tf32) {
  Compiled c;
  jit::PassLog log;
  c.fp = jit::fuse(jit::optimize(g, log), g.name);
  nv::CompileOptions o;
  o.sm = sm;
  o.allow_tf32 = tf32;
  c.mod = nv::compile(c.fp.kernels, c.fp.plan.launches, o);  // writes the plan's grids
  return c;
}

std::unique_ptr<rc::CudaExecutable> load(const Compiled& c, const std::shared_ptr<rc::Device>& dev,
                                         int sm) {
  return std::make_unique<rc::CudaExecutable>(dev, c.fp.plan,
                                              rc::GpuImage{c.mod.ptx, c.mod.cubin, sm});
}

// Uniform in [-0.1, 0.1), from a cheap hash (the buffers reach a gigabyte).
void randomize(runtime::VariableStore& store, uint32_t seed) {
  for (auto* v : store.all()) {
    if (v->type.dtype != DType::Float32) continue;
    auto* p = reinterpret_cast<float*>(v->ptr());
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + std::hash<std::string>()(v->name);
    for (int64_t i = 0; i < v->type.numel(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      p[i] = static_cast<float>(
          static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) * 0.2 - 0.1);
    }
  }
}

void create_variables(const jit::FusedProgram& fp, runtime::VariableStore& store,
                      const std::vector<std::pair<std::string, TensorType>>& extra = {}) {
  for (auto& [n, t] : fp.plan.variables) store.get_or_create(n, t, true);
  for (auto& [n, t] : extra) store.get_or_create(n, t, false);
}

// Median seconds per call of fn over `reps` calls (after one warm-up).
double time_it(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> ts;
  for (int i = 0; i < reps; ++i) {
    double t0 = now();
    fn();
    ts.push_back(now() - t0);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// ---------------------------------------------------------------- cuBLAS

struct Cublas {
  void* lib = nullptr;
  void* handle = nullptr;
  int (*create)(void**) = nullptr;
  int (*destroy)(void*) = nullptr;
  int (*set_stream)(void*, void*) = nullptr;
  int (*set_math_mode)(void*, int) = nullptr;
  int (*sgemm)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int,
               const float*, float*, int) = nullptr;
  std::string name;

  bool open(rc::CUstream stream) {
    for (const char* n :
         {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}) {
      lib = dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        name = n;
        break;
      }
    }
    if (!lib) return false;
    create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
    destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "cublasDestroy_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    set_math_mode = reinterpret_cast<decltype(set_math_mode)>(dlsym(lib, "cublasSetMathMode"));
    sgemm = reinterpret_cast<decltype(sgemm)>(dlsym(lib, "cublasSgemm_v2"));
    if (!create || !destroy || !set_stream || !set_math_mode || !sgemm) return false;
    if (create(&handle) != 0) return false;
    return set_stream(handle, stream) == 0;
  }
  ~Cublas() {
    if (handle) destroy(handle);
  }
};

// ---------------------------------------------------------------- report

struct Report {
  std::vector<std::pair<std::string, double>> values;
  void add(const std::string& k, double v) {
    values.emplace_back(k, v);
    std::printf("  %-44s %12.3f\n", k.c_str(), v);
    std::fflush(stdout);
  }
  std::string json() const {
    std::ostringstream os;
    os << "{";
    for (size_t i = 0; i < values.size(); ++i)
      os << (i ? ", " : "") << "\"" << values[i].first << "\": " << values[i].second;
    os << "}\n";
    return os.str();
  }
};

jit::OptimizerLowering seed_step(Graph& g) {
  const int64_t batch = 100, in = 784, hidden = 512, classes = 10;
  auto images = param("images", 0, {batch, 1, 28, 28});
  auto labels = param("labels", 1, {batch}, DType::Int32);
  auto w1 = variable("hidden-weight", {hidden, in});
  auto b1 = variable("hidden-bias", {hidden});
  auto w2 = variable("output-weight", {classes, hidden});
  auto b2 = variable("output-bias", {classes});
  auto h = unary(OpKind::Relu,
                 binary(OpKind::Add, matmul(reshape(images, {batch, in}), w1, false, true), b1));
  auto logits = binary(OpKind::Add, matmul(h, w2, false, true), b2);
  auto loss = make_node(OpKind::SparseCrossEntropy, {labels, logits});
  auto step = variable("train-step", {}, DType::Int64);
  auto lr = cast(fill(0.1, {}, DType::Float64), DType::Float32);
  jit::OptimizerConfig cfg;
  cfg.momentum = 0;
  jit::OptimizerLowering low = jit::lower_optimizer(cfg, {loss}, lr, step, {w1, b1, w2, b2});
  g = graph({images, labels}, {loss}, low.effects);
  return low;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, compile_only = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--compile-only") {
      compile_only = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--compile-only] [--json FILE]\n", argv[0]);
      return 64;
    }
  }
  try {
    std::shared_ptr<rc::Device> dev;
    int sm = 90;
    if (!compile_only) {
      std::string why;
      if (!rc::driver_available(&why) || rc::device_count() == 0) {
        std::fprintf(stderr, "gpu_bench: no GPU: %s\n",
                     why.empty() ? "the CUDA driver sees no device" : why.c_str());
        return 2;
      }
      dev = rc::Device::open(0);
      sm = codegen_sm(dev->info().sm);
      std::printf("gpu_bench on %s (kernels for sm_%d)\n", dev->info().str().c_str(), sm);
    }
    Report rep;
    const int64_t n = quick ? 2048 : 4096;
    const int64_t elems = quick ? (int64_t{64} << 20) : (int64_t{256} << 20);

    // Graphs.
    auto ma = variable("mm-a", {n, n}), mb = variable("mm-b", {n, n}),
         mc = variable("mm-c", {n, n});
    Graph mm = graph({}, {}, {assign(mc, matmul(ma, mb, false, false))});
    auto ex = variable("ew-x", {elems}), ey = variable("ew-y", {elems});
    NodeRef chain = binary(
        OpKind::Sub, unary(OpKind::Tanh, binary(OpKind::Mul, unary(OpKind::Exp, ex), ex)), ex);
    Graph ew = graph({}, {}, {assign(ey, chain)});
    Graph train;
    jit::OptimizerLowering low = seed_step(train);

    double t0 = now();
    Compiled mm_exact = compile_gpu(mm, sm, false), mm_tf32 = compile_gpu(mm, sm, true);
    Compiled ew_c = compile_gpu(ew, sm, false), train_c = compile_gpu(train, sm, false);
    std::printf("compiled the benchmark kernels in %.2fs (ptxas: %s)\n", now() - t0,
                mm_exact.mod.cubin.empty() ? "not found, the driver JIT-compiles the PTX"
                                           : mm_exact.mod.ptxas_path.c_str());
    for (const Compiled* c : {&mm_exact, &mm_tf32, &ew_c, &train_c})
      for (size_t i = 0; i < c->fp.plan.launches.size(); ++i) {
        const auto& l = c->fp.plan.launches[i];
        std::printf("  %-40s %s grid=%u block=%u\n", l.symbol.c_str(),
                    c->mod.notes[i].mapping.c_str(), l.gpu()->grid[0], l.gpu()->block[0]);
      }
    if (compile_only) return 0;

    // ---- matmul
    runtime::VariableStore store;
    create_variables(mm_exact.fp, store);
    create_variables(ew_c.fp, store);
    randomize(store, 1);
    rc::DeviceVariables dv(dev);
    auto mm_e = load(mm_exact, dev, sm), mm_t = load(mm_tf32, dev, sm);
    mm_e->bind_variables(store, dv);
    mm_t->bind_variables(store, dv);
    double flops = 2.0 * n * n * n;
    int reps = quick ? 5 : 10;
    std::printf("matmul %lldx%lldx%lld float32\n", (long long)n, (long long)n, (long long)n);
    auto run0 = [](rc::CudaExecutable& e) { e.run(nullptr, nullptr); };
    double t_exact = time_it([&] { run0(*mm_e); }, reps);
    rep.add("matmul_fp32_flowjit_tflops", flops / t_exact * 1e-12);
    std::vector<float> ours(static_cast<size_t>(n * n)), theirs(ours.size());
    auto* cvar = store.find("mm-c");
    dv.download(*cvar);
    std::memcpy(ours.data(), cvar->ptr(), ours.size() * 4);
    double t_tf32 = time_it([&] { run0(*mm_t); }, reps);
    rep.add("matmul_tf32_flowjit_tflops", flops / t_tf32 * 1e-12);
    Cublas cb;
    {
      rc::Device::Scope scope(*dev);
      if (cb.open(dev->stream())) {
        auto A = dv.get(*store.find("mm-a")), B = dv.get(*store.find("mm-b"));
        rc::DeviceBuffer C(dev, static_cast<uint64_t>(n * n * 4));
        float one = 1, zero = 0;
        int ni = static_cast<int>(n);
        auto gemm = [&] {
          rc::Device::Scope s(*dev);
          int st = cb.sgemm(cb.handle, 0, 0, ni, ni, ni, &one, reinterpret_cast<const float*>(B),
                            ni, reinterpret_cast<const float*>(A), ni, &zero,
                            reinterpret_cast<float*>(C.ptr()), ni);
          if (st != 0) throw std::runtime_error("cublasSgemm failed: status " + std::to_string(st));
          dev->synchronize();
        };
        cb.set_math_mode(cb.handle, 2);  // CUBLAS_PEDANTIC_MATH: FP32, no tensor cores
        double tc = time_it(gemm, reps);
        rep.add("matmul_fp32_cublas_tflops", flops / tc * 1e-12);
        rep.add("matmul_fp32_flowjit_vs_cublas", tc / t_exact);
        FLOWJIT_CU(dev->api(), cuMemcpyDtoHAsync, theirs.data(), C.ptr(), theirs.size() * 4,
                   dev->stream());
        dev->synchronize();
        double maxdiff = 0, maxval = 0;
        for (size_t i = 0; i < ours.size(); ++i) {
          maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(ours[i] - theirs[i])));
          maxval = std::max(maxval, static_cast<double>(std::fabs(theirs[i])));
        }
        rep.add("matmul_fp32_max_rel_diff_vs_cublas", maxdiff / std::max(maxval, 1e-30));
        cb.set_math_mode(cb.handle, 3);  // CUBLAS_TF32_TENSOR_OP_MATH
        double tt = time_it(gemm, reps);
        rep.add("matmul_tf32_cublas_tflops", flops / tt * 1e-12);
        rep.add("matmul_tf32_flowjit_vs_cublas", tt / t_tf32);
      } else {
        std::printf(
            "  (cuBLAS not found: no comparison; torch's numbers follow in gpu_torch_bench.py)\n");
      }
    }

    // ---- fused elementwise chain vs copy bandwidth
    std::printf("elementwise chain exp/mul/tanh/sub over %lld floats\n", (long long)elems);
    auto ew_e = load(ew_c, dev, sm);
    ew_e->bind_variables(store, dv);
    double bytes = 2.0 * 4.0 * static_cast<double>(elems);  // read x, write y
    double t_ew = time_it([&] { run0(*ew_e); }, reps * 2);
    rep.add("elementwise_chain_flowjit_gbps", bytes / t_ew * 1e-9);
    auto X = dv.get(*store.find("ew-x")), Y = dv.get(*store.find("ew-y"));
    double t_copy = time_it(
        [&] {
          rc::Device::Scope s(*dev);
          FLOWJIT_CU(dev->api(), cuMemcpyDtoDAsync, Y, X, static_cast<size_t>(elems * 4),
                     dev->stream());
          dev->synchronize();
        },
        reps * 2);
    rep.add("device_copy_gbps", bytes / t_copy * 1e-9);
    rep.add("elementwise_chain_vs_copy", t_copy / t_ew);

    // ---- the seed's train step
    std::printf(
        "seed train step (100 x 784 -> 512 -> 10, SGD), inputs and loss copied each step\n");
    runtime::VariableStore tstore_gpu, tstore_cpu;
    for (auto* s : {&tstore_gpu, &tstore_cpu}) {
      create_variables(train_c.fp, *s, low.new_variables);
      randomize(*s, 7);
    }
    rc::DeviceVariables tdv(dev);
    auto tr = load(train_c, dev, sm);
    tr->bind_variables(tstore_gpu, tdv);
    std::vector<float> images(100 * 784);
    std::vector<int32_t> labels(100);
    std::mt19937 g(3);
    for (auto& v : images) v = std::uniform_real_distribution<float>(0, 1)(g);
    for (auto& v : labels) v = static_cast<int32_t>(g() % 10);
    std::vector<float> loss(100);
    const void* ins[] = {images.data(), labels.data()};
    void* outs[] = {loss.data()};
    int steps = quick ? 50 : 200;
    tr->run(ins, outs);
    double ts0 = now();
    for (int i = 0; i < steps; ++i) tr->run(ins, outs);
    double gpu_step = (now() - ts0) / steps;
    rep.add("train_step_flowjit_gpu_ms", gpu_step * 1e3);
    jit::JobDescription job;
    job.name = "train";
    job.graph = train;
    jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, tstore_cpu);
    std::vector<float> loss_cpu(100);
    void* outs_cpu[] = {loss_cpu.data()};
    cj.program->run(ins, outs_cpu);
    double tc0 = now();
    for (int i = 0; i < steps / 5; ++i) cj.program->run(ins, outs_cpu);
    double cpu_step = (now() - tc0) / (steps / 5);
    rep.add("train_step_flowjit_cpu_ms", cpu_step * 1e3);
    rep.add("train_step_gpu_speedup_vs_cpu", cpu_step / gpu_step);
    double l_gpu = 0;
    for (float v : loss) l_gpu += v;
    rep.add("train_step_gpu_mean_loss_after_steps", l_gpu / 100);

    if (!json_path.empty()) std::ofstream(json_path) << rep.json();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
