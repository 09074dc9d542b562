/* The runtime of a job exported by flowjit.export: the plan as C data.
 *
 * flowjit.export compiles this header with _export_runtime.c and a generated
 * plan.c (the tables below for one job, and the job's entry points) into a
 * shared library beside the job's kernels (ELF objects from flowjit's CPU
 * code generator). It needs libc and libpthread only.
 *
 * A kernel follows flowjit's CPU kernel ABI (runtime/executable.h):
 *   void kernel(char *const *args, int64_t begin, int64_t end, char *scratch)
 * over the iterations [begin, end) of its launch's range; launches whose
 * range exceeds their grain are split into chunks over the context's threads,
 * each with `scratch_bytes` of scratch memory of its own. */
#ifndef FLOWJIT_EXPORT_RUNTIME_H
#define FLOWJIT_EXPORT_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#define FJ_HIDDEN __attribute__((visibility("hidden")))

typedef void (*fj_kernel)(char* const* args, int64_t begin, int64_t end, char* scratch);

/* A launch argument: abi::BufferKind's order. */
enum { FJ_INPUT = 0, FJ_OUTPUT = 1, FJ_VARIABLE = 2, FJ_ARENA = 3 };

typedef struct {
  int32_t kind;
  int32_t index;  /* input/output/variable index */
  int64_t offset; /* bytes into that buffer, or into the arena */
} fj_arg;

typedef struct {
  fj_kernel fn;
  int32_t first_arg, num_args; /* into fj_plan.args */
  int64_t range, grain, scratch_bytes;
  int32_t checks; /* the kernel reports failed checks to the status buffer */
} fj_launch;

/* A check of the run (an index range, or NaN/infinity): the status buffer's
 * int64 words {check + 1, value, flat position, 0} name the first that fails. */
typedef struct {
  const char* text; /* "job 'j', file.py:3: one_hot: indices" */
  int32_t numerics;
  int32_t rank;
  const int64_t* shape;
  int64_t limit; /* -1: limits[last index % num_limits] */
  const int64_t* limits;
  int32_t num_limits;
} fj_check;

typedef struct {
  const char* job;
  int32_t num_inputs, num_outputs, num_variables, num_launches, num_checks;
  const int64_t *input_bytes, *output_bytes;
  const unsigned char* variable_data; /* every variable, each 64-byte aligned */
  const int64_t* variable_offsets;
  const fj_launch* launches;
  const fj_arg* args;
  int64_t arena_bytes;
  int64_t status_offset; /* -1: no checks */
  int64_t scratch_bytes; /* the largest launch's */
  const fj_check* checks;
} fj_plan;

typedef struct fj_context fj_context;

/* Error codes of fj_run (and each job's _run). */
#define FJ_OK 0
#define FJ_ERROR_ARGUMENT 1 /* a null context or buffer */
#define FJ_ERROR_CHECK 2    /* a check of the run failed (fj_last_error says which) */
#define FJ_ERROR_MEMORY 3   /* memory for a call could not be allocated */

FJ_HIDDEN fj_context* fj_create(const fj_plan* plan, int num_threads);
FJ_HIDDEN void fj_destroy(fj_context* ctx);
FJ_HIDDEN int fj_run(fj_context* ctx, const void* const* inputs, void* const* outputs);
FJ_HIDDEN const char* fj_last_error(void);
FJ_HIDDEN int fj_num_threads(const fj_context* ctx);

#endif
