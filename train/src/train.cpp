// hvd::train: broadcasts and the DistributedOptimizer (hvd/train.hpp).
#include "hvd/train.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>

#if defined(HVD_TRAIN_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace hvd::train {
namespace {

// Exceptions stop here: a LibTorch error becomes a Status.
template <typename F>
Status guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Status(HVD_ERR_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return Status(HVD_ERR_INTERNAL, std::string(what) + ": an unknown exception");
  }
}

Result<hvd_dtype> dtype_of_tensor(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return HVD_FLOAT32;
    case torch::kDouble:
      return HVD_FLOAT64;
    case torch::kHalf:
      return HVD_FLOAT16;
    case torch::kBFloat16:
      return HVD_BFLOAT16;
    case torch::kInt:
      return HVD_INT32;
    case torch::kLong:
      return HVD_INT64;
    case torch::kByte:
      return HVD_UINT8;
    case torch::kChar:
      return HVD_INT8;
    default:
      return Status(HVD_ERR_UNSUPPORTED,
                    std::string("hvd has no dtype for torch's ") + c10::toString(t.scalar_type()));
  }
}

// Where a tensor lives, for hvd: NULL (host) or its CUDA device and current stream. The
// returned object must outlive the call it is passed to.
struct Placement {
  hvd_placement raw{sizeof(hvd_placement), HVD_MEMORY_HOST, -1, nullptr};
  const hvd_placement* get() const { return raw.memory_type == HVD_MEMORY_HOST ? nullptr : &raw; }
};

Result<Placement> placement_of(const torch::Tensor& t) {
  Placement p;
  if (t.device().is_cpu()) return p;
  if (!t.device().is_cuda())
    return Status(HVD_ERR_UNSUPPORTED, "hvd takes CPU and CUDA tensors, not " + t.device().str());
  p.raw.memory_type = HVD_MEMORY_CUDA;
  p.raw.device = t.device().index();
#if defined(HVD_TRAIN_WITH_CUDA)
  p.raw.stream = c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#endif  // else the legacy default stream (NULL), LibTorch's own default
  return p;
}

std::vector<int64_t> shape_of(const torch::Tensor& t) {
  if (t.dim() == 0) return {1};  // a scalar is one element
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

// Broadcasts each named tensor by name (fused by the scheduler), through a contiguous copy where
// a tensor is not contiguous.
Status broadcast_tensors(Comm& comm, const std::vector<std::pair<std::string, torch::Tensor>>& all,
                         int root) {
  torch::NoGradGuard no_grad;
  struct Pending {
    torch::Tensor target, buffer;
    Placement placement;
    std::optional<Request> request;
  };
  std::vector<Pending> pending;
  pending.reserve(all.size());
  Status first;
  // Exceptions are caught per tensor: none may unwind past a buffer hvd is writing into.
  for (const auto& [name, tensor] : all) {
    if (!tensor.defined() || tensor.numel() == 0) continue;
    first = guarded("broadcast", [&, &tensor_name = name, &t = tensor]() -> Status {
      Pending p;
      p.target = t;
      p.buffer = t.is_contiguous() ? t : t.contiguous();
      auto dtype = dtype_of_tensor(p.buffer);
      if (!dtype) return dtype.status().with_context(tensor_name);
      auto placement = placement_of(p.buffer);
      if (!placement) return placement.status().with_context(tensor_name);
      p.placement = *placement;
      auto request = comm.broadcast_async(tensor_name, p.buffer.data_ptr(), p.buffer.data_ptr(),
                                          *dtype, shape_of(p.buffer), root, p.placement.get());
      if (!request) return request.status();
      p.request.emplace(std::move(*request));
      pending.push_back(std::move(p));
      return Status::success();
    });
    if (!first.ok()) break;
  }
  for (Pending& p : pending) {  // every submitted buffer is waited for before it is released
    Status s = p.request->wait();
    if (s.ok() && !p.buffer.is_same(p.target))
      s = guarded("broadcast", [&] {
        p.target.copy_(p.buffer);
        return Status::success();
      });
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace

Status broadcast_parameters(Comm& comm, torch::nn::Module& module, int root) {
  return guarded("broadcast_parameters", [&] {
    std::vector<std::pair<std::string, torch::Tensor>> all;
    for (const auto& item : module.named_parameters())
      all.emplace_back("broadcast_parameters.param." + item.key(), item.value());
    for (const auto& item : module.named_buffers())
      all.emplace_back("broadcast_parameters.buffer." + item.key(), item.value());
    return broadcast_tensors(comm, all, root);
  });
}

Status broadcast_optimizer_state(Comm& comm, torch::optim::Optimizer& optimizer, int root) {
  // LibTorch serializes any optimizer (state keyed by parameter position, and the groups'
  // options), so root's archive is broadcast as bytes and loaded by the others.
  std::string bytes;
  Status saved;
  if (comm.rank() == root) {
    Status s = guarded("broadcast_optimizer_state: saving", [&] {
      torch::serialize::OutputArchive archive;
      optimizer.save(archive);
      std::ostringstream out;
      archive.save_to(out);
      bytes = out.str();
      return Status::success();
    });
    if (!s.ok()) {
      bytes.clear();  // broadcast an empty archive: every rank then fails alike
      saved = s;
    }
  }
  int64_t size = static_cast<int64_t>(bytes.size());
  auto sized =
      comm.broadcast_async("broadcast_optimizer_state.size", &size, &size, HVD_INT64, {1}, root);
  if (!sized) return sized.status();
  HVD_RETURN_IF_ERROR(sized->wait());
  if (!saved.ok()) return saved;
  if (size == 0)
    return Status(HVD_ERR_INTERNAL, "broadcast_optimizer_state: rank " + std::to_string(root) +
                                        " could not serialize its optimizer");
  bytes.resize(static_cast<size_t>(size));
  auto sent = comm.broadcast_async("broadcast_optimizer_state.bytes", bytes.data(), bytes.data(),
                                   HVD_UINT8, {size}, root);
  if (!sent) return sent.status();
  HVD_RETURN_IF_ERROR(sent->wait());

  Status loaded = Status::success();
  if (comm.rank() != root) {
    loaded = guarded("broadcast_optimizer_state: loading", [&] {
      c10::optional<torch::Device> device;
      for (const auto& group : optimizer.param_groups())
        for (const auto& p : group.params())
          if (!device) device = p.device();
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size(), device);
      optimizer.state().clear();  // what root has not made yet is absent here too
      optimizer.load(archive);
      // LibTorch's load restores the state, not the groups' options (the learning rate): read
      // them from the archive too.
      torch::serialize::InputArchive groups;
      archive.read("param_groups", groups);
      for (size_t i = 0; i < optimizer.param_groups().size(); ++i) {
        torch::serialize::InputArchive group, options;
        groups.read("param_groups/" + std::to_string(i), group);
        group.read("options", options);
        optimizer.param_groups()[i].options().serialize(options);
      }
      return Status::success();
    });
  }
  // Every rank learns whether every other loaded, so a failure is an error on every rank.
  int32_t failed = loaded.ok() ? 0 : 1;
  std::vector<int32_t> all(static_cast<size_t>(comm.size()));
  auto gathered =
      comm.allgather_async("broadcast_optimizer_state.loaded", &failed, all.data(), HVD_INT32, {1});
  if (!gathered) return gathered.status();
  HVD_RETURN_IF_ERROR(gathered->wait());
  if (!loaded.ok()) return loaded;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != 0)
      return Status(HVD_ERR_REMOTE, "broadcast_optimizer_state: rank " + std::to_string(r) +
                                        " could not load rank " + std::to_string(root) +
                                        "'s optimizer state (its log says why)");
  return Status::success();
}

Result<double> metric_average(Comm& comm, double value, const std::string& name) {
  auto request = comm.allreduce_async(name, &value, &value, HVD_FLOAT64, {1}, HVD_AVERAGE);
  if (!request) return request.status();
  HVD_RETURN_IF_ERROR(request->wait());
  return value;
}

// What the autograd hooks share with the optimizer. The hooks hold it weakly: a hook that
// outlives its optimizer finds nothing and does nothing.
struct DistributedOptimizer::State {
  struct Slot {
    std::string name;
    torch::Tensor parameter;
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: it holds our hook
    uintptr_t hook = 0;
    int passes = 0;      // backward passes accumulated since the last step
    torch::Tensor wire;  // what is reduced: the gradient itself, or a converted copy
    Placement placement;
    std::optional<Request> request;
    Status error;  // a failure in a hook, reported by synchronize()
  };

  Comm* comm;
  DistributedOptimizerOptions options;
  std::mutex mutex;
  std::vector<Slot> slots;
  // The gradients were reduced by synchronize() and no backward pass has run since: step() then
  // steps on them without reducing them again.
  bool synchronized = false;
  Status setup_error;  // the constructor's, reported by every synchronize()

  void gradient_ready(size_t index) noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    synchronized = false;
    Slot& slot = slots[index];
    if (slot.request || !slot.error.ok()) {
      if (slot.error.ok())
        slot.error = Status(HVD_ERR_STATE,
                            "the gradient of '" + slot.name +
                                "' was computed more than "
                                "backward_passes_per_step (" +
                                std::to_string(options.backward_passes_per_step) +
                                ") times before step(); call step() or synchronize() after the "
                                "last backward pass of a step");
      return;
    }
    if (++slot.passes < options.backward_passes_per_step) return;
    slot.error = submit(slot);
  }

  // Hands the slot's gradient (zeros if it has none) to the scheduler. With the mutex held.
  Status submit(Slot& slot) noexcept {
    return guarded("DistributedOptimizer", [&]() -> Status {
      torch::NoGradGuard no_grad;
      if (!slot.parameter.grad().defined())
        slot.parameter.mutable_grad() = torch::zeros_like(slot.parameter);
      // Sparse gradients (an Embedding with sparse=true) are reduced dense, as Horovod's
      // sparse_as_dense does: a rank that did not touch the embedding sends dense zeros.
      if (slot.parameter.grad().is_sparse())
        slot.parameter.mutable_grad() = slot.parameter.grad().to_dense();
      const torch::Tensor& grad = slot.parameter.grad();
      if (options.compression == Compression::fp16 &&
          (grad.scalar_type() == torch::kFloat || grad.scalar_type() == torch::kDouble))
        slot.wire = grad.to(torch::kHalf).contiguous();
      else
        slot.wire = grad.is_contiguous() ? grad : grad.contiguous();
      auto dtype = dtype_of_tensor(slot.wire);
      if (!dtype) return dtype.status().with_context(slot.name);
      auto placement = placement_of(slot.wire);
      if (!placement) return placement.status().with_context(slot.name);
      slot.placement = *placement;
      auto request = comm->allreduce_async(
          slot.name, slot.wire.data_ptr(), slot.wire.data_ptr(), *dtype, shape_of(slot.wire),
          options.op, options.gradient_prescale, options.gradient_postscale, slot.placement.get());
      if (!request) return request.status();
      slot.request.emplace(std::move(*request));
      return Status::success();
    });
  }
};

namespace {

class GradientReady final : public torch::autograd::FunctionPostHook {
 public:
  GradientReady(std::weak_ptr<DistributedOptimizer::State> state, size_t index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto state = state_.lock()) state->gradient_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<DistributedOptimizer::State> state_;
  size_t index_;
};

}  // namespace

DistributedOptimizer::DistributedOptimizer(Comm& comm, torch::optim::Optimizer& optimizer,
                                           const NamedParameters& parameters,
                                           DistributedOptimizerOptions options)
    : optimizer_(optimizer), state_(std::make_shared<State>()) {
  state_->comm = &comm;
  if (options.backward_passes_per_step < 1) options.backward_passes_per_step = 1;
  state_->options = std::move(options);
  std::vector<const void*> seen;  // a tied weight, listed under two names, is reduced once
  for (const auto& item : parameters) {
    if (!item.value().requires_grad()) continue;
    const void* impl = item.value().unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    State::Slot slot;
    slot.name = state_->options.name_prefix + item.key();
    slot.parameter = item.value();
    state_->slots.push_back(std::move(slot));
  }
  // The post-hook of a parameter's gradient accumulator runs once its .grad() holds this
  // pass's sum (a tensor hook would see the incoming gradient before accumulation).
  // A parameter without a hook (none could be made) is still reduced, in synchronize().
  for (size_t i = 0; i < state_->slots.size(); ++i) {
    State::Slot& slot = state_->slots[i];
    Status s = guarded("DistributedOptimizer", [&] {
      slot.accumulator = torch::autograd::impl::grad_accumulator(slot.parameter);
      if (slot.accumulator)
        slot.hook = slot.accumulator->add_post_hook(
            std::make_unique<GradientReady>(std::weak_ptr<State>(state_), i));
      return Status::success();
    });
    if (!s.ok() && state_->setup_error.ok()) state_->setup_error = s.with_context(slot.name);
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (State::Slot& slot : state_->slots) {
    if (slot.accumulator && slot.hook != 0) slot.accumulator->del_post_hook(slot.hook);
  }
  // hvd may still write into a slot's wire: wait for it. A reduction the other ranks never join
  // (this rank left its step half done) would wait forever, so past a minute the communicator
  // is aborted, which fails it at once.
  for (State::Slot& slot : state_->slots) {
    if (!slot.request) continue;
    if (slot.request->wait(60).code() == HVD_ERR_TIMEOUT) {
      (void)state_->comm->abort();
      (void)slot.request->wait();
    }
  }
}

const DistributedOptimizerOptions& DistributedOptimizer::options() const { return state_->options; }

Status DistributedOptimizer::synchronize() {
  State& state = *state_;
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.synchronized) return Status::success();
  Status first = state.setup_error;
  for (State::Slot& slot : state.slots) {
    if (!slot.request && slot.error.ok()) slot.error = state.submit(slot);
    if (first.ok() && !slot.error.ok()) first = slot.error;
  }
  // A failure of this rank's own (a hook's, a submission's) would leave the others waiting for
  // gradients it will not send: the communicator is aborted, so they fail at their next step at
  // the latest instead of hanging.
  if (!first.ok()) (void)state.comm->abort();
  for (State::Slot& slot : state.slots) {
    if (slot.request) {
      Status s = slot.request->wait();
      if (s.ok() && !slot.wire.is_same(slot.parameter.grad())) {
        s = guarded("DistributedOptimizer", [&] {
          torch::NoGradGuard no_grad;
          slot.parameter.mutable_grad().copy_(slot.wire);
          return Status::success();
        });
      }
      if (first.ok() && !s.ok()) first = s;
    }
    slot.request.reset();
    slot.wire = torch::Tensor();
    slot.passes = 0;
    slot.error = Status::success();
  }
  state.synchronized = first.ok();
  return first;
}

Status DistributedOptimizer::step() {
  HVD_RETURN_IF_ERROR(synchronize());
  Status s = guarded("optimizer step", [&] {
    optimizer_.step();
    return Status::success();
  });
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->synchronized = false;
  return s;
}

void DistributedOptimizer::zero_grad() {
  (void)guarded("zero_grad", [&] {
    optimizer_.zero_grad();
    return Status::success();
  });
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->synchronized = false;
}

}  // namespace hvd::train
