// Parameter groups (their own weight decay and lr factor, param_groups() with the no-decay
// rule), state saved and restored exactly with groups, and gradient accumulation over
// micro-batches against the full-batch gradient with a derived rounding bound.
#include "support/gradcheck.hpp"

#include <remat/nn/gpt.hpp>
#include <remat/nn/llama.hpp>
#include <remat/optim/adamw.hpp>
#include <remat/optim/sgd.hpp>

#include <limits>
#include <set>

namespace {

using remat::Parameter;
using remat::Tensor;

/// Random gradients for `params` (sum(p * r) backward), the same for the same seed.
void pg_random_grads(const std::vector<Parameter<float>>& params, std::uint64_t seed) {
  remat::Rng rng(seed);
  remat::Tape tape;
  remat::Var<float> total =
      remat::sum(params[0] * remat::Var<float>(rng.normal_tensor<float>(params[0].shape())));
  for (std::size_t i = 1; i < params.size(); ++i) {
    total = total +
            remat::sum(params[i] * remat::Var<float>(rng.normal_tensor<float>(params[i].shape())));
  }
  tape.backward(total);
}

std::vector<Parameter<float>> pg_clone(const std::vector<Parameter<float>>& ps) {
  std::vector<Parameter<float>> out;
  for (const auto& p : ps) out.emplace_back(p.value().clone());
  return out;
}

}  // namespace

TEST_CASE("param_groups: no decay for biases, norms and embeddings on Llama and GPT",
          "[optim][groups]") {
  namespace optim = remat::optim;
  const remat::nn::Llama<float> llama(remat::nn::LlamaConfig{.vocab_size = 13,
                                                             .hidden_size = 8,
                                                             .intermediate_size = 12,
                                                             .num_hidden_layers = 2,
                                                             .num_attention_heads = 2,
                                                             .num_key_value_heads = 1,
                                                             .attention_bias = true,
                                                             .max_position_embeddings = 8});
  const auto groups = optim::param_groups(
      llama.named_parameters(), {.weight_decay = 0.1, .no_decay = optim::biases_norms_embeddings});
  REQUIRE(groups.size() == 2);
  CHECK(*groups[0].weight_decay == 0.0);
  CHECK(*groups[1].weight_decay == 0.1);
  std::set<const void*> plain;
  for (const auto& p : groups[0].params) plain.insert(p.identity());
  std::size_t total = 0;
  for (const auto& g : groups) total += g.params.size();
  CHECK(total == llama.parameters().size());
  for (const auto& [name, p] : llama.named_parameters()) {
    INFO(name);
    const bool want = name.find("bias") != std::string::npos ||
                      name.find("norm") != std::string::npos ||
                      name.find("embed_tokens") != std::string::npos;
    CHECK((plain.count(p.identity()) == 1) == want);
  }
  const remat::nn::GPT<float> gpt(
      remat::nn::GPTConfig{.vocab = 11, .context = 6, .layers = 1, .heads = 2, .width = 8});
  const auto ggroups = optim::param_groups(
      gpt.named_parameters(), {.weight_decay = 0.1, .no_decay = optim::biases_norms_embeddings});
  std::set<const void*> gplain;
  for (const auto& p : ggroups[0].params) gplain.insert(p.identity());
  CHECK(gplain.count(gpt.parameter("wte.weight").identity()) == 1);
  CHECK(gplain.count(gpt.parameter("wpe.weight").identity()) == 1);
  CHECK(gplain.count(gpt.parameter("blocks.0.attn.qkv.weight").identity()) == 0);
  CHECK(gplain.count(gpt.parameter("blocks.0.attn.qkv.bias").identity()) == 1);
  // frozen parameters are left out
  remat::nn::GPT<float> frozen(
      remat::nn::GPTConfig{.vocab = 11, .context = 6, .layers = 1, .heads = 2, .width = 8});
  frozen.freeze("blocks");
  std::size_t n = 0;
  for (const auto& g : optim::param_groups(frozen.named_parameters(), {.weight_decay = 0.1}))
    n += g.params.size();
  std::size_t unfrozen = 0;
  for (const auto& [name, p] : frozen.named_parameters())
    unfrozen += name.rfind("blocks", 0) == 0 ? 0 : 1;
  CHECK(n == unfrozen);
  CHECK(n < frozen.parameters().size());
}

TEMPLATE_TEST_CASE(
    "groups: each group steps as an optimizer of its own settings would, bitwise, and resumes "
    "exactly",
    "[optim][groups]", remat::optim::SGD<float>, remat::optim::AdamW<float>) {
  using Opt = TestType;
  constexpr bool sgd = std::is_same_v<Opt, remat::optim::SGD<float>>;
  const auto make = [](const auto& params_or_groups, double lr, double wd) {
    if constexpr (sgd)
      return std::make_unique<Opt>(
          params_or_groups,
          remat::optim::SGDOptions{.lr = lr, .momentum = 0.7, .weight_decay = wd});
    else
      return std::make_unique<Opt>(params_or_groups,
                                   remat::optim::AdamWOptions{.lr = lr, .weight_decay = wd});
  };
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    remat::Rng rng(seed);
    std::vector<Parameter<float>> a, b;
    for (int i = 0; i < 3; ++i) a.emplace_back(rng.normal_tensor<float>({2 + i, 3}));
    for (int i = 0; i < 2; ++i) b.emplace_back(rng.normal_tensor<float>({4}));
    const double scale = 0.25 * double(seed), wd_a = 0.05 * double(seed), wd_default = 0.3;
    // grouped: a with its own decay and lr factor, b with the optimizer's options
    const auto ga = pg_clone(a), gb = pg_clone(b);
    auto grouped = make(
        std::vector<remat::optim::ParamGroup<float>>{{ga, wd_a, scale}, {gb, std::nullopt, 1.0}},
        0.01, wd_default);
    // separate: one optimizer per group with that group's settings
    auto alone_a = make(a, 0.01 * scale, wd_a);
    auto alone_b = make(b, 0.01, wd_default);
    std::vector<Parameter<float>> all = ga;
    all.insert(all.end(), gb.begin(), gb.end());
    for (int step = 0; step < 4; ++step) {
      std::vector<Parameter<float>> ab = a;
      ab.insert(ab.end(), b.begin(), b.end());
      pg_random_grads(all, seed * 10 + step);
      pg_random_grads(ab, seed * 10 + step);  // the same draws, in the same order
      grouped->step();
      alone_a->step();
      alone_b->step();
      grouped->zero_grad();
      alone_a->zero_grad();
      alone_b->zero_grad();
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(ga[i].value().to_vector() == a[i].value().to_vector());
    for (std::size_t i = 0; i < b.size(); ++i)
      CHECK(gb[i].value().to_vector() == b[i].value().to_vector());

    // save, build the same groups over copies, load, and both continue identically
    const auto state = grouped->state();
    const auto ca = pg_clone(ga), cb = pg_clone(gb);
    auto resumed = make(
        std::vector<remat::optim::ParamGroup<float>>{{ca, wd_a, scale}, {cb, std::nullopt, 1.0}},
        0.5, wd_default);
    resumed->load_state(state);
    std::vector<Parameter<float>> call = ca;
    call.insert(call.end(), cb.begin(), cb.end());
    for (int step = 0; step < 3; ++step) {
      pg_random_grads(all, 77 + step);
      pg_random_grads(call, 77 + step);
      grouped->step();
      resumed->step();
      grouped->zero_grad();
      resumed->zero_grad();
    }
    for (std::size_t i = 0; i < all.size(); ++i)
      CHECK(call[i].value().to_vector() == all[i].value().to_vector());
  }
}

TEST_CASE(
    "gradient accumulation: k micro-batches of b rows, each loss scaled by 1/k, give the gradient "
    "of k*b rows to rounding",
    "[optim][accumulation]") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    remat::Rng shapes(seed);
    const std::int64_t k = 2 + std::int64_t(shapes.uniform() * 4),
                       b = 1 + std::int64_t(shapes.uniform() * 7);
    const std::int64_t in = 3 + std::int64_t(shapes.uniform() * 12),
                       classes = 2 + std::int64_t(shapes.uniform() * 9);
    const std::int64_t n = k * b;
    INFO("k " << k << ", b " << b << ", in " << in << ", classes " << classes);
    remat::Rng rng(seed + 50);
    const remat::nn::Linear<float> layer(in, classes, rng);
    const Tensor<float> x = rng.normal_tensor<float>({n, in});
    const Tensor<std::int32_t> t = remat::test::ids({n}, std::int32_t(classes), seed);
    const auto grads = [&] {
      std::vector<std::vector<float>> g;
      for (const auto& p : layer.parameters()) g.push_back(p.grad().to_vector());
      return g;
    };
    {
      remat::Tape tape;
      tape.backward(remat::cross_entropy(layer(remat::Var<float>(x)), t));
    }
    const auto full = grads();
    for (auto& p : layer.parameters()) p.zero_grad();
    for (std::int64_t i = 0; i < k; ++i) {
      Tensor<float> xi({b, in});
      Tensor<std::int32_t> ti({b});
      std::copy(x.data() + i * b * in, x.data() + (i + 1) * b * in, xi.data());
      std::copy(t.data() + i * b, t.data() + (i + 1) * b, ti.data());
      remat::Tape tape;
      tape.backward(remat::cross_entropy(layer(remat::Var<float>(xi)), ti) * (1.0f / float(k)));
    }
    const auto accumulated = grads();
    // The bound. Both gradients are (1/n) sum_r d_r x_r^T (weight) and (1/n) sum_r d_r (bias),
    // d_r = softmax(logits_r) - onehot(t_r), summed in different orders and groupings. A float
    // sum of n terms is within (n - 1) u sum |terms| of the exact one (u = 2^-24), so the two
    // orders differ by at most 2 (n - 1) u S, S = (1/n) sum_r |d_r| |x_r|. Each d_r itself may
    // differ by rounding of its logits (a dot product of `in` terms: in u |w| |x|, <= 2 in u once
    // more after the softmax, as |d| <= 1 and softmax is 1-Lipschitz), the 1/k and 1/n scalings by
    // a few u: 2 (n + in + 4) u S bounds it all. S is computed here in double.
    const double u = std::numeric_limits<float>::epsilon() / 2;
    const Tensor<float>& w = layer.weight.value();
    std::vector<double> sw(static_cast<std::size_t>(classes * in), 0.0),
        sb(static_cast<std::size_t>(classes), 0.0);
    for (std::int64_t r = 0; r < n; ++r) {
      std::vector<double> logits(static_cast<std::size_t>(classes), 0.0);
      double mx = -1e300, z = 0;
      for (std::int64_t o = 0; o < classes; ++o) {
        double acc = layer.bias.value().data()[o];
        for (std::int64_t c = 0; c < in; ++c)
          acc += double(w.data()[o * in + c]) * double(x.data()[r * in + c]);
        logits[std::size_t(o)] = acc;
        mx = std::max(mx, acc);
      }
      for (double& l : logits) z += std::exp(l - mx);
      for (std::int64_t o = 0; o < classes; ++o) {
        const double d =
            std::abs(std::exp(logits[std::size_t(o)] - mx) / z - (t.data()[r] == o ? 1.0 : 0.0));
        // 1e-6 (> in u for these sizes) stands for the rounding of a d that is exactly 0 in double
        sb[std::size_t(o)] += (d + 1e-6) / double(n);
        for (std::int64_t c = 0; c < in; ++c)
          sw[std::size_t(o * in + c)] +=
              (d + 1e-6) * std::abs(double(x.data()[r * in + c])) / double(n);
      }
    }
    const double factor = 2.0 * double(n + in + 4) * u;
    for (std::size_t i = 0; i < sw.size(); ++i)
      CHECK(std::abs(double(accumulated[0][i]) - double(full[0][i])) <= factor * sw[i]);
    for (std::size_t i = 0; i < sb.size(); ++i)
      CHECK(std::abs(double(accumulated[1][i]) - double(full[1][i])) <= factor * sb[i]);
  }
}
