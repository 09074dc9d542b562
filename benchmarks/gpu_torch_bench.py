"""PyTorch on the GPU, for tools/gpu_check.sh: the same workloads as
benchmarks/gpu_bench.cpp, so the two sets of figures sit side by side.

    python3 benchmarks/gpu_torch_bench.py [--quick] [--json FILE]

Exits 2 when torch has no CUDA device.
"""
import argparse
import json
import sys
import time


def timed(fn, reps, sync):
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"gpu_torch_bench: torch is not installed ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_torch_bench: torch sees no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    out = {}

    def report(k, v):
        out[k] = v
        print(f"  {k:<44} {v:12.3f}", flush=True)

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    n = 2048 if args.quick else 4096
    reps = 5 if args.quick else 10
    a = torch.randn(n, n, device=dev) * 0.1
    b = torch.randn(n, n, device=dev) * 0.1
    c = torch.empty(n, n, device=dev)
    flops = 2.0 * n * n * n
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        t = timed(lambda: torch.matmul(a, b, out=c), reps, sync)
        report(f"matmul_{'tf32' if tf32 else 'fp32'}_torch_tflops", flops / t * 1e-12)
    torch.backends.cuda.matmul.allow_tf32 = False

    elems = (64 << 20) if args.quick else (256 << 20)
    x = torch.rand(elems, device=dev) * 0.2 - 0.1
    y = torch.empty_like(x)
    nbytes = 2.0 * 4.0 * elems

    def chain():
        torch.sub(torch.tanh(torch.exp(x) * x), x, out=y)

    report("elementwise_chain_torch_eager_gbps", nbytes / timed(chain, reps * 2, sync) * 1e-9)
    try:
        compiled = torch.compile(lambda v: torch.tanh(torch.exp(v) * v) - v)
        report("elementwise_chain_torch_compile_gbps", nbytes / timed(lambda: compiled(x), reps * 2, sync) * 1e-9)
    except Exception as e:  # no triton, or a compiler failure: eager only
        print(f"  (torch.compile unavailable: {type(e).__name__}: {e})")
    report("device_copy_torch_gbps", nbytes / timed(lambda: y.copy_(x), reps * 2, sync) * 1e-9)

    # The seed's MLP step: 100 x 784 -> 512 -> 10, SGD lr 0.1, mean CE loss,
    # inputs copied from the host each step like flowjit does.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.rand(100, 784).pin_memory()
    labels = torch.randint(0, 10, (100,), dtype=torch.int64).pin_memory()
    steps = 50 if args.quick else 200

    def step():
        xi = images.to(dev, non_blocking=True)
        yi = labels.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xi), yi)
        loss.backward()
        opt.step()
        return loss.detach().to("cpu")

    step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    report("train_step_torch_gpu_ms", (time.perf_counter() - t0) / steps * 1e3)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
