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
  double weight_decay = 0;          // SGD (SGDW), AdamW, LAMB, LARS
  // Weight decay applies to variables whose names contain one of `includes`
  // (all when empty) and none of `excludes`; or, when
  // `weight_decay_by_name` is set, to exactly the variables named in
  // `weight_decay_variables` (the Python API matches OneFlow's regular
  // expressions and sends the result).
  std::vector<std::string> weight_decay_includes, weight_decay_excludes;
  bool weight_decay_by_name = false;
  std::vector<std::string> weight_decay_variables;
  double decay_rate = 0.99;  // RMSProp
  bool centered = false;     // RMSProp
  double lars_coefficient = 0.0001;
  double clip_norm = 0;  // grad_clipping.by_global_norm over this rule's gradients; 0 disables
  double loss_scale_factor = 1;
  std::vector<std::string> variables;  // a group's variables (see `groups`)
  // A group's own learning rate (rank-0 float); null: the job's `lr`.
  ir::NodeRef lr;
  // CombinedOptimizer: one rule per disjoint set of variables, each with its
  // own rate and clipping; the top-level rule fields are then unused, the
  // loss scaling and the mirrored view stay top-level.
  std::vector<OptimizerConfig> groups;
  // OneFlow's dynamic loss scale policy: the loss is scaled by the float32
  // variable `loss_scale` and the gradients unscaled by it; a step whose
  // gradients hold an inf or a nan changes no parameter or optimizer state
  // and divides the scale by `multiplier` (not below 1); after
  // `increment_period` good steps in a row (counted in the int64 variable
  // `good_steps`) the scale is multiplied by `multiplier` (up to FLT_MAX).
  // Null: the static loss_scale_factor.
  ir::NodeRef loss_scale, good_steps;
  int64_t increment_period = 2000;
  double multiplier = 2.0;
  // OneFlow's indexed_slices_optimizer_conf: these variables (embedding
  // tables) are updated as by a sparse gradient, only in the rows (along
  // axis 0) the step's gradient touches: a row whose gradient is all zero
  // keeps its value and its optimizer state (no weight decay, no momentum
  // step). OneFlow updates the rows gathered; a gathered row whose
  // gradient sums to exactly zero is the one difference.
  std::vector<std::string> sparse_variables;
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
