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

struct VariableStorage;

// A variable of a distributed job: the copies (replicated) or pieces (split
// along `split_axis`) that the devices of this process work on, kept in step
// with the session's value lazily (runtime/distributed.h).
struct Replicas {
  int split_axis = -1;                  // -1: every device holds the whole value
  int parts = 1;                        // devices in all (all processes)
  int first_rank = 0;                   // global rank of local[0]
  std::vector<VariableStorage*> local;  // one per device of this process
  bool host_stale = false;              // the devices hold newer values than `data`
  bool devices_stale = true;            // `data` holds newer values than the devices
};

// Copies of a variable in memory the host cannot address (GPUs: runtime/cuda,
// DeviceVariables), set when a GPU job binds the variable. sync_host and
// mark_host_written (runtime/distributed.h) call it, so that every host read
// of `data` sees the newest value and every host write reaches the devices.
struct DeviceCopies {
  virtual ~DeviceCopies() = default;
  // Copies the newest device value into host.data when a device holds one;
  // returns whether it did.
  virtual bool sync_host(VariableStorage& host) = 0;
  // host.data was written (or something on the host side will write it):
  // every device copy is stale until it is uploaded again.
  virtual void host_written() = 0;
};

struct VariableStorage {
  std::string name;
  ir::TensorType type;
  bool trainable = true;
  bool initialized = false;
  AlignedBuffer data;                           // type.bytes() bytes; the address never changes
  std::unique_ptr<Replicas> replicas;           // set when a distributed job uses it
  std::unique_ptr<DeviceCopies> device_copies;  // set when a GPU job uses it
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
