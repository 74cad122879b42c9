// Forward + backward time of one Linear whose weight is float (trainable or frozen), BF16, INT8
// or NF4, alone and as the frozen base of a LoRA step (y = base(x) + B(A x), A and B trainable,
// rank --rank), and the bytes a parameter the allocator counts for each weight.
//
//   quantized_bench [--in 1024] [--out 1024] [--batch 256] [--rank 16] [--repeat 21] [--threads 1]
//                   [--dtype f32|bf16]
//
// Under --dtype bf16 every step runs under PrecisionGuard(Precision::bf16): the frozen weights
// feed the BF16 GEMM from their storage (Bf16Rows), the float ones are rounded as it packs them.
//
// Prints one JSON object per line: {"bench": "quantized_linear", "storage": ..., "lora": ...,
// "dtype": ..., "ms": median, "ratio_to_float": ..., "bytes_per_param": ...}.
#include "../examples/flags.hpp"
#include "bench_util.hpp"

namespace {

using remat::Tensor;
using remat::Var;
using remat::WeightStorage;

struct Setup {
  std::int64_t in, out, batch, rank;
  int repeat;
};

// The median forward + backward seconds of a Linear stored as `s` (f32 frozen unless trainable).
double time_step(const Setup& c, WeightStorage s, bool trainable, bool lora,
                 double* bytes_per_param) {
  remat::Rng rng(1);
  remat::nn::Linear<float> base(c.in, c.out, rng);
  const double live0 = double(remat::memory::live_bytes());
  if (!trainable) base.quantize(s);
  *bytes_per_param = (double(remat::memory::live_bytes()) - live0 + 4.0 * double(c.in * c.out)) /
                     double(c.in * c.out);
  if (s == WeightStorage::f32) *bytes_per_param = 4.0;
  remat::Parameter<float> a(rng.normal_tensor<float>({c.rank, c.in}, 0.0, 0.01));
  remat::Parameter<float> b(Tensor<float>::zeros({c.out, c.rank}));
  const Tensor<float> x = rng.normal_tensor<float>({c.batch, c.in});
  const Tensor<float> gy = rng.normal_tensor<float>({c.batch, c.out});
  return bench::time_median(c.repeat, [&] {
    remat::Tape tape;
    const Var<float> in =
        tape.input(x, true);  // a layer inside a model: its input needs a gradient
    Var<float> y = base(in);
    if (lora) y = y + remat::linear(remat::linear(in, a), b);
    tape.backward(y, gy);
  });
}

}  // namespace

int run(const Setup& c, int threads, const std::string& dtype);

int main(int argc, char** argv) {
  Setup c{1024, 1024, 256, 16, 21};
  int threads = 1;
  std::string dtype = "f32";
  CLI::App app(
      "Forward + backward time and counted bytes per parameter of a Linear stored as float, BF16, "
      "INT8 or NF4, alone and under LoRA.");
  app.add_option("--in", c.in, "input features")->check(flags::positive)->capture_default_str();
  app.add_option("--out", c.out, "output features")->check(flags::positive)->capture_default_str();
  app.add_option("--batch", c.batch, "rows of the input")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--rank", c.rank, "LoRA rank")->check(flags::positive)->capture_default_str();
  app.add_option("--repeat", c.repeat, "runs per configuration (medians)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--threads", threads, "worker threads")
      ->check(flags::thread_count(false))
      ->capture_default_str();
  app.add_option("--dtype", dtype, "what the steps compute in: f32 or bf16")
      ->check(flags::precision_name)
      ->capture_default_str();
  flags::parse(app, argc, argv);
  return flags::run_main("quantized_bench", [&] { return run(c, threads, dtype); });
}

int run(const Setup& c, int threads, const std::string& dtype) {
  // the float weight, its gradient and the adapters, the input, its gradient and the output
  flags::fits("quantized_bench", "this size",
              4.0 * (2 * double(c.in) * double(c.out) + 2 * double(c.rank) * double(c.in + c.out) +
                     2 * double(c.batch) * double(c.in) + 2 * double(c.batch) * double(c.out)));
  remat::set_num_threads(threads);
  const remat::PrecisionGuard precision(remat::parse_precision(dtype, "--dtype"));
  for (bool lora : {false, true}) {
    double bytes = 0;
    const double trainable = time_step(c, WeightStorage::f32, true, lora, &bytes);
    const double frozen = time_step(c, WeightStorage::f32, false, lora, &bytes);
    std::printf(
        "{\"bench\": \"quantized_linear\", \"storage\": \"f32 trainable\", \"lora\": %s, \"ms\": "
        "%.3f, \"bytes_per_param\": 4}\n",
        lora ? "true" : "false", trainable * 1e3);
    for (WeightStorage s :
         {WeightStorage::f32, WeightStorage::bf16, WeightStorage::int8, WeightStorage::nf4}) {
      const double t = s == WeightStorage::f32 ? frozen : time_step(c, s, false, lora, &bytes);
      if (s == WeightStorage::f32) bytes = 4.0;
      std::printf(
          "{\"bench\": \"quantized_linear\", \"storage\": \"%s\", \"lora\": %s, \"in\": %ld, "
          "\"out\": %ld, "
          "\"batch\": %ld, \"dtype\": \"%s\", \"ms\": %.3f, \"ratio_to_float\": %.3f, "
          "\"bytes_per_param\": %.4f}\n",
          remat::to_string(s), lora ? "true" : "false", long(c.in), long(c.out), long(c.batch),
          dtype.c_str(), t * 1e3, t / frozen, bytes);
    }
  }
  return 0;
}
