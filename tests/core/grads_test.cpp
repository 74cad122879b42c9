#include "support/gradcheck.hpp"

#include <remat/checkpoint/checkpoint.hpp>

using namespace remat;
using remat::test::error_message;

namespace {

inline constexpr remat::OpType kShapedGradsOp{"shaped_grads"};

/// How a custom op hands its gradient to Grads.
enum class GradsPath { add, add_with, target };

/// A custom op of any number of inputs whose output is its first input and whose backward gives
/// input k a gradient of shape grad_shapes[k] (filled with ones), through `path`. Shapes equal
/// to the inputs' make a correct op; any other shape a wrong one.
template <class T>
class ShapedGrads final : public Node<T> {
 public:
  ShapedGrads(std::vector<Shape> grad_shapes, GradsPath path, bool undefined = false)
      : grad_shapes_(std::move(grad_shapes)), path_(path), undefined_(undefined) {}
  const remat::OpType& op_type() const noexcept override { return kShapedGradsOp; }
  Tensor<T> forward(typename Node<T>::Inputs in) override { return in[0].clone(); }
  void backward(const Tensor<T>&, Grads<T>& grads) override {
    for (int k = 0; k < grads.size(); ++k) {
      const Shape& s = grad_shapes_[static_cast<std::size_t>(k)];
      if (path_ == GradsPath::add) {
        grads.add(k, undefined_ ? Tensor<T>() : Tensor<T>::ones(s));
      } else if (path_ == GradsPath::add_with) {
        grads.add_with(k, s, [](Tensor<T>& dst, bool overwrite) {
          for (T& v : dst) v = overwrite ? T(1) : v + T(1);
        });
      } else if (const auto t = grads.target(k, s); t.dst) {
        for (T& v : *t.dst) v = t.overwrite ? T(1) : v + T(1);
      }
    }
  }

 private:
  std::vector<Shape> grad_shapes_;
  GradsPath path_;
  bool undefined_;
};

/// A random shape of rank 1-3 with extents 1-4.
Shape grads_random_shape(Rng& rng) {
  std::vector<std::int64_t> dims(static_cast<std::size_t>(1 + rng.uniform_int(3)));
  for (auto& d : dims) d = 1 + rng.uniform_int(4);
  return Shape(std::span<const std::int64_t>(dims));
}

/// Another shape than `s`: half the time the same elements in another arrangement (the case a
/// size check alone would miss), else one more element on the last axis.
Shape grads_wrong_shape(Rng& rng, const Shape& s) {
  if (rng.uniform() < 0.5) {
    if (s.rank() > 1) return Shape{s.numel()};
    if (s.numel() > 1) return Shape{1, s.numel()};
  }
  return s.with_last(s.last() + 1);
}

}  // namespace

TEMPLATE_TEST_CASE(
    "a custom op's gradient of the wrong shape is a UsageError naming the op, the input and both "
    "shapes",
    "[core][grads][errors]", float, double) {
  using T = TestType;
  Rng rng(2026);
  for (int trial = 0; trial < 60; ++trial) {
    const int inputs = 1 + static_cast<int>(rng.uniform_int(3));
    const int bad = static_cast<int>(rng.uniform_int(inputs));
    const auto path = static_cast<GradsPath>(rng.uniform_int(3));
    const bool in_checkpoint = rng.uniform() < 0.5, parameters = rng.uniform() < 0.5;
    std::vector<Shape> shapes, grads;
    for (int k = 0; k < inputs; ++k) shapes.push_back(grads_random_shape(rng));
    grads = shapes;
    grads[static_cast<std::size_t>(bad)] =
        grads_wrong_shape(rng, shapes[static_cast<std::size_t>(bad)]);
    INFO("trial " << trial << ": input " << bad << " of " << inputs << ", shape "
                  << shapes[static_cast<std::size_t>(bad)] << ", gradient "
                  << grads[static_cast<std::size_t>(bad)] << ", path " << int(path)
                  << (in_checkpoint ? ", in a checkpoint" : "")
                  << (parameters ? ", parameters" : ", tape inputs"));
    for (const bool correct : {true, false}) {
      Tape tape;
      std::vector<Parameter<T>> params;
      std::vector<Var<T>> xs;
      for (const Shape& s : shapes) {
        if (parameters) {
          params.emplace_back(Tensor<T>::zeros(s));
          xs.emplace_back(params.back());
        } else {
          xs.push_back(tape.input(Tensor<T>::zeros(s), true));
        }
      }
      const auto op = [&](const Var<T>& first) {
        std::vector<Var<T>> ins = xs;
        ins[0] = first;
        auto copy = std::make_unique<ShapedGrads<T>>(correct ? shapes : grads, path);
        if (ins.size() == 1) return apply<T>(std::move(copy), {ins[0]});
        if (ins.size() == 2) return apply<T>(std::move(copy), {ins[0], ins[1]});
        return apply<T>(std::move(copy), {ins[0], ins[1], ins[2]});
      };
      const Var<T> y = in_checkpoint ? checkpoint(op, xs[0]) : op(xs[0]);
      const auto run = [&] { tape.backward(sum(y)); };
      if (correct) {
        REQUIRE_NOTHROW(run());
        // each input got ones of its own shape: the check accepts what it must
        for (std::size_t k = 0; k < shapes.size(); ++k) {
          const Tensor<T> g = parameters ? params[k].grad() : xs[k].grad();
          CHECK(g.shape() == shapes[k]);
        }
        continue;
      }
      const std::string message = error_message(run);
      CHECK_THAT(message,
                 Catch::Contains(remat::detail::cat("shaped_grads: backward() gave input ", bad)));
      std::ostringstream want, got;
      want << "of shape " << shapes[static_cast<std::size_t>(bad)];
      got << "a gradient of shape " << grads[static_cast<std::size_t>(bad)];
      CHECK_THAT(message, Catch::Contains(want.str()) && Catch::Contains(got.str()));
    }
  }
}

TEST_CASE("an undefined gradient from a custom op is a UsageError naming the op and input",
          "[core][grads][errors]") {
  Tape tape;
  const Var<float> x = tape.input(Tensor<float>::zeros({2, 3}), true);
  const Var<float> y = apply<float>(
      std::make_unique<ShapedGrads<float>>(std::vector<Shape>{Shape{2, 3}}, GradsPath::add, true),
      {x});
  const std::string message = error_message([&] { tape.backward(sum(y)); });
  CHECK_THAT(message, Catch::Contains("shaped_grads: backward() gave input 0") &&
                          Catch::Contains("(2, 3)") && Catch::Contains("undefined gradient"));
}
