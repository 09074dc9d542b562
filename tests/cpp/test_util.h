// Helpers shared by the C++ tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "abi/launch.h"
#include "codegen/kernel.h"
#include "ir/node.h"

namespace flowjit::testing {

// A fresh directory under the system temp dir (mkdtemp: unique across
// processes and threads), removed with everything in it at the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "flowjit-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Launch records for kernels compiled without a plan (what fusion would
// make: the kernels' names, geometry left for codegen to write).
inline std::vector<abi::Launch> launch_records(const std::vector<codegen::Kernel>& kernels) {
  std::vector<abi::Launch> out(kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) out[i].symbol = kernels[i].name;
  return out;
}

// A job parameter: a Parameter node named `name`, the job's argument `index`.
inline ir::NodeRef param(const std::string& name, int64_t index, const ir::Shape& s,
                         ir::DType dt = ir::DType::Float32) {
  return ir::make_node(ir::OpKind::Parameter, {},
                       ir::Attrs{{"name", name}, {"index", index}, {"shape", s}, {"dtype", dt}});
}

}  // namespace flowjit::testing
