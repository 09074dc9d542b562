// What both segment_sum emitters (cpu.cpp, nvptx.cpp) emit alike.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include "codegen/emit.h"
#include "codegen/kernel.h"

namespace flowjit::codegen {

// The segment id ids[index] as an i64 (uint8 ids zero-extended); when it
// falls in the block [s0, s0 + span) (unsigned: an id below s0, a negative
// one too, wraps high), hit(id) is emitted in a block of its own. Leaves the
// builder after it.
template <typename Hit>
void if_id_in_block(llvm::IRBuilderBase& b, llvm::Function* f, llvm::Value* ids, llvm::Value* index,
                    DType t, llvm::Value* s0, llvm::Value* span, Hit hit) {
  llvm::Type* id_type = mem_type(b.getContext(), t);
  llvm::Value* raw = b.CreateAlignedLoad(id_type, b.CreateGEP(id_type, ids, index),
                                         llvm::Align(ir::dtype_bytes(t)), "id");
  llvm::Value* id = t == DType::UInt8 ? b.CreateZExt(raw, b.getInt64Ty())
                                      : b.CreateSExtOrTrunc(raw, b.getInt64Ty());
  auto* in = llvm::BasicBlock::Create(b.getContext(), "hit", f);
  auto* next = llvm::BasicBlock::Create(b.getContext(), "next", f);
  b.CreateCondBr(b.CreateICmpULT(b.CreateSub(id, s0), span), in, next);
  b.SetInsertPoint(in);
  hit(id);
  b.CreateBr(next);
  b.SetInsertPoint(next);
}

}  // namespace flowjit::codegen
