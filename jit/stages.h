// stages: a job whose ops are placed on different device sets
// (flow.scope.placement("cpu", "0:0") around some layers and "0:1" around
// others) cut into segments, each a graph that runs on one device set.
//
// Every op has a placement (ir::SourceLoc::placement, an index into
// DistributeOptions::stages): the scope it was traced in, for gradient and
// optimizer ops the placement of the op or variable they come from, and for
// ops traced outside every scope the placement of their first placed
// operand (of their first user for sources). An assign runs where its
// variable lives.
//
// A segment is the ops of one placement at one `level`, the number of
// placement changes on the longest path to them: a 2-stage MLP's train job
// has forward 0 (stage 0), forward 1 + backward 1 (stage 1), backward 0 +
// update 0 (stage 0 again). Edges between segments go to a higher level or
// stay in one stage, so ordering segments by level orders every producer
// before its users. A value one segment makes and another uses is an output
// of the producer and a parameter of the user (the transfer between device
// sets); job parameters go straight to every segment that reads them, and
// constants (fill, iota) are made again where they are used.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "jit/distribute.h"

namespace flowjit::jit {

// Where a segment's input (or a job result) comes from: output `index` of
// segment `segment`, or job input `index` when segment is -1.
struct StageWire {
  int segment = -1;
  int index = 0;
};

struct StageSegmentGraph {
  int stage = 0;  // index into DistributeOptions::stages
  int level = 0;
  ir::Graph graph;                // params: one per wire in `inputs`
  std::vector<StageWire> inputs;  // per parameter of `graph`
  std::vector<int> after;         // segments that must finish first besides the producers
};

struct StagePartition {
  std::vector<StageSegmentGraph> segments;  // by level, then stage
  std::vector<StageWire> outputs;           // per job result
  std::string description;                  // one line per segment
};

// Throws UserError(NotImplemented) for variables read in one segment after
// another assigned them.
StagePartition partition_stages(const ir::Graph& g, const DistributeOptions& opts);

}  // namespace flowjit::jit
