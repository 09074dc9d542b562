// Lowering of kernel bodies (KNode DAGs) to LLVM IR, shared by the backends.
//
// ExprEmitter evaluates KNodes at the current index context: one i64 per
// domain dimension, of which one (vec_dim) may be vectorized `width` lanes
// wide starting at its index. Results are memoized per scope. A backend
// supplies the loop structure and a MathProvider for transcendental
// functions and random numbers (CPU: codegen/mathlib; GPU: libdevice).
#pragma once

#include <llvm/IR/IRBuilder.h>

#include <functional>
#include <map>
#include <vector>

#include "codegen/kernel.h"

namespace flowjit::codegen {

class MathProvider {
 public:
  virtual ~MathProvider() = default;
  // op is one of Exp, Log, Tanh, Sigmoid, Sin, Cos, Erf, Erfc.
  virtual llvm::Value* unary(llvm::IRBuilderBase& b, OpKind op, llvm::Value* x) = 0;
  virtual llvm::Value* pow(llvm::IRBuilderBase& b, llvm::Value* x, llvm::Value* y) = 0;
  // op is one of RandomUniform, RandomNormal, TruncatedNormal; counter is i64
  // (or a vector of i64), seed an i64 scalar (a constant, or a value read at
  // run time) and `type` the float result type.
  virtual llvm::Value* random(llvm::IRBuilderBase& b, OpKind op, llvm::Value* counter,
                              llvm::Value* seed, llvm::Type* type) = 0;
};

// An empty block `name` (just a branch on) where code is hoisted later,
// inserted at the builder's position, which continues in a new block `next`;
// leaves the builder there and returns the hoisting block (its terminator is
// where hoisted code goes). Shared by every backend's loop structure.
llvm::BasicBlock* open_hoist_block(llvm::IRBuilderBase& b, const char* name, const char* next);

// for (iv = lo; iv < hi; iv += step) body(iv), iv of lo's type; leaves the
// builder after the loop. Shared by every backend's loop structure.
void emit_for(llvm::IRBuilderBase& b, llvm::Value* lo, llvm::Value* hi, llvm::Value* step,
              const std::function<void(llvm::Value*)>& body, const char* name = "i");

llvm::Type* reg_type(llvm::LLVMContext& c, DType t);  // i1 for bool
llvm::Type* mem_type(llvm::LLVMContext& c, DType t);  // i8 for bool
// Between a loaded element (mem_type) and its register value (reg_type):
// bool i8 <-> i1, float16 half <-> float, bfloat16 i16 bits <-> float (round
// to nearest even). Identity for the other types; scalars or vectors.
llvm::Value* from_mem(llvm::IRBuilderBase& b, llvm::Value* v, DType t);
llvm::Value* to_mem(llvm::IRBuilderBase& b, llvm::Value* v, DType t);
llvm::Type* with_width(llvm::Type* scalar, int width);  // width 1: the scalar
int lanes_of(llvm::Type* t);                            // 1 for a scalar

// Reduction algebra, shared by loop and backend code.
llvm::Value* reduce_identity(llvm::IRBuilderBase& b, OpKind op, DType t, int width);
llvm::Value* reduce_combine(llvm::IRBuilderBase& b, OpKind op, DType t, llvm::Value* acc,
                            llvm::Value* v);
llvm::Value* reduce_horizontal(llvm::IRBuilderBase& b, OpKind op, DType t, llvm::Value* vec);

// [harden] Kernel::guard_arg: makes `f` (a finished kernel) return at entry
// when the int64 at `status` (made by `status` in the entry block) is not
// zero; with `words` > 1 (Kernel::guard_words), when any of status[0],
// status[4], ... status[4 * (words - 1)] is not. One load per word and
// call, on a branch marked unlikely.
void add_status_guard(llvm::Function* f,
                      const std::function<llvm::Value*(llvm::IRBuilderBase&)>& status,
                      int words = 1);

class ExprEmitter {
 public:
  ExprEmitter(const Kernel& k, llvm::IRBuilderBase& b, MathProvider& math,
              std::vector<llvm::Value*> arg_ptrs);

  // ---- index context (set by the loop structure)
  std::vector<llvm::Value*> idx;  // i64 per domain dim; nullptr means 0
  int vec_dim = -1;
  int width = 1;
  llvm::Value* mask = nullptr;  // <width x i1> lanes in bounds, or nullptr (all)
  // Vector stores to this argument (contiguous, unmasked) are non-temporal
  // and aligned to the whole vector: the loop structure guarantees that
  // alignment (it peels to it) before setting this; -1 means none.
  int nontemporal_arg = -1;
  // The seed of Random node i when the code reads it at run time (an i64
  // computed once at the function's entry); empty, or nullptr for a node:
  // the node's seed is a constant of the code.
  std::vector<llvm::Value*> seeds;

  // ---- memoization scopes
  void push_scope();
  void pop_scope();
  void set_value(int node, llvm::Value* v);  // in the current scope
  // Kept-space nodes are evaluated at `kept_point` (a block that dominates
  // the reduced loops) with `kept_width`, and splat to the current width.
  void set_kept_point(llvm::BasicBlock* bb, int kept_width);
  void clear_kept_point();
  // Invariant nodes (KNode::invariant) are evaluated once, as scalars, at
  // `bb` (a block that dominates every loop of the kernel), and splat to the
  // width where they are used. Without it they are evaluated where used: the
  // loads of such a node stay in the loop, since the kernel's stores may
  // alias them as far as LLVM knows.
  void set_invariant_point(llvm::BasicBlock* bb);

  llvm::Value* eval(int node);
  void store(const Store& s, llvm::Value* v);

  // Element address of `a` at the context's scalar point (lane 0).
  llvm::Value* element_offset(const std::vector<int64_t>& strides, int64_t offset);
  llvm::Value* lane_offsets(int64_t stride);  // <width x i64> of lane * stride
  // sum over d of idx[d] * strides[d] + base, with lanes along vec_dim.
  llvm::Value* index_value(const std::vector<int64_t>& strides, int64_t base);

  llvm::Value* compute(const KNode& n, const std::vector<llvm::Value*>& ops);
  llvm::Value* splat(llvm::Value* scalar, int width);

  const Kernel& kernel() const { return k_; }
  llvm::IRBuilderBase& builder() { return b_; }

 private:
  llvm::Value* eval_here(int node);
  llvm::Value* load(const Access& a, DType t);
  llvm::Value* guarded_load(const Access& a, DType t);
  llvm::Value* cast(llvm::Value* v, DType from, DType to);
  // Index checks (KNode CheckIndex, checked Indirect): lanes of `value`
  // (i64, `width` lanes) outside [0, limit) under the current mask are
  // reported to the status buffer with their positions.
  void check_range(llvm::Value* value, int64_t limit, llvm::Value* pos, int check);
  // Lanes of `bad` (under the current mask) reported with value and position.
  void report(llvm::Value* bad, llvm::Value* value, llvm::Value* pos, int check);
  llvm::Value* constant(double v, DType t);
  llvm::Value* lookup(int node, int width);

  const Kernel& k_;
  llvm::IRBuilderBase& b_;
  MathProvider& math_;
  std::vector<llvm::Value*> args_;
  std::vector<std::map<std::pair<int, int>, llvm::Value*>> scopes_;
  llvm::BasicBlock* kept_bb_ = nullptr;
  int kept_width_ = 1;
  int kept_scope_ = 0;
  bool in_kept_eval_ = false;
  llvm::BasicBlock* invariant_bb_ = nullptr;
  bool in_invariant_eval_ = false;
  llvm::Value* eval_invariant(int node);
  // eval() nesting: the outermost call evaluates the operand DAG bottom-up
  // with an explicit stack first, so a chain of 10,000 fused ops does not
  // recurse 10,000 frames deep (a stack overflow before).
  int eval_depth_ = 0;
  void eval_operands_first(int node);
  llvm::Value* eval_memoized(int node);
};

}  // namespace flowjit::codegen
