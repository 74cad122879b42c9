// remat::attention() (ops/attention.hpp) over its option grid: q, k and v packed in one tensor or
// apart; heads and grouped kv_heads (any divisor, or 0); RoPE (random theta, offset and scaling);
// causal or not; a sliding window; packed rows' starts; an additive bias of every shape it takes
// ((T, T), (1 or B, 1 or H, T, T)), with keys hidden by -inf, whole rows of them too; dropout;
// the fused kernel and the flash
// kernel with any block of query rows (1, fewer than T, T, more than T). Cases are drawn from a
// seeded std::mt19937 and printed whole with INFO, so that a failure names the case to rerun;
// every case runs both kernels. The main grid: 150 cases, B <= 2, T <= 9, H <= 4, D <= 4, small
// enough for finite differences on every one; then 40 cases of rows up to 40 long, cut into many
// flash blocks.
//
// What is checked, and to what bound:
// - Values against a naive float64 reference written here: scores per head, the mask rules
//   (causal j <= i, window j > i - w, packed rows j >= starts[i]), the bias added (a query
//   whose keys are all hidden: zero weights), a softmax, dropout's mask
//   redrawn from its documented counters, times V. |got - want| <= 1e-12 (1 + |want|): each
//   output is a convex combination (times 1 / (1 - p)) of at most T values of size O(1), with
//   weights from scores that are sums of D products of size O(1), so the two computations differ
//   by the order of some dozens of roundings of 1e-16 each; 1e-12 leaves orders of margin, while
//   one wrong mask entry moves an output by O(1 / T). RoPE in the reference is remat::rope
//   (checked against PyTorch in llama_ops_test) run on each packed example alone: each example
//   is rotated as a row of its own, positions restarting at offset.
// - fused vs flash: values and gradients within 1e-12 (1 + |fused|), dropout included (both draw
//   element (i, j) of head (b, h) at the same counter). The kernels add the same products, only
//   in other blocks.
// - Gradients by central differences on every case of the main grid, both kernels, dropout
//   included (every evaluation records on a fresh tape with the same seed, so the op, at the same
//   position on the tape, draws the same mask): the suite's gradcheck, |a - n| <= 1e-7 + 1e-6 |n|
//   at eps 1e-6 (tests/support/gradcheck.hpp).
// - Checkpoint replay: values and gradients of the op inside a checkpoint segment == the plain
//   ones, bitwise, on every case (a replay must redo the same arithmetic and the same draws).
// - Exact identities, bitwise: packed qkv vs its slices (the same products in the same order;
//   only the strides the heads are read at differ); a window as long as the row vs none; starts
//   of one example per row vs none; a zero bias vs none; the gradients of a subset of q, k and v
//   vs all three. A bias hiding the keys after each query, on full attention, equals causal
//   attention to 1e-12 (the softmax then adds the hidden keys' zeros).
// - float: against the double reference to 1e-5 (1 + |want|): float's rounding (6e-8) times the
//   few dozen operations each output goes through, with margin; on generated cases and on rows
//   around the default flash block (kFlashBlockRows).
// - Memory: what flash keeps (one log-sum-exp per query row) and fused keeps (the (B, H, T, T)
//   probabilities), to the byte; flash's peaks below fused's by the probabilities, less its block
//   scratch; shape-only runs counting what real ones do, to the byte.
// - Errors: each bad argument is an error starting "attention: " that names the value.

#include "support/gradcheck.hpp"
#include "support/shape_only.hpp"

#include <remat/ops/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace attention_grid {

using remat::AttentionKernel;
using remat::Shape;
using remat::Tensor;
using remat::Var;

constexpr AttentionKernel kKernels[] = {AttentionKernel::fused, AttentionKernel::flash};

// The seed of every tape here: dropout draws from (seed, the op's position on the tape).
constexpr std::uint64_t kTapeSeed = 11;

// One point of the grid: shapes and options (the kernel is chosen per run).
struct GridCase {
  bool packed = false;  // one (B, T, (H + 2G) D) input, else q, k and v apart
  std::int64_t batch = 1, time = 1, dim = 1;
  remat::AttentionOptions o;

  std::int64_t heads() const { return o.heads; }
  std::int64_t groups() const { return o.kv_heads == 0 ? o.heads : o.kv_heads; }
  std::vector<Shape> input_shapes() const {
    const Shape q{batch, time, heads() * dim}, kv{batch, time, groups() * dim};
    if (packed) return {Shape{batch, time, (heads() + 2 * groups()) * dim}};
    return {q, kv, kv};
  }
  Shape output_shape() const { return {batch, time, heads() * dim}; }

  std::string describe() const {
    std::ostringstream out;
    out.precision(17);  // theta and dropout exactly, to rerun the case
    out << (packed ? "packed" : "separate") << " B " << batch << " T " << time << " D " << dim
        << " heads " << o.heads << " kv_heads " << o.kv_heads << (o.causal ? " causal" : " full")
        << " window " << o.window << " dropout " << o.dropout << " block_rows " << o.block_rows;
    if (o.rope) {
      out << " rope(theta " << o.rope->theta << ", offset " << o.rope->offset << ", "
          << remat::to_string(o.rope->scaling.type) << " factor " << o.rope->scaling.factor
          << ", max_position_embeddings " << o.rope->scaling.max_position_embeddings << ")";
    }
    if (o.starts.defined()) {
      out << " starts";
      for (std::int32_t s : o.starts) out << ' ' << s;
    }
    if (o.bias.defined()) {
      out << " bias " << o.bias.shape();
      for (float x : o.bias) out << ' ' << x;
    }
    return out.str();
  }
};

// An integer drawn uniformly from [lo, hi].
std::int64_t draw(std::mt19937& gen, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen);
}
bool coin(std::mt19937& gen, double p = 0.5) { return std::bernoulli_distribution(p)(gen); }

// Starts of a random segmentation of each row: a new example at each position with probability
// p_new (position 0 always starts one).
Tensor<std::int32_t> random_starts(std::mt19937& gen, std::int64_t batch, std::int64_t time,
                                   double p_new) {
  Tensor<std::int32_t> s(Shape{batch, time});
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < time; ++i) {
      const bool fresh = i == 0 || coin(gen, p_new);
      s[b * time + i] = fresh ? static_cast<std::int32_t>(i) : s[b * time + i - 1];
    }
  }
  return s;
}

// A bias of one of the shapes attention() takes, normal values with about one in five -inf (a
// hidden key; on short rows, all of a query's keys now and then).
Tensor<float> random_bias(std::mt19937& gen, std::int64_t batch, std::int64_t heads,
                          std::int64_t time) {
  const std::int64_t form = draw(gen, 0, 4);
  const Shape shape = form == 0 ? Shape{time, time}
                                : Shape{form == 2 || form == 4 ? batch : 1,
                                        form == 3 || form == 4 ? heads : 1, time, time};
  Tensor<float> bias(shape);
  std::normal_distribution<float> normal;
  for (float& x : bias) x = coin(gen, 0.2) ? -INFINITY : normal(gen);
  return bias;
}

// RoPE options with a random theta and offset, and a scaling whose frequencies depend on
// positions only, or (without packed rows, whose reference rotates each example alone) dynamic
// scaling, whose frequencies depend on the row's length too.
remat::RopeOptions random_rope(std::mt19937& gen, bool packed_rows) {
  remat::RopeOptions r;
  r.theta = std::pow(10.0, std::uniform_real_distribution<double>(1.0, 5.0)(gen));
  r.offset = draw(gen, 0, 6);
  switch (draw(gen, 0, packed_rows ? 2 : 3)) {
    case 1:
      r.scaling = {.type = remat::RopeScalingType::linear, .factor = 2.5};
      break;
    case 2:
      r.scaling = {.type = remat::RopeScalingType::llama3,
                   .factor = 8.0,
                   .original_max_position_embeddings = 16};
      break;
    case 3:  // short enough that offset + T mostly exceeds it: the base grows
      r.scaling = {
          .type = remat::RopeScalingType::dynamic, .factor = 2.0, .max_position_embeddings = 2};
      break;
    default:
      break;
  }
  return r;
}

// A random point of the grid with T <= max_time. RoPE needs q and k apart and an even D; a
// window and starts are causal masks.
GridCase random_case(std::mt19937& gen, std::int64_t max_time) {
  GridCase c;
  c.packed = coin(gen);
  c.batch = draw(gen, 1, 2);
  c.time = draw(gen, 1, max_time);
  c.o.heads = draw(gen, 1, 4);
  std::vector<std::int64_t> kv_choices{0};  // 0: as many as heads
  for (std::int64_t g = 1; g <= c.o.heads; ++g)
    if (c.o.heads % g == 0) kv_choices.push_back(g);
  c.o.kv_heads = kv_choices[static_cast<std::size_t>(
      draw(gen, 0, static_cast<std::int64_t>(kv_choices.size()) - 1))];
  c.o.causal = coin(gen, 0.75);
  if (c.o.causal && coin(gen)) c.o.window = draw(gen, 1, c.time + 1);
  if (c.o.causal && coin(gen))
    c.o.starts =
        random_starts(gen, c.batch, c.time, std::uniform_real_distribution<double>(0.1, 0.6)(gen));
  const bool rope = !c.packed && coin(gen);
  if (rope) c.o.rope = random_rope(gen, c.o.starts.defined());
  c.dim = rope ? 2 * draw(gen, 1, 2) : draw(gen, 1, 4);
  if (coin(gen, 1.0 / 3)) c.o.dropout = std::uniform_real_distribution<double>(0.1, 0.5)(gen);
  if (coin(gen, 1.0 / 3)) c.o.bias = random_bias(gen, c.batch, c.o.heads, c.time);
  // the flash kernel's block: one row, some rows, the whole row, more than the row
  switch (draw(gen, 0, 3)) {
    case 0:
      c.o.block_rows = 1;
      break;
    case 1:
      c.o.block_rows = draw(gen, 1, c.time);
      break;
    case 2:
      c.o.block_rows = c.time;
      break;
    default:
      c.o.block_rows = c.time + draw(gen, 1, 3);
  }
  return c;
}

// Random normal inputs of the case's shapes, in float or double (T).
template <class T>
std::vector<Tensor<T>> random_inputs(const GridCase& c, std::uint64_t seed) {
  std::vector<Tensor<T>> in;
  remat::Rng rng(seed);
  for (const Shape& s : c.input_shapes()) in.push_back(rng.normal_tensor<T>(s));
  return in;
}

// The op on the case's inputs (one packed tensor or three) with the given kernel.
template <class T>
Var<T> attend(const GridCase& c, AttentionKernel kernel, const std::vector<Var<T>>& v) {
  remat::AttentionOptions o = c.o;
  o.kernel = kernel;
  return c.packed ? remat::attention(v[0], o) : remat::attention(v[0], v[1], v[2], o);
}

// What one run of the op gave.
template <class T>
struct Run {
  Tensor<T> y;
  std::vector<Tensor<T>> grads;  // the inputs', for the given output gradient
  std::uint32_t node = 0;        // the op's position on the tape: its dropout stream
};

// The op on a fresh tape seeded kTapeSeed; with `seed_grad`, its backward too; `checkpointed`:
// recorded inside a checkpoint segment (replayed in backward, verified op by op).
template <class T>
Run<T> run_attention(const GridCase& c, AttentionKernel kernel, const std::vector<Tensor<T>>& in,
                     const Tensor<T>* seed_grad = nullptr, bool checkpointed = false) {
  remat::Tape tape(remat::TapeOptions{.seed = kTapeSeed, .verify_replay = checkpointed});
  std::vector<Var<T>> vars;
  for (const Tensor<T>& x : in) vars.push_back(tape.input(x.clone(), true));
  Var<T> y;
  {
    std::optional<remat::CheckpointScope> scope;
    if (checkpointed) scope.emplace();
    y = attend(c, kernel, vars);
  }
  Run<T> r{y.value().clone(), {}, remat::detail::VarAccess::node_id(y)};
  if (seed_grad) {
    tape.backward(y, *seed_grad);
    for (const Var<T>& v : vars) r.grads.push_back(v.grad().clone());
  }
  return r;
}

// Columns [begin, end) of x (B, T, C).
Tensor<double> columns(const Tensor<double>& x, std::int64_t begin, std::int64_t end) {
  const std::int64_t rows = x.dim(0) * x.dim(1), width = x.dim(2);
  Tensor<double> out(Shape{x.dim(0), x.dim(1), end - begin});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = begin; k < end; ++k)
      out[r * (end - begin) + k - begin] = x[r * width + k];
  return out;
}

// Row b's examples as [begin, end) ranges of positions: the whole row without starts.
std::vector<std::pair<std::int64_t, std::int64_t>> examples(const GridCase& c, std::int64_t b) {
  if (!c.o.starts.defined()) return {{0, c.time}};
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t i = 0; i < c.time; ++i) {
    if (c.o.starts[b * c.time + i] == i) out.emplace_back(i, i);
    out.back().second = i + 1;
  }
  return out;
}

// x (B, T, heads D) with each example rotated by RoPE as if it were a row of its own (positions
// offset + i - its start), by the rope op.
Tensor<double> rotated(const GridCase& c, const Tensor<double>& x, std::int64_t heads) {
  Tensor<double> out = x.clone();
  const std::int64_t width = heads * c.dim;
  for (std::int64_t b = 0; b < c.batch; ++b) {
    for (const auto& [begin, end] : examples(c, b)) {
      const std::int64_t first = (b * c.time + begin) * width, n = (end - begin) * width;
      Tensor<double> part(Shape{1, end - begin, heads, c.dim});
      std::copy(x.data() + first, x.data() + first + n, part.data());
      const Tensor<double> turned = remat::rope(Var<double>(part), *c.o.rope).value();
      std::copy(turned.data(), turned.data() + n, out.data() + first);
    }
  }
  return out;
}

// Whether query i of batch b sees key j (the rules of AttentionOptions, written out).
bool sees(const GridCase& c, std::int64_t b, std::int64_t i, std::int64_t j) {
  if (c.o.causal && j > i) return false;
  if (c.o.window > 0 && j <= i - c.o.window) return false;
  if (c.o.starts.defined() && j < c.o.starts[b * c.time + i]) return false;
  return true;
}

// The bias of query i and key j in head h of batch b, read by broadcasting; 0 without one.
double bias_at(const GridCase& c, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const Tensor<float>& bias = c.o.bias;
  if (!bias.defined()) return 0.0;
  const std::int64_t T = c.time;
  if (bias.rank() == 2) return bias[i * T + j];
  const std::int64_t bb = bias.dim(0) == 1 ? 0 : b, hh = bias.dim(1) == 1 ? 0 : h;
  return bias[((bb * bias.dim(1) + hh) * T + i) * T + j];
}

// The op's value by definition, in double: for each (b, h, i) the scores q_i . k_j / sqrt(D)
// plus the bias over the keys i sees (head h reads key/value head h / (H / G)), their softmax
// (no weight at all when every such score is -inf), each weight
// dropped (drawn at counter ((b H + h) T + i) T + j of the op's stream (kTapeSeed, node): dropped
// when its 32 bits fall below p 2^32) or scaled by 1 / (1 - p), times the values.
Tensor<double> reference(const GridCase& c, const std::vector<Tensor<double>>& in,
                         std::uint32_t node) {
  const std::int64_t B = c.batch, T = c.time, H = c.heads(), G = c.groups(), D = c.dim;
  Tensor<double> q = c.packed ? columns(in[0], 0, H * D) : in[0];
  Tensor<double> k = c.packed ? columns(in[0], H * D, (H + G) * D) : in[1];
  const Tensor<double> v = c.packed ? columns(in[0], (H + G) * D, (H + 2 * G) * D) : in[2];
  if (c.o.rope) {
    q = rotated(c, q, H);
    k = rotated(c, k, G);
  }
  const remat::CounterRng rng = remat::CounterRng::at(kTapeSeed, node);
  const auto threshold =
      static_cast<std::uint32_t>(std::min(c.o.dropout * 4294967296.0, 4294967295.0));
  Tensor<double> y = Tensor<double>::zeros(c.output_shape());
  std::vector<double> w(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / (H / G);
      for (std::int64_t i = 0; i < T; ++i) {
        double top = -INFINITY;
        for (std::int64_t j = 0; j < T; ++j) {
          double s = 0;
          for (std::int64_t d = 0; d < D; ++d)
            s += q[(b * T + i) * H * D + h * D + d] * k[(b * T + j) * G * D + g * D + d];
          w[std::size_t(j)] =
              sees(c, b, i, j) ? s / std::sqrt(double(D)) + bias_at(c, b, h, i, j) : -INFINITY;
          top = std::max(top, w[std::size_t(j)]);
        }
        if (top == -INFINITY) continue;  // every key hidden: y's row stays zero
        double total = 0;
        for (double& x : w) total += (x = std::exp(x - top));  // exp(-inf) = 0: unseen keys
        for (std::int64_t j = 0; j < T; ++j) {
          double& x = w[std::size_t(j)];
          x /= total;
          if (c.o.dropout > 0) {
            const auto counter = static_cast<std::uint32_t>(((b * H + h) * T + i) * T + j);
            x = rng.bits(counter) < threshold ? 0.0 : x / (1 - c.o.dropout);
          }
          for (std::int64_t d = 0; d < D; ++d)
            y[(b * T + i) * H * D + h * D + d] += x * v[(b * T + j) * G * D + g * D + d];
        }
      }
    }
  }
  return y;
}

// x's values, exactly, in double.
template <class T>
Tensor<double> to_double(const Tensor<T>& x) {
  Tensor<double> out(x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = double(x[i]);
  return out;
}

// max |got - want| / (1 + |want|) over the elements.
template <class A, class B>
double max_rel_diff(const Tensor<A>& got, const Tensor<B>& want) {
  REQUIRE(got.shape() == want.shape());
  double worst = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    worst = std::max(worst, std::abs(g - w) / (1 + std::abs(w)));
  }
  return worst;
}

// Equal to the last bit (NaN would not be: none is expected).
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

// Both kernels on one case in double: each against the reference, the checkpointed gradients
// bitwise against the plain ones, and the kernels against each other.
void check_kernels(const GridCase& c, const std::vector<Tensor<double>>& in,
                   const Tensor<double>& seed_grad) {
  std::vector<Run<double>> runs;
  for (const AttentionKernel kernel : kKernels) {
    INFO(remat::to_string(kernel) << " kernel");
    Run<double> r = run_attention(c, kernel, in, &seed_grad);
    CHECK(max_rel_diff(r.y, reference(c, in, r.node)) <= 1e-12);
    const Run<double> replayed = run_attention(c, kernel, in, &seed_grad, true);
    CHECK(same_bits(replayed.y, r.y));
    for (std::size_t k = 0; k < in.size(); ++k) CHECK(same_bits(replayed.grads[k], r.grads[k]));
    runs.push_back(std::move(r));
  }
  CHECK(max_rel_diff(runs[1].y, runs[0].y) <= 1e-12);
  for (std::size_t k = 0; k < in.size(); ++k)
    CHECK(max_rel_diff(runs[1].grads[k], runs[0].grads[k]) <= 1e-12);
}

// Tensors with made-up values where the run has data (none in a shape-only run), so that a
// real and a shape-only run allocate the same.
Tensor<float> filled(const Shape& shape) {
  Tensor<float> t(shape);
  if (t.has_data())
    for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = std::sin(0.7f * float(i));
  return t;
}
// Starts of examples five positions long (the last one shorter).
Tensor<std::int32_t> every_fifth_starts(std::int64_t batch, std::int64_t time) {
  Tensor<std::int32_t> s(Shape{batch, time});
  if (s.has_data())
    for (std::int64_t i = 0; i < s.numel(); ++i) s[i] = static_cast<std::int32_t>(i % time / 5 * 5);
  return s;
}

}  // namespace attention_grid

TEST_CASE(
    "attention over the option grid: values against a float64 reference, fused and flash agree, "
    "gradients by finite differences, checkpoint replay bitwise",
    "[ops][attention][flash][gradcheck]") {
  using namespace attention_grid;
  std::mt19937 gen(20260101);
  for (int trial = 0; trial < 150; ++trial) {
    const GridCase c = random_case(gen, 9);
    INFO("trial " << trial << ": " << c.describe());
    const auto in = random_inputs<double>(c, 1000 + std::uint64_t(trial));
    const Tensor<double> seed_grad =
        remat::test::randn(c.output_shape(), 5000 + std::uint64_t(trial));
    check_kernels(c, in, seed_grad);
    for (const AttentionKernel kernel : kKernels) {
      INFO(remat::to_string(kernel) << " kernel, finite differences");
      remat::test::gradcheck([&](const remat::test::VarList& v) { return attend(c, kernel, v); },
                             in);
    }
  }
}

TEST_CASE(
    "attention over the option grid on rows of many blocks: values against the reference, fused "
    "and flash agree, checkpoint replay bitwise",
    "[ops][attention][flash]") {
  using namespace attention_grid;
  std::mt19937 gen(777);
  for (int trial = 0; trial < 40; ++trial) {
    GridCase c = random_case(gen, 40);
    // blocks of a few rows, so that a row of up to 40 is cut into many
    if (c.o.block_rows < c.time && coin(gen)) c.o.block_rows = draw(gen, 2, 9);
    INFO("trial " << trial << ": " << c.describe());
    const auto in = random_inputs<double>(c, 2000 + std::uint64_t(trial));
    check_kernels(c, in, remat::test::randn(c.output_shape(), 6000 + std::uint64_t(trial)));
  }
}

TEST_CASE(
    "attention: a window as long as the row is no window; starts of one example per row are "
    "none (bitwise where the products keep their shape)",
    "[ops][attention][flash][window][packed]") {
  using namespace attention_grid;
  std::mt19937 gen(4242);
  for (int trial = 0; trial < 30; ++trial) {
    GridCase c = random_case(gen, 20);
    c.o.causal = true;
    c.o.starts = Tensor<std::int32_t>();
    GridCase no_window = c, long_window = c, one_example = c;
    no_window.o.window = 0;
    long_window.o.window = c.time + draw(gen, 0, 2);
    one_example.o.starts = Tensor<std::int32_t>::zeros({c.batch, c.time});
    INFO("trial " << trial << ": " << c.describe() << "; long window " << long_window.o.window);
    const auto in = random_inputs<double>(c, 3000 + std::uint64_t(trial));
    const Tensor<double> seed_grad =
        remat::test::randn(c.output_shape(), 7000 + std::uint64_t(trial));
    for (const AttentionKernel kernel : kKernels) {
      INFO(remat::to_string(kernel) << " kernel");
      const Run<double> none = run_attention(no_window, kernel, in, &seed_grad);
      const Run<double> windowed = run_attention(long_window, kernel, in, &seed_grad);
      CHECK(same_bits(windowed.y, none.y));
      for (std::size_t k = 0; k < in.size(); ++k)
        CHECK(same_bits(windowed.grads[k], none.grads[k]));
      const Run<double> plain = run_attention(c, kernel, in, &seed_grad);
      const Run<double> packed = run_attention(one_example, kernel, in, &seed_grad);
      // Given starts, a flash block skips the keys before its first row's window, so its
      // products change shape (and rounding) there; everywhere else they are the same.
      const bool same_products = kernel == AttentionKernel::fused || c.o.window == 0;
      const double bound = same_products ? 0.0 : 1e-12;
      CHECK(max_rel_diff(packed.y, plain.y) <= bound);
      for (std::size_t k = 0; k < in.size(); ++k)
        CHECK(max_rel_diff(packed.grads[k], plain.grads[k]) <= bound);
    }
  }
}

TEST_CASE(
    "attention: a zero bias is none, bitwise; a bias hiding later keys on full attention is "
    "causal attention; a query whose keys are all hidden gets zero output and passes no gradient",
    "[ops][attention][flash][bias]") {
  using namespace attention_grid;
  std::mt19937 gen(5151);
  for (int trial = 0; trial < 30; ++trial) {
    GridCase c = random_case(gen, 20);
    c.o.causal = true;
    c.o.window = 0;
    c.o.starts = Tensor<std::int32_t>();
    c.o.bias = Tensor<float>();
    GridCase zero_bias = c, full = c, hidden_row = c;
    zero_bias.o.bias = Tensor<float>::zeros({c.batch, 1, c.time, c.time});
    full.o.causal = false;
    full.o.bias = Tensor<float>::zeros({c.time, c.time});
    for (std::int64_t i = 0; i < c.time; ++i)
      for (std::int64_t j = i + 1; j < c.time; ++j) full.o.bias[i * c.time + j] = -INFINITY;
    // one query of one head of one batch sees nothing
    const std::int64_t b0 = draw(gen, 0, c.batch - 1), h0 = draw(gen, 0, c.heads() - 1),
                       i0 = draw(gen, 0, c.time - 1);
    hidden_row.o.bias = Tensor<float>::zeros({c.batch, c.heads(), c.time, c.time});
    for (std::int64_t j = 0; j < c.time; ++j)
      hidden_row.o.bias[((b0 * c.heads() + h0) * c.time + i0) * c.time + j] = -INFINITY;
    INFO("trial " << trial << ": " << c.describe() << "; hidden query " << i0 << " of head " << h0
                  << " of batch " << b0);
    const auto in = random_inputs<double>(c, 8000 + std::uint64_t(trial));
    const Tensor<double> seed_grad =
        remat::test::randn(c.output_shape(), 9000 + std::uint64_t(trial));
    for (const AttentionKernel kernel : kKernels) {
      INFO(remat::to_string(kernel) << " kernel");
      const Run<double> plain = run_attention(c, kernel, in, &seed_grad);
      const Run<double> zero = run_attention(zero_bias, kernel, in, &seed_grad);
      CHECK(same_bits(zero.y, plain.y));
      for (std::size_t k = 0; k < in.size(); ++k) CHECK(same_bits(zero.grads[k], plain.grads[k]));
      const Run<double> masked = run_attention(full, kernel, in, &seed_grad);
      CHECK(max_rel_diff(masked.y, plain.y) <= 1e-12);
      for (std::size_t k = 0; k < in.size(); ++k)
        CHECK(max_rel_diff(masked.grads[k], plain.grads[k]) <= 1e-12);
      // The hidden query's output is zero; its own gradient too (nothing it computed reaches y).
      // Its q holds columns h0 D .. (h0 + 1) D of its position, apart or packed alike.
      const Run<double> hidden = run_attention(hidden_row, kernel, in, &seed_grad);
      const std::int64_t at = (b0 * c.time + i0) * c.heads() * c.dim + h0 * c.dim;
      const std::int64_t q_at = (b0 * c.time + i0) * in[0].dim(2) + h0 * c.dim;
      for (std::int64_t d = 0; d < c.dim; ++d) {
        CHECK(hidden.y[at + d] == 0.0);
        CHECK(hidden.grads[0][q_at + d] == 0.0);
      }
      CHECK(max_rel_diff(hidden.y, reference(hidden_row, in, hidden.node)) <= 1e-12);
    }
  }
}

TEST_CASE(
    "attention: its (batch, group) units run in parallel with the bits of one thread and count "
    "the same bytes on any thread count",
    "[ops][attention][flash][threads]") {
  using namespace attention_grid;
  const int before = remat::num_threads();
  std::mt19937 gen(6262);
  for (int trial = 0; trial < 24; ++trial) {
    GridCase c = random_case(gen, 40);
    if (c.batch * c.groups() < 2) c.batch = 2;  // units to run apart
    if (c.o.starts.defined()) c.o.starts = random_starts(gen, c.batch, c.time, 0.3);
    if (c.o.bias.defined()) c.o.bias = random_bias(gen, c.batch, c.heads(), c.time);
    INFO("trial " << trial << ": " << c.describe());
    const auto in = random_inputs<float>(c, 9500 + std::uint64_t(trial));
    const Tensor<float> seed_grad =
        remat::Rng(9900 + std::uint64_t(trial)).normal_tensor<float>(c.output_shape());
    for (const AttentionKernel kernel : kKernels) {
      INFO(remat::to_string(kernel) << " kernel");
      std::vector<Run<float>> runs;
      std::vector<std::size_t> peaks;
      for (const int threads : {1, 2, 3}) {
        remat::set_num_threads(threads);
        runs.push_back(run_attention(c, kernel, in, &seed_grad));
        peaks.push_back(
            remat::test::counted(false, [&] { run_attention(c, kernel, in, &seed_grad); }).peak);
      }
      for (std::size_t t = 1; t < runs.size(); ++t) {
        INFO(t + 1 << " threads against one");
        CHECK(same_bits(runs[t].y, runs[0].y));
        for (std::size_t k = 0; k < in.size(); ++k)
          CHECK(same_bits(runs[t].grads[k], runs[0].grads[k]));
        CHECK(peaks[t] == peaks[0]);
      }
    }
  }
  remat::set_num_threads(before);
}

TEST_CASE(
    "attention: packed qkv equals its q, k and v sliced apart, bitwise, values and gradients, "
    "dropout included",
    "[ops][attention][packed]") {
  using namespace attention_grid;
  // One run over one (B, T, (H + 2G) D) input: the op on it packed, or on its three slices.
  // The packed tape records three constants first, so that the op sits at the same position on
  // both tapes (after the input and three nodes) and draws the same dropout mask.
  const auto run_over = [](const GridCase& c, AttentionKernel kernel, const Tensor<double>& qkv,
                           const Tensor<double>& seed_grad, bool sliced) {
    remat::Tape tape(remat::TapeOptions{.seed = kTapeSeed});
    const Var<double> x = tape.input(qkv.clone(), true);
    const std::int64_t q_end = c.heads() * c.dim, k_end = q_end + c.groups() * c.dim;
    std::vector<Var<double>> parts;
    if (sliced) {
      parts = {remat::slice(x, 0, q_end), remat::slice(x, q_end, k_end),
               remat::slice(x, k_end, x.dim(2))};
    } else {
      for (int i = 0; i < 3; ++i) tape.input(Tensor<double>::zeros({1}));
      parts = {x};
    }
    GridCase layout = c;
    layout.packed = !sliced;
    const Var<double> y = attend(layout, kernel, parts);
    tape.backward(y, seed_grad);
    return Run<double>{y.value().clone(), {x.grad().clone()}, remat::detail::VarAccess::node_id(y)};
  };
  std::mt19937 gen(99);
  for (int trial = 0; trial < 40; ++trial) {
    GridCase c = random_case(gen, 12);
    c.packed = true;
    c.o.rope.reset();
    INFO("trial " << trial << ": " << c.describe());
    const Tensor<double> qkv = random_inputs<double>(c, 4000 + std::uint64_t(trial))[0];
    const Tensor<double> seed_grad =
        remat::test::randn(c.output_shape(), 8000 + std::uint64_t(trial));
    for (const AttentionKernel kernel : kKernels) {
      INFO(remat::to_string(kernel) << " kernel");
      const Run<double> packed = run_over(c, kernel, qkv, seed_grad, false);
      const Run<double> sliced = run_over(c, kernel, qkv, seed_grad, true);
      REQUIRE(packed.node == sliced.node);
      CHECK(same_bits(packed.y, sliced.y));
      CHECK(same_bits(packed.grads[0], sliced.grads[0]));
    }
  }
}

TEST_CASE("attention: the gradients of q, k or v alone equal those of all three, bitwise",
          "[ops][attention]") {
  using namespace attention_grid;
  std::mt19937 gen(5150);
  for (int trial = 0; trial < 20; ++trial) {
    GridCase c = random_case(gen, 10);
    c.packed = false;
    INFO("trial " << trial << ": " << c.describe());
    const auto in = random_inputs<double>(c, 9000 + std::uint64_t(trial));
    const Tensor<double> seed_grad =
        remat::test::randn(c.output_shape(), 9500 + std::uint64_t(trial));
    for (const AttentionKernel kernel : kKernels) {
      const Run<double> all = run_attention(c, kernel, in, &seed_grad);
      // every proper subset: bit k set when input k needs a gradient
      for (unsigned needs = 1; needs < 7; ++needs) {
        INFO(remat::to_string(kernel)
             << " kernel, inputs needing a gradient (q k v bits) " << needs);
        remat::Tape tape(remat::TapeOptions{.seed = kTapeSeed});
        std::vector<Var<double>> vars;
        for (std::size_t k = 0; k < 3; ++k)
          vars.push_back(tape.input(in[k].clone(), ((needs >> k) & 1u) != 0));
        tape.backward(attend(c, kernel, vars), seed_grad);
        for (std::size_t k = 0; k < 3; ++k) {
          if ((needs >> k) & 1u) {
            CHECK(same_bits(vars[k].grad(), all.grads[k]));
          } else {
            CHECK_FALSE(vars[k].grad().defined());
          }
        }
      }
    }
  }
}

TEST_CASE(
    "attention in float: against the double reference on generated cases, and flash matches "
    "fused at the default block size",
    "[ops][attention][flash]") {
  using namespace attention_grid;
  std::mt19937 gen(31);
  // float inputs, and the reference on the same values in double
  const auto check_float = [](const GridCase& c, std::uint64_t seed) {
    const auto in = random_inputs<float>(c, seed);
    std::vector<Tensor<double>> in_double;
    for (const Tensor<float>& x : in) in_double.push_back(to_double(x));
    std::vector<Tensor<float>> outputs;
    for (const AttentionKernel kernel : kKernels) {
      INFO(remat::to_string(kernel) << " kernel");
      const Run<float> r = run_attention(c, kernel, in);
      CHECK(max_rel_diff(r.y, reference(c, in_double, r.node)) <= 1e-5);
      outputs.push_back(r.y);
    }
    CHECK(max_rel_diff(outputs[1], outputs[0]) <= 1e-5);
  };
  for (int trial = 0; trial < 12; ++trial) {
    const GridCase c = random_case(gen, 40);
    INFO("trial " << trial << ": " << c.describe());
    check_float(c, 10000 + std::uint64_t(trial));
  }
  // rows of one block, one block and a row, a few blocks, at the default kFlashBlockRows (64)
  for (const std::int64_t time : {1, 63, 64, 65, 130, 200}) {
    GridCase c;
    c.packed = time % 2 == 0;
    c.batch = 2;
    c.time = time;
    c.dim = 8;
    c.o.heads = 2;
    INFO(c.describe());
    check_float(c, 11000 + std::uint64_t(time));
  }
}

TEST_CASE(
    "attention: the flash kernel keeps one log-sum-exp per query row, not the (B, H, T, T) "
    "probabilities; a shape-only run counts what a real one does",
    "[ops][attention][flash][memory][shape_only]") {
  using namespace attention_grid;
  const std::int64_t batch = 2, time = 90, heads = 4, kv_heads = 2, dim = 8;
  const auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); };
  const std::int64_t rows = std::min(remat::kFlashBlockRows, time);
  // block buffers per slot: one slot per (batch, kv group) unit, up to kAttentionSlots
  const std::int64_t slots = std::min(batch * kv_heads, remat::kAttentionSlots);
  for (const int layout : {0, 1, 2}) {  // packed; q, k and v apart; apart with RoPE
    for (const bool packed_rows : {false, true}) {
      for (const double dropout : {0.0, 0.1}) {
        GridCase c;
        c.packed = layout == 0;
        c.batch = batch, c.time = time, c.dim = dim;
        c.o.heads = heads, c.o.kv_heads = kv_heads, c.o.dropout = dropout;
        if (layout == 2) c.o.rope = remat::RopeOptions{};
        INFO(c.describe() << (packed_rows ? ", packed rows of 5" : ""));
        // One step: inputs (made inside, so that a shape-only run makes them without data),
        // forward, and backward if asked; returns the bytes the forward pass left live beyond
        // its output: what the op keeps.
        const auto step = [&](AttentionKernel kernel, bool backward) {
          remat::Tape tape;
          std::vector<Var<float>> vars;
          for (const Shape& s : c.input_shapes()) vars.push_back(tape.input(filled(s), true));
          GridCase run_case = c;
          if (packed_rows) run_case.o.starts = every_fifth_starts(batch, time);
          const std::size_t before = remat::memory::live_bytes();
          const Var<float> y = attend(run_case, kernel, vars);
          const std::size_t kept =
              remat::memory::live_bytes() - before - static_cast<std::size_t>(y.value().bytes());
          if (backward) tape.backward(y, filled(y.shape()));
          return kept;
        };
        // both keep the rotated queries and keys under RoPE (the starts are shared, not copied)
        const std::size_t rotated =
            layout == 2 ? bytes(batch * time * (heads + kv_heads) * dim) : 0;
        CHECK(step(AttentionKernel::flash, false) == rotated + bytes(batch * heads * time));
        CHECK(step(AttentionKernel::fused, false) == rotated + bytes(batch * heads * time * time));
        // Peaks, forward and a whole step: flash's is below fused's by the probabilities, less
        // the (block rows x T) buffers each slot works in (scores and dropped-out weights
        // forward; probabilities, their gradient and dropped-out weights backward, where fused
        // has two (T x T) ones).
        const std::size_t saved = bytes(batch * heads * time * time - batch * heads * time);
        for (const bool backward : {false, true}) {
          INFO((backward ? "forward and backward" : "forward"));
          const auto peak = [&](AttentionKernel kernel) {
            return remat::test::counted(false, [&] { step(kernel, backward); }).peak;
          };
          CHECK(peak(AttentionKernel::fused) >=
                peak(AttentionKernel::flash) + saved - bytes(3 * slots * rows * time));
        }
        for (const AttentionKernel kernel : kKernels) {
          INFO(remat::to_string(kernel) << " kernel, shape-only");
          remat::test::check_shape_only_exact([&] { step(kernel, true); });
        }
      }
    }
  }
}

TEST_CASE("attention: every bad argument is a clear error naming attention and the value",
          "[ops][attention][errors]") {
  using namespace attention_grid;
  using Catch::Contains;
  using Catch::StartsWith;
  using remat::test::error_message;
  using Opts = remat::AttentionOptions;
  const Var<double> q(Tensor<double>::zeros({2, 4, 8})), kv(Tensor<double>::zeros({2, 4, 4}));
  const Var<double> qkv(Tensor<double>::zeros({2, 4, 16}));  // heads 2, kv_heads 1, D 4
  const auto apart = [&](const Opts& o) {
    return error_message([&] { remat::attention(q, kv, kv, o); });
  };
  const auto packed = [&](const Opts& o) {
    return error_message([&] { remat::attention(qkv, o); });
  };

  // shapes
  CHECK_THAT(apart({.heads = 2, .kv_heads = 2}),
             StartsWith("attention: ") && Contains("(2, 4, 4)") && Contains("kv_heads 2"));
  CHECK_THROWS_AS(remat::attention(q, kv, kv, {.heads = 3, .kv_heads = 1}),
                  remat::ShapeError);  // 8 is no multiple of 3 heads
  CHECK_THROWS_AS(remat::attention(Var<double>(Tensor<double>::zeros({2, 8})), kv, kv, {}),
                  remat::ShapeError);
  CHECK_THAT(error_message([&] {
               remat::attention(q, kv, Var<double>(Tensor<double>::zeros({2, 4, 6})),
                                {.heads = 2, .kv_heads = 1});
             }),
             StartsWith("attention: ") && Contains("(2, 4, 6)"));
  CHECK_THROWS_AS(remat::attention(q, Var<double>(Tensor<double>::zeros({1, 4, 4})), kv,
                                   {.heads = 2, .kv_heads = 1}),
                  remat::ShapeError);
  CHECK_THAT(error_message([&] {
               remat::attention(Var<double>(Tensor<double>::zeros({2, 0, 8})),
                                Var<double>(Tensor<double>::zeros({2, 0, 8})),
                                Var<double>(Tensor<double>::zeros({2, 0, 8})), {});
             }),
             StartsWith("attention: ") && Contains("T >= 1") && Contains("(2, 0, 8)"));
  CHECK_NOTHROW(remat::attention(q, kv, kv, {.heads = 2, .kv_heads = 1}));
  CHECK_NOTHROW(remat::attention(q, kv, kv, {.heads = 4, .kv_heads = 2}));
  CHECK_THAT(packed({.heads = 2, .kv_heads = 2}),  // 16 is no multiple of (2 + 4) heads
             StartsWith("attention: ") && Contains("(2, 4, 16)") && Contains("heads 2") &&
                 Contains("kv_heads 2"));
  CHECK_THROWS_AS(remat::attention(Var<double>(Tensor<double>::zeros({4, 16})), {}),
                  remat::ShapeError);
  CHECK_NOTHROW(remat::attention(qkv, {.heads = 2, .kv_heads = 1}));
  // RoPE: an even D, and q, k and v apart
  CHECK_THAT(error_message([&] {
               remat::attention(Var<double>(Tensor<double>::zeros({2, 4, 6})),
                                Var<double>(Tensor<double>::zeros({2, 4, 3})),
                                Var<double>(Tensor<double>::zeros({2, 4, 3})),
                                {.heads = 2, .kv_heads = 1, .rope = remat::RopeOptions{}});
             }),
             StartsWith("attention: ") && Contains("D even") && Contains("(2, 4, 6)"));
  CHECK_THROWS_AS(remat::attention(q, kv, kv, {.heads = 4, .rope = remat::RopeOptions{}}),
                  remat::ShapeError);  // D 2 is even, but k has 2 heads, not 4
  CHECK_NOTHROW(
      remat::attention(q, kv, kv, {.heads = 4, .kv_heads = 2, .rope = remat::RopeOptions{}}));
  CHECK_THAT(packed({.heads = 2, .kv_heads = 1, .rope = remat::RopeOptions{}}),
             StartsWith("attention: ") && Contains("RoPE") && Contains("(2, 4, 16)"));
  CHECK_THROWS_AS(remat::attention(qkv, {.heads = 2, .kv_heads = 1, .rope = remat::RopeOptions{}}),
                  remat::ArgumentError);
  CHECK_THAT(apart({.heads = 4, .kv_heads = 2, .rope = remat::RopeOptions{.theta = -1.0}}),
             StartsWith("attention: ") && Contains("theta -1"));

  // options, in either form
  for (const bool one_tensor : {false, true}) {
    INFO((one_tensor ? "packed qkv" : "q, k and v apart"));
    const auto bad = [&](const Opts& o) { return one_tensor ? packed(o) : apart(o); };
    CHECK_THAT(bad({.heads = 4, .kv_heads = 3}), StartsWith("attention: ") &&
                                                     Contains("kv_heads must divide heads") &&
                                                     Contains("heads 4, kv_heads 3"));
    CHECK_THAT(bad({.heads = 0}), StartsWith("attention: ") && Contains("heads 0"));
    CHECK_THAT(bad({.heads = 2, .kv_heads = -1}),
               StartsWith("attention: ") && Contains("kv_heads -1"));
    for (const double p : {1.0, -0.25, 1.5, double(NAN)}) {
      INFO("dropout " << p);
      CHECK_THAT(bad({.heads = 2, .kv_heads = 1, .dropout = p}),
                 StartsWith("attention: ") && Contains("dropout must be in [0, 1)"));
    }
    CHECK_THAT(bad({.heads = 2, .kv_heads = 1, .dropout = 1.0}), Contains("got 1"));
    CHECK_THAT(bad({.heads = 2, .kv_heads = 1, .dropout = -0.25}), Contains("got -0.25"));
    for (const std::int64_t rows : {0, -3}) {
      CHECK_THAT(
          bad({.heads = 2, .kv_heads = 1, .kernel = AttentionKernel::flash, .block_rows = rows}),
          StartsWith("attention: ") && Contains("block_rows") &&
              Contains(remat::detail::cat("got ", rows)));
    }
    CHECK_THAT(bad({.heads = 2, .kv_heads = 1, .window = -1}),
               StartsWith("attention: ") && Contains("sliding window") && Contains("-1"));
    CHECK_THAT(bad({.heads = 2, .kv_heads = 1, .causal = false, .window = 3}),
               StartsWith("attention: ") && Contains("(3)") && Contains("causal = false"));
    CHECK_THAT(bad({.heads = 2,
                    .kv_heads = 1,
                    .causal = false,
                    .starts = Tensor<std::int32_t>::zeros({2, 4})}),
               StartsWith("attention: ") && Contains("starts") && Contains("causal = false"));
    CHECK_THROWS_AS(remat::attention(qkv, {.heads = 2, .kv_heads = 1, .dropout = 1.0}),
                    remat::ArgumentError);
    // the bias: (T, T) or (1 or B, 1 or heads, T, T); finite or -inf
    for (const Shape& shape : {Shape{4, 5}, Shape{3, 1, 4, 4}, Shape{2, 3, 4, 4}, Shape{2, 2, 4},
                               Shape{1, 1, 1, 4, 4}, Shape{4}}) {
      INFO("bias " << shape);
      const Opts o{.heads = 2, .kv_heads = 1, .bias = Tensor<float>::zeros(shape)};
      CHECK_THAT(bad(o), StartsWith("attention: bias must be") &&
                             Contains(remat::detail::cat("got ", shape)) && Contains("T 4"));
      CHECK_THROWS_AS(one_tensor ? remat::attention(qkv, o) : remat::attention(q, kv, kv, o),
                      remat::ShapeError);
    }
    for (const Shape& shape : {Shape{4, 4}, Shape{1, 1, 4, 4}, Shape{2, 1, 4, 4}, Shape{1, 2, 4, 4},
                               Shape{2, 2, 4, 4}}) {
      INFO("bias " << shape);
      CHECK_NOTHROW(
          one_tensor
              ? remat::attention(qkv,
                                 {.heads = 2, .kv_heads = 1, .bias = Tensor<float>::zeros(shape)})
              : remat::attention(q, kv, kv,
                                 {.heads = 2, .kv_heads = 1, .bias = Tensor<float>::zeros(shape)}));
    }
    for (const float x : {NAN, INFINITY}) {
      Tensor<float> bias = Tensor<float>::zeros({1, 2, 4, 4});
      bias[21] = x;
      CHECK_THAT(bad({.heads = 2, .kv_heads = 1, .bias = bias}),
                 StartsWith("attention: bias[21]") && Contains("(1, 2, 4, 4)") &&
                     Contains(remat::detail::cat("is ", x)) && Contains("-inf to hide a key"));
      CHECK_THROWS_AS(one_tensor
                          ? remat::attention(qkv, {.heads = 2, .kv_heads = 1, .bias = bias})
                          : remat::attention(q, kv, kv, {.heads = 2, .kv_heads = 1, .bias = bias}),
                      remat::ArgumentError);
    }
  }
}

TEST_CASE("attention rejects starts that are not contiguous examples",
          "[ops][attention][flash][packed][errors]") {
  using namespace attention_grid;
  using Catch::Contains;
  using Catch::StartsWith;
  // (B, T) = (2, 4): heads 2 of D 2 sharing one key/value head, apart or packed
  const Var<double> q(Tensor<double>::zeros({2, 4, 4})), kv(Tensor<double>::zeros({2, 4, 2}));
  const Var<double> qkv(Tensor<double>::zeros({2, 4, 8}));
  const auto starts = [](std::vector<std::int32_t> v) {
    Tensor<std::int32_t> s(Shape{2, 4});
    for (std::int64_t i = 0; i < 8; ++i) s[i] = v[std::size_t(i)];
    return s;
  };
  for (const bool one_tensor : {false, true}) {
    for (const AttentionKernel kernel : kKernels) {
      INFO((one_tensor ? "packed qkv, " : "q, k and v apart, ") << remat::to_string(kernel));
      const auto call = [&](const Tensor<std::int32_t>& s) {
        const remat::AttentionOptions o{
            .heads = 2, .kv_heads = 1, .starts = s, .kernel = kernel, .block_rows = 3};
        return one_tensor ? remat::attention(qkv, o) : remat::attention(q, kv, kv, o);
      };
      const auto run = [&](const Tensor<std::int32_t>& s) {
        return remat::test::error_message([&] { call(s); });
      };
      // (B, T) = (2, 4), or none
      CHECK_THAT(run(Tensor<std::int32_t>::zeros({2, 5})),
                 StartsWith("attention: ") && Contains("(2, 4)") && Contains("(2, 5)"));
      CHECK_THROWS_AS(call(Tensor<std::int32_t>::zeros({8})), remat::ShapeError);
      CHECK_THROWS_AS(call(Tensor<std::int32_t>::zeros({2, 5})), remat::ShapeError);
      // a start after its position, before the row, skipping back, or not the previous one
      CHECK_THAT(run(starts({0, 0, 0, 0, 0, 2, 1, 1})), StartsWith("attention: ") &&
                                                            Contains("starts[1, 1] = 2") &&
                                                            Contains("row 1 position 1"));
      CHECK_THAT(run(starts({-1, 0, 0, 0, 0, 0, 0, 0})),
                 Contains("starts[0, 0] = -1") && Contains("row 0 position 0"));
      CHECK_THAT(run(starts({0, 1, 0, 0, 0, 0, 0, 0})),
                 Contains("starts[0, 2] = 0") && Contains("previous position's (1)"));
      CHECK_THAT(run(starts({0, 0, 1, 1, 0, 0, 0, 0})), Contains("starts[0, 2] = 1"));
      CHECK_THROWS_AS(call(starts({0, 0, 2, 2, 0, 1, 1, 2})), remat::ArgumentError);
      // contiguous examples pass
      CHECK_NOTHROW(call(starts({0, 0, 2, 2, 0, 1, 1, 1})));
      CHECK_NOTHROW(call(starts({0, 1, 2, 3, 0, 0, 0, 3})));
    }
  }
}
