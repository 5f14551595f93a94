// TensorFlow's collectives (MultiWorkerMirroredStrategy's all-reduce, all-gather and
// broadcast on CPU) over vans: the part of vans_server.cc that replaces a server's collective
// executor manager. Included by vans_server.cc, inside its namespace, after what it uses
// (Shared, FromVans, LastError, counters); not a header of its own.
//
// TensorFlow's collective algorithms (ring reduce and gather, tree broadcast) move their
// chunks through a CollectiveRemoteAccess: the producer posts a buffer for a peer under a key
// (PostToPeer), the consumer asks for it (RecvFromPeer). TensorFlow's distributed one keeps
// posted buffers in the producer's BufRendezvous and has the consumer fetch them with a
// RecvBuf call over gRPC. VansCollectiveAccess moves them over vans instead, through this
// task's vans rendezvous: a buffer for a peer in another task is sent under a rendezvous key
// naming both devices and the collective's key (lent, no copy), and the consumer receives it
// into the tensor the algorithm gave it (one copy, from the frame). Peers in the same task
// stay on the local BufRendezvous, and the group and instance resolution (which devices, which
// keys) stays on gRPC.
//
// Steps: an executor's step is the vans step step_id ^ kCollectiveSalt, apart from the graph
// steps' rendezvous. Eager collectives run in one executor, step 0, for the task's whole
// life: it is pinned (vans_rendezvous_pin) so that the limits on steps never cleaned up do
// not end it, and its keys repeat whenever a tf.function runs again, which vans' per-key
// queues keep in order. A graph step's executor is cleaned up with the step, and its vans
// step and pin with it. An abort ends the vans step, so every pending receive fails.
//
// Who held the replaced manager: GrpcServer::Init stores it in the WorkerEnv, which owns it,
// and its address in the MasterEnv; nothing else before Start(). The eager context takes it
// from the WorkerEnv once the factory returns (EnableCollectiveOps). So the factory replaces
// both before returning, and the replaced manager, which has created no executor, is deleted.

constexpr int64_t kCollectiveSalt = 0x56414e53434f4c4c;  // "VANSCOLL"

int64_t CollectiveStep(int64_t step_id) { return step_id ^ kCollectiveSalt; }

class VansCollectiveAccess : public tensorflow::CollectiveRemoteAccessDistributed {
 public:
  VansCollectiveAccess(const tensorflow::DeviceMgr* dev_mgr,
                       tensorflow::DeviceResolverInterface* dev_resolver,
                       std::shared_ptr<tensorflow::UnboundedWorkQueue> work_queue,
                       tensorflow::WorkerCacheInterface* worker_cache, int64_t step_id,
                       std::string task_name, std::shared_ptr<Shared> shared)
      : CollectiveRemoteAccessDistributed(dev_mgr, dev_resolver, std::move(work_queue),
                                          worker_cache, step_id, std::move(task_name)),
        shared_(std::move(shared)),
        vans_step_(CollectiveStep(step_id)) {}

  void PostToPeer(const std::string& peer_device, const std::string& peer_task,
                  const std::string& key, Device* from_device,
                  tensorflow::DeviceContext* from_device_ctx,
                  const tensorflow::AllocatorAttributes& from_alloc_attr,
                  const Tensor* from_tensor, const tensorflow::DeviceLocality& client_locality,
                  tensorflow::CancellationManager* cancellation_manager,
                  const tensorflow::StatusCallback& done) override {
    if (peer_task == task_name_) {
      CollectiveRemoteAccessLocal::PostToPeer(peer_device, peer_task, key, from_device,
                                              from_device_ctx, from_alloc_attr, from_tensor,
                                              client_locality, cancellation_manager, done);
      return;
    }
    Status checked = CheckCpu(from_device, from_tensor);
    if (!checked.ok()) {
      done(checked);
      return;
    }
    // The tensor's buffer is lent to vans until its release (sent, or dropped with the
    // step), which may come before the call returns, also when it fails. `done` runs once
    // both have happened, with the call's outcome, on TensorFlow's collective work queue
    // (the release may run on a vans thread, holding its locks).
    struct Lent {
      Tensor tensor;
      tensorflow::StatusCallback done;
      std::shared_ptr<tensorflow::UnboundedWorkQueue> queue;
      Status status;
      std::atomic<int> parts{2};

      void Part() {
        if (parts.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        queue->Schedule([this]() {
          done(status);
          delete this;
        });
      }
    };
    auto* lent = new Lent{*from_tensor, done, work_queue_};
    const auto bytes = lent->tensor.tensor_data();
    const std::string vans_key = Key(from_device->name(), peer_device, key);
    const int status = vans_rendezvous_send(
        shared_->rendezvous, vans_step_, vans_key.c_str(), bytes.data(), bytes.size(), false,
        [](void* user) {
          auto* lent = static_cast<Lent*>(user);
          lent->tensor = Tensor();
          lent->Part();
        },
        lent);
    if (status != VANS_OK) {
      lent->status =
          FromVans(status, LastError(), "sending collective chunk " + key + " to " + peer_task);
    } else {
      counters.collective_sent.fetch_add(1, std::memory_order_relaxed);
    }
    lent->Part();
  }

  void RecvFromPeer(const std::string& peer_device, const std::string& peer_task,
                    bool peer_is_local, const std::string& key, Device* to_device,
                    tensorflow::DeviceContext* to_device_ctx,
                    const tensorflow::AllocatorAttributes& to_alloc_attr, Tensor* to_tensor,
                    const tensorflow::DeviceLocality& client_locality,
                    int dev_to_dev_stream_index,
                    tensorflow::CancellationManager* cancellation_manager,
                    const tensorflow::StatusCallback& done) override {
    if (peer_is_local) {
      CollectiveRemoteAccessLocal::RecvFromPeer(
          peer_device, peer_task, peer_is_local, key, to_device, to_device_ctx, to_alloc_attr,
          to_tensor, client_locality, dev_to_dev_stream_index, cancellation_manager, done);
      return;
    }
    Status checked = CheckCpu(to_device, to_tensor);
    if (!checked.ok()) {
      done(checked);
      return;
    }
    auto pending = std::make_shared<Receive>(
        to_tensor, done, work_queue_,
        tensorflow::strings::StrCat("receiving collective chunk ", key, " from ", peer_task));
    // The op's cancellation ends the receive at once; vans' answer, if it still comes, is
    // dropped.
    if (cancellation_manager != nullptr) {
      pending->cancellation = cancellation_manager;
      pending->token = cancellation_manager->get_cancellation_token();
      const bool registered = cancellation_manager->RegisterCallback(pending->token, [pending]() {
        pending->Finish(Cancelled(pending->what), nullptr);
      });
      if (!registered) {
        pending->cancellation = nullptr;
        pending->Finish(Cancelled(pending->what), nullptr);
        return;
      }
    }
    const std::string vans_key = Key(peer_device, to_device->name(), key);
    auto* owned = new std::shared_ptr<Receive>(pending);
    // Finished where `Complete` says (as RecvBuf calls on gRPC's completion threads), or, a
    // large chunk on a vans thread, on TensorFlow's collective work queue.
    const int status = RecvHere(
        shared_->rendezvous, vans_step_, vans_key.c_str(),
        [](void* user, int status, vans_buffer* value, bool) {
          std::shared_ptr<Receive> pending = std::move(*static_cast<std::shared_ptr<Receive>*>(user));
          delete static_cast<std::shared_ptr<Receive>*>(user);
          Status result;
          if (status != VANS_OK) result = FromVans(status, LastError(), pending->what);
          auto queue = pending->queue;
          Complete(
              value, [pending, result, value]() { pending->Finish(result, value); },
              [queue](std::function<void()> finish) { queue->Schedule(std::move(finish)); });
        },
        owned);
    if (status != VANS_OK) {
      delete owned;
      pending->Finish(FromVans(status, LastError(), pending->what), nullptr);
    }
  }

  void StartAbort(const Status& status) override {
    CollectiveRemoteAccessDistributed::StartAbort(status);
    // The vans step goes too: its pending receives fail. Once is enough.
    if (!aborted_.exchange(true, std::memory_order_acq_rel)) {
      vans_rendezvous_cleanup(shared_->rendezvous, vans_step_);
    }
  }

 private:
  // A receive in flight, finished once: by vans' answer or by the op's cancellation.
  struct Receive {
    Receive(Tensor* to, tensorflow::StatusCallback done,
            std::shared_ptr<tensorflow::UnboundedWorkQueue> queue, std::string what)
        : to(to), done(std::move(done)), queue(std::move(queue)), what(std::move(what)) {}

    Tensor* to;
    tensorflow::StatusCallback done;
    std::shared_ptr<tensorflow::UnboundedWorkQueue> queue;
    std::string what;
    tensorflow::CancellationManager* cancellation = nullptr;
    tensorflow::CancellationToken token = tensorflow::CancellationManager::kInvalidToken;
    std::atomic<bool> finished{false};

    // Copies `value` into the algorithm's tensor (when the receive succeeded, and its length
    // is the tensor's) and runs `done`, the first time only; frees the buffer either way.
    void Finish(Status status, vans_buffer* value) {
      if (finished.exchange(true, std::memory_order_acq_rel)) {
        vans_buffer_free(value);
        return;
      }
      if (cancellation != nullptr) cancellation->TryDeregisterCallback(token);
      if (status.ok()) {
        const size_t len = vans_buffer_len(value);
        const size_t want = to->TotalBytes();
        if (len != want) {
          status = tensorflow::errors::DataLoss("vans: ", what, ": ", len,
                                                " bytes arrived for a tensor of ", want,
                                                " (do both tasks run the same program?)");
        } else if (len > 0) {
          std::memcpy(tensorflow::DMAHelper::base(to), vans_buffer_data(value), len);
          counters.collective_received.fetch_add(1, std::memory_order_relaxed);
          counters.copied_bytes.fetch_add(len, std::memory_order_relaxed);
        }
      }
      vans_buffer_free(value);
      done(status);
    }
  };

  // The vans rendezvous key of chunk `key` from device `src` to device `dst`.
  static std::string Key(const std::string& src, const std::string& dst, const std::string& key) {
    return Rendezvous::CreateKey(src, 0, dst, "vans_collective/" + key,
                                 tensorflow::FrameAndIter(0, 0));
  }

  Status CheckCpu(Device* device, const Tensor* tensor) const {
    if (device->device_type() != tensorflow::DEVICE_CPU) {
      return tensorflow::errors::Unimplemented(
          "vans: ", shared_->protocol, " carries collectives between CPU devices; ",
          device->name(), " is not (use protocol=\"grpc\")");
    }
    if (!tensorflow::DataTypeCanUseMemcpy(tensor->dtype())) {
      return tensorflow::errors::Unimplemented("vans: a collective of ",
                                               DataTypeString(tensor->dtype()),
                                               " does not travel as bytes");
    }
    return Status();
  }

  std::shared_ptr<Shared> shared_;
  const int64_t vans_step_;
  std::atomic<bool> aborted_{false};
};

class VansCollectiveExecutorMgr : public tensorflow::RpcCollectiveExecutorMgr {
 public:
  VansCollectiveExecutorMgr(
      const tensorflow::ConfigProto& config, const tensorflow::DeviceMgr* dev_mgr,
      std::unique_ptr<tensorflow::DeviceResolverDistributed> dev_resolver,
      std::unique_ptr<tensorflow::CollectiveParamResolverDistributed> params,
      std::unique_ptr<tensorflow::NcclCommunicatorInterface> nccl,
      tensorflow::WorkerCacheInterface* worker_cache, const std::string& task_name,
      std::shared_ptr<Shared> shared)
      : RpcCollectiveExecutorMgr(config, dev_mgr, std::move(dev_resolver), std::move(params),
                                 std::move(nccl), worker_cache, task_name),
        shared_(std::move(shared)) {}

  // The step's executor goes, and its vans step (and pin) with it.
  void Cleanup(int64_t step_id) override {
    RpcCollectiveExecutorMgr::Cleanup(step_id);
    {
      std::lock_guard<std::mutex> lock(steps_mu_);
      steps_.erase(step_id);
    }
    vans_rendezvous_cleanup(shared_->rendezvous, CollectiveStep(step_id));
  }

  void CleanupAll() override {
    RpcCollectiveExecutorMgr::CleanupAll();
    std::set<int64_t> steps;
    {
      std::lock_guard<std::mutex> lock(steps_mu_);
      steps.swap(steps_);
    }
    for (int64_t step_id : steps) {
      vans_rendezvous_cleanup(shared_->rendezvous, CollectiveStep(step_id));
    }
  }

 protected:
  tensorflow::CollectiveExecutor* Create(int64_t step_id) override {
    {
      std::lock_guard<std::mutex> lock(steps_mu_);
      steps_.insert(step_id);
    }
    vans_rendezvous_pin(shared_->rendezvous, CollectiveStep(step_id));
    auto* access = new VansCollectiveAccess(dev_mgr_, dev_resolver_.get(), work_queue_,
                                            worker_cache_, step_id, task_name_, shared_);
    return new tensorflow::BaseCollectiveExecutor(this, access, step_id, dev_mgr_, work_queue_);
  }

 private:
  std::shared_ptr<Shared> shared_;
  // The steps whose executors were created and not cleaned up (their vans steps pinned).
  std::mutex steps_mu_;
  std::set<int64_t> steps_;
};

// Gives `server` a VansCollectiveExecutorMgr (see the top of this file).
void ReplaceCollectives(const ServerDef& def, ServerInterface* server,
                        std::shared_ptr<Shared> shared) {
  WorkerEnv* env = server->worker_env();
  tensorflow::WorkerCacheInterface* cache = server->master_env()->worker_cache;
  const std::string task = tensorflow::strings::StrCat("/job:", def.job_name(), "/replica:",
                                                       def.replica(), "/task:", def.task_index());
  const tensorflow::ConfigProto& config = def.default_session_config();
  // As TensorFlow's own manager: NCCL's communicator when this TensorFlow has one (GPU
  // collectives over NCCL do not go through the remote access, so vans does not touch them).
  auto nccl = tensorflow::MaybeCreateNcclCommunicator(config);
  auto devices = std::make_unique<tensorflow::DeviceResolverDistributed>(env->device_mgr);
  auto params = std::make_unique<tensorflow::CollectiveParamResolverDistributed>(
      config, env->device_mgr, devices.get(), nccl.get(), cache, task);
  env->collective_executor_mgr.reset(new VansCollectiveExecutorMgr(
      config, env->device_mgr, std::move(devices), std::move(params), std::move(nccl), cache,
      task, std::move(shared)));
  server->master_env()->collective_executor_mgr = env->collective_executor_mgr.get();
}
