#pragma once
// Small models shared by the checkpoint tests: a chain of Linear + activation layers, and a
// transformer-style block with dropout, both written with ops only.
#include <remat/remat.hpp>

#include <functional>
#include <vector>

namespace remat::test {

using Layer = std::function<Var<float>(const Var<float>&)>;

/// n layers of Linear(d -> d) + activation ("gelu" or "tanh"), PyTorch-style initialization.
struct ChainModel {
  std::vector<Parameter<float>> weights, biases;
  std::vector<Layer> layers;

  ChainModel(int n, int d, const char* activation, std::uint64_t seed) {
    Rng rng(seed);
    const double bound = 1.0 / std::sqrt(double(d));
    for (int i = 0; i < n; ++i) {
      weights.emplace_back(rng.uniform_tensor<float>({d, d}, -bound, bound));
      biases.emplace_back(rng.uniform_tensor<float>({d}, -bound, bound));
    }
    const bool gelu = std::string(activation) == "gelu";
    for (int i = 0; i < n; ++i) {
      layers.push_back([this, i, gelu](const Var<float>& x) {
        const Var<float> z = linear(x, weights[i], biases[i]);
        return gelu ? remat::gelu_tanh(z) : remat::tanh(z);
      });
    }
  }

  std::vector<Parameter<float>> parameters() const {
    std::vector<Parameter<float>> p = weights;
    p.insert(p.end(), biases.begin(), biases.end());
    return p;
  }
};

/// A pre-LN transformer block (single-head causal attention, GELU MLP) with dropout on the
/// attention weights and on both residual branches. x is (B, T, C).
struct BlockModel {
  std::vector<Parameter<float>>
      params;  // per block: ln1 g, b, qkv W, b, proj W, b, ln2 g, b, fc W, b, out W, b
  std::vector<Layer> layers;
  double p_drop;

  BlockModel(int blocks, int c, double dropout, std::uint64_t seed) : p_drop(dropout) {
    Rng rng(seed);
    const auto uniform = [&](Shape s, double fan_in) {
      return rng.uniform_tensor<float>(s, -1 / std::sqrt(fan_in), 1 / std::sqrt(fan_in));
    };
    for (int i = 0; i < blocks; ++i) {
      params.emplace_back(Tensor<float>::ones({c}));
      params.emplace_back(Tensor<float>::zeros({c}));
      params.emplace_back(uniform({3 * c, c}, c));
      params.emplace_back(uniform({3 * c}, c));
      params.emplace_back(uniform({c, c}, c));
      params.emplace_back(uniform({c}, c));
      params.emplace_back(Tensor<float>::ones({c}));
      params.emplace_back(Tensor<float>::zeros({c}));
      params.emplace_back(uniform({4 * c, c}, c));
      params.emplace_back(uniform({4 * c}, c));
      params.emplace_back(uniform({c, 4 * c}, 4 * c));
      params.emplace_back(uniform({c}, 4 * c));
    }
    for (int i = 0; i < blocks; ++i)
      layers.push_back([this, i](const Var<float>& x) { return block(x, &params[12 * i]); });
  }

  Var<float> block(const Var<float>& x, const Parameter<float>* p) const {
    const std::int64_t c = x.dim(-1);
    const auto qkv = split(linear(layer_norm(x, p[0], p[1]), p[2], p[3]), 3);
    const Var<float> scores = matmul(qkv[0], transpose(qkv[1])) * float(1 / std::sqrt(double(c)));
    const Var<float> attn = dropout(softmax(causal_mask(scores)), p_drop);
    const Var<float> h = x + dropout(linear(matmul(attn, qkv[2]), p[4], p[5]), p_drop);
    const Var<float> m =
        linear(gelu_tanh(linear(layer_norm(h, p[6], p[7]), p[8], p[9])), p[10], p[11]);
    return h + dropout(m, p_drop);
  }
};

/// Loss and every parameter's gradient after one step of `forward` on a tape seeded `seed`.
struct StepResult {
  float loss = 0;
  std::vector<std::vector<float>> grads;
  std::size_t replays = 0;
};

inline StepResult step(const std::vector<Parameter<float>>& params,
                       const std::function<Var<float>(Tape&)>& forward, std::uint64_t seed = 99,
                       TapeOptions options = {}) {
  for (auto p : params) p.free_grad();
  StepResult r;
  options.seed = seed;
  Tape tape(options);
  const Var<float> loss = forward(tape);
  tape.backward(loss);
  r.loss = loss.item();
  r.replays = tape.replay_stats().replays;
  for (const auto& p : params)
    r.grads.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<float>{});
  return r;
}

inline Tensor<std::int32_t> targets(std::int64_t n, std::int32_t classes, std::uint64_t seed) {
  Rng rng(seed);
  Tensor<std::int32_t> t({n});
  for (auto& v : t) v = static_cast<std::int32_t>(rng.uniform_int(classes));
  return t;
}

}  // namespace remat::test
