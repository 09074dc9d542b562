// diag: the C++ core's diagnostics (FLOWJIT_DEBUG's stage lines, IR and
// assembly prints, dump-dir and target warnings) through one settable sink.
// The default sink writes "[flowjit] <message>" to stderr (C++ tests, use
// without Python); the Python binding installs one that hands each message
// to logging.getLogger("flowjit").
#pragma once

#include <string_view>

namespace flowjit::ir {

// level: the FLOWJIT_DEBUG level a message belongs to. 0: a warning, said
// whatever the level; 1: stage lines, cache and kernel choices (logging's
// INFO); 2 and more: detail, the IR, fusion plan, LLVM IR, assembly (DEBUG).
// A sink may be called from any thread (kernels compile on the pool), so it
// must be thread-safe.
using DiagSink = void (*)(int level, std::string_view msg);

// Says msg (one line or several; trailing newlines are dropped) to the sink.
void diag(int level, std::string_view msg);
// Installs sink (nullptr: the default, stderr) and returns the one before.
DiagSink set_diag_sink(DiagSink sink);
// The default sink: "[flowjit] msg\n" on stderr, in one write.
void diag_to_stderr(int level, std::string_view msg);

}  // namespace flowjit::ir
