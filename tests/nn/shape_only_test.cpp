// Shape-only execution of whole training steps (core/shape_only.hpp): generated GPT and Llama
// configurations, weight storages, LoRA (dropout included), attention kinds, packed rows, loss
// heads, checkpoint plans and save policies, and generated user models, each counted by the
// allocator in a real step and in a shape-only one: the figures must be equal to the byte. Then
// a 70B Llama step priced without allocating its weights.
#include "support/gradcheck.hpp"
#include "support/random_block.hpp"
#include "support/shape_only.hpp"

#include <remat/train/estimate.hpp>
#include <remat/io/safetensors.hpp>
#include <remat/nn/gpt.hpp>
#include <remat/nn/llama.hpp>
#include <remat/nn/lora.hpp>
#include <remat/nn/quantize_blocks.hpp>
#include <remat/optim/adamw.hpp>
#include <remat/optim/sgd.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using remat::Rng;
using remat::WeightStorage;
namespace plan = remat::plan;

constexpr std::uint64_t kSeed = 2026;

/// Token ids in [0, vocab), made in the run: a shape-only run's have no values to draw.
remat::Tensor<std::int32_t> tokens(std::int64_t batch, std::int64_t time, std::int64_t vocab,
                                   std::uint64_t seed) {
  remat::Tensor<std::int32_t> t({batch, time});
  Rng rng(seed);
  if (t.has_data()) {
    for (std::int32_t& v : t) v = static_cast<std::int32_t>(rng.uniform_int(vocab));
  }
  return t;
}

/// Packed rows' starts: sequences of 1 to 5 tokens.
remat::Tensor<std::int32_t> packed_starts(std::int64_t batch, std::int64_t time) {
  remat::Tensor<std::int32_t> s({batch, time});
  if (!s.has_data()) return s;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0, start = 0; i < time; ++i) {
      if (i - start == 1 + (b + start) % 5) start = i;
      s[b * time + i] = static_cast<std::int32_t>(start);
    }
  return s;
}

/// A random save policy, named for messages.
remat::SavePolicy random_policy(Rng& rng) {
  switch (rng.uniform_int(5)) {
    case 0:
      return remat::save_nothing();
    case 1:
      return remat::save_matmuls();
    case 2:
      return remat::save_ops({remat::op::linear, remat::op::silu, remat::op::gelu});
    case 3:
      return remat::recompute_ops({remat::op::linear});
    default:
      return remat::save_if("wide outputs",
                            [](const remat::OpInfo& o) { return o.shape.numel() % 2 == 0; });
  }
}

/// Random segments over layers [begin, end): none, one, or several, some nested.
std::vector<plan::Segment> random_segments(std::size_t begin, std::size_t end, Rng& rng,
                                           int depth) {
  std::vector<plan::Segment> out;
  std::size_t at = begin;
  while (at < end) {
    const std::size_t len = 1 + static_cast<std::size_t>(rng.uniform_int(std::int64_t(end - at)));
    if (rng.uniform() < 0.6) {
      plan::Segment s{at, at + len, {}, {}};
      if (depth < 1 && len > 1 && rng.uniform() < 0.4)  // strictly inside it
        s.children = random_segments(at + rng.uniform_int(2), at + len - 1, rng, depth + 1);
      out.push_back(std::move(s));
    }
    at += len;
  }
  return out;
}

/// Gives every segment a random save policy: any segment may carry one when the plan runs (the
/// planners' predictions model fewer shapes, so the plan's own prediction is not asked for).
void give_policies(std::vector<plan::Segment>& segments, Rng& rng) {
  for (plan::Segment& s : segments) {
    s.policy = random_policy(rng);
    give_policies(s.children, rng);
  }
}

plan::Plan random_plan(std::size_t layers, Rng& rng) {
  plan::Plan p = plan::custom(plan::Chain::uniform(layers), random_segments(0, layers, rng, 0));
  give_policies(p.segments, rng);
  return p;
}

/// One model's fine-tuning options, generated.
struct Tuning {
  WeightStorage storage = WeightStorage::f32;
  bool double_quant = true;
  std::int64_t rank = 0;
  double lora_dropout = 0;
  std::vector<std::string> targets;
  bool chunked = true;
  bool sgd = false;

  std::string describe() const {
    std::string t;
    for (const std::string& s : targets) t += s + " ";
    return remat::detail::cat("storage ", remat::to_string(storage), ", LoRA rank ", rank,
                              " dropout ", lora_dropout, " on ", t, chunked ? ", chunked" : "",
                              sgd ? ", SGD" : ", AdamW");
  }
};

Tuning random_tuning(const std::vector<std::string>& linears, Rng& rng) {
  Tuning t;
  const WeightStorage storages[] = {WeightStorage::f32, WeightStorage::bf16, WeightStorage::int8,
                                    WeightStorage::nf4};
  t.storage = storages[rng.uniform_int(4)];
  t.double_quant = rng.uniform() < 0.5;
  t.chunked = rng.uniform() < 0.7;
  t.sgd = rng.uniform() < 0.3;
  if (t.storage != WeightStorage::f32 || rng.uniform() < 0.5) {
    t.rank = 1 + rng.uniform_int(4);
    t.lora_dropout = rng.uniform() < 0.5 ? 0.1 : 0.0;
    for (const std::string& n : linears) {
      if (rng.uniform() < 0.5) t.targets.push_back(n);
    }
    if (t.targets.empty()) t.targets.push_back(linears.front());
  }
  return t;
}

/// Two training steps of `make()`'s model as the fine-tuning program runs them: weights stored
/// as asked, adapters, an optimizer over what trains, a loss under `p`. The peak is the steps':
/// it starts over once the model is made (its float weights live until they are quantized).
template <class Model, class Make, class Loss>
void train_two_steps(Make&& make, const Tuning& t, Loss&& loss) {
  Model model = make();
  if (t.storage != WeightStorage::f32) remat::nn::quantize_blocks(model, t.storage, t.double_quant);
  std::optional<remat::nn::lora::Adapters<float>> adapters;
  if (t.rank > 0) {
    adapters.emplace(remat::nn::lora::apply(
        model, {.rank = t.rank, .alpha = 8, .dropout = t.lora_dropout, .targets = t.targets}));
  }
  std::vector<remat::Parameter<float>> trainable;
  for (const auto& p : model.parameters()) {
    if (!p.frozen()) trainable.push_back(p);
  }
  std::optional<remat::optim::AdamW<float>> adam;
  std::optional<remat::optim::SGD<float>> sgd;
  if (t.sgd) {
    sgd.emplace(trainable, remat::optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  } else {
    adam.emplace(trainable, remat::optim::AdamWOptions{.lr = 1e-3});
  }
  remat::memory::reset_peak();
  for (int s = 0; s < 2; ++s) {
    remat::Tape tape;
    tape.backward(loss(model));
    if (sgd) {
      sgd->step();
      sgd->zero_grad();
    } else {
      adam->step();
      adam->zero_grad();
    }
  }
}

TEST_CASE("a shape-only Llama step counts what the real one does, to the byte",
          "[nn][shape_only][llama]") {
  const int threads = remat::num_threads();
  Rng rng(kSeed);
  const std::vector<std::string> linears = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < 24; ++i) {
    const std::int64_t heads = 1 + rng.uniform_int(4), kv = rng.uniform() < 0.5 ? heads : 1;
    const std::int64_t head_dim = 2 * (1 + rng.uniform_int(4));
    remat::nn::LlamaConfig c{.vocab_size = 8 + rng.uniform_int(60),
                             .hidden_size = heads * head_dim,
                             .intermediate_size = 4 + rng.uniform_int(40),
                             .num_hidden_layers = 1 + rng.uniform_int(4),
                             .num_attention_heads = heads,
                             .num_key_value_heads = kv,
                             .tie_word_embeddings = rng.uniform() < 0.3,
                             .attention_bias = rng.uniform() < 0.3,
                             .max_position_embeddings = 64,
                             .seed = std::uint64_t(i)};
    c.attention =
        rng.uniform() < 0.5 ? remat::AttentionKernel::flash : remat::AttentionKernel::fused;
    c.mlp_bias = rng.uniform() < 0.2;
    c.qk_norm = rng.uniform() < 0.2;
    if (rng.uniform() < 0.2) c.sliding_window = 1 + rng.uniform_int(8);
    const std::int64_t batch = 1 + rng.uniform_int(3), time = 1 + rng.uniform_int(40);
    const bool packed = rng.uniform() < 0.3;
    const Tuning t = random_tuning(linears, rng);
    const plan::Plan p = random_plan(std::size_t(c.num_hidden_layers), rng);
    INFO("case " << i << ": hidden " << c.hidden_size << ", heads " << heads << "/" << kv
                 << ", layers " << c.num_hidden_layers << ", " << remat::to_string(c.attention)
                 << ", window " << c.sliding_window << ", batch " << batch << " x " << time
                 << (packed ? " packed" : "") << ", " << t.describe() << ", " << p.describe());
    // the real step on one thread or two: no count depends on it
    remat::set_num_threads(1 + i % 2);
    remat::test::check_shape_only_exact([&] {
      const auto ids = tokens(batch, time, c.vocab_size, 1);
      const auto targets = tokens(batch, time, c.vocab_size, 2);
      const auto starts = packed ? packed_starts(batch, time) : remat::Tensor<std::int32_t>();
      train_two_steps<remat::nn::Llama<float>>(
          [&] { return remat::nn::Llama<float>(c); }, t,
          [&](const remat::nn::Llama<float>& m) {
            return m.loss(ids, targets, {.plan = &p, .chunked = t.chunked, .starts = starts});
          });
    });
  }
  remat::set_num_threads(threads);
}

TEST_CASE("a shape-only GPT step counts what the real one does, to the byte",
          "[nn][shape_only][gpt]") {
  Rng rng(kSeed + 1);
  for (int i = 0; i < 16; ++i) {
    const std::int64_t heads = 1 + rng.uniform_int(4);
    remat::nn::GPTConfig c{.vocab = 8 + rng.uniform_int(60),
                           .context = 48,
                           .layers = 1 + rng.uniform_int(4),
                           .heads = heads,
                           .width = heads * 2 * (1 + rng.uniform_int(4)),
                           .dropout = rng.uniform() < 0.4 ? 0.1 : 0.0,
                           .tied = rng.uniform() < 0.3,
                           .seed = std::uint64_t(i)};
    c.attention =
        rng.uniform() < 0.5 ? remat::AttentionKernel::flash : remat::AttentionKernel::fused;
    const std::int64_t batch = 1 + rng.uniform_int(3), time = 1 + rng.uniform_int(40);
    const Tuning t = random_tuning({"qkv", "proj", "fc"}, rng);
    const plan::Plan p = random_plan(std::size_t(c.layers), rng);
    INFO("case " << i << ": width " << c.width << ", layers " << c.layers << ", dropout "
                 << c.dropout << ", " << remat::to_string(c.attention) << ", batch " << batch
                 << " x " << time << ", " << t.describe() << ", " << p.describe());
    remat::test::check_shape_only_exact([&] {
      const auto ids = tokens(batch, time, c.vocab, 1);
      const auto targets = tokens(batch, time, c.vocab, 2);
      train_two_steps<remat::nn::GPT<float>>([&] { return remat::nn::GPT<float>(c); }, t,
                                             [&](const remat::nn::GPT<float>& m) {
                                               return m.loss(ids, targets,
                                                             {.plan = &p, .chunked = t.chunked});
                                             });
    });
  }
}

TEST_CASE("a shape-only step of a generated user model counts what the real one does",
          "[nn][shape_only][random]") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    // the case's layer count is drawn before any tensor: a shape-only case has the same
    const std::size_t layers = remat_test::RandomCase(seed, 5).n;
    Rng rng(seed * 7919);
    const plan::Plan plans[] = {random_plan(layers, rng), random_plan(layers, rng)};
    INFO("seed " << seed << ", " << plans[0].describe() << "; then " << plans[1].describe());
    remat::test::check_shape_only_exact([&] {
      remat_test::RandomCase c(seed, 5);
      std::vector<remat::Parameter<float>> params{c.loss.head};
      for (const auto& layer : c.chain.params)
        params.insert(params.end(), layer.begin(), layer.end());
      remat::optim::AdamW<float> adam(params, {.lr = 1e-3});
      for (const plan::Plan& p : plans) {
        remat::Tape tape;
        tape.backward(c.loss(remat::checkpoint_sequential(c.chain.layers, p, tape.input(c.x))));
        adam.step();
        adam.zero_grad();
      }
    });
  }
}

/// Every byte figure and flag of a profiled chain, its copy figures and policies included, in
/// one list (not its costs: seconds in a real run, FLOPs in a shape-only one).
std::vector<double> byte_figures(const plan::Chain& c) {
  std::vector<double> out;
  const auto add = [&](const auto& v) { out.insert(out.end(), v.begin(), v.end()); };
  add(c.boundary_bytes);
  add(c.activation_bytes);
  add(c.forward_transient_bytes);
  add(c.segment_transient_bytes);
  add(c.replay_transient_bytes);
  add(c.replay_free_peak_bytes);
  add(c.dropped_transient_bytes);
  add(c.dropped_free_peak_bytes);
  add(c.backward_transient_bytes);
  add(c.saves_output);
  add(c.saves_input);
  add(c.saves_output_copy);
  out.insert(out.end(),
             {c.loss_bytes, c.loss_output_bytes, c.loss_forward_transient_bytes,
              c.loss_backward_transient_bytes, c.last_unheld_backward_transient_bytes.value_or(-1),
              double(c.unpriced_copies), double(c.policies.size())});
  for (const plan::PolicyCosts& q : c.policies) {
    for (std::size_t k = 0; k <= q.chained.size(); ++k) {
      const plan::PolicyCosts& v = q.variant(static_cast<int>(k));
      add(v.activation_bytes);
      add(v.forward_transient_bytes);
      add(v.backward_transient_bytes);
      add(v.saves_input);
      add(v.saves_output);
      add(v.saves_output_copy);
      out.push_back(v.last_unheld_backward_transient_bytes.value_or(-1));
    }
  }
  if (c.with_input_copy) add(byte_figures(*c.with_input_copy));
  return out;
}

TEST_CASE("a shape-only profile of a generated BF16 chain measures what a real one does",
          "[nn][shape_only][random][precision]") {
  // shared copies (Note [shared copies]) included: their figures are measured by the same
  // copy ops, which run shape-only like any op
  const remat::PrecisionGuard bf16(remat::Precision::bf16);
  int shared = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    std::vector<double> figures[2];
    for (int shape_only = 0; shape_only < 2; ++shape_only) {
      std::optional<remat::ShapeOnly> run;
      if (shape_only) run.emplace();
      remat_test::RandomCase c(seed, 5);
      INFO(c.describe());
      const plan::Chain chain =
          plan::profile(c.chain.layers, c.x, c.loss, plan::ProfileOptions{.repeats = 1});
      if (!shape_only && chain.with_input_copy) ++shared;
      figures[shape_only] = byte_figures(chain);
    }
    INFO("seed " << seed);
    CHECK(figures[1] == figures[0]);
  }
  CHECK(shared > 0);
}

// An op of the user's own that computes on its input's values.
struct Doubled final : remat::Node<float> {
  static constexpr remat::OpType kType{"doubled"};
  const remat::OpType& op_type() const noexcept override { return kType; }
  remat::Tensor<float> forward(Inputs in) override {
    remat::Tensor<float> y(in[0].shape());
    if (remat::is_shape_only()) return y;  // allocated as in a real run; nothing to compute
    y.array() = 2 * in[0].array();
    return y;
  }
  void backward(const remat::Tensor<float>& gy, remat::Grads<float>& grads) override {
    remat::Tensor<float> g(gy.shape());
    if (!remat::is_shape_only()) g.array() = 2 * gy.array();
    grads.add(0, std::move(g));
  }
};

struct DoubledShapeOnly final : remat::Node<float> {
  Doubled op;
  const remat::OpType& op_type() const noexcept override { return Doubled::kType; }
  bool runs_shape_only() const noexcept override { return true; }
  remat::Tensor<float> forward(Inputs in) override { return op.forward(in); }
  void backward(const remat::Tensor<float>& gy, remat::Grads<float>& grads) override {
    op.backward(gy, grads);
  }
};

TEST_CASE("a shape-only run refuses a custom op that does not say it runs shape-only",
          "[nn][shape_only][errors]") {
  const auto step = [](auto op) {
    remat::Tape tape;
    const remat::Var<float> x = tape.input(remat::Tensor<float>({3, 4}), true);
    tape.backward(remat::sum(remat::apply<decltype(op)>({x})));
  };
  remat::ShapeOnly run;
  const std::string msg = remat::test::error_message([&] { step(Doubled{}); });
  CHECK(msg.find("doubled") != std::string::npos);
  CHECK(msg.find("runs_shape_only") != std::string::npos);
  CHECK_THROWS_AS(step(Doubled{}), remat::UsageError);
  CHECK_NOTHROW(step(DoubledShapeOnly{}));
  CHECK_THROWS_AS(remat::ShapeOnly(), remat::UsageError);  // scopes do not nest
  CHECK_THROWS_AS(remat::Tensor<float>({1}).item(), remat::UsageError);
}

TEST_CASE("a shape-only tensor refuses to be read or written, by name",
          "[nn][shape_only][errors]") {
  remat::ShapeOnly run;
  remat::Tensor<float> t({3, 4});
  const remat::Tensor<float>& ct = t;
  for (const auto& [what, read] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"Tensor::begin", [&] { (void)t.begin(); }},
           {"Tensor::end", [&] { (void)ct.end(); }},
           {"Tensor::at",
            [&] {
              (void)t.at({1, 2});
            }},
           {"Tensor::array", [&] { (void)ct.array(); }},
           {"Tensor::matrix", [&] { (void)t.matrix(); }},
           {"Tensor::begin", [&] { (void)ct.to_vector(); }},
           {"safetensors: cannot save /nonexistent/x.safetensors: tensor 'w'", [&] {
              remat::io::save<float>("/nonexistent/x.safetensors", {{"w", t}});
            }}}) {
    INFO(what);
    const std::string msg = remat::test::error_message(read);
    CHECK(msg.find(what) != std::string::npos);
    CHECK(msg.find("shape-only") != std::string::npos);
  }
  CHECK_THROWS_AS(t.begin(), remat::UsageError);
  CHECK_THROWS_AS(remat::io::save<float>("/nonexistent/x.safetensors", {{"w", t}}), remat::IoError);
  // an empty tensor has all of its (no) values
  const remat::Tensor<float> empty({0, 3});
  CHECK(empty.to_vector().empty());
}

TEST_CASE("an empty tensor is no allocation, shape-only as in a real run", "[nn][shape_only]") {
  const remat::test::Counted c = remat::test::check_shape_only_exact([] {
    const remat::Tensor<float> empty({0, 3}), one({1});
    (void)empty;
    (void)one;
  });
  CHECK(c.allocations == 1U);
}

TEST_CASE("a custom op that runs shape-only is counted exactly", "[nn][shape_only]") {
  remat::test::check_shape_only_exact([] {
    remat::Tape tape;
    const remat::Var<float> x = tape.input(remat::Tensor<float>::ones({5, 6}), true);
    tape.backward(remat::sum(remat::apply<DoubledShapeOnly>({remat::tanh(x)})));
  });
}

// Meta-Llama-3-70B's config.json, trained with QLoRA as the seed article's example does: NF4
// blocks, rank 16 on every linear, a checkpoint per layer, one sequence of 4,096 tokens.
TEST_CASE("a 70B Llama step is priced shape-only without allocating its weights",
          "[nn][shape_only][70b]") {
  const remat::nn::LlamaConfig c{.vocab_size = 128256,
                                 .hidden_size = 8192,
                                 .intermediate_size = 28672,
                                 .num_hidden_layers = 80,
                                 .num_attention_heads = 64,
                                 .num_key_value_heads = 8,
                                 .rope_theta = 500000.0,
                                 .rms_norm_eps = 1e-5,
                                 .max_position_embeddings = 8192};
  const Tuning t{
      .storage = WeightStorage::nf4,
      .rank = 16,
      .targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  const plan::Plan p = plan::every(std::size_t(c.num_hidden_layers));
  const std::size_t live = remat::memory::live_bytes();
  const std::size_t allocations = remat::memory::allocation_count();
  const auto start = std::chrono::steady_clock::now();
  remat::test::Counted counted;
  {
    remat::ShapeOnly run;
    const auto ids = tokens(1, 4096, c.vocab_size, 1);
    const auto targets = tokens(1, 4096, c.vocab_size, 2);
    train_two_steps<remat::nn::Llama<float>>(
        [&] { return remat::nn::Llama<float>::uninitialized(c); }, t,
        [&](const remat::nn::Llama<float>& m) {
          return m.loss(ids, targets, {.plan = &p, .chunked = true});
        });
    counted = {run.peak_bytes(), run.allocation_count(), run.live_bytes()};
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WARN("70B QLoRA step, 1 x 4096, checkpoint per layer: peak "
       << double(counted.peak) / (1 << 30) << " GiB counted shape-only in " << seconds << " s");
  // nothing real was allocated, and the estimator, which counts its own shape-only steps, says
  // the same
  CHECK(remat::memory::live_bytes() == live);
  CHECK(remat::memory::allocation_count() == allocations);
  const remat::train::MemoryEstimate e =
      remat::train::estimate_memory<float>(c, {.batch = 1,
                                               .time = 4096,
                                               .storage = WeightStorage::nf4,
                                               .lora = {.rank = 16, .targets = t.targets}});
  CHECK(e.total(p) == double(counted.peak));
  CHECK(remat::memory::live_bytes() == live);
  CHECK(remat::memory::allocation_count() == allocations);
}

}  // namespace
