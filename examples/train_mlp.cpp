// Trains a small MLP to separate two interleaved spirals, a task no linear model can solve.
//
//   train_mlp [--epochs N] [--hidden H] [--batch B] [--lr LR] [--seed S] [--json]   (--help)
//
// Prints one line per epoch (loss, train and test accuracy). With --json the last line is a JSON
// object: {"accuracy": test accuracy in [0, 1], "final_loss": ..., "seconds": ...}.
#include <remat/remat.hpp>
#include <remat/optim/adamw.hpp>

#include "flags.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <string>
#include <vector>

namespace {

struct Options {
  int epochs = 60;
  int hidden = 64;
  int batch = 64;
  double lr = 0.01;
  std::uint64_t seed = 1;
  bool json = false;
};

/// The flags; `train_mlp --help` lists them with their defaults, and an unknown flag is an error
/// that prints that list.
Options parse(int argc, char** argv) {
  Options o;
  CLI::App app("Trains a small MLP (2 -> H -> H -> 2, tanh) to separate two interleaved spirals.");
  app.add_option("--epochs", o.epochs, "passes over the 2,000 training points")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "width of the two hidden layers")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--batch", o.batch, "points per step")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the data, the initialization and the shuffles")
      ->check(flags::count)
      ->capture_default_str();
  app.add_flag("--json", o.json, "end with one JSON object: accuracy, final_loss, seconds");
  flags::parse(app, argc, argv);
  return o;
}

// Two spirals of `per_class` points each: class c winds from the centre outwards, offset by c*pi.
struct Dataset {
  remat::Tensor<float> x;         // (n, 2)
  remat::Tensor<std::int32_t> y;  // (n)
};

Dataset spirals(int per_class, remat::Rng& rng) {
  const int n = 2 * per_class;
  Dataset d{remat::Tensor<float>({n, 2}), remat::Tensor<std::int32_t>({n})};
  for (int i = 0; i < n; ++i) {
    const int c = i % 2;
    const double r = 0.1 + 0.9 * rng.uniform();
    const double angle = 3 * std::numbers::pi * r + c * std::numbers::pi;
    d.x[2 * i] = static_cast<float>(r * std::cos(angle) + 0.02 * rng.normal());
    d.x[2 * i + 1] = static_cast<float>(r * std::sin(angle) + 0.02 * rng.normal());
    d.y[i] = c;
  }
  return d;
}

// 2 -> hidden -> hidden -> 2, tanh between layers.
struct Mlp {
  std::vector<remat::Parameter<float>> weights, biases;

  Mlp(int hidden, remat::Rng& rng) {
    const int sizes[] = {2, hidden, hidden, 2};
    for (int l = 0; l < 3; ++l) {
      const double bound = 1.0 / std::sqrt(sizes[l]);  // PyTorch's Linear initialization
      weights.emplace_back(rng.uniform_tensor<float>({sizes[l + 1], sizes[l]}, -bound, bound));
      biases.emplace_back(rng.uniform_tensor<float>({sizes[l + 1]}, -bound, bound));
    }
  }

  remat::Var<float> operator()(remat::Var<float> h) const {
    for (std::size_t l = 0; l < weights.size(); ++l) {
      h = remat::linear(h, weights[l], biases[l]);
      if (l + 1 < weights.size()) h = remat::tanh(h);
    }
    return h;
  }

  std::vector<remat::Parameter<float>> parameters() const {
    std::vector<remat::Parameter<float>> all = weights;
    all.insert(all.end(), biases.begin(), biases.end());
    return all;
  }
};

double accuracy(const Mlp& model, const Dataset& d) {
  remat::NoGradGuard no_grad;
  const remat::Tensor<float> logits = model(remat::Var<float>(d.x)).value();
  int correct = 0;
  for (std::int64_t i = 0; i < d.y.numel(); ++i)
    correct += (logits[2 * i + 1] > logits[2 * i]) == (d.y[i] == 1);
  return static_cast<double>(correct) / static_cast<double>(d.y.numel());
}

int run(const Options& opt) {
  // the H x H layer's weights, gradients and AdamW moments, and a batch's activations
  const double hidden = opt.hidden;
  flags::fits("train_mlp", "--hidden " + std::to_string(opt.hidden),
              4 * 4 * hidden * (hidden + 5) + 4 * 4 * double(std::min(opt.batch, 2000)) * hidden);
  remat::manual_seed(opt.seed);
  remat::Rng rng(opt.seed);
  const Dataset train = spirals(1000, rng), test = spirals(500, rng);
  Mlp model(opt.hidden, rng);
  remat::optim::AdamW<float> optimizer(model.parameters(), {.lr = opt.lr, .weight_decay = 0.0});

  const auto start = std::chrono::steady_clock::now();
  const std::int64_t n = train.y.numel();
  std::vector<std::int64_t> order(n);
  double loss_sum = 0;
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    for (std::int64_t i = 0; i < n; ++i) order[i] = i;
    for (std::int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.uniform_int(i + 1)]);
    loss_sum = 0;
    int batches = 0;
    for (std::int64_t b = 0; b < n; b += opt.batch) {
      const std::int64_t size = std::min<std::int64_t>(opt.batch, n - b);
      remat::Tensor<float> xb({size, 2});
      remat::Tensor<std::int32_t> yb({size});
      for (std::int64_t i = 0; i < size; ++i) {
        xb[2 * i] = train.x[2 * order[b + i]];
        xb[2 * i + 1] = train.x[2 * order[b + i] + 1];
        yb[i] = train.y[order[b + i]];
      }
      remat::Tape tape;
      const remat::Var<float> loss = remat::cross_entropy(model(tape.input(xb)), yb);
      tape.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
      loss_sum += loss.item();
      ++batches;
    }
    loss_sum /= batches;
    std::printf("epoch %3d  loss %.4f  train accuracy %.3f  test accuracy %.3f\n", epoch, loss_sum,
                accuracy(model, train), accuracy(model, test));
    std::fflush(stdout);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double acc = accuracy(model, test);
  if (opt.json) {
    std::printf("{\"accuracy\": %.4f, \"final_loss\": %.6f, \"seconds\": %.3f}\n", acc, loss_sum,
                seconds);
  } else {
    std::printf("test accuracy %.3f after %d epochs in %.2f s\n", acc, opt.epochs, seconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return flags::run_main("train_mlp", [&] { return run(parse(argc, argv)); });
}
