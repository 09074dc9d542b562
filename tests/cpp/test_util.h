// Helpers shared by the C++ tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

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

}  // namespace flowjit::testing
