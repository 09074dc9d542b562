// The CUDA toolkit pieces the backend uses at compile time: finding ptxas and
// libdevice, and running ptxas on PTX text (temporary files, captured output).
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/nvptx/backend.h"

extern char** environ;

namespace flowjit::codegen::nvptx {

namespace {

bool is_file(const std::string& p) {
  struct stat st;
  return !p.empty() && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_executable(const std::string& p) { return is_file(p) && ::access(p.c_str(), X_OK) == 0; }

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> toolkit_roots() {
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (!env(var).empty()) roots.push_back(env(var));
  roots.push_back("/usr/local/cuda");
  return roots;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string find_ptxas() {
  if (const char* v = std::getenv("FLOWJIT_PTXAS")) return is_executable(v) ? v : "";
  for (const std::string& r : toolkit_roots())
    if (is_executable(r + "/bin/ptxas")) return r + "/bin/ptxas";
  std::stringstream path(env("PATH"));
  std::string dir;
  while (std::getline(path, dir, ':'))
    if (!dir.empty() && is_executable(dir + "/ptxas")) return dir + "/ptxas";
  return "";
}

std::string find_libdevice() {
  if (const char* v = std::getenv("FLOWJIT_LIBDEVICE")) return is_file(v) ? v : "";
  std::vector<std::string> candidates;
  for (const std::string& r : toolkit_roots())
    candidates.push_back(r + "/nvvm/libdevice/libdevice.10.bc");
  candidates.push_back("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc");
  for (const std::string& c : candidates)
    if (is_file(c)) return c;
  return "";
}

PtxasResult run_ptxas(const std::string& ptx, int sm, const std::string& ptxas,
                      const std::vector<std::string>& extra_args) {
  PtxasResult r;
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "flowjit-ptxas-XXXXXX").string();
  std::vector<char> dir_buf(tmpl.begin(), tmpl.end());
  dir_buf.push_back('\0');
  if (!::mkdtemp(dir_buf.data())) {
    r.log = std::string("cannot create a temporary directory: ") + std::strerror(errno);
    return r;
  }
  std::string dir = dir_buf.data();
  std::string in = dir + "/kernels.ptx", out = dir + "/kernels.cubin", log = dir + "/ptxas.log";
  {
    std::ofstream f(in, std::ios::binary);
    f << ptx;
  }
  std::vector<std::string> args = {ptxas, "--gpu-name", "sm_" + std::to_string(sm), "-O3"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  args.insert(args.end(), {in, "-o", out});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, ptxas.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.log = "cannot run " + ptxas + ": " + std::strerror(rc);
  } else {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.log = read_file(log);
    if (r.exit_code == 0 && is_file(out)) {
      std::string bin = read_file(out);
      r.cubin.assign(bin.begin(), bin.end());
      r.ok = !r.cubin.empty();
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

}  // namespace flowjit::codegen::nvptx
