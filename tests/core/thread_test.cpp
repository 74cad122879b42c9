// The threading rules (docs/guide.md, "Threads"): a tape and its Vars belong to the thread that
// created the tape, and a parameter that needs a gradient is trained by one thread's tapes at a
// time. Each rule is broken here with real threads; Catch2's assertions run on the main thread
// only (they are not thread-safe), so the threads hand back what they saw.
#include "support/gradcheck.hpp"

#include <exception>
#include <thread>

namespace {

inline constexpr remat::OpType kFailingForwardOp{"failing_forward"};

/// An op whose forward fails after its inputs were resolved into leaves.
class FailingForward final : public remat::Node<float> {
 public:
  const remat::OpType& op_type() const noexcept override { return kFailingForwardOp; }
  remat::Tensor<float> forward(Inputs) override {
    throw remat::ShapeError("failing_forward: always fails");
  }
  void backward(const remat::Tensor<float>&, remat::Grads<float>&) override {}
};

/// Runs fn on a new thread and returns the message of the remat::UsageError it threw ("" if none).
template <class Fn>
std::string usage_error_on_thread(Fn&& fn) {
  std::string message = "(no UsageError)";
  std::thread t([&] {
    try {
      fn();
    } catch (const remat::UsageError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("another exception: ") + e.what();
    }
  });
  t.join();
  return message;
}

}  // namespace

TEST_CASE("a Var of one thread's tape used in an op on another thread is a UsageError",
          "[core][threads][errors]") {
  remat::Parameter<float> w(remat::Tensor<float>::ones({2}));
  remat::Tape tape;
  const remat::Var<float> x = tape.input(remat::Tensor<float>::full({2}, 3.0f), true);
  const remat::Var<float> y = x * w;
  const std::size_t recorded = tape.size();

  SECTION("on a thread with no tape") {
    const std::string msg = usage_error_on_thread([&] { remat::tanh(y); });
    CHECK_THAT(
        msg, Catch::Contains("tanh: input 0 (shape (2,)) was recorded on another thread's tape") &&
                 Catch::Contains("this thread has no current tape") && Catch::Contains("own Tape"));
  }
  SECTION("on a thread recording onto its own tape") {
    const std::string msg = usage_error_on_thread([&] {
      remat::Tape mine;
      remat::add(mine.input(remat::Tensor<float>::ones({2})), y);
    });
    CHECK_THAT(msg,
               Catch::Contains("add: input 1 (shape (2,)) was recorded on another thread's tape") &&
                   Catch::Contains("current tape is a different tape"));
  }
  SECTION("a checkpoint on another thread's Var") {
    const std::string msg = usage_error_on_thread(
        [&] { remat::checkpoint([](const remat::Var<float>& v) { return remat::tanh(v); }, y); });
    CHECK_THAT(msg, Catch::Contains("checkpoint") && Catch::Contains("another thread"));
  }
  SECTION("backward on another thread") {
    const remat::Var<float> loss = remat::sum(y);
    const std::size_t with_loss = tape.size();
    const std::string msg = usage_error_on_thread([&] { tape.backward(loss); });
    CHECK_THAT(msg, Catch::Contains("backward: this Tape was created on thread") &&
                        Catch::Contains("own Tape"));
    CHECK(tape.size() == with_loss);
    tape.backward(loss);  // the owner still can, and nothing was swept before
    CHECK(w.grad().to_vector() == std::vector<float>{3, 3});
    return;
  }
  // The other thread recorded nothing on the tape, and the tape still works here.
  CHECK(tape.size() == recorded);
  tape.backward(remat::sum(y));
  CHECK(x.grad().to_vector() == std::vector<float>{1, 1});
}

TEST_CASE(
    "two threads cannot train one parameter at once; taking turns, freezing or NoGradGuard can",
    "[core][threads][errors]") {
  remat::Parameter<double> w(remat::Tensor<double>::from({2}, {1, 2}));
  remat::Parameter<double> other(remat::Tensor<double>::from({2}, {5, 7}));
  {
    remat::Tape tape;
    const remat::Var<double> loss = remat::sum(w * w);  // this thread's tape now trains w
    const std::string msg = usage_error_on_thread([&] {
      remat::Tape mine;
      remat::sum(other * w);
    });
    CHECK_THAT(msg, Catch::Contains("mul: input 1 is a parameter (shape (2,)) that a live tape of "
                                    "another thread is training") &&
                        Catch::Contains("own copy of the model"));
    // reading w on another thread while this one trains it is fine when nothing records
    const std::string no_grad = usage_error_on_thread([&] {
      remat::Tape mine;
      remat::NoGradGuard guard;
      remat::sum(w * other);
    });
    CHECK(no_grad == "(no UsageError)");
    // a second tape of the same thread shares the claim
    {
      remat::Tape nested;
      nested.backward(remat::sum(w * 3.0));
    }
    CHECK(w.grad().to_vector() == std::vector<double>{3, 3});
    tape.backward(loss);
    CHECK(w.grad().to_vector() == std::vector<double>{5, 7});
  }
  // the tapes ended: another thread may now train w
  w.zero_grad();
  const std::string after = usage_error_on_thread([&] {
    remat::Tape mine;
    mine.backward(remat::sum(w * other));
  });
  CHECK(after == "(no UsageError)");
  CHECK(w.grad().to_vector() == std::vector<double>{5, 7});
  // a frozen parameter is never claimed: two threads may use it while both train their own
  other.freeze();
  remat::Parameter<double> a(remat::Tensor<double>::ones({2}));
  remat::Tape tape;
  const remat::Var<double> mine = remat::sum(other * a);
  const std::string frozen = usage_error_on_thread([&] {
    remat::Parameter<double> b(remat::Tensor<double>::ones({2}));
    remat::Tape theirs;
    theirs.backward(remat::sum(other * b));
  });
  CHECK(frozen == "(no UsageError)");
  tape.backward(mine);
  CHECK(a.grad().to_vector() == std::vector<double>{5, 7});
}

TEST_CASE("the parameter claim ends with the tape even when recording failed", "[core][threads]") {
  remat::Parameter<float> w(remat::Tensor<float>::ones({3}));
  {
    remat::Tape tape;
    CHECK_THROWS_AS(remat::apply<FailingForward>({w}), remat::ShapeError);
  }
  const std::string msg = usage_error_on_thread([&] {
    remat::Tape mine;
    mine.backward(remat::sum(w * w));
  });
  CHECK(msg == "(no UsageError)");
  CHECK(w.grad().to_vector() == std::vector<float>{2, 2, 2});
}
