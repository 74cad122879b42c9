// LoRA adapters (nn/lora.hpp): the wrapped forward against a direct computation, only adapters
// trained, adapter gradients under every checkpoint plan equal (==) to plain ones, PEFT's names
// and files, clear errors for adapters that do not fit, and merge() giving the same logits.
#include "support/child.hpp"
#include "support/gradcheck.hpp"

#include <remat/checkpoint/plan.hpp>
#include <remat/nn/gpt.hpp>
#include <remat/nn/llama.hpp>
#include <remat/hub/peft.hpp>
#include <remat/nn/lora.hpp>
#include <remat/nn/quantize_blocks.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <sys/stat.h>

namespace {

using remat::Tensor;
namespace lora = remat::nn::lora;

const std::vector<std::string> kLlamaLinears{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};

/// A random non-empty subset of `names`.
std::vector<std::string> lora_random_targets(const std::vector<std::string>& names,
                                             std::uint64_t seed) {
  remat::Rng rng(seed);
  std::vector<std::string> out;
  while (out.empty()) {
    for (const std::string& n : names) {
      if (rng.uniform() < 0.5) out.push_back(n);
    }
  }
  return out;
}

/// Gives every B random values (B starts at zero, which would hide most mistakes).
template <class T>
void lora_randomize_b(const lora::Adapters<T>& adapters, std::uint64_t seed) {
  remat::Rng rng(seed);
  for (const auto& a : adapters.adapters()) {
    remat::Parameter<T>(a.B.weight).data() = rng.uniform_tensor<T>(a.B.weight.shape(), -0.5, 0.5);
  }
}

/// max |got - want| / max(1, max |want|).
double lora_difference(const Tensor<float>& got, const Tensor<float>& want) {
  REQUIRE(got.shape() == want.shape());
  double diff = 0, scale = 1;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    diff = std::max(diff, std::abs(double(got.data()[i]) - double(want.data()[i])));
    scale = std::max(scale, std::abs(double(want.data()[i])));
  }
  return diff / scale;
}

std::string lora_temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("remat_lora_test_" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

remat::nn::LlamaConfig lora_llama_config(std::uint64_t seed) {
  return {.vocab_size = 29,
          .hidden_size = 16,
          .intermediate_size = 24,
          .num_hidden_layers = 4,
          .num_attention_heads = 4,
          .num_key_value_heads = 2,
          .attention_bias = seed % 2 == 1,
          .max_position_embeddings = 16,
          .seed = seed};
}

}  // namespace

TEST_CASE(
    "lora: a wrapped Linear computes W x + b + (alpha/r) B A x, starts as the base, and is "
    "gradchecked",
    "[nn][lora]") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    remat::Rng shapes(seed);
    const std::int64_t in = 2 + std::int64_t(shapes.uniform() * 9),
                       out = 2 + std::int64_t(shapes.uniform() * 9);
    const std::int64_t rank = 1 + std::int64_t(shapes.uniform() * 4);
    remat::Rng rng(seed + 10);
    remat::nn::Linear<double> layer(in, out, rng);
    const Tensor<double> x = remat::test::randn({3, in}, seed);
    const Tensor<double> base = layer(remat::Var<double>(x)).value().clone();
    const auto adapters = lora::apply(layer, {.rank = rank, .alpha = 3.0, .seed = seed});
    REQUIRE(adapters.adapters().size() == 1);
    CHECK(adapters.adapters()[0].A.weight.shape() == remat::Shape{rank, in});
    CHECK(adapters.adapters()[0].B.weight.shape() == remat::Shape{out, rank});
    // B is zero: the wrapped layer is the base layer, exactly
    CHECK(layer(remat::Var<double>(x)).value().to_vector() == base.to_vector());
    // A is uniform in +-1/sqrt(in) (kaiming_uniform_(a = sqrt(5))), not all equal
    const Tensor<double>& A = adapters.adapters()[0].A.weight.value();
    const double bound = 1.0 / std::sqrt(double(in));
    CHECK(*std::max_element(A.begin(), A.end()) <= bound);
    CHECK(*std::min_element(A.begin(), A.end()) >= -bound);
    CHECK(*std::max_element(A.begin(), A.end()) > *std::min_element(A.begin(), A.end()));
    lora_randomize_b(adapters, seed);
    const Tensor<double>& B = adapters.adapters()[0].B.weight.value();
    const Tensor<double> y = layer(remat::Var<double>(x)).value();
    const double s = 3.0 / double(rank);
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t o = 0; o < out; ++o) {
        double want = base.data()[r * out + o];
        for (std::int64_t k = 0; k < rank; ++k) {
          double ax = 0;
          for (std::int64_t c = 0; c < in; ++c) ax += A.data()[k * in + c] * x.data()[r * in + c];
          want += s * B.data()[o * rank + k] * ax;
        }
        CHECK(std::abs(y.data()[r * out + o] - want) <= 1e-12 * (1 + std::abs(want)));
      }
    }
    remat::test::gradcheck([&](const remat::test::VarList& v) { return layer(v[0]); }, {x});
    // only the adapters are trainable
    for (const auto& [name, p] : layer.named_parameters()) {
      INFO(name);
      CHECK(p.frozen() == (name.find("lora_") == std::string::npos));
    }
  }
}

TEST_CASE(
    "lora on nn::Llama: PEFT names, only adapters get gradients, checkpointed adapter gradients == "
    "plain ones",
    "[nn][lora][checkpoint]") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const remat::nn::Llama<float> model(lora_llama_config(seed));
    const std::vector<std::string> targets = lora_random_targets(kLlamaLinears, seed);
    const double dropout = seed == 2 ? 0.25 : 0.0;
    remat::nn::Llama<float>& m = const_cast<remat::nn::Llama<float>&>(model);
    const auto adapters = lora::apply(m, {.rank = 2 + std::int64_t(seed),
                                          .alpha = 8,
                                          .dropout = dropout,
                                          .targets = targets,
                                          .seed = seed});
    lora_randomize_b(adapters, seed);
    INFO("targets " << targets.size() << ", first " << targets.front() << ", dropout " << dropout);
    // one pair of adapters per targeted linear per layer, with PEFT's names
    CHECK(adapters.adapters().size() == targets.size() * 4);
    std::set<std::string> peft;
    for (const auto& [name, p] : adapters.named_parameters()) peft.insert(name);
    for (std::int64_t layer = 0; layer < 4; ++layer) {
      for (const std::string& t : kLlamaLinears) {
        const bool attn = t == "q_proj" || t == "k_proj" || t == "v_proj" || t == "o_proj";
        const std::string path =
            remat::detail::cat("model.layers.", layer, attn ? ".self_attn." : ".mlp.", t);
        const bool wanted = std::find(targets.begin(), targets.end(), t) != targets.end();
        CHECK(peft.count("base_model.model." + path + ".lora_A.weight") == (wanted ? 1u : 0u));
        CHECK(peft.count("base_model.model." + path + ".lora_B.weight") == (wanted ? 1u : 0u));
        CHECK(model.parameter(path + ".weight").frozen());
        if (wanted) CHECK(!model.parameter(path + ".lora_A.weight").frozen());
      }
    }
    const auto ids = remat::test::ids({2, 7}, 29, seed),
               next = remat::test::ids({2, 7}, 29, seed + 5);
    const remat::plan::Chain chain = model.profile(ids, next);
    for (auto& p : model.parameters()) p.zero_grad();
    for (const bool chunked : {true, false}) {
      std::map<std::string, Tensor<float>> plain;
      {
        // one seed for every run: the same dropout masks (each op draws from the seed and its
        // position on the tape, so a replay draws them again)
        remat::Tape tape(remat::TapeOptions{.seed = 77});
        tape.backward(model.loss(ids, next, {.chunked = chunked}));
        for (const auto& [name, p] : model.named_parameters()) {
          INFO(name);
          // frozen parameters get no gradient at all; every adapter gets one
          CHECK(p.grad().defined() == !p.frozen());
          if (p.grad().defined()) plain[name] = p.grad().clone();
        }
      }
      for (auto& p : model.parameters()) p.zero_grad();
      for (const remat::plan::Plan& plan :
           {remat::plan::every(chain), remat::plan::sqrt(chain), remat::plan::optimal(chain, 2)}) {
        remat::Tape tape(remat::TapeOptions{.seed = 77});
        tape.backward(model.loss(ids, next, {.plan = &plan, .chunked = chunked}));
        for (const auto& [name, p] : model.named_parameters()) {
          INFO(plan.describe() << (chunked ? " chunked: " : " plain loss: ") << name);
          CHECK(p.grad().defined() == !p.frozen());
          if (p.grad().defined()) CHECK(p.grad().to_vector() == plain[name].to_vector());
        }
        for (auto& p : model.parameters()) p.zero_grad();
      }
    }
  }
}

TEST_CASE("lora on nn::GPT and merge(): merged logits equal base + adapters to rounding",
          "[nn][lora]") {
  const remat::nn::GPTConfig config{
      .vocab = 31, .context = 12, .layers = 3, .heads = 2, .width = 16, .seed = 4};
  remat::nn::GPT<float> gpt(config);
  const auto adapters =
      lora::apply(gpt, {.rank = 4, .alpha = 16, .targets = {"qkv", "fc", "proj"}});
  CHECK(adapters.adapters().size() ==
        4 * 3);  // attn.qkv, attn.proj, mlp.fc, mlp.proj in each of 3 blocks
  lora_randomize_b(adapters, 7);
  gpt.eval();
  const auto ids = remat::test::ids({2, 9}, 31, 3);
  const Tensor<float> before = gpt.logits(ids).value().clone();
  auto merged = adapters;
  merged.merge();
  for (const auto& [name, p] : gpt.named_parameters())
    CHECK(name.find("lora_") == std::string::npos);
  const Tensor<float> after = gpt.logits(ids).value();
  CHECK(lora_difference(after, before) <= 1e-5);
  CHECK_THROWS_AS(remat::hub::save_adapters(merged, lora_temp_dir("merged")), remat::UsageError);

  remat::nn::Llama<float> llama(lora_llama_config(5));
  const auto la = lora::apply(llama, {.rank = 3, .alpha = 6, .targets = kLlamaLinears});
  lora_randomize_b(la, 8);
  const auto lids = remat::test::ids({2, 6}, 29, 4);
  const Tensor<float> lbefore = llama.logits(lids).value().clone();
  auto lm = la;
  lm.merge();
  CHECK(lora_difference(llama.logits(lids).value(), lbefore) <= 1e-5);
}

TEST_CASE("lora: a model's head, whose weight the loss reads, is refused as a target",
          "[nn][lora]") {
  using Catch::Matchers::Contains;
  // The loss and logits multiply by the head's weight (chunked), never calling its forward: an
  // adapter there would train nothing, while merge() would fold it in. PEFT adapts it; refused.
  remat::nn::Llama<float> llama(lora_llama_config(2));
  const auto refusal = [&](const lora::Options& o) {
    return remat::test::error_message([&] { lora::apply(llama, o); });
  };
  CHECK_THAT(refusal({.rank = 2, .targets = {"q_proj", "lm_head"}}),
             Contains("'lm_head'") && Contains("LoRA on a model's head is not implemented"));
  CHECK_THAT(refusal({.rank = 2, .target_regex = ".*(proj|lm_head)"}), Contains("'lm_head'"));
  CHECK_THROWS_AS(lora::apply(llama, {.rank = 2, .targets = {"lm_head"}}), remat::ArgumentError);
  for (const auto& [name, p] : llama.named_parameters())
    CHECK(name.find("lora_") == std::string::npos);
  CHECK_THROWS_AS(llama.lm_head->set_forward_hook(
                      [](const remat::Var<float>&, const remat::Var<float>& y) { return y; }),
                  remat::UsageError);
  remat::nn::GPT<float> gpt(
      {.vocab = 31, .context = 12, .layers = 2, .heads = 2, .width = 16, .seed = 4});
  CHECK_THAT(
      remat::test::error_message([&] { lora::apply(gpt, {.rank = 2, .targets = {"head"}}); }),
      Contains("'head'") && Contains("GPT's loss"));
  // every other Linear takes an adapter that reaches the loss: each B gets a gradient
  auto adapters = lora::apply(llama, {.rank = 2, .target_regex = ".*proj"});
  const auto ids = remat::test::ids({2, 6}, 29, 5);
  const Tensor<std::int32_t> targets = remat::test::ids({2, 6}, 29, 6);
  remat::Tape tape;
  tape.backward(llama.loss(ids, targets));
  CHECK(adapters.adapters().size() == 7 * 4);
  for (const auto& a : adapters.adapters()) {
    INFO(a.path);
    REQUIRE(a.B.weight.grad().defined());
    const std::vector<float> g = a.B.weight.grad().to_vector();
    CHECK(std::any_of(g.begin(), g.end(), [](float v) { return v != 0; }));
  }
}

TEST_CASE(
    "lora: save_adapters writes PEFT's files; load_adapters round trips and names what does not "
    "fit",
    "[nn][lora][io]") {
  using Catch::Matchers::Contains;
  remat::nn::Llama<float> model(lora_llama_config(3));
  const std::vector<std::string> targets{"q_proj", "v_proj"};
  const lora::Options options{.rank = 4,
                              .alpha = 8,
                              .dropout = 0.05,
                              .targets = targets,
                              .base_model_name_or_path = "tiny"};
  const auto adapters = lora::apply(model, options);
  lora_randomize_b(adapters, 3);
  const std::string dir = lora_temp_dir("roundtrip");
  remat::hub::save_adapters(adapters, dir);

  std::ifstream cf(dir + "/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(cf);
  CHECK(config.at("peft_type") == "LORA");
  CHECK(config.at("r") == 4);
  CHECK(config.at("lora_alpha") == 8.0);
  CHECK(config.at("lora_dropout") == 0.05);
  CHECK(config.at("target_modules") == nlohmann::json(targets));
  CHECK(config.at("bias") == "none");
  CHECK(config.at("task_type") == "CAUSAL_LM");
  CHECK(config.at("base_model_name_or_path") == "tiny");
  const remat::io::File file = remat::io::File::read(dir + "/adapter_model.safetensors");
  CHECK(file.entries().size() == 4 * 2 * 2);
  CHECK(file.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  CHECK(file.contains("base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight"));
  CHECK(file.entry("base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight").shape ==
        remat::Shape{8, 4});

  // a second model with other adapter values loads them back bitwise
  remat::nn::Llama<float> other(lora_llama_config(3));
  auto loaded = lora::apply(other, {.rank = 4, .alpha = 8, .targets = targets, .seed = 99});
  remat::hub::load_adapters(loaded, dir);
  const auto want = adapters.named_parameters();
  const auto got = loaded.named_parameters();
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i].first == want[i].first);
    CHECK(got[i].second.value().to_vector() == want[i].second.value().to_vector());
  }
  const auto ids = remat::test::ids({1, 5}, 29, 2);
  // the saved adapters have dropout: on while training, so the same logits only in evaluation
  CHECK(model.logits(ids).value().to_vector() != model.logits(ids).value().to_vector());
  model.eval();
  other.eval();
  CHECK(other.logits(ids).value().to_vector() == model.logits(ids).value().to_vector());

  const auto load_error = [](lora::Adapters<float>& a, const std::string& d) {
    return remat::test::error_message([&] { remat::hub::load_adapters(a, d); });
  };
  // another rank: named by the config
  remat::nn::Llama<float> m2(lora_llama_config(3));
  auto rank2 = lora::apply(m2, {.rank = 2, .alpha = 8, .targets = targets});
  CHECK_THAT(load_error(rank2, dir),
             Contains("r = 4") && Contains("rank 2") && Contains("adapter_config.json"));
  // more targets than the file has: the missing tensor is named
  remat::nn::Llama<float> m3(lora_llama_config(3));
  auto more = lora::apply(m3, {.rank = 4, .alpha = 8, .targets = {"q_proj", "v_proj", "o_proj"}});
  CHECK_THAT(load_error(more, dir), Contains("has no tensor") && Contains("o_proj.lora_A.weight"));
  // fewer targets: the extra tensor is named
  remat::nn::Llama<float> m4(lora_llama_config(3));
  auto fewer = lora::apply(m4, {.rank = 4, .alpha = 8, .targets = {"q_proj"}});
  const auto before = fewer.named_parameters()[0].second.value().to_vector();
  CHECK_THAT(load_error(fewer, dir), Contains("v_proj.lora_") && Contains("matches no adapter"));
  CHECK(fewer.named_parameters()[0].second.value().to_vector() == before);  // all or nothing
  // same names, other shapes (a wider model): the tensor and both shapes are named
  auto wide_config = lora_llama_config(3);
  wide_config.hidden_size = 24;
  wide_config.num_attention_heads = 6;
  wide_config.num_key_value_heads = 2;
  remat::nn::Llama<float> m5(wide_config);
  auto wide = lora::apply(m5, {.rank = 4, .alpha = 8, .targets = targets});
  CHECK_THAT(load_error(wide, dir), Contains("lora_A.weight") && Contains("has shape") &&
                                        Contains("(4, 16)") && Contains("(4, 24)"));
  // bad apply() arguments change nothing
  remat::nn::Llama<float> m6(lora_llama_config(3));
  CHECK_THAT(remat::test::error_message([&] {
               lora::apply(m6, {.rank = 4, .targets = {"q_proj", "qproj"}});
             }),
             Contains("'qproj' names no Linear"));
  for (const auto& [name, p] : m6.named_parameters())
    CHECK(name.find("lora_") == std::string::npos);
  CHECK_THROWS_AS(lora::apply(m6, {.rank = 0, .targets = {"q_proj"}}), remat::ArgumentError);
  CHECK_THROWS_AS(lora::apply(m6, {.rank = 2, .dropout = 1.0, .targets = {"q_proj"}}),
                  remat::ArgumentError);
  lora::apply(m6, {.rank = 2, .targets = {"q_proj"}});
  CHECK_THAT(
      remat::test::error_message([&] { lora::apply(m6, {.rank = 2, .targets = {"q_proj"}}); }),
      Contains("twice"));
}

TEST_CASE(
    "lora over a quantized base: adapter gradients under plans with save policies == plain ones, "
    "chunked and plain loss",
    "[nn][lora][checkpoint][quantized]") {
  const remat::WeightStorage storages[] = {remat::WeightStorage::f32, remat::WeightStorage::bf16,
                                           remat::WeightStorage::int8, remat::WeightStorage::nf4};
  for (std::uint64_t seed = 11; seed <= 14; ++seed) {
    remat::nn::Llama<float> model(lora_llama_config(seed));
    remat::Rng rng(seed);
    const remat::WeightStorage storage = storages[rng.uniform_int(4)];
    remat::nn::quantize_blocks(model, storage, rng.uniform() < 0.5);
    const std::vector<std::string> targets = lora_random_targets(kLlamaLinears, seed);
    const double dropout = rng.uniform() < 0.5 ? 0.2 : 0.0;
    const auto adapters = lora::apply(model, {.rank = 1 + rng.uniform_int(4),
                                              .alpha = 4,
                                              .dropout = dropout,
                                              .targets = targets,
                                              .seed = seed});
    lora_randomize_b(adapters, seed);
    const auto ids = remat::test::ids({2, 9}, 29, seed),
               next = remat::test::ids({2, 9}, 29, seed + 3);
    const remat::plan::Chain chain = remat::plan::Chain::uniform(4);
    const std::vector<remat::SavePolicy> policies{
        remat::save_nothing(), remat::save_matmuls(),
        remat::save_ops({remat::op::quantized_linear}),
        remat::recompute_ops({remat::op::linear, remat::op::quantized_linear})};
    for (const bool chunked : {true, false}) {
      std::vector<std::vector<float>> plain;
      {
        remat::Tape tape(remat::TapeOptions{.seed = 5});
        tape.backward(model.loss(ids, next, {.chunked = chunked}));
        for (const auto& p : adapters.parameters()) plain.push_back(p.grad().to_vector());
      }
      for (auto& p : adapters.parameters()) p.zero_grad();
      for (const remat::SavePolicy& policy : policies) {
        for (const remat::plan::Plan& layout : {remat::plan::every(chain), remat::plan::sqrt(chain),
                                                remat::plan::optimal(chain, 1)}) {
          const remat::plan::Plan plan = remat::plan::with_policy(layout, policy);
          remat::Tape tape(remat::TapeOptions{.seed = 5});
          tape.backward(model.loss(ids, next, {.plan = &plan, .chunked = chunked}));
          const auto params = adapters.parameters();
          for (std::size_t i = 0; i < params.size(); ++i) {
            INFO(remat::to_string(storage)
                 << ", dropout " << dropout << ", " << plan.describe()
                 << (chunked ? ", chunked" : ", plain") << " loss, adapter tensor " << i);
            CHECK(params[i].grad().to_vector() == plain[i]);
          }
          for (auto& p : adapters.parameters()) p.zero_grad();
        }
      }
    }
  }
}

TEST_CASE(
    "lora: adapter_config.json as a folder or a FIFO, or with a repeated key, is an IoError "
    "naming it",
    "[nn][lora][io][errors]") {
  using Catch::Matchers::Contains;
  remat::nn::Llama<float> model(lora_llama_config(1));
  auto adapters = lora::apply(model, {.rank = 2, .alpha = 4, .targets = {"q_proj"}});
  const std::string dir = lora_temp_dir("not_regular");
  remat::hub::save_adapters(adapters, dir);
  const std::string path = dir + "/adapter_config.json";
  std::ifstream in(path);
  const std::string good{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  in.close();
  REQUIRE_NOTHROW(remat::hub::load_adapters(adapters, dir));
  // every top-level key repeated with another value, and a repeated key in a nested object
  const nlohmann::json parsed = nlohmann::json::parse(good);
  int repeated = 0;
  for (const auto& [key, value] : parsed.items()) {
    const std::size_t at = good.find("\"" + key + "\"");
    REQUIRE(at != std::string::npos);
    std::ofstream(path) << good.substr(0, at) << "\"" << key << "\": 3, " << good.substr(at);
    const std::string message =
        remat::test::error_message([&] { remat::hub::load_adapters(adapters, dir); });
    INFO(message);
    CHECK_THAT(message, Contains(path) && Contains("the key '" + key + "' appears twice"));
    ++repeated;
  }
  CHECK(repeated >= 8);
  std::ofstream(path) << good.substr(0, good.rfind('}'))
                      << R"(, "nested_pattern": {"q_proj": 8, "q_proj": 16}})";
  CHECK_THAT(remat::test::error_message([&] { remat::hub::load_adapters(adapters, dir); }),
             Contains("'q_proj' appears twice in the object 'nested_pattern'"));
  // a folder in its place (the issue: a non-remat exception), then a FIFO (a hang)
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  CHECK_THAT(remat::test::error_message([&] { remat::hub::load_adapters(adapters, dir); }),
             Contains(path) && Contains(std::strerror(EISDIR)));
  std::filesystem::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  CHECK(remat::test::run_in_child([&] {
          return remat::test::error_status([&] { remat::hub::load_adapters(adapters, dir); },
                                           {path.c_str(), "a FIFO"});
        }) == 0);
}

TEST_CASE("the adapter_config fuzzer's seed corpus holds what its names say",
          "[nn][lora][io][errors]") {
  // the fuzzer's fixture: rank-2, alpha-4 adapters on q_proj of a tiny Llama
  remat::nn::Llama<float> model(remat::nn::LlamaConfig{.vocab_size = 5,
                                                       .hidden_size = 4,
                                                       .intermediate_size = 4,
                                                       .num_hidden_layers = 1,
                                                       .num_attention_heads = 2,
                                                       .num_key_value_heads = 2,
                                                       .max_position_embeddings = 4});
  auto adapters = lora::apply(model, {.rank = 2, .alpha = 4, .targets = {"q_proj"}});
  const std::string dir = lora_temp_dir("adapter_corpus");
  remat::hub::save_adapters(adapters, dir);
  const auto corpus = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() /
                      "fuzz" / "corpus" / "adapter_config";
  REQUIRE(std::filesystem::is_directory(corpus));
  int valid = 0, rejected = 0;
  for (const auto& e : std::filesystem::directory_iterator(corpus)) {
    const std::string name = e.path().filename().string();
    INFO(name);
    std::filesystem::copy_file(e.path(), dir + "/adapter_config.json",
                               std::filesystem::copy_options::overwrite_existing);
    if (name.rfind("valid_", 0) == 0) {
      CHECK_NOTHROW(remat::hub::load_adapters(adapters, dir));
      ++valid;
    } else {
      CHECK_THROWS_AS(remat::hub::load_adapters(adapters, dir), remat::IoError);
      ++rejected;
    }
  }
  CHECK(valid >= 1);
  CHECK(rejected >= 9);
}
