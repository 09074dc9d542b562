/* The runtime of a job exported by flowjit.export (see _export_runtime.h):
 * runs the plan's launches in order, as flowjit's own CPU runtime does
 * (runtime/executable.cpp), with a thread pool of its own instead of TBB.
 *
 * A context owns the pool and a free list of workspaces (an arena, the
 * resolved argument arrays, scratch and staging memory). A call takes a
 * workspace, so calls from several threads run at once on one context; the
 * pool's threads serve the parallel launches of every call. */
#define _GNU_SOURCE
#include "_export_runtime.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FJ_ALIGN 64

static __thread char fj_error[1024];

static void fj_set_error(const char* text) { snprintf(fj_error, sizeof fj_error, "%s", text); }

FJ_HIDDEN const char* fj_last_error(void) { return fj_error; }

static void* fj_alloc(int64_t bytes) {
  if (bytes <= 0) bytes = FJ_ALIGN;
  size_t n = ((size_t)bytes + FJ_ALIGN - 1) / FJ_ALIGN * FJ_ALIGN;
  return aligned_alloc(FJ_ALIGN, n);
}

/* ---- the thread pool */

typedef struct fj_task {
  fj_kernel fn;
  char* const* args;
  int64_t range, step, chunks;
  atomic_llong next;  /* the next chunk to take */
  atomic_llong done;  /* chunks finished */
  atomic_int holders; /* pool threads working on it (taken under the pool's lock) */
  struct fj_task* link;
} fj_task;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t work, finished;
  fj_task* head;      /* posted tasks, newest first, until their callers remove them */
  atomic_uint posted; /* tasks posted so far: idle threads spin on it before sleeping */
  int stop;
  int num_threads; /* pool threads (a call's own thread works too) */
  pthread_t* threads;
  char** scratch;
} fj_pool;

typedef struct {
  fj_pool* pool;
  int index;
} fj_worker_arg;

/* Iterations of `pause` an idle thread (or a caller waiting for its task)
 * spins before it sleeps: about 50-100 us, so the launches of a call, and
 * calls in a loop, find the threads awake. */
#define FJ_SPIN 2000

static void fj_run_chunks(fj_task* t, char* scratch) {
  for (;;) {
    long long c = atomic_fetch_add(&t->next, 1);
    if (c >= t->chunks) return;
    int64_t b = c * t->step;
    int64_t e = b + t->step < t->range ? b + t->step : t->range;
    if (b < e) t->fn(t->args, b, e, scratch);
    atomic_fetch_add(&t->done, 1);
  }
}

static fj_task* fj_open_task(fj_pool* p) {
  for (fj_task* t = p->head; t; t = t->link)
    if (atomic_load(&t->next) < t->chunks) return t;
  return NULL;
}

static void* fj_worker(void* arg) {
  fj_pool* p = ((fj_worker_arg*)arg)->pool;
  char* scratch = p->scratch[((fj_worker_arg*)arg)->index];
  free(arg);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    fj_task* t = fj_open_task(p);
    if (t) {
      atomic_fetch_add(&t->holders, 1);
      pthread_mutex_unlock(&p->mu);
      fj_run_chunks(t, scratch);
      atomic_fetch_sub(&t->holders, 1); /* t may be gone after this */
      pthread_mutex_lock(&p->mu);
      pthread_cond_broadcast(&p->finished);
      continue;
    }
    if (p->stop) break;
    unsigned seen = atomic_load(&p->posted);
    pthread_mutex_unlock(&p->mu);
    for (int spin = 0; spin < FJ_SPIN && atomic_load(&p->posted) == seen; ++spin)
      __builtin_ia32_pause();
    pthread_mutex_lock(&p->mu);
    if (!p->stop && atomic_load(&p->posted) == seen && !fj_open_task(p))
      pthread_cond_wait(&p->work, &p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void fj_pool_stop(fj_pool* p, int started) {
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < started; ++i) pthread_join(p->threads[i], NULL);
  for (int i = 0; i < p->num_threads; ++i) free(p->scratch[i]);
  free(p->scratch);
  free(p->threads);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->finished);
  pthread_mutex_destroy(&p->mu);
}

static int fj_pool_start(fj_pool* p, int num_threads, int64_t scratch_bytes) {
  memset(p, 0, sizeof *p);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->finished, NULL);
  p->num_threads = num_threads;
  p->threads = calloc((size_t)num_threads + 1, sizeof(pthread_t));
  p->scratch = calloc((size_t)num_threads + 1, sizeof(char*));
  if (!p->threads || !p->scratch) {
    fj_pool_stop(p, 0);
    return 0;
  }
  for (int i = 0; i < num_threads; ++i)
    if (scratch_bytes > 0 && (p->scratch[i] = fj_alloc(scratch_bytes)) == NULL) {
      fj_pool_stop(p, 0);
      return 0;
    }
  for (int i = 0; i < num_threads; ++i) {
    fj_worker_arg* a = malloc(sizeof *a);
    if (a) {
      a->pool = p;
      a->index = i;
    }
    if (!a || pthread_create(&p->threads[i], NULL, fj_worker, a) != 0) {
      free(a);
      fj_pool_stop(p, i);
      return 0;
    }
  }
  return 1;
}

/* Runs every chunk of `t` on the pool and this thread; returns when all are
 * done and no pool thread holds `t` any more. */
static void fj_parallel(fj_pool* p, fj_task* t, char* scratch) {
  pthread_mutex_lock(&p->mu);
  t->link = p->head;
  p->head = t;
  atomic_fetch_add(&p->posted, 1);
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  fj_run_chunks(t, scratch);
  /* (done == chunks means every chunk was taken, so no thread takes `t` up
   * any more; holders then only falls.) */
  for (int spin = 0; spin < FJ_SPIN; ++spin) {
    if (atomic_load(&t->done) == t->chunks && atomic_load(&t->holders) == 0) break;
    __builtin_ia32_pause();
  }
  pthread_mutex_lock(&p->mu);
  while (atomic_load(&t->done) < t->chunks || atomic_load(&t->holders) > 0)
    pthread_cond_wait(&p->finished, &p->mu);
  for (fj_task** at = &p->head; *at; at = &(*at)->link)
    if (*at == t) {
      *at = t->link;
      break;
    }
  pthread_mutex_unlock(&p->mu);
}

/* ---- contexts and calls */

typedef struct fj_workspace {
  char* arena;
  char** argv;   /* every launch's resolved arguments, concatenated */
  char* scratch; /* the calling thread's */
  char** staged; /* per input, then per output: an aligned copy, made when needed */
  struct fj_workspace* next;
} fj_workspace;

struct fj_context {
  const fj_plan* plan;
  fj_pool pool;
  pthread_mutex_t mu;
  fj_workspace* free_list;
};

static void fj_workspace_free(const fj_plan* plan, fj_workspace* w) {
  if (!w) return;
  free(w->arena);
  free(w->argv);
  free(w->scratch);
  if (w->staged)
    for (int i = 0; i < plan->num_inputs + plan->num_outputs; ++i) free(w->staged[i]);
  free(w->staged);
  free(w);
}

static fj_workspace* fj_workspace_new(const fj_plan* plan) {
  fj_workspace* w = calloc(1, sizeof *w);
  if (!w) return NULL;
  int32_t num_args = 0;
  for (int i = 0; i < plan->num_launches; ++i) num_args += plan->launches[i].num_args;
  w->arena = fj_alloc(plan->arena_bytes);
  w->argv = calloc((size_t)num_args + 1, sizeof(char*));
  w->staged = calloc((size_t)(plan->num_inputs + plan->num_outputs) + 1, sizeof(char*));
  w->scratch = plan->scratch_bytes > 0 ? fj_alloc(plan->scratch_bytes) : NULL;
  if (!w->arena || !w->argv || !w->staged || (plan->scratch_bytes > 0 && !w->scratch)) {
    fj_workspace_free(plan, w);
    return NULL;
  }
  return w;
}

FJ_HIDDEN fj_context* fj_create(const fj_plan* plan, int num_threads) {
  if (num_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    num_threads = n > 0 ? (int)n : 1;
  }
  fj_context* ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    fj_set_error("flowjit export: out of memory for a context");
    return NULL;
  }
  ctx->plan = plan;
  pthread_mutex_init(&ctx->mu, NULL);
  if (!fj_pool_start(&ctx->pool, num_threads - 1, plan->scratch_bytes)) {
    pthread_mutex_destroy(&ctx->mu);
    free(ctx);
    fj_set_error("flowjit export: cannot start the context's threads");
    return NULL;
  }
  return ctx;
}

FJ_HIDDEN void fj_destroy(fj_context* ctx) {
  if (!ctx) return;
  fj_pool_stop(&ctx->pool, ctx->pool.num_threads);
  while (ctx->free_list) {
    fj_workspace* w = ctx->free_list;
    ctx->free_list = w->next;
    fj_workspace_free(ctx->plan, w);
  }
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
}

FJ_HIDDEN int fj_num_threads(const fj_context* ctx) { return ctx ? ctx->pool.num_threads + 1 : 0; }

/* The message of a failed check, as flowjit's runtime words it
 * (runtime/executable.cpp, describe_failed_check). */
static void fj_check_error(const fj_plan* plan, const int64_t* status) {
  int64_t which = status[0] - 1, value = status[1], position = status[2];
  if (which < 0 || which >= plan->num_checks) {
    snprintf(fj_error, sizeof fj_error, "job '%s': a check of the run failed (%lld)", plan->job,
             (long long)status[0]);
    return;
  }
  const fj_check* c = &plan->checks[which];
  int64_t at[16] = {0};
  int rank = c->rank < 16 ? c->rank : 16;
  int64_t rest = position;
  for (int d = rank - 1; d >= 0; --d) {
    int64_t e = c->shape[d] > 1 ? c->shape[d] : 1;
    at[d] = rest % e;
    rest /= e;
  }
  char where[256];
  size_t n = 0;
  where[0] = 0;
  for (int d = 0; d < rank && n < sizeof where; ++d)
    n += (size_t)snprintf(where + n, sizeof where - n, "%s%lld", d ? ", " : "", (long long)at[d]);
  if (c->numerics) {
    double v;
    memcpy(&v, &value, sizeof v);
    snprintf(fj_error, sizeof fj_error, "%s, %s at [%s]", c->text,
             v != v  ? "nan"
             : v > 0 ? "inf"
                     : "-inf",
             where);
    return;
  }
  int64_t limit = c->limit;
  if (limit < 0 && c->num_limits > 0) limit = c->limits[(rank ? at[rank - 1] : 0) % c->num_limits];
  snprintf(fj_error, sizeof fj_error, "%s holds %lld at [%s], outside the valid range [0, %lld)",
           c->text, (long long)value, where, (long long)limit);
}

FJ_HIDDEN int fj_run(fj_context* ctx, const void* const* inputs, void* const* outputs) {
  if (!ctx) {
    fj_set_error("flowjit export: the context is null (did _create fail?)");
    return FJ_ERROR_ARGUMENT;
  }
  const fj_plan* plan = ctx->plan;
  for (int i = 0; i < plan->num_inputs; ++i)
    if (!inputs || !inputs[i]) {
      snprintf(fj_error, sizeof fj_error, "job '%s': input %d is a null pointer", plan->job, i);
      return FJ_ERROR_ARGUMENT;
    }
  for (int i = 0; i < plan->num_outputs; ++i)
    if (!outputs || !outputs[i]) {
      snprintf(fj_error, sizeof fj_error, "job '%s': output %d is a null pointer", plan->job, i);
      return FJ_ERROR_ARGUMENT;
    }
  pthread_mutex_lock(&ctx->mu);
  fj_workspace* w = ctx->free_list;
  if (w) ctx->free_list = w->next;
  pthread_mutex_unlock(&ctx->mu);
  if (!w && !(w = fj_workspace_new(plan))) {
    snprintf(fj_error, sizeof fj_error,
             "job '%s': out of memory for a call's workspace (%lld bytes)", plan->job,
             (long long)plan->arena_bytes);
    return FJ_ERROR_MEMORY;
  }
  int rc = FJ_OK;
  /* The kernels take 64-byte aligned buffers: others go through a copy. */
  const char *in[64], **in_p = in;
  char *out[64], **out_p = out;
  if (plan->num_inputs > 64) in_p = malloc(sizeof(char*) * (size_t)plan->num_inputs);
  if (plan->num_outputs > 64) out_p = malloc(sizeof(char*) * (size_t)plan->num_outputs);
  if (!in_p || !out_p) {
    rc = FJ_ERROR_MEMORY;
    snprintf(fj_error, sizeof fj_error, "job '%s': out of memory", plan->job);
    goto done;
  }
  for (int i = 0; i < plan->num_inputs; ++i) {
    in_p[i] = inputs[i];
    if (((uintptr_t)inputs[i]) % FJ_ALIGN == 0) continue;
    if (!w->staged[i] && !(w->staged[i] = fj_alloc(plan->input_bytes[i]))) {
      rc = FJ_ERROR_MEMORY;
      snprintf(fj_error, sizeof fj_error, "job '%s': out of memory", plan->job);
      goto done;
    }
    memcpy(w->staged[i], inputs[i], (size_t)plan->input_bytes[i]);
    in_p[i] = w->staged[i];
  }
  for (int i = 0; i < plan->num_outputs; ++i) {
    out_p[i] = outputs[i];
    if (((uintptr_t)outputs[i]) % FJ_ALIGN == 0) continue;
    char** s = &w->staged[plan->num_inputs + i];
    if (!*s && !(*s = fj_alloc(plan->output_bytes[i]))) {
      rc = FJ_ERROR_MEMORY;
      snprintf(fj_error, sizeof fj_error, "job '%s': out of memory", plan->job);
      goto done;
    }
    out_p[i] = *s;
  }
  /* Every launch's arguments. */
  for (int li = 0, a = 0; li < plan->num_launches; ++li) {
    const fj_launch* l = &plan->launches[li];
    for (int k = 0; k < l->num_args; ++k, ++a) {
      const fj_arg* r = &plan->args[l->first_arg + k];
      char* base = NULL;
      switch (r->kind) {
        case FJ_INPUT:
          base = (char*)in_p[r->index];
          break;
        case FJ_OUTPUT:
          base = out_p[r->index];
          break;
        case FJ_VARIABLE:
          base = (char*)plan->variable_data + plan->variable_offsets[r->index];
          break;
        default:
          base = w->arena;
          break;
      }
      w->argv[a] = base + r->offset;
    }
  }
  if (plan->status_offset >= 0) memset(w->arena + plan->status_offset, 0, 32);
  const int threads = ctx->pool.num_threads + 1;
  for (int li = 0; li < plan->num_launches; ++li) {
    const fj_launch* l = &plan->launches[li];
    char* const* args = w->argv + l->first_arg;
    if (l->range > 0) {
      if (l->range <= l->grain || threads <= 1) {
        l->fn(args, 0, l->range, w->scratch);
      } else {
        int64_t chunks = (l->range + l->grain - 1) / l->grain;
        if (chunks > threads) chunks = threads;
        fj_task t;
        memset(&t, 0, sizeof t);
        t.fn = l->fn;
        t.args = args;
        t.range = l->range;
        t.chunks = chunks;
        t.step = (l->range + chunks - 1) / chunks;
        atomic_init(&t.next, 0);
        atomic_init(&t.done, 0);
        atomic_init(&t.holders, 0);
        fj_parallel(&ctx->pool, &t, w->scratch);
      }
    }
    if (l->checks) {
      const int64_t* status = (const int64_t*)(w->arena + plan->status_offset);
      if (status[0] != 0) {
        fj_check_error(plan, status);
        rc = FJ_ERROR_CHECK;
        goto done;
      }
    }
  }
  for (int i = 0; i < plan->num_outputs; ++i)
    if (out_p[i] != outputs[i]) memcpy(outputs[i], out_p[i], (size_t)plan->output_bytes[i]);
done:
  if (in_p != in) free(in_p);
  if (out_p != out) free(out_p);
  pthread_mutex_lock(&ctx->mu);
  w->next = ctx->free_list;
  ctx->free_list = w;
  pthread_mutex_unlock(&ctx->mu);
  return rc;
}

/* ---- float16 conversions the kernels may call (LLVM's libcalls where the
 * CPU has no instruction for them), as flowjit's JIT defines them
 * (codegen/cpu/backend.cpp): round to nearest even. */
#if defined(__FLT16_MAX__)
static float fj_half_bits_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalize */
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t fj_double_to_half_bits(double v) {
  uint64_t b;
  memcpy(&b, &v, 8);
  uint16_t sign = (uint16_t)((b >> 48) & 0x8000);
  int exp = (int)((b >> 52) & 0x7ff);
  uint64_t man = b & 0xfffffffffffffull;
  if (exp == 0x7ff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  int e = exp - 1023 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00);
  uint64_t full = man | (1ull << 52); /* 53 bits */
  int shift;
  if (e <= 0) {
    if (e < -10) return sign;
    shift = 42 + 1 - e; /* subnormal */
    e = 0;
  } else {
    shift = 42;
  }
  uint64_t q = full >> shift, rem = full & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  if (e == 0) return (uint16_t)(sign | q); /* may round up into the smallest normal */
  uint32_t r = ((uint32_t)e << 10) + (uint32_t)(q & 0x3ff) + (uint32_t)((q >> 10) - 1) * 0x400;
  if (r >= 0x7c00) return (uint16_t)(sign | 0x7c00);
  return (uint16_t)(sign | r);
}

static _Float16 fj_bits_f16(uint16_t bits) {
  _Float16 h;
  memcpy(&h, &bits, 2);
  return h;
}
static uint16_t fj_f16_bits(_Float16 h) {
  uint16_t bits;
  memcpy(&bits, &h, 2);
  return bits;
}
FJ_HIDDEN float __extendhfsf2(_Float16 h) { return fj_half_bits_to_float(fj_f16_bits(h)); }
FJ_HIDDEN double __extendhfdf2(_Float16 h) { return fj_half_bits_to_float(fj_f16_bits(h)); }
FJ_HIDDEN _Float16 __truncsfhf2(float v) { return fj_bits_f16(fj_double_to_half_bits(v)); }
FJ_HIDDEN _Float16 __truncdfhf2(double v) { return fj_bits_f16(fj_double_to_half_bits(v)); }
#endif
