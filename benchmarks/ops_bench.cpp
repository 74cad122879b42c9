// Micro-benchmark of remat's core ops: forward and backward time of each op on shapes like those
// of the models in remat_bench, and this machine's GEMM rate.
//
//   ops_bench [--threads T] [--repeat N]
//
// Prints one JSON object per line: {"bench": "gemm", ...} with the GEMM rate, then one
// {"bench": "op", "op": ..., "forward_ms": ..., "backward_ms": ...} per op (medians of N runs).
#include "../examples/flags.hpp"
#include "bench_util.hpp"

#include <functional>

namespace {

using remat::Shape;
using remat::Tensor;
using remat::Var;
using Op = std::function<Var<float>(const std::vector<Var<float>>&)>;

void bench_op(const char* name, const std::vector<Shape>& shapes, const Op& op, int repeat) {
  remat::Rng rng(3);
  std::vector<Tensor<float>> inputs;
  for (const Shape& s : shapes) inputs.push_back(rng.normal_tensor<float>(s));
  std::vector<double> forward, backward;
  for (int i = 0; i <= repeat; ++i) {
    remat::Tape tape;
    std::vector<Var<float>> vars;
    for (const auto& t : inputs) vars.push_back(tape.input(t, true));
    const double t0 = bench::now_seconds();
    const Var<float> y = op(vars);
    const double t1 = bench::now_seconds();
    tape.backward(y, Tensor<float>::ones(y.shape()));
    const double t2 = bench::now_seconds();
    if (i == 0) continue;  // warm-up
    forward.push_back(t1 - t0);
    backward.push_back(t2 - t1);
  }
  std::ostringstream shape_list;
  for (std::size_t i = 0; i < shapes.size(); ++i) shape_list << (i ? " " : "") << shapes[i];
  const std::string shape_text = shape_list.str();
  std::printf(
      "{\"bench\": \"op\", \"op\": \"%s\", \"shapes\": \"%s\", \"forward_ms\": %.4f, "
      "\"backward_ms\": %.4f}\n",
      name, shape_text.c_str(), bench::median(forward) * 1e3, bench::median(backward) * 1e3);
  std::fflush(stdout);
}

}  // namespace

int run(int threads, int repeat);

int main(int argc, char** argv) {
  int threads = 1, repeat = 20;
  CLI::App app(
      "Micro-benchmark of remat's core ops (forward and backward) and this machine's GEMM rate.");
  app.add_option("--threads", threads, "worker threads")
      ->check(flags::thread_count(false))
      ->capture_default_str();
  app.add_option("--repeat", repeat, "runs per op (medians)")
      ->check(flags::positive)
      ->capture_default_str();
  flags::parse(app, argc, argv);
  return flags::run_main("ops_bench", [&] { return run(threads, repeat); });
}

int run(int threads, int repeat) {
  remat::set_num_threads(threads);
  for (std::int64_t n : {256, 1024}) {
    std::printf("{\"bench\": \"gemm\", \"n\": %ld, \"threads\": %d, \"gflops\": %.1f}\n",
                static_cast<long>(n), threads, bench::gemm_gflops(n));
  }
  using V = std::vector<Var<float>>;
  bench_op(
      "linear", {{256, 1024}, {1024, 1024}, {1024}},
      [](const V& v) { return remat::linear(v[0], v[1], v[2]); }, repeat);
  bench_op(
      "matmul", {{32, 256, 64}, {32, 64, 256}},
      [](const V& v) { return remat::matmul(v[0], v[1]); }, repeat);
  bench_op(
      "gelu", {{256, 1024}}, [](const V& v) { return remat::gelu_tanh(v[0]); }, repeat);
  bench_op(
      "tanh", {{64, 256}}, [](const V& v) { return remat::tanh(v[0]); }, repeat);
  bench_op(
      "add", {{2048, 256}, {256}}, [](const V& v) { return remat::add(v[0], v[1]); }, repeat);
  bench_op(
      "mul", {{2048, 256}, {2048, 256}}, [](const V& v) { return remat::mul(v[0], v[1]); }, repeat);
  bench_op(
      "softmax", {{32, 256, 256}}, [](const V& v) { return remat::softmax(v[0]); }, repeat);
  bench_op(
      "causal_mask", {{32, 256, 256}}, [](const V& v) { return remat::causal_mask(v[0]); }, repeat);
  bench_op(
      "layer_norm", {{2048, 256}, {256}, {256}},
      [](const V& v) { return remat::layer_norm(v[0], v[1], v[2]); }, repeat);
  bench_op(
      "transpose", {{32, 256, 64}}, [](const V& v) { return remat::transpose(v[0]); }, repeat);
  bench_op(
      "dropout", {{2048, 256}}, [](const V& v) { return remat::dropout(v[0], 0.1); }, repeat);
  bench_op(
      "cross_entropy", {{2048, 256}},
      [](const V& v) {
        static const auto targets = [] {
          Tensor<std::int32_t> t({2048});
          for (std::int64_t i = 0; i < 2048; ++i) t[i] = static_cast<std::int32_t>(i * 7 % 256);
          return t;
        }();
        return remat::cross_entropy(v[0], targets);
      },
      repeat);
  return 0;
}
