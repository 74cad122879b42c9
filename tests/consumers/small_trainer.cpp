// The small trainer a user writes, and the TU whose compile time docs/benchmarks.md tracks
// (benchmarks/compile_time.sh): a residual MLP, AdamW, one checkpoint per block. It includes
// only the headers it uses, not remat/remat.hpp. Exits non-zero unless the loss went down.
#include <remat/checkpoint/checkpoint.hpp>
#include <remat/core/tape.hpp>
#include <remat/nn/layers.hpp>
#include <remat/ops/arithmetic.hpp>
#include <remat/ops/mse_loss.hpp>
#include <remat/ops/unary.hpp>
#include <remat/optim/adamw.hpp>

#include <cstdio>
#include <vector>

int main() {
  remat::Rng rng(7);
  const std::int64_t width = 64, depth = 8;
  std::vector<remat::nn::Linear<float>> layers;
  std::vector<remat::Parameter<float>> params;
  for (std::int64_t i = 0; i < depth; ++i) {
    layers.emplace_back(width, width, rng);
    for (const auto& p : layers.back().parameters()) params.push_back(p);
  }
  remat::optim::AdamW<float> opt(params, {.lr = 1e-3});
  const remat::Tensor<float> x = rng.normal_tensor<float>({32, width});
  const remat::Tensor<float> y = rng.normal_tensor<float>({32, width});
  float first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    remat::Tape tape;
    remat::Var<float> h = tape.input(x);
    for (const auto& layer : layers) {
      h = remat::checkpoint([&](const remat::Var<float>& v) { return v + remat::gelu(layer(v)); },
                            h);
    }
    const remat::Var<float> loss = remat::mse_loss(h, tape.input(y));
    tape.backward(loss);
    opt.step();
    opt.zero_grad();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
