"""tools/scale_model.py's arithmetic on small known plans (no timings are
asserted: the kernel times here are made up or whatever the profiler saw)."""
import importlib.util
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("scale_model", os.path.join(ROOT, "tools", "scale_model.py"))
sm = importlib.util.module_from_spec(spec)
sys.modules["scale_model"] = sm  # dataclasses look their module up
spec.loader.exec_module(sm)

# A 2-device data-parallel plan as CompiledJob.plan prints it: forward,
# backward of two layers, one bucket per layer (the second of two
# all_reduces), then the updates.
PLAN = """\
  [0] k0_matmul range=2 grain=1 : matmul
  [1] k1_loss range=50 grain=31 : reduce_max, sub
  [2] k2_grad_out range=1 grain=1 : matmul, mul
  [3] @k3.all_reduce.f32.p2.o1.i10 range=1 grain=1 complete_before=9 : all_reduce f32[10]
  [4] @k4.all_reduce.f32.p2.o1.i5120 range=1 grain=1 complete_before=10 : all_reduce f32[10,512]
  [5] k5_grad_hidden range=2 grain=1 : matmul, mul
  [6] k6_grad_hidden_w range=2 grain=1 : matmul, mul
  [7] @k7.all_reduce.f32.p2.o1.i512 range=1 grain=1 complete_before=11 : all_reduce f32[512]
  [8] @k8.all_reduce.f32.p2.o1.i401408 range=1 grain=1 complete_before=12 : all_reduce f32[512,784]
  [9] k9_sub range=10 grain=8192 : sub
  [10] k10_sub range=5120 grain=8192 : sub
  [11] k11_sub range=512 grain=8192 : sub
  [12] k12_sub range=401408 grain=8192 : sub
"""
TIMES = {"k0_matmul": 6e-4, "k1_loss": 1e-5, "k2_grad_out": 1e-5, "k5_grad_hidden": 2e-5,
         "k6_grad_hidden_w": 6e-4, "k9_sub": 1e-6, "k10_sub": 2e-6, "k11_sub": 1e-6, "k12_sub": 1e-4}
HALF = {k: v / 2 for k, v in TIMES.items()}


def plan():
    return sm.parse_plan(PLAN, TIMES, HALF)


def test_the_plan_is_read_with_sizes_and_completion_points():
    p = plan()
    assert p.parts == 2 and len(p.steps) == 13
    colls = [s for s in p.steps if s.op]
    assert [s.op for s in colls] == ["all_reduce"] * 4
    assert [s.message_bytes() for s in colls] == [40, 20480, 2048, 1605632]
    assert [s.complete_before for s in colls] == [9, 10, 11, 12]
    assert p.steps[0].seconds == TIMES["k0_matmul"] and p.steps[0].seconds_half == HALF["k0_matmul"]


def test_one_device_is_the_measured_compute():
    p = plan()
    net = sm.Network(25, 10)
    for overlap in (False, True):
        r = sm.step_time(p, 1, 1, net, overlap, "weak")
        assert r["step"] == pytest.approx(sum(TIMES.values())) and r["comm"] == 0
        assert sm.efficiency(p, 1, 1, net, overlap, "weak") == pytest.approx(1.0)


def test_ring_arithmetic_and_buckets():
    p = plan()
    alpha, gbps = 10e-6, 8.0  # 1 GB/s
    net = sm.Network(gbps, alpha * 1e6)
    r = sm.step_time(p, 4, 1, net, False, "weak")
    # Two buckets (adjacent all_reduces are one message each): 2 (P-1) steps
    # of alpha + n / (P beta) for n = 20520 and 1607680 bytes.
    want = sum(2 * 3 * (alpha + n / 4 / 1e9) for n in (40 + 20480, 2048 + 1605632))
    assert r["comm"] == pytest.approx(want)
    assert r["step"] == pytest.approx(sum(TIMES.values()) + want)
    assert sm.collective_seconds("all_gather", 4000, 4, alpha, 1e9) == pytest.approx(3 * (alpha + 1000 / 1e9))
    assert sm.collective_seconds("all_reduce", 4000, 1, alpha, 1e9) == 0


def test_monotonic_in_bandwidth_and_latency():
    p = plan()
    for overlap in (False, True):
        for scaling in ("weak", "strong"):
            steps = [sm.step_time(p, 8, 8, sm.Network(g, 10), overlap, scaling)["step"]
                     for g in (1, 10, 25, 100, 400)]
            assert all(a > b for a, b in zip(steps, steps[1:])), steps
            lat = [sm.step_time(p, 8, 8, sm.Network(25, a), overlap, scaling)["step"] for a in (1, 10, 100)]
            assert all(a < b for a, b in zip(lat, lat[1:])), lat


def test_overlap_is_never_slower_and_hides_behind_backward_work():
    p = plan()
    net = sm.Network(25, 10)
    on = sm.step_time(p, 16, 1, net, True)
    off = sm.step_time(p, 16, 1, net, False)
    # The first bucket runs while k5/k6 compute: the step is shorter.
    assert on["step"] < off["step"] and on["exposed"] < off["exposed"]
    # Nothing hides more than the backward work after the first bucket.
    assert off["step"] - on["step"] <= TIMES["k5_grad_hidden"] + TIMES["k6_grad_hidden_w"] + 1e-12
    rng = random.Random(5)
    for _ in range(200):  # random plans, sizes and networks
        steps = []
        n = rng.randint(2, 14)
        for i in range(n):
            if rng.random() < 0.4:
                op = rng.choice(["all_reduce", "all_reduce", "all_gather", "reduce_scatter"])
                cb = rng.randint(i + 1, n) if op in ("all_reduce", "all_gather") and rng.random() < 0.8 else -1
                steps.append(sm.Step(f"@k{i}", 0.0, op, 4, 2, 1, rng.randint(1, 1 << 20), cb))
            else:
                steps.append(sm.Step(f"k{i}", rng.random() * 1e-3, seconds_half=rng.random() * 5e-4))
        rp = sm.Plan(steps)
        for m, g in ((2, 1), (4, 8), (64, 1)):
            for scaling in ("weak", "strong"):
                net = sm.Network(rng.choice([1, 25, 100]), rng.choice([1, 10, 50]))
                a = sm.step_time(rp, m, g, net, True, scaling)["step"]
                b = sm.step_time(rp, m, g, net, False, scaling)["step"]
                assert a <= b + 1e-12, (steps, m, g)
                assert a >= sm.step_time(rp, m, g, net, True, scaling)["compute"] - 1e-12


def test_strong_scaling_shrinks_the_batch_work_and_efficiency_falls():
    p = plan()
    net = sm.Network(100, 10)
    c2 = sm.step_time(p, 1, 2, net, False, "strong")["compute"]
    c8 = sm.step_time(p, 1, 8, net, False, "strong")["compute"]
    assert c2 == pytest.approx(sum(TIMES.values()))  # the measured plan's own device count
    assert c8 == pytest.approx(sum(TIMES.values()) / 4)  # all these times halve with the batch
    effs = [sm.efficiency(p, m, 1, net, True, "strong") for m in (2, 4, 16, 64)]
    assert all(a > b for a, b in zip(effs, effs[1:])), effs
    at = sm.stops_scaling(p, 1, net, True, "strong")
    assert at is not None and sm.efficiency(p, at, 1, net, True, "strong") < 0.5
    assert sm.efficiency(p, at // 2, 1, net, True, "strong") >= 0.5


def test_weak_scaling_keeps_a_split_layers_piece():
    text = ("  [0] k0 range=1 grain=1 : matmul\n"
            "  [1] @k1.all_gather.f32.p2.o1.i500 range=1 grain=1 : all_gather f32[500]\n"
            "  [2] k2 range=1 grain=1 : matmul\n")
    p = sm.parse_plan(text, {"k0": 1e-3, "k2": 1e-3})
    net = sm.Network(8, 0)  # 1 GB/s, no latency
    # weak: a 2000-byte piece per device, 8 devices: (P-1) pieces cross each link.
    assert sm.step_time(p, 8, 1, net, False, "weak")["comm"] == pytest.approx(7 * 2000 / 1e9)
    # strong: the whole 4000-byte tensor stays.
    p.steps[0].seconds_half = p.steps[2].seconds_half = 5e-4
    assert sm.step_time(p, 8, 1, net, False, "strong")["comm"] == pytest.approx(7 * 500 / 1e9)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no launches"):
        sm.parse_plan("nothing here", {})
    with pytest.raises(ValueError, match="unknown dtype"):
        sm.parse_plan("  [0] @k0.all_reduce.q7.p2.o1.i4 range=1 grain=1 : x\n", {})
    with pytest.raises(SystemExit):
        sm.main(["--gbps", "fast"])
    with pytest.raises(SystemExit):
        sm.main(["--batch", "3"])


def test_a_compiled_plan_feeds_the_model():
    """The real 2-device seed plan: its collectives, their completion points
    and the profiler's kernel times reach the model (times not asserted)."""
    p = sm.measure_plan("seed", 8, False, 3, strong=True)
    colls = [s for s in p.steps if s.op]
    assert p.parts == 2 and colls and all(s.op == "all_reduce" for s in colls)
    assert sum(s.message_bytes() for s in colls) == 4 * (784 * 512 + 512 + 512 * 10 + 10)
    assert all(s.complete_before > i for i, s in enumerate(p.steps) if s.op)
    kernels = [s for s in p.steps if not s.op]
    assert all(s.seconds > 0 and s.seconds_half is not None for s in kernels)
    net = sm.Network(25, 10)
    one = sm.step_time(p, 1, 1, net, True, "weak")
    assert one["step"] == pytest.approx(sum(s.seconds for s in kernels))
    assert sm.step_time(p, 4, 8, net, True, "weak")["step"] <= sm.step_time(p, 4, 8, net, False, "weak")["step"]
