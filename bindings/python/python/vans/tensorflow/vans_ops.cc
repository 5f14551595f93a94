// TensorFlow ops of vans: pull and push of embedding rows from vans table servers.
//
// Built by vans.tensorflow against the installed TensorFlow (tf.sysconfig's flags) and loaded
// with tf.load_op_library. The kernels call into the vans Python extension, which this library
// links, through the table of C functions `vans_tf_api()` returns; the op names its worker by
// a handle (an attribute) that vans checks, never by an address, so a graph built by hand can
// make an op fail but not touch memory. Each call blocks the kernel's thread until the
// servers answered, without the Python interpreter.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

// The layout of vans' function table (bindings/python/src/tf_api.rs), version 2.
struct VansApi {
  uint32_t version;
  int (*pull)(uint64_t worker, const uint64_t* keys, size_t n, float* out, size_t out_len,
              int32_t cmd, char* err, size_t err_len);
  int (*push)(uint64_t worker, const uint64_t* keys, size_t n, const float* vals, size_t len,
              int32_t cmd, char* err, size_t err_len);
  int (*push_pull)(uint64_t worker, const uint64_t* keys, size_t n, const float* vals,
                   size_t len, float* out, size_t out_len, int32_t cmd, char* err,
                   size_t err_len);
};

// The function table, exported by the vans extension module.
extern "C" const VansApi* vans_tf_api(void);

namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::errors::Unavailable;
using tensorflow::shape_inference::InferenceContext;

constexpr uint32_t kApiVersion = 2;
// The widest row a table has (ps::optim::MAX_DIM); with it, keys * dim stays far from
// overflow for any key count a tensor can hold in memory.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxKeys = int64_t{1} << 40;

// Attributes every op takes: the function table, the worker, the row width, the command.
class VansOp : public OpKernel {
 public:
  explicit VansOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t worker = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("worker", &worker));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("cmd", &cmd_));
    api_ = vans_tf_api();
    worker_ = static_cast<uint64_t>(worker);
    OP_REQUIRES(ctx, worker > 0,
                InvalidArgument("vans: the op has no worker (use vans.tensorflow's functions)"));
    OP_REQUIRES(ctx, api_->version == kApiVersion,
                InvalidArgument("vans: the op library was built for another vans version"));
    OP_REQUIRES(ctx, dim_ > 0 && dim_ <= kMaxDim,
                InvalidArgument("vans: dim must be in 1..=", kMaxDim));
  }

 protected:
  // The keys' order as unsigned 64-bit values (vans' key order): the permutation sorting
  // them, empty when they already are; fails on a repeated key.
  Status Order(const Tensor& keys, std::vector<uint64_t>* sorted, std::vector<int64_t>* perm) {
    auto flat = keys.flat<int64_t>();
    const int64_t n = flat.size();
    if (n > kMaxKeys) return InvalidArgument("vans: ", n, " keys in one op are too many");
    sorted->resize(n);
    for (int64_t i = 0; i < n; i++) (*sorted)[i] = static_cast<uint64_t>(flat(i));
    if (std::is_sorted(sorted->begin(), sorted->end())) {
      perm->clear();
    } else {
      perm->resize(n);
      std::iota(perm->begin(), perm->end(), 0);
      std::sort(perm->begin(), perm->end(),
                [&](int64_t a, int64_t b) { return (*sorted)[a] < (*sorted)[b]; });
      std::vector<uint64_t> by_key(n);
      for (int64_t i = 0; i < n; i++) by_key[i] = (*sorted)[(*perm)[i]];
      sorted->swap(by_key);
    }
    if (std::adjacent_find(sorted->begin(), sorted->end()) != sorted->end()) {
      return InvalidArgument("vans: keys must be unique (tf.unique them first)");
    }
    return Status();
  }

  Status Failed(const char* what, const char* err) {
    return Unavailable("vans: ", what, ": ", err);
  }

  const VansApi* api_ = nullptr;
  uint64_t worker_ = 0;
  int64_t dim_ = 0;
  int32_t cmd_ = 0;
};

// VansPull (kPush false), VansPush (kPull false) and VansPushPull: keys in any order, the
// values of a push and the rows of a pull in the keys' order. Keys already in order (what
// vans.tensorflow's layer passes) move no row twice: each server's answer lands in the output
// itself; otherwise rows are gathered into key order for a push and scattered back after a
// pull.
template <bool kPush, bool kPull>
class VansKernel : public VansOp {
 public:
  using VansOp::VansOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, keys.dims() == 1, InvalidArgument("vans: keys must be a vector"));
    std::vector<uint64_t> sorted;
    std::vector<int64_t> perm;
    OP_REQUIRES_OK(ctx, Order(keys, &sorted, &perm));
    const int64_t n = static_cast<int64_t>(sorted.size());
    const size_t len = static_cast<size_t>(n * dim_);
    const float* given = nullptr;
    std::vector<float> gathered;
    if (kPush) {
      const Tensor& vals = ctx->input(1);
      OP_REQUIRES(ctx, vals.NumElements() == n * dim_,
                  InvalidArgument("vans: ", vals.NumElements(), " values for ", n,
                                  " keys of dim ", dim_));
      given = vals.flat<float>().data();
      if (!perm.empty()) {
        gathered.resize(len);
        for (int64_t i = 0; i < n; i++) {
          std::copy_n(given + perm[i] * dim_, dim_, gathered.data() + i * dim_);
        }
        given = gathered.data();
      }
    }
    float* rows = nullptr;
    std::vector<float> staged;
    float* target = nullptr;
    if (kPull) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &out));
      rows = out->flat<float>().data();
      staged.resize(perm.empty() ? 0 : len);
      target = perm.empty() ? rows : staged.data();
    }
    char err[512] = {0};
    int failed = 0;
    if (kPush && kPull) {
      failed = api_->push_pull(worker_, sorted.data(), n, given, len, target, len, cmd_, err,
                               sizeof err);
    } else if (kPush) {
      failed = api_->push(worker_, sorted.data(), n, given, len, cmd_, err, sizeof err);
    } else {
      failed = api_->pull(worker_, sorted.data(), n, target, len, cmd_, err, sizeof err);
    }
    if (failed != 0) {
      ctx->CtxFailure(Failed(kPush ? (kPull ? "push-pull" : "push") : "pull", err));
      return;
    }
    for (size_t i = 0; kPull && i < perm.size(); i++) {
      std::copy_n(staged.data() + i * dim_, dim_, rows + perm[i] * dim_);
    }
  }
};

}  // namespace

REGISTER_OP("VansPull")
    .Input("keys: int64")
    .Output("rows: float")
    .Attr("worker: int")
    .Attr("dim: int")
    .Attr("cmd: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(0), 0), dim));
      return Status();
    })
    .Doc("Rows of unique int64 keys (as unsigned) from vans table servers: [n, dim].");

REGISTER_OP("VansPush")
    .Input("keys: int64")
    .Input("values: float")
    .Attr("worker: int")
    .Attr("dim: int")
    .Attr("cmd: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext*) { return Status(); })
    .Doc("Pushes [n, dim] values (gradients) of unique int64 keys to vans table servers.");

REGISTER_OP("VansPushPull")
    .Input("keys: int64")
    .Input("values: float")
    .Output("rows: float")
    .Attr("worker: int")
    .Attr("dim: int")
    .Attr("cmd: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(0), 0), dim));
      return Status();
    })
    .Doc("Pushes [n, dim] values of unique int64 keys, then returns their updated rows.");

using VansPullKernel = VansKernel<false, true>;
using VansPushKernel = VansKernel<true, false>;
using VansPushPullKernel = VansKernel<true, true>;
REGISTER_KERNEL_BUILDER(Name("VansPull").Device(DEVICE_CPU), VansPullKernel);
REGISTER_KERNEL_BUILDER(Name("VansPush").Device(DEVICE_CPU), VansPushKernel);
REGISTER_KERNEL_BUILDER(Name("VansPushPull").Device(DEVICE_CPU), VansPushPullKernel);
