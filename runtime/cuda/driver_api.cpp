// Loading libcuda.so.1 with dlopen and checking driver calls.
#include "runtime/cuda/driver_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "ir/error.h"

namespace flowjit::runtime::cuda {

const char* const kNoDriverMessage =
    "no CUDA driver: libcuda.so.1 not found; jobs placed on a GPU need an NVIDIA driver";

std::string error_text(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName) api.cuGetErrorName(r, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(r, &text);
  if (!name && !text) return "CUDA error " + std::to_string(r);
  std::string s = name ? name : "CUDA error " + std::to_string(r);
  if (text) s += std::string(": ") + text;
  return s;
}

void check(const DriverApi& api, CUresult r, const char* call, const std::string& context) {
  if (r == kCudaSuccess) return;
  // "cuMemAlloc" rather than the ABI name's version suffix.
  throw_user(ErrorKind::Runtime, "CUDA driver call ", call, " failed: ", error_text(api, r),
             context.empty() ? "" : " (" + context + ")");
}

DriverApi load_driver(const std::string& library) {
  void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    throw_user(ErrorKind::Runtime, kNoDriverMessage,
               library == "libcuda.so.1" ? "" : " (tried " + library + ")",
               e ? std::string(" [") + e + "]" : "");
  }
  DriverApi api;
  api.library = library;
  api.handle = h;
  std::string missing;
#define FLOWJIT_CUDA_RESOLVE(member, symbol, ret, params)           \
  api.member = reinterpret_cast<ret(*) params>(::dlsym(h, symbol)); \
  if (!api.member) missing += std::string(missing.empty() ? "" : ", ") + symbol;
  FLOWJIT_CUDA_DRIVER_FUNCTIONS(FLOWJIT_CUDA_RESOLVE)
#undef FLOWJIT_CUDA_RESOLVE
  if (!missing.empty()) {
    ::dlclose(h);
    throw_user(ErrorKind::Runtime, "the CUDA driver ", library, " lacks ", missing,
               " (an NVIDIA driver for CUDA 11 or newer is needed)");
  }
  check(api, api.cuInit(0), "cuInit", "initializing the CUDA driver from " + library);
  return api;
}

namespace {
struct Loaded {
  std::unique_ptr<DriverApi> api;
  std::string error;
};
Loaded& loaded() {
  static Loaded l = [] {
    Loaded r;
    const char* env = std::getenv("FLOWJIT_LIBCUDA");
    try {
      r.api = std::make_unique<DriverApi>(load_driver(env && *env ? env : "libcuda.so.1"));
    } catch (const UserError& e) {
      r.error = e.what();
    }
    return r;
  }();
  return l;
}
}  // namespace

const DriverApi& driver() {
  Loaded& l = loaded();
  if (!l.api) throw UserError(ErrorKind::Runtime, l.error);
  return *l.api;
}

bool driver_available(std::string* why) {
  Loaded& l = loaded();
  if (why) *why = l.error;
  return l.api != nullptr;
}

}  // namespace flowjit::runtime::cuda
