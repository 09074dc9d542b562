// diag: the diagnostics sink (diag.h).
#include "ir/diag.h"

#include <atomic>
#include <cstdio>
#include <string>

namespace flowjit::ir {

namespace {
std::atomic<DiagSink> g_sink{&diag_to_stderr};
}  // namespace

void diag_to_stderr(int /*level*/, std::string_view msg) {
  std::string line = "[flowjit] ";
  line.append(msg);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of threads don't mix
  std::fflush(stderr);
}

void diag(int level, std::string_view msg) {
  while (!msg.empty() && msg.back() == '\n') msg.remove_suffix(1);
  g_sink.load()(level, msg);
}

DiagSink set_diag_sink(DiagSink sink) { return g_sink.exchange(sink ? sink : &diag_to_stderr); }

}  // namespace flowjit::ir
