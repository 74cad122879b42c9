#pragma once
// Random blocks for checkpoint tests: a small grammar (linear, matmul, tanh, relu, gelu, sigmoid,
// residual adds, products, dropout, layer norm, reshapes, transposes, splits and concats, values
// with several consumers) writes random blocks; RandomChain runs n copies with parameters of their
// own, RandomLoss ends them in one of several losses. Used by random_block_test.cpp (predicted
// against counted memory) and policy_test.cpp (save policies).
#include <remat/remat.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace remat_test {

/// One statement of a generated block: value `out` = op(values[a], values[b]).
struct BlockOp {
  enum Kind {
    linear,
    matmul,
    unary,
    add,
    mul,
    dropout,
    layer_norm,
    reshape,
    transpose,
    split_concat
  } kind;
  int a = 0, b = 0;  // inputs (indices of earlier values; b only for add and mul)
  int width = 0;     // output width (linear, matmul)
  int fn = 0;        // unary: 0 tanh, 1 relu, 2 gelu, 3 sigmoid
};

inline const char* kOpNames[] = {"linear",  "matmul",     "unary",   "add",       "mul",
                                 "dropout", "layer_norm", "reshape", "transpose", "split_concat"};
inline const char* kUnaryNames[] = {"tanh", "relu", "gelu", "sigmoid"};

/// A block over (batch, width) values: values[0] is the input, the last value the output (same
/// shape as the input).
struct RandomBlock {
  int width = 0, hidden = 0;
  std::vector<BlockOp> ops;
  std::vector<int> widths;  // per value

  std::string describe() const {
    std::ostringstream out;
    out << "block(width " << width << ", hidden " << hidden << "): v0 = x";
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const BlockOp& o = ops[i];
      out << "; v" << i + 1 << " = "
          << (o.kind == BlockOp::unary ? kUnaryNames[o.fn] : kOpNames[o.kind]) << "(v" << o.a;
      if (o.kind == BlockOp::add || o.kind == BlockOp::mul) out << ", v" << o.b;
      if (o.kind == BlockOp::linear || o.kind == BlockOp::matmul) out << " -> " << o.width;
      out << ")";
    }
    return out.str();
  }
};

/// An earlier value of width w, favouring recent ones (or -1 if there is none).
inline int pick_value(remat::Rng& rng, const std::vector<int>& widths, int w) {
  std::vector<int> found;
  for (int i = static_cast<int>(widths.size()); i-- > 0;) {
    if (widths[i] == w) found.push_back(i);
  }
  if (found.empty()) return -1;
  // the latest half the time, else any
  return rng.uniform() < 0.5 ? found[0]
                             : found[rng.uniform_int(static_cast<std::int64_t>(found.size()))];
}

inline RandomBlock random_block(remat::Rng& rng, int width) {
  RandomBlock blk;
  blk.width = width;
  blk.hidden = 2 * width;
  blk.widths = {width};
  const int length = 2 + static_cast<int>(rng.uniform_int(6));
  const auto push = [&](BlockOp op, int w) {
    blk.ops.push_back(op);
    blk.widths.push_back(w);
  };
  // An op with parameters comes first, or second after an op without (so the block's input may
  // not be saved), and later ops read values from it on (only the second input of an add or a
  // product may be earlier), so every layer needs gradients.
  const BlockOp::Kind first[] = {BlockOp::linear, BlockOp::matmul, BlockOp::layer_norm};
  const BlockOp::Kind prefix[] = {BlockOp::dropout, BlockOp::unary, BlockOp::reshape,
                                  BlockOp::transpose, BlockOp::split_concat};
  const int with_parameters = rng.uniform() < 0.3 ? 1 : 0;
  if (with_parameters == 1)
    push(BlockOp{prefix[rng.uniform_int(5)], 0, 0, 0, static_cast<int>(rng.uniform_int(4))}, width);
  for (int i = with_parameters; i < length; ++i) {
    const auto values = static_cast<std::int64_t>(blk.widths.size());
    const int from = with_parameters + 1;  // the first value that depends on parameters
    const int a = i == with_parameters  ? with_parameters
                  : rng.uniform() < 0.6 ? static_cast<int>(values) - 1
                                        : from + static_cast<int>(rng.uniform_int(values - from));
    const int w = blk.widths[a];
    BlockOp op{i == with_parameters ? first[rng.uniform_int(3)]
                                    : static_cast<BlockOp::Kind>(rng.uniform_int(10))};
    op.a = a;
    switch (op.kind) {
      case BlockOp::linear:
      case BlockOp::matmul:
        op.width = rng.uniform() < 0.5 ? blk.width : blk.hidden;
        push(op, op.width);
        break;
      case BlockOp::unary:
        op.fn = static_cast<int>(rng.uniform_int(4));
        push(op, w);
        break;
      case BlockOp::add:
      case BlockOp::mul:
        op.b = pick_value(rng, blk.widths, w);
        push(op, w);
        break;
      default:
        push(op, w);
    }
  }
  // the output: back to the input's width, then a random last op (residual add, dropout, layer
  // norm, an activation or a linear)
  if (blk.widths.back() != width)
    push(BlockOp{BlockOp::linear, static_cast<int>(blk.widths.size()) - 1, 0, width}, width);
  const int last = static_cast<int>(blk.widths.size()) - 1;
  switch (rng.uniform_int(5)) {
    case 0:
      push(BlockOp{BlockOp::add, last, pick_value(rng, blk.widths, width)}, width);
      break;
    case 1:
      push(BlockOp{BlockOp::dropout, last}, width);
      break;
    case 2:
      push(BlockOp{BlockOp::layer_norm, last}, width);
      break;
    case 3:
      push(BlockOp{BlockOp::unary, last, 0, 0, static_cast<int>(rng.uniform_int(4))}, width);
      break;
    default:
      push(BlockOp{BlockOp::linear, last, 0, width}, width);
  }
  return blk;
}

/// n copies of a block, each with parameters of its own, as callables for checkpoint_sequential.
struct RandomChain {
  RandomBlock block;
  std::int64_t batch = 0;
  std::vector<std::vector<remat::Parameter<float>>>
      params;  // per layer, per op (two for layer_norm: gamma then beta)
  std::vector<std::function<remat::Var<float>(const remat::Var<float>&)>> layers;

  RandomChain(const RandomBlock& b, std::size_t n, std::int64_t batch_size, std::uint64_t seed)
      : block(b), batch(batch_size) {
    remat::Rng rng(seed);
    params.resize(n);
    for (auto& p : params) {
      for (const BlockOp& op : block.ops) {
        const int w = block.widths[op.a];
        if (op.kind == BlockOp::linear) {
          p.emplace_back(rng.uniform_tensor<float>({op.width, w}, -1 / std::sqrt(double(w)),
                                                   1 / std::sqrt(double(w))));
          p.emplace_back(rng.uniform_tensor<float>({op.width}, -0.1, 0.1));
        } else if (op.kind == BlockOp::matmul) {
          p.emplace_back(rng.uniform_tensor<float>({w, op.width}, -1 / std::sqrt(double(w)),
                                                   1 / std::sqrt(double(w))));
        } else if (op.kind == BlockOp::layer_norm) {
          p.emplace_back(rng.uniform_tensor<float>({w}, 0.5, 1.5));
          p.emplace_back(rng.uniform_tensor<float>({w}, -0.1, 0.1));
        }
      }
    }
    for (std::size_t l = 0; l < n; ++l)
      layers.push_back([this, l](const remat::Var<float>& x) { return run(x, params[l]); });
  }

  remat::Var<float> run(const remat::Var<float>& x,
                        const std::vector<remat::Parameter<float>>& p) const {
    std::vector<remat::Var<float>> v{x};
    std::size_t next = 0;
    for (const BlockOp& op : block.ops) {
      const remat::Var<float>& a = v[op.a];
      const std::int64_t w = block.widths[op.a];
      switch (op.kind) {
        case BlockOp::linear:
          v.push_back(remat::linear(a, p[next], p[next + 1]));
          next += 2;
          break;
        case BlockOp::matmul:
          v.push_back(remat::matmul(a, p[next++]));
          break;
        case BlockOp::unary:
          v.push_back(op.fn == 0   ? remat::tanh(a)
                      : op.fn == 1 ? remat::relu(a)
                      : op.fn == 2 ? remat::gelu(a)
                                   : remat::sigmoid(a));
          break;
        case BlockOp::add:
          v.push_back(a + v[op.b]);
          break;
        case BlockOp::mul:
          v.push_back(a * v[op.b]);
          break;
        case BlockOp::dropout:
          v.push_back(remat::dropout(a, 0.25));
          break;
        case BlockOp::layer_norm:
          v.push_back(remat::layer_norm(a, p[next], p[next + 1]));
          next += 2;
          break;
        case BlockOp::reshape:  // a view, an op on it, and a view back
          v.push_back(remat::reshape(remat::scale(remat::reshape(a, {batch * 2, w / 2}), 0.5f),
                                     {batch, w}));
          break;
        case BlockOp::transpose:
          v.push_back(remat::transpose(remat::relu(remat::transpose(a))));
          break;
        case BlockOp::split_concat: {
          const auto parts = remat::split(a, 2);
          v.push_back(
              remat::concat(std::vector<remat::Var<float>>{remat::tanh(parts[1]), parts[0]}));
          break;
        }
      }
    }
    return v.back();
  }

  void zero_grad() {
    for (auto& layer : params) {
      for (auto& q : layer) q.zero_grad();
    }
  }
};

/// The losses a chain ends in.
struct RandomLoss {
  int kind = 0;  // 0 mean of squares, 1 MSE through a head, 2 cross-entropy through a head, 3
                 // chunked, 4 sum
  mutable remat::Parameter<float> head;
  remat::Tensor<float> target;
  remat::Tensor<std::int32_t> labels;
  std::int64_t chunk = 1;

  static constexpr const char* names[] = {"mean of squares", "MSE through a head", "cross-entropy",
                                          "chunked cross-entropy", "sum"};

  RandomLoss(int k, std::int64_t batch, int width, remat::Rng& rng) : kind(k) {
    const int classes = 3 * width;
    head = remat::Parameter<float>(
        rng.uniform_tensor<float>({k == 1 ? width / 2 : classes, width}, -0.2, 0.2));
    target = rng.normal_tensor<float>({batch, width / 2});
    labels = remat::Tensor<std::int32_t>({batch});
    if (labels.has_data()) {  // none in a shape-only run
      for (auto& t : labels) t = static_cast<std::int32_t>(rng.uniform_int(classes));
    }
    chunk = std::max<std::int64_t>(1, batch / 3);
  }

  remat::Var<float> operator()(const remat::Var<float>& y) const {
    switch (kind) {
      case 0:
        return remat::mean(y * y);
      case 1: {
        const remat::Var<float> d = remat::linear(y, head) - remat::Var<float>(target);
        return remat::mean(d * d);
      }
      case 2:
        return remat::cross_entropy(remat::linear(y, head), labels);
      case 3:
        return remat::linear_cross_entropy(y, head, labels, chunk);
      default:
        return remat::sum(y);
    }
  }
};

/// A generated case, all drawn from `seed` in this order: a block width, a batch, 1 to
/// `max_layers` layers of one random block, the chain's parameters (from seed + 1), a random loss
/// and an input; `rng` then continues the same stream for the test's own draws.
struct RandomCase {
  std::uint64_t seed;
  remat::Rng rng;
  int width;
  std::int64_t batch;
  std::size_t n;
  RandomBlock block;
  RandomChain chain;
  RandomLoss loss;
  remat::Tensor<float> x;

  RandomCase(std::uint64_t s, std::int64_t max_layers)
      : seed(s),
        rng(s),
        width(4 << rng.uniform_int(3)),
        batch(3 + rng.uniform_int(6)),
        n(1 + static_cast<std::size_t>(rng.uniform_int(max_layers))),
        block(random_block(rng, width)),
        chain(block, n, batch, s + 1),
        loss(static_cast<int>(rng.uniform_int(5)), batch, width, rng),
        x(rng.normal_tensor<float>({batch, width})) {}

  /// "seed S: N layers of block(...), batch B, loss: L", for INFO().
  std::string describe() const {
    std::ostringstream out;
    out << "seed " << seed << ": " << n << " layers of " << block.describe() << ", batch " << batch
        << ", loss: " << RandomLoss::names[loss.kind];
    return out.str();
  }
};

}  // namespace remat_test
