// The session's variable store.
#include "runtime/variables.h"

#include "ir/error.h"

namespace flowjit::runtime {

VariableStorage* VariableStore::find(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : it->second.get();
}

VariableStorage* VariableStore::get_or_create(const std::string& name, const ir::TensorType& type,
                                              bool trainable, bool* created) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vars_.find(name);
  if (created) *created = false;
  if (it != vars_.end()) {
    FJ_USER_CHECK(it->second->type == type, ErrorKind::Value, "variable '", name,
                  "' already exists as ", it->second->type.str(), " but is now requested as ",
                  type.str(),
                  "; two jobs (or two layers) use the same name with different "
                  "shapes: give one of them another name");
    return it->second.get();
  }
  auto v = std::make_unique<VariableStorage>();
  v->name = name;
  v->type = type;
  v->trainable = trainable;
  v->data = allocate_aligned(static_cast<size_t>(type.bytes()));
  VariableStorage* raw = v.get();
  vars_[name] = std::move(v);
  if (created) *created = true;
  return raw;
}

std::vector<VariableStorage*> VariableStore::all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<VariableStorage*> out;
  for (auto& [k, v] : vars_) out.push_back(v.get());
  return out;
}

void VariableStore::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  vars_.clear();
}

size_t VariableStore::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return vars_.size();
}

}  // namespace flowjit::runtime
