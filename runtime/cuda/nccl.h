// NCCL, the collectives between GPUs, loaded at run time (never linked) like
// the CUDA driver, and a Communicator (runtime/comm/collective.h) built on it for
// buffers in GPU memory.
//
// The types and constants are declared here rather than taken from nccl.h,
// so flowjit builds without NCCL; nccl_abi_check.cpp compares them with
// nccl.h where it is installed. The library is found at run time: the
// dynamic loader's libnccl.so.2, the pip package nvidia-nccl-cu* of the
// running Python, then a CUDA toolkit's lib64/lib ($FLOWJIT_NCCL_LIBRARY
// overrides the search). As with the driver, a table can be filled by hand
// (tests: a fake NCCL), so the communicator's logic runs without a GPU.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/types.h"
#include "runtime/comm/collective.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/driver_api.h"

namespace flowjit::runtime {
class RendezvousStore;
}

namespace flowjit::runtime::cuda {

// nccl.h's enums are int-sized; they are passed and returned as int.
using ncclResult_t = int;
using ncclDataType_t = int;
using ncclRedOp_t = int;
struct ncclComm;
using ncclComm_t = ncclComm*;
constexpr int kNcclUniqueIdBytes = 128;
// What ncclGetUniqueId makes and every rank of a communicator must be given.
struct ncclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclUnhandledCudaError = 1;
constexpr ncclResult_t kNcclSystemError = 2;
constexpr ncclResult_t kNcclInternalError = 3;
constexpr ncclResult_t kNcclInvalidArgument = 4;
constexpr ncclResult_t kNcclInvalidUsage = 5;
constexpr ncclResult_t kNcclRemoteError = 6;
constexpr ncclResult_t kNcclInProgress = 7;

constexpr ncclDataType_t kNcclInt8 = 0;
constexpr ncclDataType_t kNcclUint8 = 1;
constexpr ncclDataType_t kNcclInt32 = 2;
constexpr ncclDataType_t kNcclUint32 = 3;
constexpr ncclDataType_t kNcclInt64 = 4;
constexpr ncclDataType_t kNcclUint64 = 5;
constexpr ncclDataType_t kNcclFloat16 = 6;
constexpr ncclDataType_t kNcclFloat32 = 7;
constexpr ncclDataType_t kNcclFloat64 = 8;
constexpr ncclDataType_t kNcclBfloat16 = 9;

constexpr ncclRedOp_t kNcclSum = 0;
constexpr ncclRedOp_t kNcclProd = 1;
constexpr ncclRedOp_t kNcclMax = 2;
constexpr ncclRedOp_t kNcclMin = 3;

// X(member, return type, parameters); the symbol is the member's name.
#define FLOWJIT_NCCL_FUNCTIONS(X)                                                               \
  X(ncclGetVersion, ncclResult_t, (int* version))                                               \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId * id))                                         \
  X(ncclCommInitRank, ncclResult_t, (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank)) \
  X(ncclCommInitAll, ncclResult_t, (ncclComm_t * comms, int ndev, const int* devlist))          \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t comm))                                           \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t comm))                                             \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t comm, ncclResult_t * error))               \
  X(ncclGetErrorString, const char*, (ncclResult_t result))                                     \
  X(ncclAllReduce, ncclResult_t,                                                                \
    (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,           \
     ncclComm_t comm, CUstream stream))                                                         \
  X(ncclAllGather, ncclResult_t,                                                                \
    (const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,     \
     CUstream stream))                                                                          \
  X(ncclReduceScatter, ncclResult_t,                                                            \
    (const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,      \
     ncclComm_t comm, CUstream stream))                                                         \
  X(ncclGroupStart, ncclResult_t, ())                                                           \
  X(ncclGroupEnd, ncclResult_t, ())

// Resolved when present (NCCL 2.13 and newer), left null otherwise: the
// detail behind an error code ("Cuda failure 'out of memory'").
#define FLOWJIT_NCCL_OPTIONAL_FUNCTIONS(X) X(ncclGetLastError, const char*, (ncclComm_t comm))

struct NcclApi {
#define FLOWJIT_NCCL_MEMBER(member, ret, params) ret(*member) params = nullptr;
  FLOWJIT_NCCL_FUNCTIONS(FLOWJIT_NCCL_MEMBER)
  FLOWJIT_NCCL_OPTIONAL_FUNCTIONS(FLOWJIT_NCCL_MEMBER)
#undef FLOWJIT_NCCL_MEMBER
  std::string library;  // the path loaded ("" for a hand-made table)
  void* handle = nullptr;
  int version = 0;  // ncclGetVersion's code, e.g. 22809
};

// "2.28.9" from a version code (both of NCCL's encodings).
std::string nccl_version_text(int code);

// "ncclInvalidArgument: invalid argument (run with NCCL_DEBUG=WARN for
// details)": the code's name and NCCL's own text for it.
std::string nccl_error_text(const NcclApi& api, ncclResult_t r);

// Throws UserError(Runtime) "NCCL call ncclAllReduce failed: <error text>;
// NCCL's last error: <ncclGetLastError> (<context>)" unless r is success.
void nccl_check(const NcclApi& api, ncclResult_t r, const char* call,
                const std::string& context = "");

// The message when no NCCL library can be loaded.
extern const char* const kNoNcclMessage;

// Loads one library and resolves every function. Throws UserError(Runtime):
// kNoNcclMessage naming the library (plus dlerror's text) when it cannot be
// loaded, "... lacks ncclXxx" when a symbol is missing. Stays loaded.
NcclApi load_nccl(const std::string& library);

// The libraries the search tries, in order: "libnccl.so.2" (the dynamic
// loader's search), then those of the pip package and CUDA toolkits that
// exist here. Ignores $FLOWJIT_NCCL_LIBRARY.
std::vector<std::string> nccl_library_candidates();

// $FLOWJIT_NCCL_LIBRARY when set (that library only: a wrong path is an
// error naming it, not a silent fallback), else the first of the candidates
// that loads. Searches afresh on every call; throws as load_nccl does.
NcclApi find_nccl();

// The process-wide NCCL: find_nccl() once. A failure is remembered and rethrown.
const NcclApi& nccl();
// Whether nccl() would succeed; never throws. `why` gets the message.
bool nccl_available(std::string* why = nullptr);

// The NCCL_VERSION_CODE of the nccl.h that nccl_abi_check.cpp compared this
// file's declarations with, or 0 when it was compiled without one.
int nccl_abi_header_version();

// How a collective of an ir::DType runs in NCCL. Bool is a byte holding 0 or
// 1 and reduces with OR, which NCCL lacks: for 0/1 bytes OR is max, so Bool
// is Uint8 with ncclMax. Integers add with wrap-around, as accumulate() does.
struct NcclReduction {
  ncclDataType_t type;
  ncclRedOp_t op;
};
NcclReduction nccl_reduction(ir::DType dtype);

// Copies `rows` rows of `width` bytes, `src_pitch` bytes apart in src, to
// rows `dst_pitch` bytes apart in dst, on the device's stream (asynchronous;
// the device's context must be current). One cuMemcpy2DAsync where it can
// (row by row for pitches past what it takes, or a table without it); the
// communicator's layout changes between [outer][ranks][inner] and NCCL's
// rank-major blocks are such copies.
// `stream` null: the device's stream.
void strided_copy(const Device& device, CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src,
                  size_t src_pitch, size_t width, size_t rows, CUstream stream = nullptr);

struct NcclOptions {
  // The NCCL to use (it must outlive the communicator); null: the
  // process-wide nccl().
  const NcclApi* nccl = nullptr;
  // How long a rank waits for a collective to complete before it gives up
  // and aborts the communicator; 0: as long as it takes (a dead peer is
  // still noticed, through ncclCommGetAsyncError, where NCCL notices it).
  double timeout_seconds = 0;
};

// A Communicator whose ranks are GPUs, one rank per GPU, each driving NCCL
// from its own thread (the contract of runtime/comm/collective.h). The void*
// buffers of every call are CUdeviceptr values on that rank's GPU.
//
// Streams: a collective is enqueued on the rank's Device stream, after the
// work already there (the kernels that produced `in`), and the call waits
// until it is complete, so `out` is ready on return. The wait polls an
// event, so that abort() or a failing peer wakes a rank that is waiting.
// While an Enqueued is alive for a rank (overlap, runtime/cuda/executable.h),
// its collectives go on the Enqueued's stream instead and return at once;
// the caller orders them with events and waits with wait_event, which
// notices an abort, a failing peer and the timeout as a collective's own
// wait does.
//
// Results: every rank gets the same bits (NCCL reduces each element once
// and sends that result to all ranks), but NCCL's summation order is its
// own, not rank order: with three or more ranks, floating-point sums may
// differ in the last bits from make_thread_communicator's. Integer results
// are exact (wrapping on overflow).
//
// Layout: NCCL gathers and scatters one contiguous block per rank. With
// outer > 1 the [outer][ranks][inner] layout of all_gather's output and of
// reduce_scatter's input goes through a staging buffer in the rank's device
// memory and strided_copy. A buffer that overlaps another in a way NCCL
// cannot do in place is staged too.
//
// Failure: a failed NCCL or driver call, an error NCCL reports for the
// communicator, or the timeout makes the rank throw UserError(Runtime)
// naming it and abort the communicator; every other rank, waiting or
// entering a collective later, then aborts its own NCCL communicator (which
// stops its kernels) and throws "a collective was aborted: <first reason>".
// What cannot be interrupted is a rank inside an NCCL call itself rather
// than waiting on its stream: ncclCommInitRank until all ranks join, or a
// first collective whose connection set-up waits for a peer.
class NcclCommunicator final : public Communicator {
  struct Rank;

 public:
  // One process: devices[i] is rank i (ncclCommInitAll). Distinct GPUs.
  static std::shared_ptr<NcclCommunicator> create(std::vector<std::shared_ptr<Device>> devices,
                                                  const NcclOptions& options = {});
  // Several processes: this process's devices are ranks first_rank ..
  // first_rank + devices.size() - 1 of world_size; every process passes the
  // id that one of them made with nccl_unique_id (share_nccl_unique_id
  // carries it through a rendezvous store). Blocks until every rank has
  // joined: NCCL gives no way to give up earlier.
  static std::shared_ptr<NcclCommunicator> create(const ncclUniqueId& id, int world_size,
                                                  int first_rank,
                                                  std::vector<std::shared_ptr<Device>> devices,
                                                  const NcclOptions& options = {});
  // Destroys the NCCL communicators (those of an aborted communicator are
  // aborted instead). Every process of a job must destroy its communicator:
  // NCCL's destroy waits for the other ranks on the same machine.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int size() const override { return world_; }
  // "nccl 2.28.9: 2 GPUs", "nccl 2.28.9: ranks 2..3 of 4"
  std::string describe() const override;

  void all_reduce(int rank, const void* in, void* out, int64_t count, ir::DType dtype) override;
  void all_gather(int rank, const void* in, void* out, int64_t outer, int64_t inner_bytes) override;
  void reduce_scatter(int rank, const void* in, void* out, int64_t outer, int64_t inner,
                      ir::DType dtype) override;
  // One NCCL group: the all_reduces go out as one fused launch.
  void all_reduce_many(int rank, const std::vector<Buffer>& buffers, ir::DType dtype) override;
  // NCCL has no barrier: a one-element all_reduce stands in for it.
  void barrier(int rank) override;
  void abort(const std::string& why) override;

  // Rank `rank`'s collectives go on `stream` (one of its Device's streams)
  // without waiting, for the object's life. Throws as a collective does on an
  // aborted communicator.
  class Enqueued {
   public:
    Enqueued(NcclCommunicator& c, int rank, CUstream stream);
    ~Enqueued();
    Enqueued(const Enqueued&) = delete;
    Enqueued& operator=(const Enqueued&) = delete;

   private:
    Rank& r_;
  };
  // Waits until `event` (recorded on one of rank `rank`'s streams after
  // enqueued collectives) has completed; fails, aborting the communicator,
  // as a collective's wait does. `what` names the wait in errors.
  void wait_event(int rank, CUevent event, const std::string& what);

  int first_rank() const { return first_; }
  int local_ranks() const { return static_cast<int>(ranks_.size()); }
  const NcclApi& api() const { return api_; }
  Device& device(int rank);  // the GPU of one of this process's ranks

 private:
  NcclCommunicator(const NcclApi& api, int world, int first,
                   std::vector<std::shared_ptr<Device>> devices, const NcclOptions& options);
  void finish_setup();
  Rank& enter(int rank);
  template <class F>
  void run(Rank& r, const std::string& what, F&& enqueue);
  void wait(Rank& r, const std::string& what);
  void poll(Rank& r, CUevent event, const std::string& what);
  void abort_comm(Rank& r);
  CUdeviceptr staging(Rank& r, uint64_t bytes);
  std::string where(const Rank& r) const;  // "rank 1 (GPU 1)"
  std::string abort_reason();

  const NcclApi& api_;
  int world_, first_;
  std::chrono::nanoseconds timeout_{0};
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::string abort_reason_;
};

// A communicator over GPUs `ordinals` of this process, opened through
// `driver` (null: the process-wide driver()). Throws the driver's
// kNoDriverMessage without a driver, kNoNcclMessage without NCCL.
std::shared_ptr<NcclCommunicator> make_nccl_communicator(const std::vector<int>& ordinals,
                                                         const NcclOptions& options = {},
                                                         const DriverApi* driver = nullptr);

// A fresh id for a new multi-process communicator (ncclGetUniqueId).
ncclUniqueId nccl_unique_id(const NcclApi* api = nullptr);

// The process that `creates` makes an id and sets it in the store under
// `key`; the others wait for it (up to the store's timeout) and read it.
ncclUniqueId share_nccl_unique_id(RendezvousStore& store, const std::string& key, bool create,
                                  const NcclApi* api = nullptr);

}  // namespace flowjit::runtime::cuda
