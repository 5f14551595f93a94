// TensorFlow's runtime over vans: server factories for the protocols "grpc+vans" (pull, as
// TensorFlow's RecvTensor and Seastar), "grpc+vans+push" (push, as DeepRec's StarServer) and
// the seeds' names "grpc+seastar", "star_server" and "star_server_lite".
//
// Built by vans.tensorflow against the installed TensorFlow (tf.sysconfig's flags) and the
// vans extension module, whose C ABI (vans.h) it calls; loaded with tf.load_library, which
// runs the registration below.
//
// A server of these protocols is TensorFlow's own gRPC server (made by the "grpc" factory:
// the master, worker and eager services stay on gRPC), with one change made before it
// starts: its WorkerEnv's rendezvous manager is a VansRendezvousMgr. Every tensor a step
// sends to another task goes into the vans rendezvous of this process's vans node, and every
// receive of a tensor produced by another task asks vans for it: the consumer's node pulls it
// from the producer's (pull) or finds it delivered there (push). Tensors between devices of
// one task stay in TensorFlow's local rendezvous.
//
// Who else holds the replaced manager: nothing. GrpcServer::Init creates it and stores it in
// the WorkerEnv only; the worker service, the graph manager, the session manager and the
// eager service read `worker_env->rendezvous_mgr` when they need it, and none runs before
// Start(). The replaced one has served no step, so it is deleted at once; the GrpcServer's
// destructor deletes its successor as it would have deleted it. The collective executor
// manager is replaced too, so that collectives' chunks go over vans (vans_collective.h).

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/common_runtime/base_collective_executor.h"
#include "tensorflow/core/common_runtime/collective_rma_local.h"
#include "tensorflow/core/common_runtime/device_mgr.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/distributed_runtime/base_rendezvous_mgr.h"
#include "tensorflow/core/distributed_runtime/collective_param_resolver_distributed.h"
#include "tensorflow/core/distributed_runtime/collective_rma_distributed.h"
#include "tensorflow/core/distributed_runtime/device_resolver_distributed.h"
#include "tensorflow/core/distributed_runtime/master_env.h"
#include "tensorflow/core/distributed_runtime/rpc_collective_executor_mgr.h"
#include "tensorflow/core/distributed_runtime/server_lib.h"
#include "tensorflow/core/distributed_runtime/worker_env.h"
#include "tensorflow/core/platform/unbounded_work_queue.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/nccl/collective_communicator.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/protobuf/cluster.pb.h"
#include "tensorflow/core/protobuf/tensorflow_server.pb.h"
#include "vans.h"

extern char** environ;

namespace vans_tf {
namespace {

using tensorflow::BaseRemoteRendezvous;
using tensorflow::BaseRendezvousMgr;
using tensorflow::DataType;
using tensorflow::Device;
using tensorflow::DeviceNameUtils;
using tensorflow::Rendezvous;
using tensorflow::RendezvousMgrInterface;
using tensorflow::ServerDef;
using tensorflow::ServerFactory;
using tensorflow::ServerInterface;
using tensorflow::Tensor;
using tensorflow::TensorProto;
using tensorflow::TensorShape;
using tensorflow::WorkerEnv;
using Status = absl::Status;

// The protocol names this plugin serves, and the vans rendezvous protocol of each.
struct ProtocolName {
  const char* name;
  int protocol;
};
constexpr ProtocolName kProtocols[] = {
    {"grpc+vans", VANS_RENDEZVOUS_PULL},
    {"grpc+vans+push", VANS_RENDEZVOUS_PUSH},
    {"grpc+seastar", VANS_RENDEZVOUS_PULL},
    {"star_server", VANS_RENDEZVOUS_PUSH},
    {"star_server_lite", VANS_RENDEZVOUS_PUSH},
};

// The header a tensor travels with, beside its bytes (vans_rendezvous_send_with_header;
// little-endian, as every machine TensorFlow's CPU wheels run on):
//   u32 magic "VTF1" | u32 dtype | u32 dims | u32 flags | i64 dim size * dims
// Flag bit 0: the bytes are a serialized TensorProto (strings, variants, resources),
// otherwise the tensor's buffer as is.
constexpr uint32_t kMagic = 0x31465456;  // "VTF1"
constexpr uint32_t kFlagProto = 1;
constexpr size_t kFixedHeader = 16;
// Received tensors up to this size are finished on the vans thread that received them.
constexpr size_t kInlineBytes = 64 << 10;
// TensorShape's own bound on dimensions.
constexpr uint32_t kMaxDims = 254;

// What crossed vans in this process, for tests and the benchmark (vans_tf_stats).
struct Counters {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> received_bytes{0};
  std::atomic<uint64_t> copied_bytes{0};
  // RecvPool's buffers: newly allocated, and handed out again.
  std::atomic<uint64_t> pool_allocated{0};
  std::atomic<uint64_t> pool_reused{0};
  // Collective chunks (vans_collective.h) sent to and received from other tasks.
  std::atomic<uint64_t> collective_sent{0};
  std::atomic<uint64_t> collective_received{0};
};
Counters counters;

// Received tensors from this size on get their memory from RecvPool.
constexpr size_t kPooledBytes = 1 << 20;

// Host buffers for large received tensors, recycled instead of returned to malloc.
//
// TensorFlow's CPU allocator is malloc. glibc gives a large block back to the kernel when it
// is freed (an mmap of its own, or the top of a thread arena's heap, trimmed), so the next
// large receive writes into fresh pages: the kernel maps and zeroes every 4 KiB of it in the
// middle of the copy. With the compute pool's threads allocating and freeing, a 16 MiB tensor
// per step spent more time in those page faults than in the copy. This pool keeps the buffers
// of dropped tensors (at most kIdleBytes of them) and hands them out again, already mapped,
// as vans' FramePool does for frames. It serves plain host memory only: a receive whose
// tensor must be GPU-compatible (pinned) gets the device's allocator. (TensorFlow marks every
// cross-task receive `nic_compatible`, memory an RDMA NIC could register; vans reads frames
// into memory of its own, so that asks nothing of the tensor.)
class RecvPool : public tensorflow::Allocator {
 public:
  // The one pool of the process; never destroyed (tensors may outlive static destructors).
  static RecvPool* Get() {
    static RecvPool* pool = new RecvPool();
    return pool;
  }

  std::string Name() override { return "vans_recv_pool"; }

  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    if (alignment > kAlignment) return nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The smallest idle buffer that fits, if it wastes at most a quarter of itself.
      auto it = idle_.lower_bound(num_bytes);
      if (it != idle_.end() && it->first - num_bytes <= it->first / 4) {
        void* buffer = it->second;
        idle_bytes_ -= it->first;
        idle_.erase(it);
        counters.pool_reused.fetch_add(1, std::memory_order_relaxed);
        return buffer;
      }
    }
    const size_t capacity = (num_bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* buffer = std::aligned_alloc(kAlignment, capacity);
    if (buffer == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    capacity_[buffer] = capacity;
    counters.pool_allocated.fetch_add(1, std::memory_order_relaxed);
    return buffer;
  }

  void DeallocateRaw(void* ptr) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto found = capacity_.find(ptr);
    if (found == capacity_.end()) return;  // not ours: cannot happen
    const size_t capacity = found->second;
    if (idle_bytes_ + capacity <= kIdleBytes) {
      idle_bytes_ += capacity;
      idle_.emplace(capacity, ptr);
      return;
    }
    capacity_.erase(found);
    std::free(ptr);
  }

 private:
  // A page: more than any alignment TensorFlow asks of host memory (64).
  static constexpr size_t kAlignment = 4096;
  // Idle bytes kept, at most: four 64 MiB tensors.
  static constexpr size_t kIdleBytes = size_t{256} << 20;

  std::mutex mu_;
  std::multimap<size_t, void*> idle_;        // capacity -> buffer
  std::unordered_map<void*, size_t> capacity_;  // every buffer of the pool, idle or in use
  size_t idle_bytes_ = 0;
};

// True while this thread is inside RecvHere's vans_rendezvous_recv_async_inline, so a
// completion that runs then is of a value that was already here.
thread_local bool asking = false;
// True while a vans I/O thread finishes a receive, and so while it runs what TensorFlow runs
// inline from it (a receive's consumers, which may ask for the next tensor).
thread_local bool on_vans_thread = false;

// vans_rendezvous_recv_async_inline, with `asking` set around it (and restored after: a
// receive finished here may run kernels inline that ask again).
int RecvHere(const vans_rendezvous* rendezvous, int64_t step_id, const char* key,
             vans_recv_callback done, void* user_data) {
  const bool outer = asking;
  asking = true;
  const int status = vans_rendezvous_recv_async_inline(rendezvous, step_id, key, done, user_data);
  asking = outer;
  return status;
}

// A receive's completion (`value` may be null): `finish` runs on this thread or, through
// `hand_off`, on one of TensorFlow's. Here when the value is small (its copy is short, as
// gRPC's completion threads finish RecvTensor calls) or when a TensorFlow thread asked for
// a value already here (another thread would only add a wake-up). A large value on a vans
// I/O thread, whether vans delivered it there or a kernel run inline from a delivery asked
// for it, is handed off, so its copy never holds up vans.
template <typename Finish, typename HandOff>
void Complete(const vans_buffer* value, Finish finish, HandOff hand_off) {
  const bool small = value == nullptr || vans_buffer_len(value) <= kInlineBytes;
  if (!small && (!asking || on_vans_thread)) {
    hand_off(std::move(finish));
    return;
  }
  const bool outer = on_vans_thread;
  // A completion nobody asked for on this thread is vans' delivery, on its I/O thread.
  on_vans_thread = outer || !asking;
  finish();
  on_vans_thread = outer;
}

std::string LastError() {
  const char* error = vans_last_error();
  return error == nullptr ? std::string("unknown error") : std::string(error);
}

// The task a device name belongs to: "/job:ps/replica:0/task:0".
std::string TaskOf(const DeviceNameUtils::ParsedName& device) {
  return tensorflow::strings::StrCat("/job:", device.job, "/replica:", device.replica,
                                     "/task:", device.task);
}

// A receive ended because its step was cancelled: a consequence of another failure, so
// marked derived, as TensorFlow marks its own RPCs' cancellations. TensorFlow reports a
// step's non-derived errors before derived ones; unmarked, this one could hide the failure
// that caused it (a replaced task's Aborted, which MonitoredTrainingSession recovers from)
// behind a CancelledError nobody recovers from. The executor marks it itself only when the
// cancellation has ended, and this one can arrive while it runs.
Status Cancelled(const std::string& what) {
  return tsl::StatusGroup::MakeDerived(
      tensorflow::errors::Cancelled(what, ": the step was cancelled"));
}

// A vans failure of a receive, as the TensorFlow status recovery expects: a task that died
// or stopped is Unavailable (MonitoredTrainingSession and the coordinator retry those), a
// rendezvous failure Aborted, a bad argument InvalidArgument. Never derived: a rendezvous
// failure may be the step's first (a peer declared dead fails the receives from it that
// way), and TensorFlow's master cancels a step's other calls only on a non-derived error
// (derived, it would wait on the dead task's RunGraph, which gRPC never times out).
Status FromVans(int status, const std::string& error, const std::string& what) {
  std::string message = tensorflow::strings::StrCat("vans: ", what, ": ", error);
  switch (status) {
    case VANS_ERR_INVALID_ARGUMENT:
      return tensorflow::errors::InvalidArgument(message);
    case VANS_ERR_RENDEZVOUS:
      return tensorflow::errors::Aborted(message);
    default:
      return tensorflow::errors::Unavailable(message);
  }
}

void WriteU32(char* at, uint32_t value) { std::memcpy(at, &value, 4); }
uint32_t ReadU32(const char* at) {
  uint32_t value;
  std::memcpy(&value, at, 4);
  return value;
}

// What a tensor travels as: its header, and its bytes, lent to vans until `release` runs
// (the tensor's own buffer, kept alive by a reference; no copy), or none for a dead tensor.
struct Encoded {
  std::string header;
  const void* data = "";
  size_t len = 0;
  void (*release)(void*) = nullptr;
  void* lent = nullptr;
};

// `val` as it travels. Plain tensors lend their buffer; strings, variants and resources are
// serialized as a TensorProto (which is then what is lent).
Status Encode(const Tensor& val, bool is_dead, Encoded* out) {
  const uint32_t dims = is_dead ? 0 : static_cast<uint32_t>(val.dims());
  uint32_t flags = 0;
  if (!is_dead) {
    if (tensorflow::DataTypeCanUseMemcpy(val.dtype())) {
      auto bytes = val.tensor_data();
      if (!bytes.empty()) {
        auto* kept = new Tensor(val);
        out->data = bytes.data();
        out->len = bytes.size();
        out->lent = kept;
        out->release = [](void* tensor) { delete static_cast<Tensor*>(tensor); };
      }
    } else {
      TensorProto proto;
      val.AsProtoTensorContent(&proto);
      auto* serialized = new std::string();
      if (!proto.SerializeToString(serialized)) {
        delete serialized;
        return tensorflow::errors::Internal("vans: a ", DataTypeString(val.dtype()),
                                            " tensor did not serialize");
      }
      out->data = serialized->data();
      out->len = serialized->size();
      out->lent = serialized;
      out->release = [](void* bytes) { delete static_cast<std::string*>(bytes); };
      flags |= kFlagProto;
    }
  }
  out->header.resize(kFixedHeader + 8 * static_cast<size_t>(dims));
  char* at = out->header.data();
  WriteU32(at, kMagic);
  WriteU32(at + 4, is_dead ? 0 : static_cast<uint32_t>(val.dtype()));
  WriteU32(at + 8, dims);
  WriteU32(at + 12, flags);
  for (uint32_t i = 0; i < dims; i++) {
    const int64_t size = val.dim_size(static_cast<int>(i));
    std::memcpy(at + kFixedHeader + 8 * i, &size, 8);
  }
  return Status();
}

// The tensor whose header is `header` and whose bytes are `data`, allocated by `allocator`
// (from RecvPool when it is large and `pooled`): the bytes are copied once, from the
// received frame into the tensor. Checks every length first.
Status Decode(const char* header, size_t header_len, const char* data, size_t data_len,
              tensorflow::Allocator* allocator, bool pooled, Tensor* out) {
  if (header_len < kFixedHeader || ReadU32(header) != kMagic) {
    return tensorflow::errors::DataLoss("vans: a received tensor has no vans header (",
                                        header_len, " bytes); do both tasks run the same "
                                        "protocol and the same vans?");
  }
  const uint32_t dtype = ReadU32(header + 4);
  const uint32_t dims = ReadU32(header + 8);
  const uint32_t flags = ReadU32(header + 12);
  if (dims > kMaxDims || header_len != kFixedHeader + 8 * static_cast<size_t>(dims)) {
    return tensorflow::errors::DataLoss("vans: a received tensor's header claims ", dims,
                                        " dimensions in ", header_len, " bytes");
  }
  if (flags & kFlagProto) {
    TensorProto proto;
    if (data_len > static_cast<size_t>(INT32_MAX) ||
        !proto.ParseFromArray(data, static_cast<int>(data_len)) ||
        !out->FromProto(allocator, proto)) {
      return tensorflow::errors::DataLoss("vans: a received tensor's TensorProto (",
                                          data_len, " bytes) does not parse");
    }
    return Status();
  }
  if (!tensorflow::DataType_IsValid(static_cast<int>(dtype)) ||
      !tensorflow::DataTypeCanUseMemcpy(static_cast<DataType>(dtype)) ||
      tensorflow::DataTypeSize(static_cast<DataType>(dtype)) == 0) {
    return tensorflow::errors::DataLoss("vans: a received tensor has data type ", dtype,
                                        ", which does not travel as bytes");
  }
  std::vector<int64_t> sizes(dims);
  for (uint32_t i = 0; i < dims; i++) std::memcpy(&sizes[i], header + kFixedHeader + 8 * i, 8);
  TensorShape shape;
  Status built = TensorShape::BuildTensorShape(sizes, &shape);
  if (!built.ok()) {
    return tensorflow::errors::DataLoss("vans: a received tensor's shape: ", built.message());
  }
  const DataType type = static_cast<DataType>(dtype);
  const uint64_t expected =
      static_cast<uint64_t>(shape.num_elements()) * tensorflow::DataTypeSize(type);
  if (expected != data_len) {
    return tensorflow::errors::DataLoss("vans: a received ", DataTypeString(type), " tensor of ",
                                        shape.DebugString(), " carries ", data_len,
                                        " bytes instead of ", expected);
  }
  if (pooled && data_len >= kPooledBytes) allocator = RecvPool::Get();
  Tensor tensor(allocator, type, shape);
  if (!tensor.IsInitialized()) {
    return tensorflow::errors::ResourceExhausted("vans: no memory for a received ",
                                                 DataTypeString(type), " tensor of ",
                                                 shape.DebugString());
  }
  if (data_len > 0) std::memcpy(const_cast<char*>(tensor.tensor_data().data()), data, data_len);
  counters.copied_bytes.fetch_add(data_len, std::memory_order_relaxed);
  *out = std::move(tensor);
  return Status();
}

// What every step's rendezvous of one server shares: the vans node and its rendezvous.
struct Shared {
  vans_node* node = nullptr;
  vans_rendezvous* rendezvous = nullptr;
  std::string protocol;

  ~Shared() {
    vans_rendezvous_free(rendezvous);
    if (node != nullptr) vans_node_stop(node);
    vans_node_free(node);
  }
};

class VansRemoteRendezvous : public BaseRemoteRendezvous {
 public:
  VansRemoteRendezvous(const WorkerEnv* env, int64_t step_id, std::shared_ptr<Shared> shared)
      : BaseRemoteRendezvous(env, step_id), shared_(std::move(shared)) {}

  Status Send(const ParsedKey& key, const Rendezvous::Args& args, const Tensor& val,
              bool is_dead) override {
    if (IsSameWorker(key.src, key.dst)) {
      return BaseRemoteRendezvous::Send(key, args, val, is_dead);
    }
    if (aborted_.load(std::memory_order_acquire)) {
      return tensorflow::errors::Aborted("vans: step ", step_id_, " was aborted");
    }
    if (key.src.type != "CPU" || key.dst.type != "CPU") {
      return tensorflow::errors::Unimplemented(
          "vans: ", shared_->protocol, " carries tensors between CPU devices; ",
          key.src_device, " -> ", key.dst_device, " is not (use protocol=\"grpc\")");
    }
    Encoded encoded;
    TF_RETURN_IF_ERROR(Encode(val, is_dead, &encoded));
    const std::string full_key(key.FullKey());
    // vans keeps the tensor's buffer until it was sent (or dropped), then releases it.
    const int status = vans_rendezvous_send_with_header(
        shared_->rendezvous, step_id_, full_key.c_str(), encoded.header.data(),
        encoded.header.size(), encoded.data, encoded.len, is_dead, encoded.release,
        encoded.lent);
    if (status != VANS_OK) {
      return FromVans(status, LastError(),
                      tensorflow::strings::StrCat("sending ", key.edge_name, " to ",
                                                  TaskOf(key.dst)));
    }
    counters.sent.fetch_add(1, std::memory_order_relaxed);
    return Status();
  }

  void StartAbort(const Status& status) override {
    BaseRemoteRendezvous::StartAbort(status);
    // The step's vans table goes too: its pending receives fail, values kept for other
    // tasks are dropped. Once is enough.
    if (!aborted_.exchange(true, std::memory_order_acq_rel)) {
      vans_rendezvous_cleanup(shared_->rendezvous, step_id_);
    }
  }

 protected:
  void RecvFromRemoteAsync(const ParsedKey& parsed, const Rendezvous::Args& args,
                           DoneCallback done) override {
    if (parsed.src.type != "CPU" || parsed.dst.type != "CPU") {
      done(tensorflow::errors::Unimplemented(
               "vans: ", shared_->protocol, " carries tensors between CPU devices; ",
               parsed.src_device, " -> ", parsed.dst_device, " is not (use protocol=\"grpc\")"),
           Args(), args, Tensor(), false);
      return;
    }
    Device* device = nullptr;
    Status found = env_->device_mgr->LookupDevice(parsed.dst_device, &device);
    if (!found.ok()) {
      done(found, Args(), args, Tensor(), false);
      return;
    }
    // The pending receive holds a reference: the step's rendezvous outlives it.
    this->Ref();
    auto pending = std::make_shared<Pending>(
        tsl::core::RefCountPtr<VansRemoteRendezvous>(this),
        device->GetAllocator(args.alloc_attrs), args, std::move(done),
        std::string(parsed.edge_name), TaskOf(parsed.src));
    // A cancelled step (the master saw another partition fail) ends the receive at once,
    // as RpcRemoteRendezvous's calls do; vans' answer, if one still comes, is dropped.
    if (auto* manager = args.cancellation_manager) {
      pending->cancellation = manager;
      pending->token = manager->get_cancellation_token();
      const bool registered = manager->RegisterCallback(pending->token, [pending]() {
        pending->Finish(Cancelled(pending->What()), nullptr, false);
      });
      if (!registered) {
        pending->cancellation = nullptr;
        pending->Finish(Cancelled(pending->What()), nullptr, false);
        return;
      }
    }
    const std::string full_key(parsed.FullKey());
    auto* owned = new std::shared_ptr<Pending>(pending);
    // A value already here (push mode, mostly) completes on this thread, as TensorFlow's
    // local rendezvous completes its receives: no switch to a vans thread and back.
    const int status =
        RecvHere(shared_->rendezvous, step_id_, full_key.c_str(), &Received, owned);
    if (status != VANS_OK) {
      // `Received` is never called: finish here.
      delete owned;
      pending->Finish(FromVans(status, LastError(), pending->What()), nullptr, false);
    }
  }

 private:
  // A receive in flight, finished once: by vans' answer (on a TensorFlow compute thread) or
  // by the step's cancellation, whichever comes first.
  struct Pending {
    Pending(tsl::core::RefCountPtr<VansRemoteRendezvous> rendezvous,
            tensorflow::Allocator* allocator, const Rendezvous::Args& args, DoneCallback done,
            std::string name, std::string task)
        : rendezvous(std::move(rendezvous)),
          allocator(allocator),
          args(args),
          done(std::move(done)),
          name(std::move(name)),
          task(std::move(task)) {}

    tsl::core::RefCountPtr<VansRemoteRendezvous> rendezvous;
    tensorflow::Allocator* allocator;
    Rendezvous::Args args;
    DoneCallback done;
    std::string name;
    std::string task;
    tensorflow::CancellationManager* cancellation = nullptr;
    tensorflow::CancellationToken token = tensorflow::CancellationManager::kInvalidToken;
    std::atomic<bool> finished{false};

    std::string What() const {
      return tensorflow::strings::StrCat("receiving ", name, " from ", task);
    }

    // Decodes `value` (when the receive succeeded) and runs `done`, the first time only;
    // frees the buffer either way.
    void Finish(Status status, vans_buffer* value, bool is_dead) {
      if (finished.exchange(true, std::memory_order_acq_rel)) {
        vans_buffer_free(value);
        return;
      }
      // From vans' side: the cancellation callback must not run any more (from the
      // cancellation's side it is running, and this fails harmlessly).
      if (cancellation != nullptr) cancellation->TryDeregisterCallback(token);
      Tensor tensor;
      if (status.ok()) {
        counters.received.fetch_add(1, std::memory_order_relaxed);
        counters.received_bytes.fetch_add(vans_buffer_len(value), std::memory_order_relaxed);
      }
      if (status.ok() && !is_dead) {
        size_t header_len = 0;
        const void* header = vans_buffer_header(value, &header_len);
        status = Decode(static_cast<const char*>(header), header_len,
                        static_cast<const char*>(vans_buffer_data(value)),
                        vans_buffer_len(value), allocator,
                        !args.alloc_attrs.gpu_compatible(),
                        &tensor);
        if (!status.ok()) status = tensorflow::errors::DataLoss(What(), ": ", status.message());
      }
      vans_buffer_free(value);
      done(status, Args(), args, tensor, is_dead);
    }
  };

  // vans' completion, on a vans I/O thread (or on the asking thread, for a value already
  // here); finished there or on TensorFlow's compute pool, as `Complete` decides (the
  // executor runs only inexpensive kernels inline, and hands expensive ones to its pool).
  static void Received(void* user_data, int status, vans_buffer* value, bool is_dead) {
    std::shared_ptr<Pending> pending = std::move(*static_cast<std::shared_ptr<Pending>*>(user_data));
    delete static_cast<std::shared_ptr<Pending>*>(user_data);
    Status result;
    if (status != VANS_OK) result = FromVans(status, LastError(), pending->What());
    auto* pool = pending->rendezvous->env_->compute_pool;
    Complete(
        value, [pending, result, value, is_dead]() { pending->Finish(result, value, is_dead); },
        [pool](std::function<void()> finish) { pool->Schedule(std::move(finish)); });
  }

  std::shared_ptr<Shared> shared_;
  std::atomic<bool> aborted_{false};
};

class VansRendezvousMgr : public BaseRendezvousMgr {
 public:
  VansRendezvousMgr(const WorkerEnv* env, std::shared_ptr<Shared> shared)
      : BaseRendezvousMgr(env), shared_(std::move(shared)) {}

 protected:
  tsl::core::RefCountPtr<BaseRemoteRendezvous> Create(int64_t step_id,
                                                      const WorkerEnv* env) override {
    return tsl::core::RefCountPtr<BaseRemoteRendezvous>(
        new VansRemoteRendezvous(env, step_id, shared_));
  }

 private:
  std::shared_ptr<Shared> shared_;
};

#include "vans_collective.h"

// `text` as a JSON string.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The TF_CONFIG of `def`: its cluster (a job whose tasks are 0..n-1 as a list, any other as
// an object from index to address), its task and its protocol.
std::string TfConfig(const ServerDef& def) {
  std::string json = "{\"cluster\": {";
  bool first_job = true;
  for (const auto& job : def.cluster().job()) {
    std::map<int, std::string> tasks(job.tasks().begin(), job.tasks().end());
    bool dense = tasks.empty() || (tasks.begin()->first == 0 &&
                                   tasks.rbegin()->first == static_cast<int>(tasks.size()) - 1);
    json += first_job ? "" : ", ";
    first_job = false;
    json += Quoted(job.name()) + (dense ? ": [" : ": {");
    bool first_task = true;
    for (const auto& [index, address] : tasks) {
      json += first_task ? "" : ", ";
      first_task = false;
      if (!dense) json += Quoted(std::to_string(index)) + ": ";
      json += Quoted(address);
    }
    json += dense ? "]" : "}";
  }
  json += "}, \"task\": {\"type\": " + Quoted(def.job_name()) +
          ", \"index\": " + std::to_string(def.task_index()) +
          "}, \"rpc_layer\": " + Quoted(def.protocol()) + "}";
  return json;
}

// Starts this task's vans node (blocking until every task's joined) and its rendezvous.
Status StartVans(const ServerDef& def, int protocol, Shared* shared) {
  vans_config* config = nullptr;
  if (vans_config_new(&config) != VANS_OK) {
    return tensorflow::errors::Internal("vans: ", LastError());
  }
  std::unique_ptr<vans_config, void (*)(vans_config*)> owned(config, vans_config_free);
  // The process's vans variables (the cluster secret, DMLC_ENABLE_RDMA, PS_VERBOSE, ...);
  // names vans does not read are refused, and skipped. The cluster comes from the ServerDef.
  bool map_named = false;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; entry++) {
    const char* eq = std::strchr(*entry, '=');
    if (eq == nullptr) continue;
    const std::string name(*entry, eq - *entry);
    if (name == "TF_CONFIG") continue;
    if (vans_config_set(config, name.c_str(), eq + 1) == VANS_OK) {
      map_named = map_named || name == "VANS_ENDPOINT_MAP";
    }
  }
  // The launch directory's .endpoint_map, as the Seastar and StarServer deployments read it.
  if (!map_named && std::ifstream(".endpoint_map").good()) {
    vans_config_set(config, "VANS_ENDPOINT_MAP", ".endpoint_map");
  }
  const std::string tf_config = TfConfig(def);
  if (vans_config_set(config, "TF_CONFIG", tf_config.c_str()) != VANS_OK ||
      vans_config_set(config, "VANS_TF_SERVER", "1") != VANS_OK) {
    return tensorflow::errors::Internal("vans: ", LastError());
  }
  const std::string task =
      tensorflow::strings::StrCat("/job:", def.job_name(), "/task:", def.task_index());
  int status = vans_node_start(config, &shared->node);
  if (status != VANS_OK) {
    const std::string what = tensorflow::strings::StrCat(
        "task ", task, " could not join the vans cluster of protocol ", def.protocol(),
        " (every task must run a server with the same protocol)");
    return status == VANS_ERR_CONFIG ? tensorflow::errors::InvalidArgument(
                                           "vans: ", what, ": ", LastError())
                                     : FromVans(status, LastError(), what);
  }
  status = vans_rendezvous_start(shared->node, protocol, &shared->rendezvous);
  if (status != VANS_OK) return FromVans(status, LastError(), "starting the rendezvous");
  return Status();
}

class VansServerFactory : public ServerFactory {
 public:
  explicit VansServerFactory(const ProtocolName& protocol) : protocol_(protocol) {}

  bool AcceptsOptions(const ServerDef& def) override { return def.protocol() == protocol_.name; }

  Status NewServer(const ServerDef& def, const Options& options,
                   std::unique_ptr<ServerInterface>* out) override {
    // TensorFlow's own gRPC server, for everything but the tensors.
    ServerDef grpc_def = def;
    grpc_def.set_protocol("grpc");
    ServerFactory* grpc = nullptr;
    TF_RETURN_IF_ERROR(ServerFactory::GetFactory(grpc_def, &grpc));
    std::unique_ptr<ServerInterface> server;
    TF_RETURN_IF_ERROR(grpc->NewServer(grpc_def, options, &server));
    auto shared = std::make_shared<Shared>();
    shared->protocol = protocol_.name;
    TF_RETURN_IF_ERROR(StartVans(def, protocol_.protocol, shared.get()));
    ReplaceCollectives(def, server.get(), shared);
    WorkerEnv* env = server->worker_env();
    RendezvousMgrInterface* replaced = env->rendezvous_mgr;
    env->rendezvous_mgr = new VansRendezvousMgr(env, std::move(shared));
    delete replaced;
    *out = std::move(server);
    return Status();
  }

 private:
  const ProtocolName protocol_;
};

const bool registered = [] {
  for (const ProtocolName& protocol : kProtocols) {
    ServerFactory::Register(protocol.name, new VansServerFactory(protocol));
  }
  return true;
}();

}  // namespace
}  // namespace vans_tf

// Tensors this process sent and received over vans, the bytes received (headers included)
// and the bytes copied from received frames into tensors (collective chunks included), then
// RecvPool's new and reused buffers, then the collective chunks sent and received, in that
// order, into `out[8]`.
extern "C" __attribute__((visibility("default"))) void vans_tf_stats(uint64_t* out) {
  out[0] = vans_tf::counters.sent.load(std::memory_order_relaxed);
  out[1] = vans_tf::counters.received.load(std::memory_order_relaxed);
  out[2] = vans_tf::counters.received_bytes.load(std::memory_order_relaxed);
  out[3] = vans_tf::counters.copied_bytes.load(std::memory_order_relaxed);
  out[4] = vans_tf::counters.pool_allocated.load(std::memory_order_relaxed);
  out[5] = vans_tf::counters.pool_reused.load(std::memory_order_relaxed);
  out[6] = vans_tf::counters.collective_sent.load(std::memory_order_relaxed);
  out[7] = vans_tf::counters.collective_received.load(std::memory_order_relaxed);
}
