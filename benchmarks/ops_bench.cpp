// Micro-benchmark of remat's core ops: forward and backward time of each op on shapes like those
// of the models in remat_bench, and this machine's GEMM rate.
//
//   ops_bench [--threads T] [--repeat N] [--loss-head V,C,N]
//
// Prints one JSON object per line: {"bench": "gemm", ...} with the GEMM rate, {"bench":
// "gemm_bf16", "kernel": ..., "vs_float": ...} for each BF16 GEMM kernel the machine runs (ratio
// to the float rate measured just before), then one
// {"bench": "op", "op": ..., "forward_ms": ..., "backward_ms": ...} per op (medians of N runs;
// linear_bf16: a linear under Precision::bf16).
// --loss-head instead times linear_cross_entropy on N rows of width C against a (V, C) head, for
// chunks of 16 to 512 rows, the head frozen (the fused path, Note [fused loss head]) and
// trained: {"bench": "loss_head", "chunk_rows": ..., "head": "frozen" | "trained",
// "forward_ms": ..., "backward_ms": ..., "peak_mib": ...} (the allocator's peak above the
// inputs, the weight's gradient included when trained).
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
int run_loss_head(int threads, int repeat, const std::vector<std::int64_t>& vcn);

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
  std::vector<std::int64_t> loss_head;
  app.add_option("--loss-head", loss_head,
                 "V,C,N: time the chunked loss head instead, vocabulary V, width C, N rows")
      ->delimiter(',')
      ->expected(3)
      ->check(flags::positive);
  flags::parse(app, argc, argv);
  return flags::run_main("ops_bench", [&] {
    return loss_head.empty() ? run(threads, repeat) : run_loss_head(threads, repeat, loss_head);
  });
}

int run(int threads, int repeat) {
  remat::set_num_threads(threads);
  for (std::int64_t n : {256, 1024}) {
    const double float_rate = bench::gemm_gflops(n);
    std::printf("{\"bench\": \"gemm\", \"n\": %ld, \"threads\": %d, \"gflops\": %.1f}\n",
                static_cast<long>(n), threads, float_rate);
    // the BF16 GEMM by each kernel this machine runs, beside the float rate of the same run
    for (const auto kernel :
         {remat::Bf16Kernel::convert, remat::Bf16Kernel::avx512_bf16, remat::Bf16Kernel::amx}) {
      if (kernel > remat::supported_bf16_kernel()) continue;
      remat::set_bf16_kernel(kernel);
      const double rate = bench::gemm_gflops(n, 7, true);
      std::printf(
          "{\"bench\": \"gemm_bf16\", \"kernel\": \"%s\", \"n\": %ld, \"threads\": %d, "
          "\"gflops\": %.1f, \"vs_float\": %.2f}\n",
          remat::to_string(kernel), static_cast<long>(n), threads, rate, rate / float_rate);
    }
    remat::set_bf16_kernel(remat::supported_bf16_kernel());
  }
  using V = std::vector<Var<float>>;
  bench_op(
      "linear", {{256, 1024}, {1024, 1024}, {1024}},
      [](const V& v) { return remat::linear(v[0], v[1], v[2]); }, repeat);
  // in BF16 at two of the gpt's shapes (remat_bench): the backward's weight gradient is the
  // GEMM whose A is transposed (dy^T x, Note [BF16 GEMM packing])
  for (const std::int64_t in : {256, 1024}) {
    const remat::PrecisionGuard bf16(remat::Precision::bf16);
    const std::int64_t out = in == 256 ? 768 : 256;
    bench_op(
        "linear_bf16", {{2048, in}, {out, in}, {out}},
        [](const V& v) { return remat::linear(v[0], v[1], v[2]); }, repeat);
  }
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

int run_loss_head(int threads, int repeat, const std::vector<std::int64_t>& vcn) {
  remat::set_num_threads(threads);
  const std::int64_t v = vcn[0], c = vcn[1], n = vcn[2];
  remat::Rng rng(5);
  const Tensor<float> h = rng.normal_tensor<float>({n, c});
  remat::Parameter<float> w(rng.normal_tensor<float>({v, c}, 0.0, 0.02));
  Tensor<std::int32_t> targets({n});
  for (std::int64_t i = 0; i < n; ++i) targets[i] = static_cast<std::int32_t>(i * 7919 % v);
  for (const bool trained : {false, true}) {
    if (trained)
      w.unfreeze();
    else
      w.freeze();
    for (std::int64_t chunk : {16, 32, 64, 128, 256, 512}) {
      if (chunk > n) break;
      std::vector<double> forward, backward;
      std::size_t peak = 0;
      for (int i = 0; i <= repeat; ++i) {
        w.free_grad();  // each run allocates the trained head's gradient, counted in its peak
        remat::Tape tape;
        const Var<float> x = tape.input(h, true);
        remat::memory::Probe probe;
        const double t0 = bench::now_seconds();
        const Var<float> loss = remat::linear_cross_entropy(x, w, targets, chunk);
        const double t1 = bench::now_seconds();
        tape.backward(loss);
        const double t2 = bench::now_seconds();
        peak = probe.peak_above_start();
        if (i == 0) continue;  // warm-up
        forward.push_back(t1 - t0);
        backward.push_back(t2 - t1);
      }
      std::printf(
          "{\"bench\": \"loss_head\", \"vocab\": %ld, \"width\": %ld, \"rows\": %ld, "
          "\"chunk_rows\": %ld, \"head\": \"%s\", \"threads\": %d, \"forward_ms\": %.1f, "
          "\"backward_ms\": %.1f, \"peak_mib\": %.1f}\n",
          static_cast<long>(v), static_cast<long>(c), static_cast<long>(n),
          static_cast<long>(chunk), trained ? "trained" : "frozen", threads,
          bench::median(forward) * 1e3, bench::median(backward) * 1e3,
          static_cast<double>(peak) / (1 << 20));
      std::fflush(stdout);
    }
  }
  return 0;
}
