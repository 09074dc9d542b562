/* Runs an exported job from C (tests/python/test_export.py): reads each
 * input from a file, runs the job, writes each output to a file.
 *
 *   driver IN... OUT... [THREADS CALLS]
 *
 * With THREADS > 1, that many threads call the job CALLS times each on one
 * context, at once; every call's outputs must equal the first call's
 * (exit 4 otherwise). Exits 3 when Python or LLVM is mapped into the
 * process, 2 with the job's error message when a call fails.
 * Compiled with -DJOB=<prefix> -DHEADER=\"file.h\". */
#include HEADER

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define FN(x) CAT(JOB, x)

static const long long in_bytes[] = IN_BYTES;
static const long long out_bytes[] = OUT_BYTES;
enum { NI = sizeof in_bytes / sizeof in_bytes[0], NO = sizeof out_bytes / sizeof out_bytes[0] };

static FN(_context) * ctx;
static void* ins[NI + 1];
static void* first[NO + 1];
static int calls = 1;
static int mismatches = 0, failures = 0;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void* worker(void* arg) {
  (void)arg;
  void* outs[NO + 1];
  for (int i = 0; i < NO; ++i)
    outs[i] = (char*)malloc((size_t)out_bytes[i] + 1) + 1; /* unaligned */
  for (int c = 0; c < calls; ++c) {
    if (FN(_run_arrays)(ctx, (const void* const*)ins, outs) != FLOWJIT_OK) {
      pthread_mutex_lock(&mu);
      ++failures;
      pthread_mutex_unlock(&mu);
      continue;
    }
    for (int i = 0; i < NO; ++i)
      if (memcmp(outs[i], first[i], (size_t)out_bytes[i]) != 0) {
        pthread_mutex_lock(&mu);
        ++mismatches;
        pthread_mutex_unlock(&mu);
      }
  }
  for (int i = 0; i < NO; ++i) free((char*)outs[i] - 1);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 1 + NI + NO) {
    fprintf(stderr, "usage: driver IN... OUT... [THREADS CALLS]\n");
    return 1;
  }
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, "python") || strstr(line, "LLVM") || strstr(line, "libtbb")) {
      fprintf(stderr, "mapped: %s", line);
      return 3;
    }
  if (maps) fclose(maps);
  for (int i = 0; i < NI; ++i) {
    ins[i] = aligned_alloc(64, ((size_t)in_bytes[i] + 63) / 64 * 64 + 64);
    FILE* f = fopen(argv[1 + i], "rb");
    if (!f || fread(ins[i], 1, (size_t)in_bytes[i], f) != (size_t)in_bytes[i]) {
      fprintf(stderr, "cannot read %s\n", argv[1 + i]);
      return 1;
    }
    fclose(f);
  }
  int threads = argc > 1 + NI + NO ? atoi(argv[1 + NI + NO]) : 1;
  calls = argc > 2 + NI + NO ? atoi(argv[2 + NI + NO]) : 1;
  ctx = FN(_create)(0);
  if (!ctx) {
    fprintf(stderr, "create: %s\n", FN(_last_error)());
    return 2;
  }
  for (int i = 0; i < NO; ++i)
    first[i] = aligned_alloc(64, ((size_t)out_bytes[i] + 63) / 64 * 64 + 64);
  if (FN(_run_arrays)(ctx, (const void* const*)ins, first) != FLOWJIT_OK) {
    fprintf(stderr, "%s\n", FN(_last_error)());
    return 2;
  }
  if (threads > 1) {
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
    if (failures || mismatches) {
      fprintf(stderr, "%d failed calls, %d calls with other outputs\n", failures, mismatches);
      return 4;
    }
  }
  for (int i = 0; i < NO; ++i) {
    FILE* f = fopen(argv[1 + NI + i], "wb");
    if (!f || fwrite(first[i], 1, (size_t)out_bytes[i], f) != (size_t)out_bytes[i]) return 1;
    fclose(f);
  }
  FN(_destroy)(ctx);
  return 0;
}
