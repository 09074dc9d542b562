// pipeline: the pass pipeline and its logging.
#include "jit/pipeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include "ir/diag.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "jit/passes/cse.h"
#include "jit/passes/dce.h"
#include "jit/passes/decompose.h"
#include "jit/passes/fold.h"
#include "jit/passes/layout.h"
#include "jit/passes/reshape_sink.h"
#include "jit/passes/simplify.h"
#include "jit/passes/transpose_fold.h"
#include "jit/passes/widen_half.h"

namespace flowjit::jit {

using namespace ir;

void PassLog::stage(const std::string& name, double seconds, const std::string& detail) {
  times.emplace_back(name, seconds);
  if (debug >= 1) {
    char line[64];
    std::snprintf(line, sizeof line, ": %-18s %8.3f ms", name.c_str(), seconds * 1e3);
    diag(1, job + line + (detail.empty() ? "" : "  ") + detail);
  }
}

void PassLog::dump(const std::string& stage, const std::string& text) {
  if (dump_dir.empty()) return;
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "%03d", dump_counter++);
  // The directory is made on first use; a dump that cannot be written is
  // reported once instead of silently missing.
  std::error_code ec;
  std::filesystem::create_directories(dump_dir, ec);
  std::string name = job;  // a job name never leaves the directory
  for (char& c : name)
    if (c == '/' || c == '\0') c = '_';
  if (!name.empty() && name[0] == '.') name[0] = '_';
  std::string path = dump_dir + "/" + name + "." + prefix + "." + stage + ".txt";
  // The names are predictable, so a file is created exclusively and never
  // through a link: a planted link must not make us overwrite its target.
  // An earlier compile's dump (a regular file of ours) is replaced; unlink
  // removes a name, never what a link points to.
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(path.c_str(), flags, 0600);
  std::string why;
  if (fd < 0 && errno == EEXIST) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        ::unlink(path.c_str()) == 0)
      fd = ::open(path.c_str(), flags, 0600);
    else
      why = "it exists and is not a regular file of this user (a link?)";
  }
  if (fd < 0 && why.empty()) why = std::strerror(errno);
  size_t done = 0;
  while (fd >= 0 && done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = std::strerror(errno);
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (fd >= 0 && ::close(fd) != 0 && why.empty()) why = std::strerror(errno);
  if (!why.empty() && !dump_failed) {
    dump_failed = true;
    diag(0, "FLOWJIT_DUMP_DIR: cannot write " + path + ": " + why);
  }
}

Graph optimize(const Graph& input, PassLog& log, const OptimizeOptions& options) {
  Graph g = input;
  bool composites_left = true;
  auto run = [&](const char* name, const std::function<Graph(const Graph&)>& pass) {
    auto t0 = std::chrono::steady_clock::now();
    Graph next = pass(g);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bool unchanged = next.same_as(g);
    if (std::string(name) == "decompose") composites_left = false;
    verify_or_throw(next, name, VerifyOptions{composites_left});
    log.stage(std::string("pass ") + name, dt, unchanged ? "(unchanged)" : "");
    if (log.debug >= 2 && !unchanged)
      diag(2, log.job + " after " + name + ":\n" + print_graph(next));
    if (!unchanged) log.dump(name, print_graph(next, PrintOptions{true}));
    g = std::move(next);
  };
  verify_or_throw(g, "trace");
  run("simplify", simplify);
  run("fold", fold);
  run("cse", cse);
  run("transpose_fold", transpose_fold);
  run("layout", layout);
  run("decompose", decompose);
  run("widen_half",
      [&](const Graph& x) { return widen_half(x, options.f16_matmuls, options.bf16_matmuls); });
  run("reshape_sink", reshape_sink);
  run("simplify", simplify);
  run("fold", fold);
  run("dce", dce);
  return g;
}

}  // namespace flowjit::jit
