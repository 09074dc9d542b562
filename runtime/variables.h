// The session's variable store: named, typed, aligned storage shared by every
// job that names a variable.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/types.h"
#include "runtime/memory.h"

namespace flowjit::runtime {

struct VariableStorage {
  std::string name;
  ir::TensorType type;
  bool trainable = true;
  bool initialized = false;
  AlignedBuffer data;  // type.bytes() bytes; the address never changes
  char* ptr() const { return data.get(); }
};

class VariableStore {
 public:
  // Returns the variable or nullptr.
  VariableStorage* find(const std::string& name);
  // Creates a zero-filled variable. Throws UserError if the name exists with
  // another type.
  VariableStorage* get_or_create(const std::string& name, const ir::TensorType& type,
                                 bool trainable, bool* created = nullptr);
  std::vector<VariableStorage*> all();  // sorted by name
  void clear();
  size_t size();

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<VariableStorage>> vars_;
};

}  // namespace flowjit::runtime
