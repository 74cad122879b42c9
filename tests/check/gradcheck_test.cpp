// remat::check::gradcheck on custom ops written through the public interface (Node<T>, Grads<T>,
// apply): it passes ops whose backward is right, and fails each kind of wrong one, naming what
// differs. Each op is the guide's example or a deliberate mistake in it.
#include "support/gradcheck.hpp"

#include <cmath>

namespace {

inline constexpr remat::OpType kBumpOp{"bump"};
inline constexpr remat::OpType kProductOp{"product"};
inline constexpr remat::OpType kDriftingOp{"drifting"};
inline constexpr remat::OpType kSavesTooMuchOp{"saves_too_much"};

/// y = x * exp(-x^2) * s, s a scalar argument: the guide's custom op.
template <class T>
class Bump final : public remat::Node<T> {
 public:
  explicit Bump(T scale, int mistake = 0) : scale_(scale), mistake_(mistake) {}
  const remat::OpType& op_type() const noexcept override { return kBumpOp; }

  remat::Tensor<T> forward(typename remat::Node<T>::Inputs in) override {
    const remat::Tensor<T>& x = in[0];
    this->save(0, x);
    remat::Tensor<T> y(x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) y[i] = scale_ * x[i] * std::exp(-x[i] * x[i]);
    return y;
  }

  // dy/dx = s (1 - 2 x^2) exp(-x^2)
  void backward(const remat::Tensor<T>& gy, remat::Grads<T>& grads) override {
    if (!grads.needs(0)) return;
    const remat::Tensor<T>& x = this->saved(0);
    remat::Tensor<T> gx(x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T two = mistake_ == 1 ? T(1) : T(2);  // mistake 1: a wrong derivative
      gx[i] = gy[i] * scale_ * (1 - two * x[i] * x[i]) * std::exp(-x[i] * x[i]);
    }
    if (mistake_ == 2) gx[x.numel() - 1] = 0;  // mistake 2: one element forgotten
    grads.add(0, std::move(gx));
  }

 private:
  T scale_;
  int mistake_;
};

/// z = a * b element-wise, two inputs; mistake 1 adds a's gradient to b.
template <class T>
class Product final : public remat::Node<T> {
 public:
  explicit Product(int mistake = 0) : mistake_(mistake) {}
  const remat::OpType& op_type() const noexcept override { return kProductOp; }
  remat::Tensor<T> forward(typename remat::Node<T>::Inputs in) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
    remat::Tensor<T> z(in[0].shape());
    for (std::int64_t i = 0; i < z.numel(); ++i) z[i] = in[0][i] * in[1][i];
    return z;
  }
  void backward(const remat::Tensor<T>& gy, remat::Grads<T>& grads) override {
    const remat::Tensor<T>& a = this->saved(0);
    const remat::Tensor<T>& b = this->saved(1);
    remat::Tensor<T> ga(a.shape()), gb(b.shape());
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      ga[i] = gy[i] * b[i];
      gb[i] = gy[i] * a[i];
    }
    grads.add(0, ga);
    grads.add(mistake_ == 1 ? 0 : 1, mistake_ == 1 ? ga : gb);
  }

 private:
  int mistake_;
};

/// Right gradients, but forward is not deterministic: it drifts by a call counter.
class Drifting final : public remat::Node<double> {
 public:
  const remat::OpType& op_type() const noexcept override { return kDriftingOp; }
  remat::Tensor<double> forward(Inputs in) override {
    remat::Tensor<double> y = in[0].clone();
    y[0] += 1e-3 * static_cast<double>(calls_++);
    return y;
  }
  void backward(const remat::Tensor<double>& gy, remat::Grads<double>& grads) override {
    grads.add(0, gy);
  }

 private:
  int calls_ = 0;
};

/// Saves into a slot that does not exist.
class SavesTooMuch final : public remat::Node<double> {
 public:
  const remat::OpType& op_type() const noexcept override { return kSavesTooMuchOp; }
  remat::Tensor<double> forward(Inputs in) override {
    this->save(kMaxSaved, in[0]);
    return in[0].clone();
  }
  void backward(const remat::Tensor<double>& gy, remat::Grads<double>& grads) override {
    grads.add(0, gy);
  }
};

}  // namespace

TEST_CASE("gradcheck passes custom ops whose backward is right", "[check][gradcheck]") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const remat::Tensor<double> x =
        remat::test::randn({2 + static_cast<std::int64_t>(seed), 3}, seed);
    const auto result = remat::check::gradcheck(
        [](const auto& v) { return remat::apply<Bump<double>>({v[0]}, 1.5); }, {x});
    INFO(result.message());
    CHECK(result.ok());
    CHECK(result.checked == static_cast<std::size_t>(x.numel()));
    CHECK(result.message().empty());
    // composed with built-in ops, and with two inputs
    remat::test::gradcheck(
        [](const auto& v) {
          return remat::tanh(remat::apply<Product<double>>({v[0] * 2.0, v[1]}));
        },
        {x, remat::test::randn(x.shape(), seed + 10)});
  }
  // the same op in float, recorded on a tape, with a parameter as its input
  remat::Parameter<float> w(remat::Tensor<float>::from({2}, {0.5f, -1}));
  remat::Tape tape;
  tape.backward(remat::sum(remat::apply<Bump<float>>({w}, 2.0f)));
  CHECK(w.grad()[0] == Approx(2 * (1 - 2 * 0.25) * std::exp(-0.25)));
  CHECK_NOTHROW(remat::check::require_gradients(
      [](const auto& v) { return remat::apply<Bump<double>>({v[0]}, 1.0); },
      {remat::test::randn({4}, 3)}));
}

TEST_CASE("gradcheck fails custom ops whose backward is wrong, naming the elements",
          "[check][gradcheck][errors]") {
  const remat::Tensor<double> x = remat::test::randn({3, 4}, 5);
  SECTION("a wrong derivative: every element that matters differs") {
    const auto result = remat::check::gradcheck(
        [](const auto& v) { return remat::apply<Bump<double>>({v[0]}, 1.5, 1); }, {x});
    CHECK_FALSE(result.ok());
    CHECK(result.mismatches.size() == static_cast<std::size_t>(x.numel()));
    CHECK_THAT(result.message(), Catch::Contains("12 of 12 gradient elements differ") &&
                                     Catch::Contains("input 0 element 0"));
    CHECK_THROWS_AS(
        remat::check::require_gradients(
            [](const auto& v) { return remat::apply<Bump<double>>({v[0]}, 1.5, 1); }, {x}),
        remat::GradcheckError);
  }
  SECTION("one element forgotten: exactly it is named") {
    const auto result = remat::check::gradcheck(
        [](const auto& v) { return remat::apply<Bump<double>>({v[0]}, 1.5, 2); }, {x});
    REQUIRE(result.mismatches.size() == 1);
    CHECK(result.mismatches[0].input == 0);
    CHECK(result.mismatches[0].element == 11);
    CHECK(result.mismatches[0].analytic == 0);
    CHECK(result.mismatches[0].numeric != 0);
  }
  SECTION("a gradient sent to the wrong input") {
    const auto result = remat::check::gradcheck(
        [](const auto& v) {
          return remat::apply<Product<double>>({v[0], v[1]}, 1);
        },
        {x, remat::test::randn(x.shape(), 6)});
    CHECK_FALSE(result.ok());
    bool both_inputs = false, seen0 = false, seen1 = false;
    for (const auto& m : result.mismatches) (m.input == 0 ? seen0 : seen1) = true;
    both_inputs = seen0 && seen1;
    CHECK(both_inputs);  // input 0 got an extra term, input 1 got nothing
  }
  SECTION("a forward that is not deterministic fails inside a checkpoint, naming the op") {
    const auto result =
        remat::check::gradcheck([](const auto& v) { return remat::apply<Drifting>({v[0]}); }, {x});
    CHECK(result.mismatches.empty());  // its gradient is right
    CHECK_FALSE(result.ok());
    CHECK_THAT(result.problem, Catch::Contains("replay differed") && Catch::Contains("'drifting'"));
  }
}

TEST_CASE("custom ops are checked at the interface", "[check][errors]") {
  remat::Tape tape;
  const remat::Var<double> x = tape.input(remat::Tensor<double>::ones({2}), true);
  CHECK_THAT(remat::test::error_message([&] { remat::apply<double>(nullptr, {x}); }),
             Catch::Contains("apply: the op is null"));
  CHECK_THAT(remat::test::error_message([&] { remat::apply<SavesTooMuch>({x}); }),
             Catch::Contains("saves_too_much: save() slot 4 is out of range [0, 4)"));
  CHECK_THROWS_AS(remat::check::gradcheck([](const auto& v) { return v[0]; },
                                          {remat::Tensor<double>::ones({1})}, {.eps = 0}),
                  remat::ArgumentError);
}
