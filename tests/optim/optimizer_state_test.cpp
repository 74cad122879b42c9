#include "support/gradcheck.hpp"

#include <remat/optim/adamw.hpp>
#include <remat/optim/sgd.hpp>

#include <memory>

namespace {

using remat::Parameter;
using remat::Tensor;
using remat::test::error_message;

/// Gives every parameter a random gradient (sum(p * g) backward).
void os_random_grads(std::vector<Parameter<double>>& params, remat::Rng& rng) {
  remat::Tape tape;
  remat::Var<double> total =
      remat::sum(params[0] * remat::Var<double>(rng.normal_tensor<double>(params[0].shape())));
  for (std::size_t i = 1; i < params.size(); ++i) {
    total = total + remat::sum(params[i] *
                               remat::Var<double>(rng.normal_tensor<double>(params[i].shape())));
  }
  tape.backward(total);
}

std::vector<Parameter<double>> os_params(remat::Rng& rng) {
  return {Parameter<double>(rng.normal_tensor<double>({3, 2})),
          Parameter<double>(rng.normal_tensor<double>({4}))};
}

}  // namespace

TEMPLATE_TEST_CASE("state() and load_state() carry an optimizer's run over to another, bitwise",
                   "[optim]", remat::optim::SGD<double>, remat::optim::AdamW<double>) {
  using Opt = TestType;
  remat::Rng rng(3);
  for (int before = 0; before < 4; ++before) {
    remat::Rng init(10 + static_cast<std::uint64_t>(before));
    auto pa = os_params(init);
    std::vector<Parameter<double>> pb;
    for (const auto& p : pa) pb.emplace_back(p.value().clone());
    const auto make = [](std::vector<Parameter<double>> ps) {
      if constexpr (std::is_same_v<Opt, remat::optim::SGD<double>>)
        return Opt(std::move(ps), {.lr = 0.1, .momentum = 0.8, .weight_decay = 0.1});
      else
        return Opt(std::move(ps), {.lr = 0.1});
    };
    Opt a = make(pa), b = make(pb);
    remat::Rng grads_a(20), grads_b(20);
    for (int s = 0; s < before; ++s) {
      os_random_grads(pa, grads_a);
      a.step();
      a.zero_grad();
    }
    for (int s = 0; s < before; ++s)
      grads_b.normal_tensor<double>({3, 2}),
          grads_b.normal_tensor<double>({4});  // keep the streams aligned
    for (std::size_t i = 0; i < pa.size(); ++i)
      std::copy(pa[i].value().begin(), pa[i].value().end(), pb[i].data().begin());
    const auto state = a.state();
    CHECK(state.optimizer == a.name());
    CHECK(state.steps == before);
    b.load_state(state);
    CHECK(b.steps() == before);
    for (int s = 0; s < 3; ++s) {
      os_random_grads(pa, grads_a);
      os_random_grads(pb, grads_b);
      a.step();
      b.step();
      for (std::size_t i = 0; i < pa.size(); ++i)
        CHECK(pb[i].value().to_vector() == pa[i].value().to_vector());
    }
    // the state taken earlier is a copy: later steps did not change it
    if (before > 0)
      CHECK(b.state().buffers[0].begin()->second.to_vector() !=
            state.buffers[0].begin()->second.to_vector());
  }
}

TEST_CASE("load_state() refuses a state that does not fit, and changes nothing",
          "[optim][errors]") {
  remat::Rng rng(4);
  auto params = os_params(rng);
  remat::optim::AdamW<double> adam(params, {.lr = 0.1});
  os_random_grads(params, rng);
  adam.step();
  const auto good = adam.state();
  remat::optim::SGD<double> sgd(params, {.lr = 0.1, .momentum = 0.9});
  CHECK_THAT(error_message([&] { sgd.load_state(good); }),
             Catch::Contains("SGD.load_state: the state is of AdamW, not of SGD"));
  const auto refuses = [&](remat::optim::OptimizerState<double> s, const std::string& fragment) {
    const auto before = adam.state();
    CHECK_THAT(error_message([&] { adam.load_state(s); }), Catch::Contains(fragment));
    CHECK(adam.steps() == before.steps);
    CHECK(adam.first_moment(0).to_vector() == before.buffers[0].at("m").to_vector());
  };
  auto s = good;
  s.steps = -1;
  refuses(s, "negative step count");
  s = good;
  s.lr = -1;
  refuses(s, "learning rate");
  s = good;
  s.buffers.pop_back();
  refuses(s, "for 1 parameters");
  s = good;
  s.buffers[1]["velocity"] = Tensor<double>::zeros({4});
  refuses(s, "a buffer 'velocity' that AdamW does not keep");
  s = good;
  s.buffers[1]["m"] = Tensor<double>::zeros({5});
  refuses(s, "buffer 'm' of parameter 1 has shape (5,)");
  s = good;
  s.buffers[0].erase("v");
  refuses(s, "one of the moments");
  s = good;
  s.counters[0]["updates"] = 0;
  refuses(s, "update count is 0 but it has moments");
  s = good;
  s.counters[0].erase("updates");
  refuses(s, "no counter 'updates'");
  s = good;
  s.counters[0]["updates"] = -2;
  refuses(s, "is negative");
  s = good;
  s.counters[0]["t"] = 1;
  refuses(s, "a counter 't' that AdamW does not keep");
}
