// Compile-time check that driver_api.h's own declarations match cuda.h where
// a CUDA toolkit is installed (flowjit itself never needs cuda.h).
#include "runtime/cuda/driver_api.h"  // first: cuda.h's macros rename cu* names

#if __has_include(<cuda.h>)
#include <cuda.h>

#include <type_traits>

namespace fc = flowjit::runtime::cuda;

static_assert(std::is_same_v<fc::CUdeviceptr, ::CUdeviceptr>, "CUdeviceptr");
static_assert(std::is_same_v<fc::CUdevice, ::CUdevice>, "CUdevice");
static_assert(sizeof(fc::CUresult) == sizeof(::CUresult), "CUresult");
static_assert(fc::kCudaSuccess == CUDA_SUCCESS);
static_assert(fc::kCudaErrorInvalidValue == CUDA_ERROR_INVALID_VALUE);
static_assert(fc::kCudaErrorOutOfMemory == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(fc::kCudaErrorNoDevice == CUDA_ERROR_NO_DEVICE);
static_assert(fc::kCudaErrorInvalidImage == CUDA_ERROR_INVALID_IMAGE);
static_assert(fc::kCudaErrorNotFound == CUDA_ERROR_NOT_FOUND);
static_assert(fc::kCudaErrorNotReady == CUDA_ERROR_NOT_READY);
static_assert(fc::kAttrMaxThreadsPerBlock == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
static_assert(fc::kAttrMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(fc::kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(fc::kAttrComputeCapabilityMinor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(fc::kAttrMaxSharedMemoryPerBlockOptin ==
              CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
static_assert(fc::kFuncAttrMaxDynamicSharedSizeBytes ==
              CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(fc::kStreamNonBlocking == CU_STREAM_NON_BLOCKING);
static_assert(fc::kEventDisableTiming == CU_EVENT_DISABLE_TIMING);
static_assert(fc::kJitInfoLogBuffer == CU_JIT_INFO_LOG_BUFFER);
static_assert(fc::kJitInfoLogBufferSizeBytes == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
static_assert(fc::kJitErrorLogBuffer == CU_JIT_ERROR_LOG_BUFFER);
static_assert(fc::kJitErrorLogBufferSizeBytes == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
#endif
