// Fuzzes the IR text parser (ir/printer.h: parse_graph). Any input either
// parses or throws UserError; what parses prints, and the print parses back
// to the same print (the printer and the parser agree).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ir/error.h"
#include "ir/printer.h"
#include "ir/verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string printed;
  try {
    flowjit::ir::Graph g = flowjit::ir::parse_graph(text);
    flowjit::ir::verify_graph(g);
    printed = flowjit::ir::print_graph(g);
  } catch (const flowjit::UserError&) {
    return 0;  // rejected with a message: fine
  }
  // A graph that parsed must survive its own print (InternalError or a
  // UserError here is a finding: libFuzzer reports the uncaught exception).
  flowjit::ir::Graph again = flowjit::ir::parse_graph(printed);
  std::string reprinted = flowjit::ir::print_graph(again);
  if (reprinted != printed) {
    std::fprintf(stderr, "print/parse round trip differs:\n%s\n---\n%s\n", printed.c_str(),
                 reprinted.c_str());
    std::abort();
  }
  return 0;
}
