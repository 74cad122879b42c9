// Module trees: registering a child makes every walk over the tree (parameters, names, modes,
// freezing) reach it. The trees are generated at random; the builder writes down, as it adds
// each parameter, the dotted name it must get and the leaf that must follow the mode, and the
// module's own walks are checked against that record.
#include "support/gradcheck.hpp"

#include <memory>
#include <string>
#include <vector>

namespace {

/// A module whose parameters and children a test adds from outside.
class TreeModule : public remat::nn::Module<double> {
 public:
  using Module::add_module;
  using Module::add_parameter;
  std::vector<std::unique_ptr<remat::nn::Module<double>>> owned;  // children made by the builder
};

/// What the builder recorded: every parameter with the name it must get, and every module.
struct Expected {
  std::vector<std::pair<std::string, remat::Parameter<double>>> params;
  std::vector<const remat::nn::Module<double>*> modules;
  std::vector<const remat::nn::Dropout<double>*> dropouts;
};

/// Adds to `m` (named `prefix`) a random mix of parameters, library layers and sub-trees.
void grow(TreeModule& m, const std::string& prefix, int depth, remat::Rng& rng, Expected& want) {
  want.modules.push_back(&m);
  const std::int64_t entries = rng.uniform_int(5);
  for (std::int64_t i = 0; i < entries; ++i) {
    // Appended rather than `const char* + std::string`, which GCC 12 flags with a false -Wrestrict.
    std::string name(rng.uniform_int(2) == 0 ? "p" : "c");
    name += std::to_string(i);
    const std::int64_t kind = depth >= 4 ? rng.uniform_int(4) : rng.uniform_int(5);
    if (kind == 0) {  // a parameter of its own
      const std::int64_t n = 1 + rng.uniform_int(3);
      want.params.emplace_back(prefix + name,
                               m.add_parameter(name, remat::Tensor<double>::zeros({n})));
    } else if (kind == 1) {
      auto d = std::make_unique<remat::nn::Dropout<double>>(0.5);
      want.modules.push_back(d.get());
      want.dropouts.push_back(d.get());
      m.add_module(name, *d);
      m.owned.push_back(std::move(d));
    } else if (kind == 2) {
      auto l = std::make_unique<remat::nn::Linear<double>>(2, 3, rng, rng.uniform_int(2) == 0);
      want.modules.push_back(l.get());
      want.params.emplace_back(prefix + name + ".weight", l->weight);
      if (l->bias.defined()) want.params.emplace_back(prefix + name + ".bias", l->bias);
      m.add_module(name, *l);
      m.owned.push_back(std::move(l));
    } else if (kind == 3) {
      auto n = std::make_unique<remat::nn::LayerNorm<double>>(4);
      want.modules.push_back(n.get());
      want.params.emplace_back(prefix + name + ".weight", n->weight);
      want.params.emplace_back(prefix + name + ".bias", n->bias);
      m.add_module(name, *n);
      m.owned.push_back(std::move(n));
    } else {  // a sub-tree, registered before or after it is filled
      auto child = std::make_unique<TreeModule>();
      const bool register_first = rng.uniform_int(2) == 0;
      if (register_first) m.add_module(name, *child);
      grow(*child, prefix + name + ".", depth + 1, rng, want);
      if (!register_first) m.add_module(name, *child);
      m.owned.push_back(std::move(child));
    }
  }
}

bool all_in_mode(const Expected& want, bool training) {
  for (const auto* m : want.modules) {
    if (m->training() != training) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("random module trees: names, parameters, modes and freezing reach every registered leaf",
          "[nn][module]") {
  std::size_t total_params = 0, total_dropouts = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    remat::Rng rng(seed);
    TreeModule root;
    Expected want;
    grow(root, "", 0, rng, want);
    INFO("seed " << seed << ": " << want.params.size() << " parameters, " << want.modules.size()
                 << " modules");
    total_params += want.params.size();
    total_dropouts += want.dropouts.size();

    const auto named = root.named_parameters();
    REQUIRE(named.size() == want.params.size());
    for (std::size_t i = 0; i < named.size(); ++i) {
      CHECK(named[i].first == want.params[i].first);
      CHECK(named[i].second.identity() == want.params[i].second.identity());
      CHECK(root.parameter(want.params[i].first).identity() == want.params[i].second.identity());
    }
    const auto params = root.parameters();
    REQUIRE(params.size() == want.params.size());
    std::int64_t count = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].identity() == want.params[i].second.identity());
      count += want.params[i].second.numel();
    }
    CHECK(root.parameter_count() == count);

    CHECK(all_in_mode(want, true));
    root.eval();
    CHECK(all_in_mode(want, false));
    // every dropout leaf is now the identity
    for (const auto* d : want.dropouts) {
      const remat::Var<double> x(remat::Tensor<double>::ones({64}));
      CHECK((*d)(x).value().to_vector() == x.value().to_vector());
    }
    root.train();
    CHECK(all_in_mode(want, true));

    if (!want.params.empty()) {
      // freeze a random prefix of a random name: exactly the names starting with it freeze
      const std::string& name = want.params[static_cast<std::size_t>(rng.uniform_int(
                                                static_cast<std::int64_t>(want.params.size())))]
                                    .first;
      const std::string prefix = name.substr(
          0, static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(name.size())) + 1));
      root.freeze(prefix);
      for (const auto& [n, p] : want.params)
        CHECK(p.frozen() == (n.compare(0, prefix.size(), prefix) == 0));
      root.unfreeze();
      for (const auto& [n, p] : want.params) CHECK_FALSE(p.frozen());
    }
  }
  // the generator did generate something worth checking
  CHECK(total_params > 100);
  CHECK(total_dropouts > 10);
}

TEST_CASE("a module registered in a tree keeps its mode and parameters when moved",
          "[nn][module]") {
  remat::Rng rng(3);
  std::vector<remat::nn::MLP<float>> mlps;
  for (int i = 0; i < 5; ++i)
    mlps.emplace_back(4, 8, 0.5, rng);  // the vector reallocates: elements move
  for (auto& m : mlps) m.eval();
  for (const auto& m : mlps) {
    CHECK_FALSE(m.training());
    CHECK_FALSE(m.drop.training());
    CHECK_FALSE(m.fc.training());
  }
  remat::nn::MLP<float> moved = std::move(mlps.front());
  moved.train();
  CHECK(moved.drop.training());
  CHECK(mlps.front().drop.training());  // copies and moved-from modules are the same module
  CHECK(moved.named_parameters().size() == 4);
  CHECK(moved.parameter("fc.weight").identity() == moved.fc.weight.identity());
}

TEST_CASE("a GPT in eval() runs no dropout anywhere; in train() it does", "[nn][module][gpt]") {
  remat::nn::GPT<float> gpt(remat::nn::GPTConfig{
      .vocab = 11, .context = 8, .layers = 2, .heads = 2, .width = 8, .dropout = 0.5});
  const auto ids = remat::test::ids({2, 8}, 11, 1);
  const auto logits_with_seed = [&](std::uint64_t seed) {
    remat::Tape tape(remat::TapeOptions{.seed = seed});
    return gpt.logits(ids).value().to_vector();
  };
  CHECK(logits_with_seed(1) != logits_with_seed(2));
  gpt.eval();
  CHECK(logits_with_seed(1) == logits_with_seed(2));
  CHECK_FALSE(gpt.drop.training());
  for (const auto& block : gpt.blocks) {
    CHECK_FALSE(block.attn.training());
    CHECK_FALSE(block.attn.drop.training());
    CHECK_FALSE(block.mlp.drop.training());
  }
  gpt.train();
  CHECK(logits_with_seed(1) != logits_with_seed(2));
  CHECK(gpt.blocks.back().mlp.drop.training());
}

TEST_CASE(
    "module trees reject cycles and duplicate names; a shared child's parameters are listed once",
    "[nn][module][errors]") {
  TreeModule a, b;
  const auto w = a.add_parameter("w", remat::Tensor<double>::zeros({2}));
  a.add_module("b", b);
  CHECK_THAT(remat::test::error_message([&] { b.add_module("a", a); }),
             Catch::Contains("its own descendant"));
  CHECK_THAT(remat::test::error_message([&] { a.add_module("a", a); }),
             Catch::Contains("its own descendant"));
  CHECK_THAT(
      remat::test::error_message([&] { a.add_parameter("w", remat::Tensor<double>::zeros({1})); }),
      Catch::Contains("'w' added twice"));
  CHECK_THAT(remat::test::error_message([&] { a.add_module("b", b); }),
             Catch::Contains("'b' added twice"));
  const auto v =
      b.add_parameter("v", remat::Tensor<double>::zeros({3}));  // added after b was registered
  a.add_module("b_again", b);
  const auto named = a.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "w");
  CHECK(named[1].first == "b.v");
  CHECK(named[1].second.identity() == v.identity());
  CHECK(a.parameter_count() == 5);
  CHECK(w.identity() == a.parameter("w").identity());
}
