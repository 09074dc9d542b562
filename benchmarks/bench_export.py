"""Exported libraries ([deploy]): the latency of one seed-MLP predict call
(batch 1 and 100) through flowjit.export's shared library called from a C
program, against the same job called from Python and against the job's
ONNX export in ONNX Runtime, on the same host in the same run; and the
library's size.

The C figures come from a small C program (compiled here with cc) that
times calls in a loop with clock_gettime: best and median of 7 repetitions
of a calibrated number of calls, as the Python figures. Every implementation
uses the host's cores (flowjit's pool, the library's context with one thread
per CPU, ONNX Runtime's default intra-op threads).

    python benchmarks/bench_export.py
"""
import os
import shutil
import subprocess
import tempfile

import numpy as np

import _common as C

_TIMER_C = r"""
#include HEADER
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define FN(x) CAT(JOB, x)
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
int main(void) {
  static const long long in_bytes[] = IN_BYTES, out_bytes[] = OUT_BYTES;
  enum { NI = sizeof in_bytes / sizeof *in_bytes, NO = sizeof out_bytes / sizeof *out_bytes };
  void *in[NI], *out[NO];
  for (int i = 0; i < NI; ++i) {
    in[i] = aligned_alloc(64, (in_bytes[i] + 63) / 64 * 64);
    memset(in[i], 0, in_bytes[i]);
    for (long long k = 0; k < in_bytes[i] / 4; ++k) ((float *)in[i])[k] = (float)(k % 97) / 97.0f;
  }
  for (int i = 0; i < NO; ++i) out[i] = aligned_alloc(64, (out_bytes[i] + 63) / 64 * 64);
  FN(_context) *ctx = FN(_create)(0);
  if (!ctx) return 2;
  for (int w = 0; w < 20; ++w) FN(_run_arrays)(ctx, (const void *const *)in, out);
  double t0 = now();
  FN(_run_arrays)(ctx, (const void *const *)in, out);
  double one = now() - t0;
  long n = (long)(0.08 / (one > 1e-7 ? one : 1e-7));
  if (n < 1) n = 1;
  if (n > 200000) n = 200000;
  double reps[7];
  for (int r = 0; r < 7; ++r) {
    t0 = now();
    for (long c = 0; c < n; ++c) FN(_run_arrays)(ctx, (const void *const *)in, out);
    reps[r] = (now() - t0) / n;
  }
  qsort(reps, 7, sizeof *reps, cmp);
  printf("%.9f %.9f %d\n", reps[0], reps[3], FN(_num_threads)(ctx));
  FN(_destroy)(ctx);
  return 0;
}
"""


def _c_timing(lib, job, tmp):
    cc = shutil.which(os.environ.get("CC", "cc"))
    src = os.path.join(tmp, "timer.c")
    with open(src, "w") as f:
        f.write(_TIMER_C)

    def sizes(items):
        return "{" + ", ".join(str(int(np.prod(s)) * 4 if d in ("float32", "int32") else
                                   int(np.prod(s)) * np.dtype(d).itemsize) for _, d, s in items) + "}"

    exe = os.path.join(tmp, f"timer_{job.prefix}")
    libdir, libname = os.path.split(lib.library)
    subprocess.run([cc, "-O2", f"-DJOB={job.prefix}", f'-DHEADER="{lib.header}"',
                    f"-DIN_BYTES={sizes(job.inputs)}", f"-DOUT_BYTES={sizes(job.outputs)}", src,
                    "-o", exe, f"-L{libdir}", f"-l:{libname}", f"-Wl,-rpath,{libdir}", "-pthread"],
                   check=True)
    best, med, threads = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
    return float(best), float(med), int(threads)


def _seed_job(batch):
    import flowjit as flow
    import flowjit.typing as tp

    def seed_predict(images: tp.Numpy.Placeholder((batch, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, name="hidden")
        return flow.nn.softmax(flow.layers.dense(hidden, 10, name="output"))

    seed_predict.__name__ = f"seed_predict_b{batch}"
    return flow.global_function(type="predict")(seed_predict)


def run():
    import flowjit.export as fe
    rows = []
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return [C.skipped("export", "seed predict", "C call", "no C compiler (cc)")]
    ort = C.peer("onnxruntime")
    fo = None
    if ort is not None:
        try:
            import flowjit.onnx as fo
        except ImportError as e:
            print(f"# SKIP onnx export: {e}")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        for batch in (1, 100):
            job = _seed_job(batch)
            images = rng.random((batch, 1, 28, 28), dtype=np.float32)
            job(images)
            lib = fe.export(job, os.path.join(tmp, f"libseed{batch}.so"), name=f"seed{batch}")
            case = f"seed MLP predict, batch {batch}"
            best, med, threads = _c_timing(lib, lib.jobs[0], tmp)
            rows.append(C.row("export", case, "flowjit", best * 1e6, med * 1e6, "us/call",
                              f"C call of the exported library ({threads} threads), "
                              f"{lib.size_bytes / 1e6:.2f} MB library"))
            fns = {"flowjit Python call": lambda: job(images)}
            if fo is not None:
                model = fo.export(job)
                opts = ort.SessionOptions()
                sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
                name = sess.get_inputs()[0].name
                fns["onnxruntime"] = lambda: sess.run(None, {name: images})
            for impl, (b, m) in C.interleaved(fns).items():
                note = f"onnxruntime {ort.__version__} (Python API)" if impl == "onnxruntime" else ""
                rows.append(C.row("export", case, impl, b * 1e6, m * 1e6, "us/call", note))
            rows.append(C.row("export", case, "library size", lib.size_bytes / 1e6, lib.size_bytes / 1e6,
                              "MB", f"of which variables {lib.variables_bytes / 1e6:.2f} MB; "
                              f"{lib.jobs[0].kernels} kernels; needs only libc"))
    return rows


if __name__ == "__main__":
    C.fair_env()
    C.header()
    C.print_load("(export)")
    C.print_rows(run(), "exported library: one predict call (best and median of 7 repetitions)")
