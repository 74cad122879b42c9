#include "support/gradcheck.hpp"

#include <map>
#include <vector>

using namespace remat;
using remat::test::error_message;

namespace {

inline constexpr remat::OpType kProbeOp{"probe"};

/// Identity op that records the allocator's live bytes when the backward sweep reaches it.
class LiveBytesProbe final : public Node<float> {
 public:
  explicit LiveBytesProbe(std::size_t* seen) : seen_(seen) {}
  const remat::OpType& op_type() const noexcept override { return kProbeOp; }
  Tensor<float> forward(Inputs in) override { return in[0]; }
  void backward(const Tensor<float>& gy, Grads<float>& grads) override {
    *seen_ = memory::live_bytes();
    grads.add(0, gy);
  }

 private:
  std::size_t* seen_;
};

}  // namespace

TEST_CASE("backward computes gradients of inputs and parameters", "[core][tape]") {
  Parameter<double> w(Tensor<double>::from({2}, {3, -1}));
  Tape tape;
  auto x = tape.input(Tensor<double>::from({2}, {2, 5}), true);
  auto loss = sum(x * x * w);  // d/dx = 2 x w, d/dw = x^2
  tape.backward(loss);
  CHECK(loss.item() == 2 * 2 * 3 - 25);
  CHECK(x.grad().to_vector() == std::vector<double>{12, -10});
  CHECK(w.grad().to_vector() == std::vector<double>{4, 25});
  CHECK(x.requires_grad());
  CHECK(loss.requires_grad());
}

TEST_CASE("parameter gradients accumulate over uses and across tapes until zero_grad",
          "[core][tape]") {
  Parameter<double> w(Tensor<double>::from({1}, {2}));
  for (int step = 0; step < 2; ++step) {
    Tape tape;
    auto loss = sum(w * w + w);  // w used three times: d/dw = 2w + 1 = 5
    tape.backward(loss);
  }
  CHECK(w.grad()[0] == 10);
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("overwrite_grad writes a gradient that backward then adds to, never a held one",
          "[core][tape]") {
  Parameter<double> w(Tensor<double>::from({2}, {1, 2}));
  {
    Tape tape;
    tape.backward(sum(w * 3.0));
  }
  const Tensor<double> held = w.grad();  // a handle the user keeps: it must not change
  const double* backward_buffer = held.data();
  const std::span<double> g = w.overwrite_grad();
  REQUIRE(g.size() == 2);
  CHECK(g.data() != backward_buffer);
  g[0] = 10;
  g[1] = 20;
  CHECK(held.to_vector() == std::vector<double>{3, 3});
  CHECK(w.grad().to_vector() == std::vector<double>{10, 20});
  {
    Tape tape;
    tape.backward(sum(w * 3.0));  // accumulates onto the written gradient
  }
  CHECK(w.grad().to_vector() == std::vector<double>{13, 23});
  // after zero_grad, the buffer nothing else holds is reused, and the gradient is valid again
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
  const double* reused = w.overwrite_grad().data();
  w.overwrite_grad()[0] = 5;
  CHECK(w.grad().data() == reused);
  CHECK(w.grad()[0] == 5);
  w.freeze();
  CHECK_THROWS_AS(w.overwrite_grad(), UsageError);
  CHECK_THROWS_AS(Parameter<double>().overwrite_grad(), UsageError);
}

TEST_CASE("frozen parameters get no gradient and need none", "[core][tape]") {
  Parameter<double> frozen(Tensor<double>::from({1}, {2}));
  Parameter<double> trained(Tensor<double>::from({1}, {3}));
  frozen.freeze();
  {
    Tape tape;
    tape.backward(sum(frozen * trained));
  }
  CHECK_FALSE(frozen.grad().defined());
  CHECK(trained.grad()[0] == 2);
  {
    Tape tape;
    auto only_frozen = sum(frozen * 2.0);
    CHECK_THROWS_AS(tape.backward(only_frozen), UsageError);
  }
  frozen.unfreeze();
  trained.zero_grad();
  {
    Tape tape;
    tape.backward(sum(frozen * trained));
  }
  CHECK(frozen.grad()[0] == 3);
}

TEST_CASE("NoGradGuard computes values without recording", "[core][tape]") {
  Parameter<float> w(Tensor<float>::ones({3}));
  Tape tape;
  const std::size_t before = tape.size();
  Var<float> y;
  {
    NoGradGuard guard;
    y = tanh(w * 2.0f);
  }
  CHECK(tape.size() == before);
  CHECK_FALSE(y.on_tape());
  CHECK(y.value()[0] == Approx(std::tanh(2.0f)));
  auto z = sum(w * 2.0f);
  CHECK(z.on_tape());
  CHECK(tape.size() > before);
}

TEST_CASE("a 100,000-op chain runs backward and is destroyed without deep recursion",
          "[core][tape]") {
  constexpr int kOps = 100000;
  Parameter<float> w(Tensor<float>::full({1}, 1.0f));
  float grad = 0;
  {
    Tape tape;
    Var<float> x = w;
    for (int i = 0; i < kOps; ++i) x = x * 0.9999f + 0.0001f;
    CHECK(tape.size() > kOps);
    tape.backward(sum(x));
    grad = w.grad()[0];
  }
  float want = 1.0f;  // the backward pass multiplies by 0.9999f once per step, in float
  for (int i = 0; i < kOps; ++i) want = 0.9999f * want;
  CHECK(grad == want);
}

TEST_CASE("saved tensors and gradients are freed as soon as the sweep passes them",
          "[core][tape][memory]") {
  // x -> tanh_1 .. tanh_n -> sum, with a probe after tanh_m. Each tanh saves its output (N floats).
  constexpr std::int64_t N = 1000;
  constexpr int n = 10, m = 4;
  const std::size_t live0 = memory::live_bytes();
  std::size_t at_probe = 0;
  {
    Tape tape;
    Var<float> x = tape.input(Tensor<float>::full({N}, 0.5f));
    Parameter<float> w(Tensor<float>::ones({N}));  // makes the chain need gradients
    Var<float> y = x * w;  // saves x and w (shared buffers); its output is not saved by tanh
    for (int i = 1; i <= n; ++i) {
      y = tanh(y);
      if (i == m) y = apply<float>(std::make_unique<LiveBytesProbe>(&at_probe), {y});
    }
    Var<float> loss = sum(y);
    const std::size_t forward_live = memory::live_bytes() - live0;
    // x, w, n tanh outputs (the last one also held by y), the loss
    CHECK(forward_live == (2 + n) * N * 4 + 4);
    tape.backward(loss);
    // When the sweep reaches the probe, tanh_{m+1..n} have freed their outputs (but y still holds
    // tanh_n's), the gradients above the probe are gone, and one gradient buffer (the probe's) is
    // live. The loss and backward()'s seed are one float each.
    const std::size_t expected = (2 + m + 1 + 1) * N * 4 + 4 + 4;
    // without early freeing, tanh_{m+1..n-1}'s outputs and their gradients would still be here
    // (a fact about the figures, so checked where it is decided: at compile time)
    static_assert((2 + m + 1 + 1) * N * 4 + 8 < (2 + n) * N * 4);
    CHECK(at_probe - live0 == expected);
    // after backward: x, w, w's gradient and y remain; everything the sweep used is gone
    CHECK(memory::live_bytes() - live0 == 4 * N * 4 + 4);
  }
  CHECK(memory::live_bytes() == live0);
}

TEST_CASE("the probe sees what early freeing saves: outputs the user holds stay live",
          "[core][tape][memory]") {
  // The chain above, with the user holding every tanh output: the sweep cannot free
  // tanh_{m+1..n-1}'s outputs, and the probe sees exactly those n - m - 1 buffers more.
  constexpr std::int64_t N = 1000;
  constexpr int n = 10, m = 4;
  const std::size_t live0 = memory::live_bytes();
  for (const bool hold : {false, true}) {
    std::size_t at_probe = 0;
    {
      Tape tape;
      Var<float> x = tape.input(Tensor<float>::full({N}, 0.5f));
      Parameter<float> w(Tensor<float>::ones({N}));
      std::vector<Var<float>> held;
      Var<float> y = x * w;
      for (int i = 1; i <= n; ++i) {
        y = tanh(y);
        if (hold) held.push_back(y);
        if (i == m) y = apply<float>(std::make_unique<LiveBytesProbe>(&at_probe), {y});
      }
      tape.backward(sum(y));
    }
    const std::size_t freed_early = (2 + m + 1 + 1) * N * 4 + 4 + 4;
    INFO("holding the outputs: " << hold);
    CHECK(at_probe - live0 == freed_early + (hold ? (n - m - 1) * N * 4 : 0));
  }
}

TEST_CASE("misuse raises UsageError with a message that says what to do", "[core][tape][errors]") {
  Parameter<float> w(Tensor<float>::ones({2}));

  SECTION("backward twice") {
    Tape tape;
    auto loss = sum(w * w);
    tape.backward(loss);
    CHECK_THAT(error_message([&] { tape.backward(loss); }), Catch::Contains("already swept"));
    CHECK_THROWS_AS(sum(loss * 2.0f), UsageError);  // recording after backward
  }
  SECTION("backward on a non-scalar without a gradient") {
    Tape tape;
    auto y = w * 2.0f;
    CHECK_THAT(error_message([&] { tape.backward(y); }),
               Catch::Contains("(2,)") && Catch::Contains("not a single value"));
    CHECK_THAT(error_message([&] { tape.backward(y, Tensor<float>::ones({3})); }),
               Catch::Contains("(3,)"));
    tape.backward(y, Tensor<float>::ones({2}));
    CHECK(w.grad()[0] == 2);
  }
  SECTION("a Var used after its tape ended") {
    Var<float> y;
    {
      Tape tape;
      y = w * 2.0f;
    }
    CHECK(y.value()[0] == 2);  // the value itself stays readable
    CHECK_THAT(error_message([&] { tanh(y); }),
               Catch::Contains("tanh") && Catch::Contains("tape that has ended"));
    CHECK_THROWS_AS(y.grad(), UsageError);
  }
  SECTION("Vars of two tapes in one op") {
    Tape a;
    auto x = a.input(Tensor<float>::ones({2}));
    Tape b;
    auto y = b.input(Tensor<float>::ones({2}));
    CHECK_THAT(error_message([&] { add(x, y); }), Catch::Contains("different tape"));
  }
  SECTION("backward from another tape's Var") {
    Tape a;
    auto loss = sum(a.input(Tensor<float>::ones({2}), true));
    Tape b;
    CHECK_THAT(error_message([&] { b.backward(loss); }),
               Catch::Contains("not recorded on this tape"));
  }
  SECTION("an undefined Var") {
    CHECK_THAT(error_message([&] { tanh(Var<float>()); }), Catch::Contains("undefined"));
  }
}

TEST_CASE("anomaly mode names the first op that produced NaN or infinity", "[core][tape][errors]") {
  SECTION("in the forward pass") {
    Tape tape(TapeOptions{.detect_anomaly = true});
    auto x = tape.input(Tensor<float>::from({3}, {1, -1, 2}), true);
    auto y = exp(x);                                             // fine
    const std::string msg = error_message([&] { log(x * y); });  // log of a negative: NaN
    CHECK_THAT(msg, Catch::Contains("anomaly") && Catch::Contains("'log'") &&
                        Catch::Contains("(3,)") && Catch::Contains("forward"));
  }
  SECTION("in the backward pass") {
    Tape tape(TapeOptions{.detect_anomaly = true});
    auto x = tape.input(Tensor<float>::from({2}, {0, 4}), true);
    auto y = sqrt(x);  // d sqrt(x)/dx at 0 is infinite
    const std::string msg = error_message([&] { tape.backward(sum(y)); });
    CHECK_THAT(msg, Catch::Contains("anomaly") && Catch::Contains("backward of node") &&
                        Catch::Contains("'sqrt'"));
  }
  SECTION("off by default: values pass through") {
    Tape tape;
    auto x = tape.input(Tensor<float>::from({1}, {-1}), true);
    CHECK(std::isnan(log(x).item()));
  }
}

TEST_CASE("backward hooks hear each trained parameter once, when its gradient is final",
          "[core][tape]") {
  // three layers; `shared` is used by the first and the last, `frozen` trains nothing
  remat::Rng rng(4);
  std::vector<Parameter<double>> w;
  for (int i = 0; i < 3; ++i) w.emplace_back(rng.normal_tensor<double>({4, 4}));
  Parameter<double> shared(rng.normal_tensor<double>({4, 4}));
  Parameter<double> frozen(rng.normal_tensor<double>({4, 4}));
  frozen.freeze();
  const Tensor<double> input = rng.normal_tensor<double>({2, 4});
  for (const bool checkpointed : {false, true}) {
    INFO((checkpointed ? "every layer checkpointed" : "plain"));
    for (Parameter<double>* p : {&w[0], &w[1], &w[2], &shared}) p->zero_grad();
    Tape tape;
    Var<double> h = tape.input(input);
    const auto layer = [&](int i) {
      return [&, i](const Var<double>& x) {
        const Var<double> y = tanh(matmul(x, w[static_cast<std::size_t>(i)]));
        return i == 1 ? matmul(y, frozen) : matmul(y, shared);
      };
    };
    for (int i = 0; i < 3; ++i) h = checkpointed ? checkpoint(layer(i), h) : layer(i)(h);
    const std::vector<const void*> first_use = tape.parameters_by_first_use();
    CHECK(first_use == std::vector<const void*>{w[0].identity(), shared.identity(), w[1].identity(),
                                                frozen.identity(), w[2].identity()});
    std::vector<const void*> heard;
    std::map<const void*, Tensor<double>> at_ready;
    std::size_t ops = 0;
    const BackwardHooks hooks{.gradient_ready =
                                  [&](const void* p) {
                                    heard.push_back(p);
                                    for (Parameter<double>* q : {&w[0], &w[1], &w[2], &shared})
                                      if (q->identity() == p) at_ready[p] = q->grad().clone();
                                  },
                              .after_op = [&] { ++ops; }};
    tape.backward(sum(h * h), hooks);
    // reverse first use, frozen left out; each gradient was already its final value
    CHECK(heard == std::vector<const void*>{w[2].identity(), w[1].identity(), shared.identity(),
                                            w[0].identity()});
    for (Parameter<double>* q : {&w[0], &w[1], &w[2], &shared})
      CHECK((at_ready.at(q->identity()).array() == q->grad().array()).all());
    CHECK(ops >= tape.size());  // every node, replays included
    CHECK(tape.replay_stats().replays == (checkpointed ? 3U : 0U));
  }
}
