#include "support/gradcheck.hpp"
#include "support/models.hpp"

#include <remat/optim/adamw.hpp>

#include <thread>

using namespace remat;

TEST_CASE("parallel_for visits every index exactly once, from any number of callers",
          "[core][parallel][threads]") {
  const int before = num_threads();
  set_num_threads(4);
  constexpr std::int64_t n = 1 << 18;
  std::vector<std::thread> callers;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<std::atomic<int>> hits(n);
      for (int round = 0; round < 20; ++round) {
        remat::detail::parallel_for(n, 1024, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
          // a nested loop runs inline instead of deadlocking
          remat::detail::parallel_for(4096, 16, [](std::int64_t, std::int64_t) {});
        });
      }
      for (std::int64_t i = 0; i < n; ++i) failures[t] += hits[i].load() != 20;
    });
  }
  for (auto& c : callers) c.join();
  for (int f : failures) CHECK(f == 0);
  set_num_threads(before);
}

TEST_CASE("results do not depend on the thread count", "[core][parallel][threads]") {
  Rng rng(1);
  const auto x = rng.normal_tensor<float>({512, 300});
  const auto g = rng.normal_tensor<float>({300});
  const auto run = [&](int threads) {
    set_num_threads(threads);
    Tape tape;
    auto v = tape.input(x, true);
    auto gamma = tape.input(g, true);
    auto loss = sum(softmax(layer_norm(gelu_tanh(v * gamma), gamma, gamma)) * v);
    tape.backward(loss);
    return std::make_pair(loss.item(), v.grad().to_vector());
  };
  const int before = num_threads();
  const auto one = run(1);
  const auto three = run(3);
  set_num_threads(before);
  CHECK(one.first == three.first);
  CHECK(one.second == three.second);
}

TEST_CASE("two threads training separate models at once match training them one after the other",
          "[core][threads]") {
  const auto train = [](std::uint64_t seed, std::vector<float>* out) {
    remat::test::BlockModel model(2, 16, 0.1, seed);
    Rng rng(seed + 1);
    const auto x = rng.normal_tensor<float>({2, 12, 16});
    const auto t = remat::test::targets(24, 16, seed + 2);
    optim::AdamW<float> opt(model.params, {.lr = 1e-2});
    for (int step = 0; step < 4; ++step) {
      Tape tape(TapeOptions{.seed = seed * 100 + static_cast<std::uint64_t>(step)});
      auto loss = cross_entropy(
          checkpoint_sequential(model.layers, plan::every(std::size_t{2}), tape.input(x)), t);
      tape.backward(loss);
      opt.step();
      opt.zero_grad();
      out->push_back(loss.item());
    }
    for (const auto& p : model.params) {
      const auto v = p.value().to_vector();
      out->insert(out->end(), v.begin(), v.end());
    }
  };
  std::vector<float> alone_a, alone_b, together_a, together_b;
  train(1, &alone_a);
  train(2, &alone_b);
  std::thread ta(train, 1, &together_a), tb(train, 2, &together_b);
  ta.join();
  tb.join();
  CHECK(together_a == alone_a);
  CHECK(together_b == alone_b);
}
