// optimizer: lowers `optimizer.minimize(loss)` into IR.
//
// The loss gradient follows OneFlow: a non-scalar loss is seeded with ones and
// every parameter gradient is scaled by 1 / (number of loss elements), so a
// per-sample loss trains like its mean (the seed is 1 / n directly, the same
// value). Then optional global-norm clipping, then one update per trainable
// variable written as assigns. Optimizer state (momentum, moments) lives in
// variables named after the parameter ("hidden-weight-momentum"), created
// zero-filled, so checkpoints carry it. The learning rate and the train step
// are IR values (the schedule is computed in the graph from the step
// variable), so a schedule never recompiles anything.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/node.h"

namespace flowjit::jit {

struct OptimizerConfig {
  enum class Kind { SGD, Adam, AdamW, RMSProp, LAMB, LARS };
  Kind kind = Kind::SGD;
  double momentum = 0.9;  // SGD and LARS; 0 is plain SGD
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  bool do_bias_correction = false;  // Adam, AdamW (LAMB always corrects)
  double weight_decay = 0;          // AdamW, LAMB, LARS
  // Weight decay applies to variables whose names contain one of `includes`
  // (all when empty) and none of `excludes`.
  std::vector<std::string> weight_decay_includes, weight_decay_excludes;
  double decay_rate = 0.99;  // RMSProp
  bool centered = false;     // RMSProp
  double lars_coefficient = 0.0001;
  double clip_norm = 0;  // grad_clipping.by_global_norm; 0 disables
  double loss_scale_factor = 1;
  std::vector<std::string> variables;  // restrict updates to these; empty = all trainable
  // The mirrored view over this many devices: each device's gradients are
  // averaged over all devices (all_reduce / parts) before the update, so
  // replicated variables stay equal (PyTorch DDP's rule).
  int mirrored_parts = 0;
};

struct OptimizerLowering {
  std::vector<ir::NodeRef> effects;  // assigns: parameters, state, step
  // State variables the lowering introduced; the caller creates them zeroed.
  std::vector<std::pair<std::string, ir::TensorType>> new_variables;
  // The gradients of `watched` (flow.watch_diff), as the backward pass sees
  // them: seeded with ones per loss element, before any scaling or clipping.
  std::vector<ir::NodeRef> watched_grads;
};

// `losses` are the blobs passed to minimize; `lr` is a rank-0 float32 value,
// `step` the job's int64 train-step variable (read before the update), and
// `params` the trainable Variable nodes the losses may depend on.
OptimizerLowering lower_optimizer(const OptimizerConfig& cfg,
                                  const std::vector<ir::NodeRef>& losses, const ir::NodeRef& lr,
                                  const ir::NodeRef& step, const std::vector<ir::NodeRef>& params,
                                  const std::vector<ir::NodeRef>& watched = {});

std::string optimizer_name(OptimizerConfig::Kind k);

}  // namespace flowjit::jit
