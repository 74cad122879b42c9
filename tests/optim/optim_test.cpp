#include "support/gradcheck.hpp"

#include <remat/optim/adamw.hpp>
#include <remat/optim/clip.hpp>
#include <remat/optim/schedule.hpp>
#include <remat/optim/sgd.hpp>

#include <cmath>

using namespace remat;
using remat::test::error_message;

namespace {

/// Gives p the gradient g by running backward on sum(p * g).
template <class T>
void set_grad(Parameter<T>& p, const Tensor<T>& g) {
  Tape tape;
  tape.backward(sum(p * Var<T>(g)));
}

}  // namespace

TEMPLATE_TEST_CASE("SGD with momentum and weight decay follows PyTorch's update", "[optim]", float,
                   double) {
  using T = TestType;
  Parameter<T> p(Tensor<T>::from({2}, {1, -2}));
  optim::SGD<T> sgd({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  double w[2] = {1, -2}, v[2] = {0, 0};
  const double grads[3][2] = {{0.5, -1}, {0.25, 2}, {-1, 0.5}};
  for (int step = 0; step < 3; ++step) {
    set_grad(p, Tensor<T>::from({2}, {T(grads[step][0]), T(grads[step][1])}));
    sgd.step();
    sgd.zero_grad();
    for (int i = 0; i < 2; ++i) {
      const double g = grads[step][i] + 0.01 * w[i];
      v[i] = step == 0 ? g : 0.9 * v[i] + g;
      w[i] -= 0.1 * v[i];
      CHECK(p.value()[i] == Approx(w[i]).epsilon(std::is_same_v<T, float> ? 1e-6 : 1e-14));
    }
  }
  CHECK(sgd.steps() == 3);
}

TEMPLATE_TEST_CASE("AdamW follows PyTorch's update with decoupled weight decay", "[optim]", float,
                   double) {
  using T = TestType;
  Parameter<T> p(Tensor<T>::from({2}, {1, -2}));
  optim::AdamW<T> adam({p},
                       {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1});
  double w[2] = {1, -2}, m[2] = {0, 0}, s[2] = {0, 0};
  const double grads[3][2] = {{0.5, -1}, {0.25, 2}, {-1, 0.5}};
  for (int step = 1; step <= 3; ++step) {
    set_grad(p, Tensor<T>::from({2}, {T(grads[step - 1][0]), T(grads[step - 1][1])}));
    adam.step();
    adam.zero_grad();
    for (int i = 0; i < 2; ++i) {
      const double g = grads[step - 1][i];
      w[i] *= 1 - 0.01 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g;
      s[i] = 0.99 * s[i] + 0.01 * g * g;
      w[i] -= 0.01 * (m[i] / (1 - std::pow(0.9, step))) /
              (std::sqrt(s[i] / (1 - std::pow(0.99, step))) + 1e-8);
      CHECK(p.value()[i] == Approx(w[i]).epsilon(std::is_same_v<T, float> ? 1e-6 : 1e-13));
    }
  }
}

TEST_CASE("optimizers skip parameters without gradients and refuse to step with none",
          "[optim][errors]") {
  Parameter<float> a(Tensor<float>::ones({2})), b(Tensor<float>::ones({2}));
  optim::SGD<float> sgd({a, b}, {.lr = 1.0});
  CHECK_THAT(error_message([&] { sgd.step(); }),
             Catch::Contains("none of the 2 parameters has a gradient"));
  set_grad(a, Tensor<float>::ones({2}));
  sgd.step();
  CHECK(a.value()[0] == 0.0f);
  CHECK(b.value()[0] == 1.0f);
  CHECK_THROWS_AS((optim::SGD<float>({a, a})), ArgumentError);
  CHECK_THROWS_AS((optim::AdamW<float>({a}, {.beta1 = 1.0})), ArgumentError);
  CHECK_THROWS_AS(sgd.set_lr(-1), ArgumentError);
}

TEST_CASE("clip_grad_norm scales all gradients by one factor when their global norm is too large",
          "[optim]") {
  Parameter<double> a(Tensor<double>::zeros({2})), b(Tensor<double>::zeros({1})),
      none(Tensor<double>::zeros({1}));
  set_grad(a, Tensor<double>::from({2}, {3, 0}));
  set_grad(b, Tensor<double>::from({1}, {4}));
  CHECK(optim::clip_grad_norm<double>({a, b, none}, 10.0) == 5.0);  // below the limit: unchanged
  CHECK(a.grad()[0] == 3.0);
  CHECK(optim::clip_grad_norm<double>({a, b, none}, 1.0) == 5.0);
  // scaled by max_norm / (norm + 1e-6), PyTorch's guard against a zero norm; the norm is exactly 5
  const double scale = 1.0 / (5.0 + 1e-6);
  CHECK(a.grad()[0] == 3.0 * scale);
  CHECK(b.grad()[0] == 4.0 * scale);
  CHECK(none.grad().defined() == false);
  CHECK_THROWS_AS(optim::clip_grad_norm<double>({a}, 0.0), ArgumentError);
}

TEST_CASE("CosineSchedule warms up linearly, then decays along a half cosine to its floor",
          "[optim]") {
  const optim::CosineSchedule s(1.0, 4, 14, 0.1);
  CHECK(s(0) == 0.25);
  CHECK(s(3) == 1.0);
  CHECK(s(4) == 1.0);
  // halfway: the mean of peak and floor (cos(pi / 2) is 6e-17, not 0, in double)
  CHECK(s(9) == Approx(0.55).epsilon(1e-15));
  CHECK(s(14) == Approx(0.1).epsilon(1e-15));
  CHECK(s(100) == Approx(0.1).epsilon(1e-15));
  CHECK_THROWS_AS(optim::CosineSchedule(1.0, 5, 4), ArgumentError);
}

TEST_CASE("an optimizer over another model's parameters refuses to step", "[optim][errors]") {
  Parameter<float> model_a(Tensor<float>::ones({2})), model_b(Tensor<float>::ones({2}));
  optim::AdamW<float> opt({model_a});
  {
    Tape tape;
    tape.backward(sum(model_b * 2.0f));  // the loss uses model B only
  }
  CHECK_THAT(error_message([&] { opt.step(); }),
             Catch::Contains("none of the 1 parameters has a gradient") &&
                 Catch::Contains("uses this optimizer's parameters"));
  CHECK(model_a.value()[0] == 1.0f);
}
