// Compile units of the CPU backend: a kernel's structural key, the process
// cache of compiled kernel code keyed by it, and the object container that
// carries several units and the kernels' symbol names as one artifact.
// Only codegen/cpu includes this.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "codegen/cpu/cpu_codegen.h"
#include "codegen/kernel.h"

namespace flowjit::codegen::cpu {

// Everything that decides a kernel's code except its name and summary, as
// bytes: two kernels with equal keys compile to the same machine code (with
// the same symbol) for the same target and optimization level. Without
// `with_seeds` the Random nodes' seeds are left out: the key of a seeded
// body, whose code reads them at run time.
std::string structural_key(const Kernel& k, bool with_seeds = true);

// The symbol a unit's code is compiled under: "fjk_" and 32 hex digits of a
// SHA-256 of the unit key (structural key, target id, optimization level).
std::string unit_symbol(const std::string& unit_key);

// One kernel compiled alone: a relocatable object defining `symbol`.
struct CompiledUnit {
  std::string symbol;
  std::vector<char> object;
  abi::CpuRange shape;
  std::string llvm_ir;   // optimized module text; empty when it was not asked for
  std::string assembly;  // only in a unit compiled for a call that asked for it
  double seconds_emit = 0, seconds_optimize = 0, seconds_codegen = 0;
  // LLVM IR instructions of the module as emitted and after optimization
  // (FLOWJIT_DEBUG=2's line per kernel: what the emitter hands LLVM).
  size_t ir_emitted = 0, ir_optimized = 0;
  size_t bytes() const { return object.size() + llvm_ir.size() + symbol.size() + 64; }
};

// Compiled units of this process by unit key, bounded in bytes (the whole
// cache is dropped when a new unit would pass the bound; units in use stay
// alive through their shared_ptr). Thread-safe.
class UnitCache {
 public:
  static UnitCache& process();
  std::shared_ptr<const CompiledUnit> find(const std::string& key);
  void put(const std::string& key, std::shared_ptr<const CompiledUnit> unit);
  void clear();
  size_t size();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledUnit>> units_;
  size_t bytes_ = 0;
};

// The container of a compiled job (CompiledObject::object): several ELF
// objects and a table naming, for each kernel symbol a caller looks up, the
// unit symbol that defines its code.
//   "FJKOBJS\0", u32 version, u32 objects, u32 aliases,
//   objects: u64 size, bytes; aliases: u32 size, name, u32 size, target.
// Integers little-endian. A plain ELF object (no container) is still loaded.
constexpr uint32_t kContainerVersion = 1;

struct UnpackedObjects {
  std::vector<std::pair<const char*, size_t>> objects;  // views into the container
  std::map<std::string, std::string> aliases;
};

std::vector<char> pack_objects(const std::vector<const std::vector<char>*>& objects,
                               const std::vector<std::pair<std::string, std::string>>& aliases);
bool is_container(const std::vector<char>& blob);
// Throws UserError(Runtime) for a truncated or damaged container, or one of
// another version.
UnpackedObjects unpack_objects(const std::vector<char>& blob);

}  // namespace flowjit::codegen::cpu
