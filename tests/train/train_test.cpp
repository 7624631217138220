// hvd::train under real processes (hvdrun -np N): every rank runs every test. A distributed step
// is checked against one process stepping on the concatenated batch, which every rank computes
// alone from the same seeded data.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm_environment.hpp"
#include "hvd/train.hpp"

namespace {

using hvd_test::CommEnvironment;
using hvd_test::g_comm;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 3));
    // Only rank 0 feeds `extra` into the loss in some tests: the others never make its gradient.
    extra = register_parameter("extra", torch::full({4}, 0.5));
    unused = register_parameter("unused", torch::ones({2}));
    register_buffer("steps", torch::zeros({1}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor extra, unused;
};
TORCH_MODULE(Net);

// A model whose initial weights depend on `seed` only.
Net make_net(uint64_t seed) {
  torch::manual_seed(seed);
  return Net();
}

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

// Rank r's batch of `rows` samples, the same on every rank that asks for it.
std::pair<torch::Tensor, torch::Tensor> batch_of(int r, int step, int rows = 4) {
  torch::manual_seed(1000 + 97 * static_cast<uint64_t>(step) + static_cast<uint64_t>(r));
  return {torch::randn({rows, 6}), torch::randn({rows, 3})};
}

torch::Tensor loss_of(Net& net, const std::pair<torch::Tensor, torch::Tensor>& b) {
  return torch::mse_loss(net->forward(b.first), b.second);
}

// Every rank's copy of `t` (a flat float tensor of the same size everywhere).
std::vector<torch::Tensor> gather(const torch::Tensor& t) {
  torch::Tensor all = torch::empty({g_comm->size(), t.numel()});
  hvd::Status s = g_comm->allgather(t.data_ptr<float>(), all.data_ptr<float>(),
                                    static_cast<uint64_t>(t.numel()), HVD_FLOAT32);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return all.unbind(0);
}

void expect_same_on_every_rank(const torch::Tensor& t) {
  auto all = gather(t);
  for (size_t r = 0; r < all.size(); ++r)
    EXPECT_TRUE(torch::equal(all[r], all[0])) << "rank " << r << " differs from rank 0";
}

torch::optim::SGD sgd_of(Net& net, double lr = 0.1) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
}

TEST(BroadcastParameters, EveryRankHoldsTheRootsParametersAndBuffers) {
  for (int root : {0, g_comm->size() - 1}) {
    Net net = make_net(100 + static_cast<uint64_t>(g_comm->rank()));  // different everywhere
    net->named_buffers()["steps"].fill_(g_comm->rank());
    Net roots = make_net(100 + static_cast<uint64_t>(root));
    ASSERT_TRUE(hvd::train::broadcast_parameters(*g_comm, *net, root).ok());
    EXPECT_TRUE(torch::equal(flat(*net), flat(*roots))) << "root " << root;
    EXPECT_EQ(net->named_buffers()["steps"].item<int64_t>(), root);
  }
}

TEST(MetricAverage, IsTheMeanOverTheRanks) {
  auto mean = hvd::train::metric_average(*g_comm, g_comm->rank(), "metric");
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_DOUBLE_EQ(*mean, (g_comm->size() - 1) / 2.0);
}

// Steps `steps` times on the distributed optimizer (each rank on its batch, `passes` backward
// passes per step) and the same on one process over every rank's batches, and compares.
void expect_steps_match_one_process(hvd::train::DistributedOptimizerOptions options, int steps,
                                    double atol) {
  const int size = g_comm->size();
  const int passes = options.backward_passes_per_step;
  Net net = make_net(7);
  Net alone = make_net(7);
  auto sgd = sgd_of(net);
  auto alone_sgd = sgd_of(alone);
  hvd::train::DistributedOptimizer opt(*g_comm, sgd, net->named_parameters(), options);
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    alone_sgd.zero_grad();
    for (int pass = 0; pass < passes; ++pass) {
      const int k = step * passes + pass;
      loss_of(net, batch_of(g_comm->rank(), k)).backward();
      // The mean over the concatenated batch is the mean of the ranks' means (equal rows).
      std::vector<torch::Tensor> xs, ys;
      for (int r = 0; r < size; ++r) {
        auto b = batch_of(r, k);
        xs.push_back(b.first);
        ys.push_back(b.second);
      }
      loss_of(alone, {torch::cat(xs), torch::cat(ys)}).backward();
    }
    hvd::Status s = opt.step();
    ASSERT_TRUE(s.ok()) << s.to_string();
    alone_sgd.step();
  }
  EXPECT_TRUE(torch::allclose(flat(*net), flat(*alone), 1e-4, atol))
      << "max difference " << (flat(*net) - flat(*alone)).abs().max().item<float>();
  expect_same_on_every_rank(flat(*net));
}

TEST(DistributedOptimizer, StepsAsOneProcessOnTheConcatenatedBatch) {
  expect_steps_match_one_process({}, 3, 1e-6);
}

TEST(DistributedOptimizer, TwoBackwardPassesPerStepSumLocallyThenAverage) {
  hvd::train::DistributedOptimizerOptions options;
  options.backward_passes_per_step = 2;
  expect_steps_match_one_process(options, 2, 1e-6);
}

TEST(DistributedOptimizer, Fp16CompressionIsWithinFp16Tolerance) {
  hvd::train::DistributedOptimizerOptions options;
  options.compression = hvd::train::Compression::fp16;
  expect_steps_match_one_process(options, 2, 2e-3);
}

TEST(DistributedOptimizer, SumWithScalesIsScaledSum) {
  const int size = g_comm->size();
  Net net = make_net(3);
  auto sgd = sgd_of(net);
  hvd::train::DistributedOptimizerOptions options;
  options.op = HVD_SUM;
  options.gradient_prescale = 2;
  options.gradient_postscale = 0.25;
  hvd::train::DistributedOptimizer opt(*g_comm, sgd, net->named_parameters(), options);
  net->fc1->weight.mutable_grad() = torch::full({5, 6}, double(g_comm->rank() + 1));
  ASSERT_TRUE(opt.synchronize().ok());
  // sum over r of 2 (r + 1), x 0.25: integer-valued, so exact.
  const double expected = 0.25 * 2 * size * (size + 1) / 2.0;
  EXPECT_TRUE(torch::equal(net->fc1->weight.grad(), torch::full({5, 6}, expected)));
}

TEST(DistributedOptimizer, AParameterWithoutAGradientIsReducedAsZeros) {
  const int size = g_comm->size();
  Net net = make_net(5);
  auto sgd = sgd_of(net);
  hvd::train::DistributedOptimizer opt(*g_comm, sgd, net->named_parameters());
  opt.zero_grad();
  // `extra` gets the gradient 1 on rank 0 alone; `unused` none anywhere.
  torch::Tensor loss = loss_of(net, batch_of(g_comm->rank(), 0));
  if (g_comm->rank() == 0) loss = loss + net->extra.sum();
  loss.backward();
  hvd::Status s = opt.step();  // no rank waits for a gradient another never makes
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(torch::allclose(net->extra.grad(), torch::full({4}, 1.0 / size)));
  EXPECT_TRUE(torch::equal(net->unused.grad(), torch::zeros({2})));
  EXPECT_TRUE(torch::equal(net->unused.detach(), torch::ones({2})));
  expect_same_on_every_rank(flat(*net));
}

// A rank's own failure (here: rank 0 runs a backward pass too many, which has already added into
// the gradient in flight) fails its step and aborts the communicator, so the others fail at their
// next step at the latest instead of waiting for it. On a child communicator, so that the job's
// own stays usable.
TEST(DistributedOptimizer, ABackwardPassTooManyOnOneRankFailsItsStepAndAbortsTheComm) {
  auto child = g_comm->split(0, g_comm->rank());
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  {
    Net net = make_net(9);
    auto sgd = sgd_of(net);
    hvd::train::DistributedOptimizer opt(*child, sgd, net->named_parameters());
    loss_of(net, batch_of(g_comm->rank(), 0)).backward();
    if (g_comm->rank() == 0) loss_of(net, batch_of(0, 1)).backward();
    hvd::Status s = opt.step();
    if (g_comm->rank() == 0) {
      EXPECT_EQ(s.code(), HVD_ERR_STATE) << s.to_string();
      EXPECT_NE(s.message().find("more than backward_passes_per_step"), std::string::npos)
          << s.to_string();
    }
    // The others' first reduction may have completed before rank 0 aborted; the next cannot.
    opt.zero_grad();
    loss_of(net, batch_of(g_comm->rank(), 2)).backward();
    if (g_comm->size() > 1 || g_comm->rank() == 0) {
      EXPECT_FALSE(opt.step().ok()) << "the communicator was aborted";
    }
  }
  (void)child->finalize();
}

// Horovod's pattern: synchronize(), touch the gradients (clip them), then step() without a
// second reduction. With a sum, a second one would multiply them by the ranks again.
TEST(DistributedOptimizer, SynchronizeThenStepReducesOnce) {
  const int size = g_comm->size();
  Net net = make_net(3);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.0));
  hvd::train::DistributedOptimizerOptions options;
  options.op = HVD_SUM;
  hvd::train::DistributedOptimizer opt(*g_comm, sgd, net->named_parameters(), options);
  net->fc2->bias.mutable_grad() = torch::ones({3});
  ASSERT_TRUE(opt.synchronize().ok());
  ASSERT_TRUE(opt.step().ok());
  EXPECT_TRUE(torch::equal(net->fc2->bias.grad(), torch::full({3}, double(size))));
}

// A weight listed under two names (tied weights) is one parameter: reduced once.
TEST(DistributedOptimizer, ATiedWeightListedTwiceIsReducedOnce) {
  const int size = g_comm->size();
  Net net = make_net(3);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.0));
  auto named = net->named_parameters();
  named.insert("tied.fc2.bias", net->fc2->bias);
  hvd::train::DistributedOptimizerOptions options;
  options.op = HVD_SUM;
  hvd::train::DistributedOptimizer opt(*g_comm, sgd, named, options);
  net->fc2->bias.mutable_grad() = torch::ones({3});
  ASSERT_TRUE(opt.step().ok());
  EXPECT_TRUE(torch::equal(net->fc2->bias.grad(), torch::full({3}, double(size))));
}

TEST(DistributedOptimizer, AProcessSetTrainsAlone) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Ranks 0 and size-1 train; the others (at 3 or 4 ranks) stay out.
  auto set = g_comm->process_set({0, g_comm->size() - 1});
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  if (!*set) return;
  Net net = make_net(11 + static_cast<uint64_t>(g_comm->rank()));
  ASSERT_TRUE(hvd::train::broadcast_parameters(*set, *net, 0).ok());
  auto sgd = sgd_of(net);
  hvd::train::DistributedOptimizer opt(*set, sgd, net->named_parameters());
  opt.zero_grad();
  loss_of(net, batch_of(set->rank(), 0)).backward();
  hvd::Status s = opt.step();
  ASSERT_TRUE(s.ok()) << s.to_string();
  torch::Tensor mine = flat(*net);
  torch::Tensor all = torch::empty({2, mine.numel()});
  ASSERT_TRUE(set->allgather(mine.data_ptr<float>(), all.data_ptr<float>(),
                             static_cast<uint64_t>(mine.numel()), HVD_FLOAT32)
                  .ok());
  EXPECT_TRUE(torch::equal(all[0], all[1]));
  ASSERT_TRUE(set->finalize().ok());
}

TEST(BroadcastOptimizerState, EveryRankHoldsTheRootsMomentumAndLearningRate) {
  Net net = make_net(13);
  torch::optim::SGD sgd(net->parameters(),
                        torch::optim::SGDOptions(0.1 * (g_comm->rank() + 1)).momentum(0.9));
  loss_of(net, batch_of(g_comm->rank(), 0)).backward();  // momentum differs on every rank
  sgd.step();
  ASSERT_TRUE(hvd::train::broadcast_optimizer_state(*g_comm, sgd, 0).ok());
  auto& options = static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
  EXPECT_DOUBLE_EQ(options.lr(), 0.1);
  std::vector<torch::Tensor> momenta;
  for (const auto& p : net->parameters()) {
    auto it = sgd.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it == sgd.state().end()) continue;  // no gradient reached it on root either
    momenta.push_back(
        static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().flatten());
  }
  ASSERT_FALSE(momenta.empty());
  expect_same_on_every_rank(torch::cat(momenta));
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new CommEnvironment);
  return RUN_ALL_TESTS();
}
