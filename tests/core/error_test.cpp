// REMAT_ASSERT: a passing check costs nothing (its message is not even built); a failing one is an
// InternalError naming the place, the message and the condition. ArgumentError, UsageError and
// InternalError are distinct remat::Errors.
#include "support/gradcheck.hpp"

#include <string>
#include <type_traits>

namespace {

int error_test_message_parts_built = 0;

int error_test_counted(int v) {
  ++error_test_message_parts_built;
  return v;
}

}  // namespace

TEST_CASE("REMAT_ASSERT passes silently and fails as an InternalError naming the place",
          "[core][errors]") {
  REMAT_ASSERT(1 + 1 == 2, "value ", error_test_counted(3));
  CHECK(error_test_message_parts_built == 0);
  const auto fails = [] { REMAT_ASSERT(1 + 1 == 3, "value ", error_test_counted(3)); };
  CHECK_THROWS_AS(fails(), remat::InternalError);
  CHECK_THAT(remat::test::error_message(fails),
             Catch::StartsWith("internal error at ") && Catch::Contains("error_test.cpp:") &&
                 Catch::Contains(": value 3 (1 + 1 == 3 does not hold)"));
  CHECK(error_test_message_parts_built == 2);
  // a path that must not be reached names no condition
  const std::string unreachable =
      remat::test::error_message([] { REMAT_ASSERT(false, "node ", 7, " lost its value"); });
  CHECK_THAT(unreachable, Catch::EndsWith(": node 7 lost its value"));
}

TEST_CASE("bad arguments, misuse and internal errors are told apart", "[core][errors]") {
  static_assert(std::is_base_of_v<remat::Error, remat::ArgumentError>);
  static_assert(std::is_base_of_v<remat::Error, remat::UsageError>);
  static_assert(std::is_base_of_v<remat::Error, remat::InternalError>);
  static_assert(!std::is_base_of_v<remat::UsageError, remat::ArgumentError>);
  static_assert(!std::is_base_of_v<remat::ArgumentError, remat::UsageError>);
  // a value the function cannot take
  CHECK_THROWS_AS(remat::set_num_threads(0), remat::ArgumentError);
  // a valid call at the wrong time
  remat::Tape tape;
  const remat::Var<double> x = tape.input(remat::Tensor<double>::ones({2}), true);
  const remat::Var<double> loss = remat::sum(x * x);
  tape.backward(loss);
  CHECK_THROWS_AS(tape.backward(loss), remat::UsageError);
}
