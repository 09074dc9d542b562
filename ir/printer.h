// The IR text form: a printer, and a parser that reads the printer's output.
//
//   graph predict_job {
//     %x = parameter() {dtype=f32, index=0, name="x", shape=[4,3]} : f32[4,3]  @"job.py":7
//     %0 = variable() {dtype=f32, name="w", shape=[3,2]} : f32[3,2]
//     %1 = matmul(%x, %0) {transpose_a=false, transpose_b=false} : f32[4,2]
//     return %1
//   }
//
// Parameters are named by their `name` attribute; other nodes are numbered in
// topological order. Effects are listed after `effects`. Locations are
// optional (`@"file":line`); print_graph omits them unless asked.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "ir/graph.h"

namespace flowjit::ir {

struct PrintOptions {
  bool locations = false;
};

std::string print_graph(const Graph& g, PrintOptions opts = {});

// A double as the printer writes attributes: the shortest form that reads
// back exactly ("0.2", "1e-09", "inf", "nan"; a ".0" added to integers).
std::string format_double(double d);

// The names print_graph gives to every node of `g` ("%x", "%3"), so that
// other dumps (the fusion plan) can refer to the printed IR.
std::unordered_map<const Node*, std::string> value_names(const Graph& g);
std::string print_attrs(const Attrs& a);  // "{k=v, ...}" or "" when empty
std::string print_attr_value(const AttrValue& v);

// Parses print_graph's output. Throws UserError (ErrorKind::Value) with the
// line and column of the first problem.
Graph parse_graph(std::string_view text);

}  // namespace flowjit::ir
