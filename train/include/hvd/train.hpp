// hvd/train.hpp — data-parallel training with LibTorch over hvd (Horovod's torch API in C++).
//
//   auto comm = hvd::Comm::init().value();
//   Net model;
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01 * comm.size()));
//   hvd::train::broadcast_parameters(comm, *model, 0);          // every rank starts alike
//   hvd::train::DistributedOptimizer opt(comm, sgd, model->named_parameters());
//   for (auto& batch : my_shard) {
//     opt.zero_grad();
//     loss_of(model, batch).backward();  // each gradient leaves for the allreduce when ready
//     if (hvd::Status s = opt.step(); !s.ok()) { ...every rank's step fails... }
//   }
//
// Each gradient is handed to hvd's fusion scheduler by name (the parameter's name) as soon as
// autograd has accumulated it, so the allreduce of the last layers overlaps the backward pass of
// the first; step() waits for the averaged gradients, then runs the wrapped optimizer. The calls
// return hvd::Status: a LibTorch exception becomes HVD_ERR_INTERNAL, and no exception leaves an
// autograd hook.
//
// Lifetimes: the communicator, the wrapped optimizer and the parameters outlive the
// DistributedOptimizer. Every rank wraps the same parameters under the same names. Construct it
// after moving the model to its device or dtype: `module->to()` replaces the parameters'
// gradient accumulators, and with them the hooks (the gradients are then still reduced, in
// step(), but no longer while backward runs).
#ifndef HVD_TRAIN_HPP
#define HVD_TRAIN_HPP

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hvd/hvd.hpp"

namespace hvd::train {

// Copies root's parameters and buffers (running means and the like) to every rank, in the
// module's named order. Collective: every rank passes a module of the same structure.
Status broadcast_parameters(Comm& comm, torch::nn::Module& module, int root = 0);

// Copies root's optimizer state (per-parameter state such as momentum buffers, and every
// parameter group's options such as the learning rate) to every rank. Collective. Every rank's
// optimizer must be of the same type over the same parameters; state that root has not made
// yet (momentum before the first step) is absent on every rank afterwards.
Status broadcast_optimizer_state(Comm& comm, torch::optim::Optimizer& optimizer, int root = 0);

// The average of `value` over the ranks (a loss, an accuracy). `name` identifies the allreduce:
// every rank passes the same name, and no two concurrent metrics share one.
Result<double> metric_average(Comm& comm, double value, const std::string& name);

// What goes on the wire. fp16 halves the bytes of float32 gradients; the sum is taken in fp16
// (float32 and float64 gradients are converted, reduced, and converted back; others go as they
// are).
enum class Compression { none, fp16 };

struct DistributedOptimizerOptions {
  hvd_reduce_op op = HVD_AVERAGE;   // HVD_AVERAGE or HVD_SUM over the ranks
  double gradient_prescale = 1.0;   // each rank's gradient x prescale before the reduction
  double gradient_postscale = 1.0;  // the reduced gradient x postscale
  // Gradients are summed locally over this many backward passes (as autograd does when
  // zero_grad is not called between them), then reduced over the ranks once, in the last pass.
  int backward_passes_per_step = 1;
  Compression compression = Compression::none;
  // Tensor names are this prefix + the parameter's name. Two optimizers on one communicator
  // need different prefixes.
  std::string name_prefix = "grad.";
};

class DistributedOptimizer {
 public:
  using NamedParameters = torch::OrderedDict<std::string, torch::Tensor>;

  // Wraps `optimizer`, whose parameters are `parameters` (module.named_parameters()); those that
  // require a gradient are reduced, a tensor listed under two names (tied weights) once, and a
  // sparse gradient as a dense one. Parameters the optimizer has that are not named here are
  // stepped on their local gradient.
  DistributedOptimizer(Comm& comm, torch::optim::Optimizer& optimizer,
                       const NamedParameters& parameters, DistributedOptimizerOptions options = {});
  // Waits for any reduction still in flight (hvd writes into its buffers); one that the other
  // ranks do not join within a minute is ended by aborting the communicator.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Waits until every gradient is reduced (submitting, as zeros, those of parameters that got
  // none in this step, so no rank waits for a gradient another rank never makes), then leaves
  // them in the parameters' .grad(). Horovod's synchronize(): a step() after it (with no
  // backward pass between) steps on these gradients without reducing them again, so they can be
  // clipped in between. The first failure is returned. A failure of this rank's own (a backward
  // pass more than backward_passes_per_step, a gradient hvd cannot take) aborts the
  // communicator, so that the other ranks fail at their next step at the latest instead of
  // waiting forever for its gradients.
  Status synchronize();
  // synchronize() (unless it was just called), then the wrapped optimizer's step(); on failure
  // the optimizer is not stepped.
  Status step();
  // The wrapped optimizer's zero_grad().
  void zero_grad();

  torch::optim::Optimizer& optimizer() { return optimizer_; }
  const DistributedOptimizerOptions& options() const;

  struct State;  // what the autograd hooks share with this object

 private:
  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<State> state_;
};

}  // namespace hvd::train

#endif  // HVD_TRAIN_HPP
