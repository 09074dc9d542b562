// A fake NCCL for tests without a GPU (nccl_test.cpp, nvptx_test.cpp): an
// NcclApi table whose collectives run at once in the calling thread: the
// ranks meet at a barrier, rank 0 computes every rank's result, and they
// meet again. The fake rejects what NCCL does not allow: overlapping
// buffers other than NCCL's in-place forms, the wrong stream or context,
// foreign memory. It runs beside a fake CUDA driver whose device memory is
// host memory; what it asks of that driver goes through hooks() (set by
// each test file for its own fake driver).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/nccl.h"

namespace flowjit::testing::fake_nccl {

namespace rc = flowjit::runtime::cuda;

// What the fake asks of the fake driver it runs beside.
struct Hooks {
  std::function<int(rc::CUstream)> device_of_stream = [](rc::CUstream) { return 0; };
  std::function<int()> current_device = [] { return 0; };
  std::function<bool(uintptr_t, size_t)> is_device_memory = [](uintptr_t, size_t) { return true; };
  // Collectives enqueue nothing that ever completes (until aborted).
  std::function<bool()> hang = [] { return false; };
  std::function<void(int)> aborted = [](int) {};  // a device's communicator was aborted
  // A collective that passed the checks, as the fake driver's operation on
  // `stream` touching [send, +send_bytes) and [recv, +recv_bytes).
  std::function<void(rc::CUstream, const std::string&, uintptr_t, size_t, uintptr_t, size_t)>
      enqueued = [](rc::CUstream, const std::string&, uintptr_t, size_t, uintptr_t, size_t) {};
};
inline Hooks& hooks() {
  static Hooks h;
  return h;
}

struct World {
  explicit World(int ranks)
      : n(ranks), send(static_cast<size_t>(ranks)), recv(static_cast<size_t>(ranks)) {}
  int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const void*> send;
  std::vector<void*> recv;
  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    uint64_t g = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != g; });
  }
};

struct Comm {
  std::shared_ptr<World> world;
  int rank = 0, device = 0;
};

struct Nccl {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<World>> worlds;  // by unique id
  std::vector<std::string> calls;
  int next_id = 0;
  int created = 0, destroyed = 0, aborted = 0;
  std::atomic<int> fail_rank{-1};   // that rank's collectives fail at once
  std::atomic<int> async_rank{-1};  // that rank's communicator reports async_error
  rc::ncclResult_t async_error = rc::kNcclSuccess;
};
inline Nccl& nccl() {
  static Nccl n;
  return n;
}
inline thread_local std::string t_last_error;
inline thread_local int t_group_depth = 0;

inline void record(const std::string& call) {
  std::lock_guard<std::mutex> lock(nccl().mu);
  nccl().calls.push_back(call);
}
inline rc::ncclResult_t fail(rc::ncclResult_t r, const std::string& why) {
  t_last_error = why;
  return r;
}

inline size_t type_size(rc::ncclDataType_t t) {
  switch (t) {
    case rc::kNcclInt8:
    case rc::kNcclUint8:
      return 1;
    case rc::kNcclInt32:
    case rc::kNcclFloat32:
      return 4;
    case rc::kNcclInt64:
    case rc::kNcclFloat64:
      return 8;
    default:
      return 0;
  }
}

template <class T>
inline void reduce_into(void* dst, const void* src, size_t n, rc::ncclRedOp_t op) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) {
    if (op == rc::kNcclMax) {
      d[i] = std::max(d[i], s[i]);
    } else if constexpr (std::is_integral_v<T>) {  // wraps, as on a GPU
      using U = std::make_unsigned_t<T>;
      d[i] = static_cast<T>(static_cast<U>(static_cast<U>(d[i]) + static_cast<U>(s[i])));
    } else {
      d[i] = d[i] + s[i];
    }
  }
}
inline void reduce(void* dst, const void* src, size_t n, rc::ncclDataType_t t, rc::ncclRedOp_t op) {
  switch (t) {
    case rc::kNcclInt8:
      return reduce_into<int8_t>(dst, src, n, op);
    case rc::kNcclUint8:
      return reduce_into<uint8_t>(dst, src, n, op);
    case rc::kNcclInt32:
      return reduce_into<int32_t>(dst, src, n, op);
    case rc::kNcclInt64:
      return reduce_into<int64_t>(dst, src, n, op);
    case rc::kNcclFloat32:
      return reduce_into<float>(dst, src, n, op);
    case rc::kNcclFloat64:
      return reduce_into<double>(dst, src, n, op);
  }
}

inline uintptr_t u(const void* p) { return reinterpret_cast<uintptr_t>(p); }
inline bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  return u(a) < u(b) + bn && u(b) < u(a) + an;
}

// The checks every collective makes, then the meeting of the ranks.
inline rc::ncclResult_t collective(const char* name, Comm* c, rc::CUstream stream, const void* send,
                                   size_t send_bytes, void* recv, size_t recv_bytes, bool bad_alias,
                                   rc::ncclDataType_t type, rc::ncclRedOp_t op,
                                   const std::function<void(World&)>& compute) {
  record(std::string(name) + " " + std::to_string(send_bytes));
  if (!c) return fail(rc::kNcclInvalidArgument, "fake: comm argument is NULL");
  if (type_size(type) == 0 || (op != rc::kNcclSum && op != rc::kNcclMax))
    return fail(rc::kNcclInvalidArgument, "fake: unsupported type or op");
  if (hooks().device_of_stream(stream) != c->device || hooks().current_device() != c->device)
    return fail(rc::kNcclInvalidUsage, "fake: stream or context of another GPU");
  if (!hooks().is_device_memory(u(send), send_bytes) ||
      !hooks().is_device_memory(u(recv), recv_bytes))
    return fail(rc::kNcclInvalidArgument, "fake: not device memory");
  if (bad_alias) return fail(rc::kNcclInvalidArgument, "fake: overlap that is not in place");
  if (nccl().fail_rank == c->rank)
    return fail(rc::kNcclInvalidArgument, "fake: rank " + std::to_string(c->rank) + " refuses");
  hooks().enqueued(stream, name, u(send), send_bytes, u(recv), recv_bytes);
  if (hooks().hang()) return rc::kNcclSuccess;
  World& w = *c->world;
  w.send[static_cast<size_t>(c->rank)] = send;
  w.recv[static_cast<size_t>(c->rank)] = recv;
  w.barrier();
  if (c->rank == 0) compute(w);
  w.barrier();
  return rc::kNcclSuccess;
}

inline rc::ncclResult_t all_reduce(const void* send, void* recv, size_t count, rc::ncclDataType_t t,
                                   rc::ncclRedOp_t op, rc::ncclComm_t comm, rc::CUstream s) {
  size_t bytes = count * type_size(t);
  bool bad_alias = send != recv && overlap(send, bytes, recv, bytes);
  return collective("ncclAllReduce", reinterpret_cast<Comm*>(comm), s, send, bytes, recv, bytes,
                    bad_alias, t, op, [&](World& w) {
                      std::vector<char> sum(static_cast<const char*>(w.send[0]),
                                            static_cast<const char*>(w.send[0]) + bytes);
                      for (int q = 1; q < w.n; ++q)
                        reduce(sum.data(), w.send[static_cast<size_t>(q)], count, t, op);
                      for (int q = 0; q < w.n; ++q)
                        std::memcpy(w.recv[static_cast<size_t>(q)], sum.data(), bytes);
                    });
}

inline rc::ncclResult_t all_gather(const void* send, void* recv, size_t count, rc::ncclDataType_t t,
                                   rc::ncclComm_t comm, rc::CUstream s) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  size_t block = count * type_size(t), total = c ? block * static_cast<size_t>(c->world->n) : 0;
  bool bad_alias = c && overlap(send, block, recv, total) &&
                   u(send) != u(recv) + static_cast<size_t>(c->rank) * block;
  return collective("ncclAllGather", c, s, send, block, recv, total, bad_alias, t, rc::kNcclSum,
                    [&](World& w) {
                      std::vector<char> all(total);
                      for (int q = 0; q < w.n; ++q)
                        std::memcpy(all.data() + static_cast<size_t>(q) * block,
                                    w.send[static_cast<size_t>(q)], block);
                      for (int q = 0; q < w.n; ++q)
                        std::memcpy(w.recv[static_cast<size_t>(q)], all.data(), total);
                    });
}

inline rc::ncclResult_t reduce_scatter(const void* send, void* recv, size_t count,
                                       rc::ncclDataType_t t, rc::ncclRedOp_t op,
                                       rc::ncclComm_t comm, rc::CUstream s) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  size_t block = count * type_size(t), total = c ? block * static_cast<size_t>(c->world->n) : 0;
  bool bad_alias = c && overlap(send, total, recv, block) &&
                   u(recv) != u(send) + static_cast<size_t>(c->rank) * block;
  return collective(
      "ncclReduceScatter", c, s, send, total, recv, block, bad_alias, t, op, [&](World& w) {
        std::vector<char> out(total);
        for (int q = 0; q < w.n; ++q) {
          char* d = out.data() + static_cast<size_t>(q) * block;
          std::memcpy(d, static_cast<const char*>(w.send[0]) + static_cast<size_t>(q) * block,
                      block);
          for (int p = 1; p < w.n; ++p)
            reduce(d,
                   static_cast<const char*>(w.send[static_cast<size_t>(p)]) +
                       static_cast<size_t>(q) * block,
                   count, t, op);
        }
        for (int q = 0; q < w.n; ++q)
          std::memcpy(w.recv[static_cast<size_t>(q)], out.data() + static_cast<size_t>(q) * block,
                      block);
      });
}

inline rc::ncclResult_t get_version(int* v) {
  *v = 22809;
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t get_unique_id(rc::ncclUniqueId* id) {
  record("ncclGetUniqueId");
  std::lock_guard<std::mutex> lock(nccl().mu);
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "fake-id-%d", nccl().next_id++);
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t init_rank(rc::ncclComm_t* comm, int nranks, rc::ncclUniqueId id, int rank) {
  record("ncclCommInitRank " + std::to_string(rank) + (t_group_depth ? " (grouped)" : ""));
  // NCCL takes the rank's GPU from the current context.
  if (hooks().current_device() < 0) return fail(rc::kNcclInvalidUsage, "fake: no current GPU");
  std::lock_guard<std::mutex> lock(nccl().mu);
  auto& w = nccl().worlds[std::string(id.internal, sizeof(id.internal))];
  if (!w) w = std::make_shared<World>(nranks);
  if (w->n != nranks) return fail(rc::kNcclInvalidUsage, "fake: world size mismatch");
  *comm = reinterpret_cast<rc::ncclComm_t>(new Comm{w, rank, hooks().current_device()});
  ++nccl().created;
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t init_all(rc::ncclComm_t* comms, int n, const int* devices) {
  record("ncclCommInitAll " + std::to_string(n));
  auto w = std::make_shared<World>(n);
  std::lock_guard<std::mutex> lock(nccl().mu);
  for (int i = 0; i < n; ++i)
    comms[i] = reinterpret_cast<rc::ncclComm_t>(new Comm{w, i, devices[i]});
  nccl().created += n;
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t destroy(rc::ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(nccl().mu);
  delete reinterpret_cast<Comm*>(comm);
  ++nccl().destroyed;
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t abort_comm(rc::ncclComm_t comm) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  hooks().aborted(c->device);  // its hung kernels end
  std::lock_guard<std::mutex> lock(nccl().mu);
  delete c;
  ++nccl().aborted;
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t async_error(rc::ncclComm_t comm, rc::ncclResult_t* e) {
  if (!comm) return fail(rc::kNcclInvalidArgument, "fake: comm argument is NULL");
  *e = reinterpret_cast<Comm*>(comm)->rank == nccl().async_rank ? nccl().async_error
                                                                : rc::kNcclSuccess;
  return rc::kNcclSuccess;
}
inline const char* error_text(rc::ncclResult_t r) {
  switch (r) {
    case rc::kNcclInvalidArgument:
      return "fake invalid argument";
    case rc::kNcclInvalidUsage:
      return "fake invalid usage";
    case rc::kNcclRemoteError:
      return "fake remote process exited";
    default:
      return "fake error";
  }
}
inline const char* last_error(rc::ncclComm_t) { return t_last_error.c_str(); }
inline rc::ncclResult_t group_start() {
  ++t_group_depth;
  record("ncclGroupStart");
  return rc::kNcclSuccess;
}
inline rc::ncclResult_t group_end() {
  record("ncclGroupEnd");
  return --t_group_depth < 0 ? fail(rc::kNcclInvalidUsage, "fake: group end without start")
                             : rc::kNcclSuccess;
}

inline const rc::NcclApi& api() {
  static const rc::NcclApi a = [] {
    rc::NcclApi n;
    n.ncclGetVersion = get_version;
    n.ncclGetUniqueId = get_unique_id;
    n.ncclCommInitRank = init_rank;
    n.ncclCommInitAll = init_all;
    n.ncclCommDestroy = destroy;
    n.ncclCommAbort = abort_comm;
    n.ncclCommGetAsyncError = async_error;
    n.ncclGetErrorString = error_text;
    n.ncclAllReduce = all_reduce;
    n.ncclAllGather = all_gather;
    n.ncclReduceScatter = reduce_scatter;
    n.ncclGroupStart = group_start;
    n.ncclGroupEnd = group_end;
    n.ncclGetLastError = last_error;
    n.version = 22809;
    return n;
  }();
  return a;
}

}  // namespace flowjit::testing::fake_nccl
