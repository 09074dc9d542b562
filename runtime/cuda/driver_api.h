// The CUDA driver API, loaded at run time from libcuda.so.1 (never linked),
// as a typed table of the functions flowjit uses.
//
// The types and constants are declared here rather than taken from cuda.h,
// so flowjit builds without a CUDA toolkit; driver_abi_check.cpp compares
// them with cuda.h where it is installed. Symbols are resolved by their ABI
// names (cuMemAlloc_v2 and so on: what cuda.h's macros map the plain names to).
//
// A table can also be filled by hand (tests: a fake driver), so the runtime's
// logic runs and is tested on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flowjit::runtime::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUstream_st;
struct CUmod_st;
struct CUfunc_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUevent = CUevent_st*;

constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorInvalidValue = 1;
constexpr CUresult kCudaErrorOutOfMemory = 2;
constexpr CUresult kCudaErrorNoDevice = 100;
constexpr CUresult kCudaErrorInvalidImage = 200;
constexpr CUresult kCudaErrorNotFound = 500;
constexpr CUresult kCudaErrorNotReady = 600;

constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;
constexpr int kJitInfoLogBuffer = 3;            // CU_JIT_INFO_LOG_BUFFER
constexpr int kJitInfoLogBufferSizeBytes = 4;   // CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
constexpr int kJitErrorLogBuffer = 5;           // CU_JIT_ERROR_LOG_BUFFER
constexpr int kJitErrorLogBufferSizeBytes = 6;  // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
constexpr int kMemoryTypeDevice = 2;            // CU_MEMORYTYPE_DEVICE

// A strided (2D) copy, cuda.h's CUDA_MEMCPY2D field for field: `Height` rows
// of `WidthInBytes`, rows `srcPitch` / `dstPitch` bytes apart. The NCCL
// communicator uses it to move blocks between [outer][ranks][inner] and the
// rank-major layout NCCL works in (checked against cuda.h in nccl_abi_check.cpp).
struct CUarray_st;
using CUarray = CUarray_st*;
struct CUDA_MEMCPY2D {
  size_t srcXInBytes = 0, srcY = 0;
  int srcMemoryType = 0;  // an enum in cuda.h
  const void* srcHost = nullptr;
  CUdeviceptr srcDevice = 0;
  CUarray srcArray = nullptr;
  size_t srcPitch = 0;
  size_t dstXInBytes = 0, dstY = 0;
  int dstMemoryType = 0;
  void* dstHost = nullptr;
  CUdeviceptr dstDevice = 0;
  CUarray dstArray = nullptr;
  size_t dstPitch = 0;
  size_t WidthInBytes = 0, Height = 0;
};

// X(member, ABI symbol, return type, parameters)
#define FLOWJIT_CUDA_DRIVER_FUNCTIONS(X)                                                           \
  X(cuInit, "cuInit", CUresult, (unsigned flags))                                                  \
  X(cuGetErrorString, "cuGetErrorString", CUresult, (CUresult error, const char** str))            \
  X(cuGetErrorName, "cuGetErrorName", CUresult, (CUresult error, const char** str))                \
  X(cuDriverGetVersion, "cuDriverGetVersion", CUresult, (int* version))                            \
  X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int* count))                                  \
  X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice * device, int ordinal))                        \
  X(cuDeviceGetName, "cuDeviceGetName", CUresult, (char* name, int len, CUdevice dev))             \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult,                                        \
    (int* value, int attrib, CUdevice dev))                                                        \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", CUresult, (size_t* bytes, CUdevice dev))              \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult,                                \
    (CUcontext * ctx, CUdevice dev))                                                               \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice dev))           \
  X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", CUresult, (CUcontext ctx))                            \
  X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", CUresult, (CUcontext * ctx))                            \
  X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, ())                                            \
  X(cuStreamCreate, "cuStreamCreate", CUresult, (CUstream * stream, unsigned flags))               \
  X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult, (CUstream stream))                            \
  X(cuStreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream stream))                       \
  X(cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr * ptr, size_t bytes))                      \
  X(cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr ptr))                                        \
  X(cuMemAllocHost, "cuMemAllocHost_v2", CUresult, (void** ptr, size_t bytes))                     \
  X(cuMemFreeHost, "cuMemFreeHost", CUresult, (void* ptr))                                         \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult,                                           \
    (CUdeviceptr dst, const void* src, size_t bytes, CUstream stream))                             \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult,                                           \
    (void* dst, CUdeviceptr src, size_t bytes, CUstream stream))                                   \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult,                                           \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))                             \
  X(cuMemcpy2DAsync, "cuMemcpy2DAsync_v2", CUresult, (const CUDA_MEMCPY2D* copy, CUstream stream)) \
  X(cuModuleLoadDataEx, "cuModuleLoadDataEx", CUresult,                                            \
    (CUmodule * module, const void* image, unsigned num_options, int* options, void** values))     \
  X(cuModuleUnload, "cuModuleUnload", CUresult, (CUmodule module))                                 \
  X(cuModuleGetFunction, "cuModuleGetFunction", CUresult,                                          \
    (CUfunction * fn, CUmodule module, const char* name))                                          \
  X(cuFuncSetAttribute, "cuFuncSetAttribute", CUresult, (CUfunction fn, int attrib, int value))    \
  X(cuLaunchKernel, "cuLaunchKernel", CUresult,                                                    \
    (CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,  \
     unsigned shared_bytes, CUstream stream, void** params, void** extra))                         \
  X(cuEventCreate, "cuEventCreate", CUresult, (CUevent * event, unsigned flags))                   \
  X(cuEventDestroy, "cuEventDestroy_v2", CUresult, (CUevent event))                                \
  X(cuEventRecord, "cuEventRecord", CUresult, (CUevent event, CUstream stream))                    \
  X(cuEventQuery, "cuEventQuery", CUresult, (CUevent event))                                       \
  X(cuEventSynchronize, "cuEventSynchronize", CUresult, (CUevent event))                           \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult,                                              \
    (CUstream stream, CUevent event, unsigned flags))

struct DriverApi {
#define FLOWJIT_CUDA_MEMBER(member, symbol, ret, params) ret(*member) params = nullptr;
  FLOWJIT_CUDA_DRIVER_FUNCTIONS(FLOWJIT_CUDA_MEMBER)
#undef FLOWJIT_CUDA_MEMBER
  std::string library;  // the path loaded ("" for a hand-made table)
  void* handle = nullptr;
};

// "CUDA_ERROR_OUT_OF_MEMORY: out of memory" (the driver's own texts), or
// "CUDA error 2" when the driver cannot name it.
std::string error_text(const DriverApi& api, CUresult r);

// Throws UserError(Runtime) "CUDA driver call cuMemAlloc failed:
// CUDA_ERROR_OUT_OF_MEMORY: out of memory (while <context>)" unless r is success.
void check(const DriverApi& api, CUresult r, const char* call, const std::string& context = "");
#define FLOWJIT_CU(api, call, ...) \
  ::flowjit::runtime::cuda::check((api), (api).call(__VA_ARGS__), #call)

// The message when libcuda.so.1 cannot be loaded.
extern const char* const kNoDriverMessage;

// Loads a driver library and resolves every function, then calls cuInit(0).
// Throws UserError(Runtime): kNoDriverMessage (plus dlerror's text) when the
// library is missing, "... lacks cuXxx" when a symbol is, and the cuInit
// failure (e.g. no device) otherwise. The library stays loaded.
DriverApi load_driver(const std::string& library = "libcuda.so.1");

// The process-wide driver: loaded once, from $FLOWJIT_LIBCUDA when set,
// otherwise libcuda.so.1. A failure is remembered and rethrown.
const DriverApi& driver();
// Whether driver() would succeed; never throws. `why` gets the message.
bool driver_available(std::string* why = nullptr);

}  // namespace flowjit::runtime::cuda
