// Compile-time check that nccl.h's own declarations (runtime/cuda/nccl.h)
// match NCCL's nccl.h where it is installed: sizes, constants and the exact
// signature of every function in the table. Also checks CUDA_MEMCPY2D and
// cuMemcpy2DAsync of driver_api.h against cuda.h, added to the driver table
// for the NCCL communicator's strided copies. flowjit itself needs neither header.
#include "runtime/cuda/nccl.h"  // first: cuda.h's macros rename cu* names

#if __has_include(<nccl.h>) && __has_include(<cuda.h>)
#include <cuda.h>
#include <nccl.h>

#include <cstddef>
#include <type_traits>

namespace fc = flowjit::runtime::cuda;

static_assert(fc::kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(fc::ncclUniqueId) == sizeof(::ncclUniqueId), "ncclUniqueId");
static_assert(alignof(fc::ncclUniqueId) == alignof(::ncclUniqueId), "ncclUniqueId");
static_assert(sizeof(fc::ncclResult_t) == sizeof(::ncclResult_t), "ncclResult_t");
static_assert(sizeof(fc::ncclDataType_t) == sizeof(::ncclDataType_t), "ncclDataType_t");
static_assert(sizeof(fc::ncclRedOp_t) == sizeof(::ncclRedOp_t), "ncclRedOp_t");
static_assert(sizeof(fc::ncclComm_t) == sizeof(::ncclComm_t), "ncclComm_t");
static_assert(sizeof(fc::CUstream) == sizeof(::cudaStream_t), "cudaStream_t");

static_assert(fc::kNcclSuccess == ncclSuccess);
static_assert(fc::kNcclUnhandledCudaError == ncclUnhandledCudaError);
static_assert(fc::kNcclSystemError == ncclSystemError);
static_assert(fc::kNcclInternalError == ncclInternalError);
static_assert(fc::kNcclInvalidArgument == ncclInvalidArgument);
static_assert(fc::kNcclInvalidUsage == ncclInvalidUsage);
static_assert(fc::kNcclRemoteError == ncclRemoteError);
static_assert(fc::kNcclInProgress == ncclInProgress);

static_assert(fc::kNcclInt8 == ncclInt8);
static_assert(fc::kNcclUint8 == ncclUint8);
static_assert(fc::kNcclInt32 == ncclInt32);
static_assert(fc::kNcclUint32 == ncclUint32);
static_assert(fc::kNcclInt64 == ncclInt64);
static_assert(fc::kNcclUint64 == ncclUint64);
static_assert(fc::kNcclFloat16 == ncclFloat16);
static_assert(fc::kNcclFloat32 == ncclFloat32);
static_assert(fc::kNcclFloat64 == ncclFloat64);
static_assert(fc::kNcclBfloat16 == ncclBfloat16);

static_assert(fc::kNcclSum == ncclSum);
static_assert(fc::kNcclProd == ncclProd);
static_assert(fc::kNcclMax == ncclMax);
static_assert(fc::kNcclMin == ncclMin);

// The table's signatures, spelled with nccl.h's types: expanding the X-macro
// where its type names mean NCCL's makes each entry a statement about the
// real declaration.
namespace nccl_signatures {
using ncclResult_t = ::ncclResult_t;
using ncclDataType_t = ::ncclDataType_t;
using ncclRedOp_t = ::ncclRedOp_t;
using ncclComm_t = ::ncclComm_t;
using ncclUniqueId = ::ncclUniqueId;
using CUstream = ::cudaStream_t;
#define FLOWJIT_NCCL_SIGNATURE(member, ret, params) \
  static_assert(std::is_same_v<decltype(&::member), ret(*) params>, #member);
FLOWJIT_NCCL_FUNCTIONS(FLOWJIT_NCCL_SIGNATURE)
FLOWJIT_NCCL_OPTIONAL_FUNCTIONS(FLOWJIT_NCCL_SIGNATURE)
#undef FLOWJIT_NCCL_SIGNATURE
}  // namespace nccl_signatures

// CUDA_MEMCPY2D, field by field.
#define FLOWJIT_MEMCPY2D_FIELD(f)                                                 \
  static_assert(offsetof(fc::CUDA_MEMCPY2D, f) == offsetof(::CUDA_MEMCPY2D, f) && \
                    sizeof(fc::CUDA_MEMCPY2D::f) == sizeof(::CUDA_MEMCPY2D::f),   \
                "CUDA_MEMCPY2D::" #f);
FLOWJIT_MEMCPY2D_FIELD(srcXInBytes)
FLOWJIT_MEMCPY2D_FIELD(srcY)
FLOWJIT_MEMCPY2D_FIELD(srcMemoryType)
FLOWJIT_MEMCPY2D_FIELD(srcHost)
FLOWJIT_MEMCPY2D_FIELD(srcDevice)
FLOWJIT_MEMCPY2D_FIELD(srcArray)
FLOWJIT_MEMCPY2D_FIELD(srcPitch)
FLOWJIT_MEMCPY2D_FIELD(dstXInBytes)
FLOWJIT_MEMCPY2D_FIELD(dstY)
FLOWJIT_MEMCPY2D_FIELD(dstMemoryType)
FLOWJIT_MEMCPY2D_FIELD(dstHost)
FLOWJIT_MEMCPY2D_FIELD(dstDevice)
FLOWJIT_MEMCPY2D_FIELD(dstArray)
FLOWJIT_MEMCPY2D_FIELD(dstPitch)
FLOWJIT_MEMCPY2D_FIELD(WidthInBytes)
FLOWJIT_MEMCPY2D_FIELD(Height)
#undef FLOWJIT_MEMCPY2D_FIELD
static_assert(sizeof(fc::CUDA_MEMCPY2D) == sizeof(::CUDA_MEMCPY2D), "CUDA_MEMCPY2D");
static_assert(fc::kMemoryTypeDevice == CU_MEMORYTYPE_DEVICE);
static_assert(std::is_same_v<decltype(&::cuMemcpy2DAsync_v2),
                             ::CUresult (*)(const ::CUDA_MEMCPY2D*, ::CUstream)>,
              "cuMemcpy2DAsync_v2");

int flowjit::runtime::cuda::nccl_abi_header_version() { return NCCL_VERSION_CODE; }

#else

int flowjit::runtime::cuda::nccl_abi_header_version() { return 0; }

#endif
