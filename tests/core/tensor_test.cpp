#include <catch2/catch.hpp>
#include <remat/remat.hpp>

using namespace remat;

TEMPLATE_TEST_CASE("tensors: creation, access, views and copies", "[core][tensor]", float, double) {
  using T = TestType;
  auto t = Tensor<T>::from({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.numel() == 6);
  CHECK(t.bytes() == 6 * sizeof(T));
  CHECK(t.at({1, 2}) == 6);
  CHECK(t.matrix()(1, 0) == 4);
  auto view = t.reshape({3, 2});
  view[0] = 10;
  CHECK(t[0] == 10);  // a view shares the buffer
  auto copy = t.clone();
  copy[0] = 20;
  CHECK(t[0] == 10);  // a clone does not
  CHECK(t.narrow_rows(1, 2).to_vector() == std::vector<T>{4, 5, 6});
  CHECK(Tensor<T>::scalar(3).rank() == 0);
  CHECK(Tensor<T>::scalar(3).item() == 3);
  CHECK_FALSE(Tensor<T>().defined());
}

TEST_CASE("tensors reject bad shapes and indices", "[core][tensor][errors]") {
  const auto t = Tensor<float>::zeros({2, 3});
  CHECK_THROWS_AS(Tensor<float>::from({2, 2}, {1, 2, 3}), ShapeError);
  CHECK_THROWS_AS(t.reshape({4, 2}), ShapeError);
  CHECK_THROWS_AS(t.at({2, 0}), IndexError);
  CHECK_THROWS_AS(t.at({0}), IndexError);
  CHECK_THROWS_AS(t.item(), ShapeError);
  CHECK_THROWS_AS(t.narrow_rows(1, 3), IndexError);
  CHECK_THROWS_AS((Shape{2, -1}), ShapeError);
  CHECK_THROWS_AS((Shape{1, 1, 1, 1, 1, 1, 1}), ShapeError);
}

TEST_CASE("shapes print, compare and index from either end", "[core][shape]") {
  const Shape s{2, 3, 4};
  CHECK(s[-1] == 4);
  CHECK(s.rows() == 6);
  CHECK(s.with_last(7) == Shape{2, 3, 7});
  CHECK(s.dropped_back(2) == Shape{2});
  std::ostringstream out;
  out << s << Shape{5} << Shape{};
  CHECK(out.str() == "(2, 3, 4)(5,)()");
  CHECK_THROWS_AS(s[3], IndexError);
}
