#include "support/gradcheck.hpp"
#include "support/models.hpp"

using namespace remat;
using remat::test::BlockModel;
using remat::test::ChainModel;
using remat::test::error_message;
using remat::test::step;

namespace {

inline constexpr remat::OpType kDriftingReplayOp{"drifting_op"};

// A custom op that adds a global counter: deterministic it is not, so a replay diverges.
int g_drift = 0;
class DriftingOp final : public Node<float> {
 public:
  const remat::OpType& op_type() const noexcept override { return kDriftingReplayOp; }
  Tensor<float> forward(Inputs in) override {
    Tensor<float> out = in[0].clone();
    out[0] += static_cast<float>(g_drift++);
    return out;
  }
  void backward(const Tensor<float>& gy, Grads<float>& grads) override { grads.add(0, gy); }
};

Var<float> drifting(const Var<float>& x) {
  return apply<float>(std::make_unique<DriftingOp>(), {x});
}

}  // namespace

TEST_CASE("checkpointed gradients equal plain ones bit for bit: MLP under every plan",
          "[checkpoint]") {
  ChainModel model(12, 16, "gelu", 1);
  Rng rng(2);
  const auto x = rng.normal_tensor<float>({8, 16});
  const auto t = remat::test::targets(8, 16, 3);
  const auto run = [&](const plan::Plan& p) {
    return step(model.parameters(), [&](Tape& tape) {
      return cross_entropy(checkpoint_sequential(model.layers, p, tape.input(x)), t);
    });
  };
  const plan::Chain chain = plan::Chain::uniform(12, 1, 1);
  const auto plain = run(plan::none(chain));
  for (const plan::Plan& p :
       {plan::every(chain), plan::sqrt(chain), plan::budget(chain, plan::sqrt(chain).peak_bytes),
        plan::optimal(chain, 2), plan::optimal(chain, 0)}) {
    INFO(p.describe());
    const auto r = run(p);
    CHECK(r.loss == plain.loss);
    CHECK(r.grads == plain.grads);
    CHECK(r.replays == p.segment_count());  // each segment replayed exactly once
  }
}

TEST_CASE("checkpointed gradients equal plain ones bit for bit: transformer blocks with dropout",
          "[checkpoint]") {
  BlockModel model(4, 8, 0.2, 5);
  Rng rng(6);
  const auto x = rng.normal_tensor<float>({2, 6, 8});
  const auto t = remat::test::targets(12, 8, 7);
  const auto run = [&](const plan::Plan& p, TapeOptions options = {}) {
    return step(
        model.params,
        [&](Tape& tape) {
          return cross_entropy(checkpoint_sequential(model.layers, p, tape.input(x)), t);
        },
        99, options);
  };
  const plan::Chain chain = plan::Chain::uniform(4, 1, 3);
  const auto plain = run(plan::none(chain));
  for (const plan::Plan& p :
       {plan::every(chain), plan::sqrt(chain), plan::budget(chain, plan::every(chain).peak_bytes),
        plan::optimal(chain, 1)}) {
    INFO(p.describe());
    const auto r = run(p);
    CHECK(r.loss == plain.loss);
    CHECK(r.grads == plain.grads);
    const auto verified = run(p, TapeOptions{.verify_replay = true});
    CHECK(verified.grads == plain.grads);
  }
  // dropout really is on: a different seed changes the loss
  CHECK(step(
            model.params,
            [&](Tape& tape) {
              return cross_entropy(
                  checkpoint_sequential(model.layers, plan::none(chain), tape.input(x)), t);
            },
            100)
            .loss != plain.loss);
}

TEST_CASE("checkpoint(fn, ...) and CheckpointScope give the same gradients as plain code",
          "[checkpoint]") {
  ChainModel model(3, 8, "tanh", 11);
  Rng rng(12);
  const auto x = rng.normal_tensor<float>({4, 8});
  const auto forward = [&](int mode) {
    return step(model.parameters(), [&](Tape& tape) {
      Var<float> h = tape.input(x);
      for (const auto& layer : model.layers) {
        if (mode == 0) h = layer(h);
        if (mode == 1) h = checkpoint(layer, h);
        if (mode == 2) {
          CheckpointScope scope;
          h = layer(h);
        }
      }
      return sum(h * h);
    });
  };
  const auto plain = forward(0);
  CHECK(forward(1).grads == plain.grads);
  CHECK(forward(2).grads == plain.grads);
  CHECK(forward(1).replays == 3);
}

TEST_CASE("checkpoints nest: three levels deep", "[checkpoint]") {
  ChainModel model(8, 8, "gelu", 21);
  Rng rng(22);
  const auto x = rng.normal_tensor<float>({4, 8});
  const auto run = [&](bool nested) {
    return step(model.parameters(), [&](Tape& tape) {
      Var<float> h = tape.input(x);
      const auto layers = [&](int a, int b, Var<float> v) {
        for (int i = a; i < b; ++i) v = model.layers[i](v);
        return v;
      };
      if (!nested) return sum(layers(0, 8, h));
      // level 1: [0, 8); level 2: [0, 4) and [4, 8); level 3: each layer of [4, 8)
      h = checkpoint(
          [&](Var<float> v) {
            v = checkpoint([&](Var<float> u) { return layers(0, 4, u); }, v);
            return checkpoint(
                [&](Var<float> u) {
                  for (int i = 4; i < 8; ++i) u = checkpoint(model.layers[i], u);
                  return u;
                },
                v);
          },
          h);
      CHECK(remat::detail::TapeAccess::state(tape).segments().size() == 1 + 2 + 4);
      return sum(h);
    });
  };
  const auto plain = run(false);
  const auto nested = run(true);
  CHECK(nested.loss == plain.loss);
  CHECK(nested.grads == plain.grads);
  CHECK(nested.replays == 7);
}

TEST_CASE("inputs that need no gradient do not stop parameter gradients inside a segment",
          "[checkpoint]") {
  Parameter<float> w(Tensor<float>::full({3}, 0.5f));
  Parameter<float> frozen_table(Tensor<float>::from({2, 3}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}));
  frozen_table.freeze();
  Tape tape;
  const auto ids = Tensor<std::int32_t>::from({2}, {1, 0});
  const Var<float> e = embedding(frozen_table, ids);  // needs no gradient
  CHECK_FALSE(e.requires_grad());
  const Var<float> y = checkpoint([&](const Var<float>& v) { return tanh(v * w); }, e);
  tape.backward(sum(y));
  REQUIRE(w.grad().defined());
  // d/dw sum tanh(e w) = sum over rows of e (1 - tanh^2(e w))
  for (int j = 0; j < 3; ++j) {
    double want = 0;
    for (int r = 0; r < 2; ++r) {
      const double v = frozen_table.value()[(1 - r) * 3 + j];
      want += v * (1 - std::pow(std::tanh(v * 0.5), 2));
    }
    CHECK(w.grad()[j] == Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("a Var captured by the checkpointed function, not passed as input, still works",
          "[checkpoint]") {
  ChainModel model(2, 8, "tanh", 31);
  Rng rng(32);
  const auto x = rng.normal_tensor<float>({4, 8});
  const auto run = [&](bool ckpt) {
    return step(model.parameters(), [&](Tape& tape) {
      const Var<float> a = model.layers[0](tape.input(x));
      const Var<float> outer = a * 3.0f;  // used inside without being an input
      const auto fn = [&](const Var<float>& h) { return model.layers[1](h) + outer; };
      return sum(ckpt ? checkpoint(fn, a) : fn(a));
    });
  };
  CHECK(run(true).grads == run(false).grads);
}

TEST_CASE("code inside a checkpoint runs once per step: side effects do not repeat",
          "[checkpoint]") {
  ChainModel model(4, 8, "gelu", 41);
  int calls = 0;
  double running_mean = 0;  // like a BatchNorm statistic
  Rng rng(42);
  const auto x = rng.normal_tensor<float>({4, 8});
  Tape tape;
  Var<float> h = tape.input(x);
  for (const auto& layer : model.layers) {
    h = checkpoint(
        [&](const Var<float>& v) {
          ++calls;
          running_mean = 0.9 * running_mean + 0.1 * v.value().array().mean();
          return layer(v);
        },
        h);
  }
  const double mean_after_forward = running_mean;
  tape.backward(sum(h));
  CHECK(tape.replay_stats().replays == 4);
  CHECK(calls == 4);
  CHECK(running_mean == mean_after_forward);
}

TEST_CASE("a replay that diverges is caught and named", "[checkpoint][errors]") {
  Parameter<float> w(Tensor<float>::ones({4}));
  SECTION("default check: a segment output differs") {
    Tape tape;
    const Var<float> x = tape.input(Tensor<float>::ones({4}));
    const Var<float> y = checkpoint([&](const Var<float>& v) { return tanh(drifting(v * w)); }, x);
    const std::string msg = error_message([&] { tape.backward(sum(y)); });
    CHECK_THAT(msg, Catch::Contains("segment 0") && Catch::Contains("'tanh'") &&
                        Catch::Contains("verify_replay"));
  }
  SECTION("verify mode names the first op that diverged") {
    Tape tape(TapeOptions{.verify_replay = true});
    const Var<float> x = tape.input(Tensor<float>::ones({4}));
    const Var<float> y = checkpoint([&](const Var<float>& v) { return tanh(drifting(v * w)); }, x);
    const std::string msg = error_message([&] { tape.backward(sum(y)); });
    // nodes: 0 input, 1 parameter, 2 mul, 3 drifting_op, 4 tanh
    CHECK_THAT(
        msg, Catch::Contains("node 3 'drifting_op'") && Catch::Contains("first op that diverged"));
  }
  SECTION("a parameter changed between forward and backward") {
    Tape tape;
    const Var<float> x = tape.input(Tensor<float>::ones({4}));
    const Var<float> y = checkpoint([&](const Var<float>& v) { return tanh(v * w); }, x);
    w.data()[0] = 5.0f;
    CHECK_THROWS_AS(tape.backward(sum(y)), ReplayError);
  }
}

TEST_CASE("checkpoint without a recording tape just runs the function", "[checkpoint]") {
  const Var<float> x(Tensor<float>::ones({2}));
  const Var<float> y = checkpoint([](const Var<float>& v) { return v * 2.0f; }, x);
  CHECK(y.value()[1] == 2.0f);
  Tape tape;
  NoGradGuard guard;
  CheckpointScope scope;
  CHECK_FALSE(scope.active());
}

TEST_CASE("checkpoint_sequential rejects a plan for another number of layers",
          "[checkpoint][errors]") {
  ChainModel model(3, 4, "tanh", 51);
  Tape tape;
  const Var<float> x = tape.input(Tensor<float>::ones({1, 4}));
  CHECK_THAT(
      error_message([&] { checkpoint_sequential(model.layers, plan::every(std::size_t{5}), x); }),
      Catch::Contains("for 5 layers but 3"));
}

TEST_CASE("a checkpointed function whose result ignores its inputs is reported",
          "[checkpoint][errors]") {
  Parameter<float> w(Tensor<float>::ones({2}));
  Tape tape;
  const Var<float> x = tape.input(Tensor<float>::ones({2}), true);
  const Var<float> other = tape.input(Tensor<float>::full({2}, 3.0f), true);
  // reads `other` instead of its argument: x would silently get no gradient
  CHECK_THAT(
      error_message([&] { checkpoint([&](const Var<float>&) { return tanh(other * w); }, x); }),
      Catch::Contains("depends on none of the 1 Var(s)") && Catch::Contains("Pass the Vars"));
  // identity and partial use are fine
  CHECK_NOTHROW(checkpoint([](const Var<float>& v) { return v; }, x));
  CHECK_NOTHROW(
      checkpoint([&](const Var<float>& a, const Var<float>&) { return a * w; }, x, other));
  CHECK_NOTHROW(
      checkpoint([&](const Var<float>& v) { return std::make_tuple(tanh(other), v * 2.0f); }, x));
  // inputs moved into by-value parameters still count as the inputs they were
  CHECK_NOTHROW(checkpoint([&](Var<float>, Var<float> b) { return b * w; }, Var<float>(x),
                           Var<float>(other)));
}
