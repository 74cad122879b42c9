#include "support/gradcheck.hpp"

#include <remat/core/print.hpp>

#include <sstream>

namespace {

template <class X>
std::string print_to_string(const X& x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

}  // namespace

TEST_CASE("operator<< prints a tensor like PyTorch, with its shape and dtype", "[core][print]") {
  using remat::Shape;
  using remat::Tensor;
  CHECK(print_to_string(Tensor<double>::from({2, 2}, {0.1234, -1.5, 2, 3.25})) ==
        "tensor([[ 0.1234, -1.5000],\n"
        "        [ 2.0000,  3.2500]], shape=(2, 2), dtype=float64)");
  CHECK(print_to_string(Tensor<float>::scalar(2.5f)) == "tensor(2.5000, shape=(), dtype=float32)");
  CHECK(print_to_string(Tensor<std::int32_t>::from({3}, {1, -20, 300})) ==
        "tensor([  1, -20, 300], shape=(3,), dtype=int32)");
  CHECK(print_to_string(Tensor<float>::from({2}, {1e-5f, 100.0f})) ==
        "tensor([1.0000e-05, 1.0000e+02], shape=(2,), dtype=float32)");
  CHECK(print_to_string(Tensor<bool>::from({2}, {true, false})) ==
        "tensor([ True, False], shape=(2,), dtype=bool)");
  CHECK(print_to_string(Tensor<double>::from({1, 2, 1}, {1, 2})) ==
        "tensor([[[1.0000],\n"
        "         [2.0000]]], shape=(1, 2, 1), dtype=float64)");
  CHECK(print_to_string(Tensor<float>()) == "tensor(undefined)");
  CHECK(print_to_string(remat::Var<double>(Tensor<double>::from({1}, {-0.5}))) ==
        "tensor([-0.5000], shape=(1,), dtype=float64)");
}

TEST_CASE("operator<< elides the middle of a large tensor", "[core][print]") {
  using remat::Tensor;
  Tensor<float> t(remat::Shape{40, 50});
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i % 7);
  const std::string s = print_to_string(t);
  CHECK(s.rfind("tensor([[0.0000, 1.0000, 2.0000, ..., 5.0000, 6.0000, 0.0000],\n", 0) == 0);
  CHECK(s.find("        ...,\n") != std::string::npos);
  CHECK(s.find("shape=(40, 50), dtype=float32)") != std::string::npos);
  // 6 rows of 6 values and the ellipses, not 2000 values
  CHECK(std::count(s.begin(), s.end(), '\n') == 6);
  CHECK(s.size() < 500);
  // small tensors print in full
  const std::string small = print_to_string(Tensor<float>::zeros({10, 100}));
  CHECK(small.find("...") == std::string::npos);
}
