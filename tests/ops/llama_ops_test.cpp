// The ops of Llama/Qwen-style models (rms_norm, rope, silu, swiglu, gelu, gelu_tanh, where,
// masked_fill, mse_loss, reshape to a run-time shape, and attention with grouped-query heads,
// RoPE and a sliding window: the reference's "grouped_query_attention" cases): values and
// gradients against PyTorch 1.13 in double (tests/reference/ops.json), finite differences on
// generated shapes, and clear errors for bad arguments.
#include "support/gradcheck.hpp"
#include "support/reference.hpp"

#include <remat/ops/attention.hpp>
#include <remat/ops/mse_loss.hpp>
#include <remat/ops/rms_norm.hpp>
#include <remat/ops/rope.hpp>
#include <remat/ops/silu.hpp>
#include <remat/ops/where.hpp>

#include <set>

namespace {

using remat::Shape;
using remat::Tensor;
using remat::Var;
using remat::test::VarList;

/// The op a reference case names, as a function of its floating inputs (in `names` order).
struct RefOp {
  std::vector<std::string> names;
  remat::test::Function f;
};

/// A rope case's rope_scaling (Hugging Face's dict), or none.
remat::RopeScaling rope_scaling(const nlohmann::json& p) {
  remat::RopeScaling s;
  if (!p.contains("scaling")) return s;
  const nlohmann::json& r = p.at("scaling");
  const std::string type = r.at("rope_type");
  s.type = type == "linear"    ? remat::RopeScalingType::linear
           : type == "dynamic" ? remat::RopeScalingType::dynamic
                               : remat::RopeScalingType::llama3;
  REQUIRE(remat::to_string(s.type) == type);
  s.factor = r.at("factor");
  s.low_freq_factor = r.value("low_freq_factor", 1.0);
  s.high_freq_factor = r.value("high_freq_factor", 4.0);
  s.original_max_position_embeddings = r.value("original_max_position_embeddings", 0);
  s.max_position_embeddings = r.value("max_position_embeddings", 0);
  return s;
}

RefOp llama_ops_ref_op(const nlohmann::json& c) {
  const std::string op = c.at("op");
  const nlohmann::json& p = c.at("params");
  const nlohmann::json& in = c.at("inputs");
  if (op == "rms_norm") {
    const double eps = p.at("eps");
    return {{"x", "w"}, [eps](const VarList& v) { return remat::rms_norm(v[0], v[1], eps); }};
  }
  if (op == "silu") return {{"x"}, [](const VarList& v) { return remat::silu(v[0]); }};
  if (op == "gelu") return {{"x"}, [](const VarList& v) { return remat::gelu(v[0]); }};
  if (op == "gelu_tanh") return {{"x"}, [](const VarList& v) { return remat::gelu_tanh(v[0]); }};
  if (op == "swiglu")
    return {{"gate", "up"}, [](const VarList& v) { return remat::swiglu(v[0], v[1]); }};
  if (op == "where") {
    Tensor<bool> cond = remat::test::json_tensor<bool>(in.at("cond"));
    return {{"a", "b"}, [cond](const VarList& v) { return remat::where(cond, v[0], v[1]); }};
  }
  if (op == "masked_fill") {
    Tensor<bool> mask = remat::test::json_tensor<bool>(in.at("mask"));
    const double value = p.at("value");
    return {{"x"},
            [mask, value](const VarList& v) { return remat::masked_fill(v[0], mask, value); }};
  }
  if (op == "mse_loss") {
    const std::string r = p.at("reduction");
    const remat::Reduction reduction = r == "mean"  ? remat::Reduction::mean
                                       : r == "sum" ? remat::Reduction::sum
                                                    : remat::Reduction::none;
    return {{"input", "target"},
            [reduction](const VarList& v) { return remat::mse_loss(v[0], v[1], reduction); }};
  }
  if (op == "reshape") {
    const std::vector<std::int64_t> dims = p.at("shape");
    return {{"x"}, [dims](const VarList& v) {
              return remat::reshape(v[0], Shape(std::span<const std::int64_t>(dims)));
            }};
  }
  if (op == "rope") {
    const remat::RopeOptions o{
        .theta = p.at("theta"), .offset = p.at("offset"), .scaling = rope_scaling(p)};
    return {{"x"}, [o](const VarList& v) { return remat::rope(v[0], o); }};
  }
  if (op == "grouped_query_attention") {
    const std::int64_t h = p.at("heads"), g = p.at("kv_heads"), window = p.value("window", 0);
    const remat::RopeOptions o{.theta = p.at("theta"), .offset = p.at("offset")};
    return {{"q", "k", "v"}, [h, g, o, window](const VarList& v) {
              return remat::attention(v[0], v[1], v[2],
                                      {.heads = h, .kv_heads = g, .rope = o, .window = window});
            }};
  }
  if (op == "add") return {{"a", "b"}, [](const VarList& v) { return remat::add(v[0], v[1]); }};
  if (op == "sub") return {{"a", "b"}, [](const VarList& v) { return remat::sub(v[0], v[1]); }};
  if (op == "mul") return {{"a", "b"}, [](const VarList& v) { return remat::mul(v[0], v[1]); }};
  if (op == "div") return {{"a", "b"}, [](const VarList& v) { return remat::div(v[0], v[1]); }};
  FAIL("unknown op in ops.json: " << op);
  return {};
}

}  // namespace

TEST_CASE("Llama ops agree with PyTorch 1.13 in value and gradient to 1e-10", "[ops][reference]") {
  const nlohmann::json& cases = remat::test::reference("ops.json").at("cases");
  REQUIRE(cases.size() >= 60);
  std::set<std::string> seen;
  for (const nlohmann::json& c : cases) {
    const RefOp op = llama_ops_ref_op(c);
    std::vector<Tensor<double>> inputs;
    for (const std::string& name : op.names)
      inputs.push_back(remat::test::json_tensor<double>(c.at("inputs").at(name)));
    const Tensor<double> r = remat::test::json_tensor<double>(c.at("R"));
    std::vector<Tensor<double>> grads;
    const Tensor<double> out = remat::test::evaluate(op.f, inputs, 1, &r, &grads);
    INFO(c.at("op") << " " << c.at("params").dump() << ", input shape " << inputs[0].shape());
    CHECK(remat::test::relative_difference(out, remat::test::json_tensor<double>(c.at("output"))) <=
          1e-10);
    for (std::size_t k = 0; k < op.names.size(); ++k) {
      INFO("gradient of " << op.names[k]);
      CHECK(remat::test::relative_difference(
                grads[k], remat::test::json_tensor<double>(c.at("grads").at(op.names[k]))) <=
            1e-10);
    }
    seen.insert(c.at("op").get<std::string>());
  }
  CHECK(seen.size() == 15);
}

TEST_CASE("Llama ops: gradients by finite differences on generated shapes", "[ops][gradcheck]") {
  remat::Rng rng(2024);
  for (int trial = 0; trial < 4; ++trial) {
    const std::int64_t b = 1 + rng.uniform_int(2), t = 1 + rng.uniform_int(4),
                       c = 1 + rng.uniform_int(6);
    const Shape shape{b, t, c};
    DYNAMIC_SECTION("shape " << shape) {
      const std::uint64_t seed = 100 + static_cast<std::uint64_t>(trial);
      const auto x = remat::test::randn(shape, seed), y = remat::test::randn(shape, seed + 1);
      remat::test::gradcheck([](const VarList& v) { return remat::rms_norm(v[0], v[1], 1e-3); },
                             {x, remat::test::randn({c}, seed + 2)});
      remat::test::gradcheck([](const VarList& v) { return remat::silu(v[0]); }, {x});
      remat::test::gradcheck([](const VarList& v) { return remat::gelu(v[0]); }, {x});
      remat::test::gradcheck([](const VarList& v) { return remat::swiglu(v[0], v[1]); }, {x, y});
      Tensor<bool> mask(Shape{t, c});
      for (bool& m : mask) m = rng.uniform_int(2) == 1;
      remat::test::gradcheck([mask](const VarList& v) { return remat::where(mask, v[0], v[1]); },
                             {x, y});
      remat::test::gradcheck(
          [mask](const VarList& v) { return remat::masked_fill(v[0], mask, 3.0); }, {x});
      for (remat::Reduction r :
           {remat::Reduction::mean, remat::Reduction::sum, remat::Reduction::none}) {
        remat::test::gradcheck([r](const VarList& v) { return remat::mse_loss(v[0], v[1], r); },
                               {x, y});
      }
      const Shape flat{b * t * c};
      remat::test::gradcheck([flat](const VarList& v) { return remat::reshape(v[0] * v[0], flat); },
                             {x});
      // rope on (B, T, H, D): the head size must be even
      const std::int64_t heads = 1 + rng.uniform_int(3), d = 2 * (1 + rng.uniform_int(3));
      const remat::RopeOptions o{.theta = 100.0 + 1000.0 * rng.uniform(),
                                 .offset = rng.uniform_int(5)};
      remat::test::gradcheck([o](const VarList& v) { return remat::rope(v[0], o); },
                             {remat::test::randn({b, t, heads, d}, seed + 3)});
    }
  }
}

TEST_CASE(
    "attention with grouped-query heads and RoPE: gradients by finite differences, and equal to "
    "MHA on repeated heads",
    "[ops][gradcheck][attention]") {
  remat::Rng rng(77);
  for (int trial = 0; trial < 4; ++trial) {
    const std::int64_t g = 1 + rng.uniform_int(2), rep = 1 + rng.uniform_int(3), h = g * rep;
    const std::int64_t b = 1 + rng.uniform_int(2), t = 1 + rng.uniform_int(5),
                       d = 2 * (1 + rng.uniform_int(2));
    const remat::RopeOptions o{.theta = 10000.0, .offset = rng.uniform_int(4)};
    DYNAMIC_SECTION("B " << b << " T " << t << " heads " << h << " kv_heads " << g << " D " << d) {
      const std::uint64_t seed = 300 + static_cast<std::uint64_t>(trial);
      const auto q = remat::test::randn({b, t, h * d}, seed),
                 k = remat::test::randn({b, t, g * d}, seed + 1),
                 v = remat::test::randn({b, t, g * d}, seed + 2);
      remat::test::gradcheck(
          [=](const VarList& x) {
            return remat::attention(x[0], x[1], x[2], {.heads = h, .kv_heads = g, .rope = o});
          },
          {q, k, v});
      // The same keys and values repeated for every query head (Hugging Face's repeat_kv) with
      // kv_heads = heads give the same output.
      Tensor<double> k_rep(Shape{b, t, h * d}), v_rep(Shape{b, t, h * d});
      for (std::int64_t row = 0; row < b * t; ++row) {
        for (std::int64_t head = 0; head < h; ++head) {
          for (std::int64_t i = 0; i < d; ++i) {
            k_rep[(row * h + head) * d + i] = k[(row * g + head / rep) * d + i];
            v_rep[(row * h + head) * d + i] = v[(row * g + head / rep) * d + i];
          }
        }
      }
      const auto grouped = remat::attention(Var<double>(q), Var<double>(k), Var<double>(v),
                                            {.heads = h, .kv_heads = g, .rope = o})
                               .value();
      const auto full = remat::attention(Var<double>(q), Var<double>(k_rep), Var<double>(v_rep),
                                         {.heads = h, .kv_heads = h, .rope = o})
                            .value();
      CHECK(remat::test::relative_difference(grouped, full) <= 1e-14);
    }
  }
}

TEST_CASE("add, sub, mul, div broadcast by NumPy's rules; broadcast_to sums its gradient",
          "[ops][arithmetic][gradcheck]") {
  const std::vector<std::pair<Shape, Shape>> families = {
      {{2, 1, 4}, {3, 1}}, {{1, 3}, {2, 1}},    {{2, 3, 1}, {1, 1, 4}},
      {{4, 1, 1}, {3, 2}}, {{3, 4}, {2, 1, 4}}, {{1}, {2, 1, 3}},
  };
  for (const auto& [sa, sb] : families) {
    DYNAMIC_SECTION("shapes " << sa << " and " << sb) {
      const auto a = remat::test::randn(sa, 1);
      auto b = remat::test::randn(sb, 2);
      for (double& v : b) v = v > 0 ? v + 0.5 : v - 0.5;
      remat::test::gradcheck([](const VarList& v) { return remat::add(v[0], v[1]); }, {a, b});
      remat::test::gradcheck([](const VarList& v) { return remat::sub(v[0], v[1]); }, {a, b});
      remat::test::gradcheck([](const VarList& v) { return remat::mul(v[0], v[1]); }, {a, b});
      remat::test::gradcheck([](const VarList& v) { return remat::div(v[0], v[1]); }, {a, b});
      const Shape out = remat::detail::numpy_broadcast_shape("test", sa, sb);
      remat::test::gradcheck([out](const VarList& v) { return remat::broadcast_to(v[0], out); },
                             {a});
      // every output element is the operands' elements at the repeated coordinates
      const Tensor<double> sum = remat::add(Var<double>(a), Var<double>(b)).value();
      REQUIRE(sum.shape() == out);
      CHECK(sum[sum.numel() - 1] == a[a.numel() - 1] + b[b.numel() - 1]);
      CHECK(sum[0] == a[0] + b[0]);
    }
  }
  using Catch::Matchers::Contains;
  CHECK_THAT(remat::test::error_message([] {
               remat::mul(Var<float>(Tensor<float>::zeros({2, 3})),
                          Var<float>(Tensor<float>::zeros({4, 1})));
             }),
             Contains("mul") && Contains("(2, 3)") && Contains("(4, 1)") && Contains("NumPy"));
  CHECK_THROWS_AS(remat::broadcast_to(Var<float>(Tensor<float>::zeros({2, 3})), Shape{3, 3}),
                  remat::ShapeError);
}

TEST_CASE("Llama ops: bad arguments are clear errors", "[ops][errors]") {
  const Var<double> x(Tensor<double>::zeros({2, 3, 4}));
  const Var<double> w(Tensor<double>::ones({3}));
  using Catch::Matchers::Contains;
  CHECK_THAT(remat::test::error_message([&] { remat::rms_norm(x, w); }),
             Contains("rms_norm") && Contains("(2, 3, 4)"));
  CHECK_THROWS_AS(remat::rms_norm(x, Var<double>(Tensor<double>::ones({4})), 0.0),
                  remat::ArgumentError);
  CHECK_THAT(remat::test::error_message([&] {
               remat::rope(Var<double>(Tensor<double>::zeros({2, 3, 5})));
             }),
             Contains("rope") && Contains("even"));
  CHECK_THROWS_AS(remat::rope(Var<double>(Tensor<double>::zeros({1, 2, 3, 4})), {.theta = -1.0}),
                  remat::ArgumentError);
  CHECK_THAT(remat::test::error_message([&] { remat::swiglu(x, w); }),
             Contains("swiglu") && Contains("(3,)"));
  CHECK_THAT(remat::test::error_message([&] { remat::where(Tensor<bool>::zeros({3}), x, x); }),
             Contains("where") && Contains("(3,)"));
  CHECK_THAT(remat::test::error_message([&] {
               remat::masked_fill(x, Tensor<bool>::zeros({4, 4}), 0.0);
             }),
             Contains("masked_fill") && Contains("(4, 4)"));
  CHECK_THAT(remat::test::error_message([&] { remat::mse_loss(x, w); }),
             Contains("mse_loss") && Contains("(2, 3, 4)"));
  CHECK_THAT(remat::test::error_message([&] {
               remat::reshape(x, Shape{5, 5});
             }),
             Contains("reshape") && Contains("(5, 5)"));
  const Var<double> q(Tensor<double>::zeros({1, 3, 8})), kv(Tensor<double>::zeros({1, 3, 4}));
  CHECK_THAT(
      remat::test::error_message([&] { remat::attention(q, kv, kv, {.heads = 2, .kv_heads = 2}); }),
      Catch::StartsWith("attention: ") && Contains("(1, 3, 4)"));
  CHECK_THROWS_AS(remat::attention(q, kv, kv, {.heads = 3, .kv_heads = 1}),
                  remat::ShapeError);  // 8 not divisible by 3
  CHECK_NOTHROW(remat::attention(q, kv, kv, {.heads = 2, .kv_heads = 1}));
}

TEST_CASE("reshape takes a shape known only at run time, with one inferred extent",
          "[ops][layout]") {
  const Var<float> x(Tensor<float>::zeros({2, 3, 4}));
  std::vector<std::int64_t> dims{4, -1};
  CHECK(remat::reshape(x, std::span<const std::int64_t>(dims)).shape() == Shape{4, 6});
  CHECK(remat::reshape(x, x.shape().dropped_back().appended(2).appended(2)).shape() ==
        Shape{2, 3, 2, 2});
}
