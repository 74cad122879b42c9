#pragma once
/// @file
/// Grads<T>: the gradients of a node's inputs, as an op's backward() sees them, and how a
/// gradient is added into a slot (adopted, copied into a reused buffer, or summed).

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "remat/core/node.hpp"

namespace remat {
namespace detail {

/// dst += src, element-wise, in parallel for large tensors.
template <class T>
void add_into(Tensor<T>& dst, const Tensor<T>& src) {
  if (shape_only()) return;
  T* REMAT_RESTRICT d = dst.data();
  const T* REMAT_RESTRICT s = src.data();
  parallel_for(dst.numel(), kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) d[i] += s[i];
  });
}

/// Accumulates g into a gradient slot. An empty slot adopts g without copying; a stale slot
/// (see ParamState) receives a copy of g in its own buffer; a slot whose buffer is shared with
/// anything else is copied before it is written (copy on write), so adopting never lets one
/// gradient leak into another.
template <class T>
void accumulate(Tensor<T>& slot, bool stale, Tensor<T> g) {
  REMAT_ASSERT(!slot.defined() || slot.shape() == g.shape(), "gradient of shape ", g.shape(),
               " added to one of shape ", slot.shape());
  if (!slot.defined() || (stale && !slot.is_unique())) {
    slot = std::move(g);
  } else if (stale) {
    if (!shape_only()) std::memcpy(slot.data(), g.data(), g.bytes());
  } else {
    if (!slot.is_unique()) slot = slot.clone();
    add_into(slot, g);
  }
}

}  // namespace detail

/// The gradients of an op's inputs, handed to Node::backward(). Input k is the op's k-th input,
/// in the order they were given to apply() (or record()).
///
///     void backward(const Tensor<T>& gy, Grads<T>& grads) override {
///       if (grads.needs(0)) grads.add(0, gy * 2);   // skip work for inputs that need none
///     }
///
/// add() may be called several times for one input: the gradients sum.
template <class T>
class Grads {
 public:
  /// Whether input k needs a gradient; backward() may skip the work for those that do not.
  bool needs(int k) const { return input(k).requires_grad; }

  /// Adds g (the shape of input k's value) to input k's gradient. Takes g by value: a tensor
  /// nobody else holds is adopted without a copy. A g of another shape than input k's value (or
  /// undefined) is a UsageError naming the op, the input and both shapes.
  void add(int k, Tensor<T> g) {
    if (!needs(k)) return;
    Node<T>& in = input(k);
    check_shape(k, in, g.defined() ? &g.shape() : nullptr);
    detail::accumulate(in.grad_slot(), in.grad_stale(), std::move(g));
    in.mark_grad_written();
  }

  /// A gradient of another element type than the input's does not compile: convert it first.
  template <class U>
  void add(int, const Tensor<U>&) {
    static_assert(std::is_same_v<U, T>,
                  "remat::Grads<T>::add: a gradient has its input's element type T; convert it "
                  "(for example with a loop into a Tensor<T>) before adding it");
  }

  /// Lets `write(dst, overwrite)` produce input k's gradient in place: with overwrite true, dst
  /// is a new uninitialized tensor of `shape` to assign; with false, dst holds the gradient so far
  /// and write must add to it. Saves a temporary and a pass for GEMM-shaped gradients. In a
  /// shape-only run the buffer is made and write() is not called: it would only do arithmetic
  /// (a write that allocates scratch must use target() and allocate it itself).
  template <class Write>
  void add_with(int k, const Shape& shape, Write&& write) {
    if (!needs(k)) return;
    Target t = target(k, shape);
    if (!detail::shape_only()) write(*t.dst, t.overwrite);
  }

  /// Input k's gradient buffer, for ops that write several gradients in one loop: dst is null
  /// when input k needs none; with overwrite, it holds garbage to assign, else a sum to add to.
  struct Target {
    Tensor<T>* dst = nullptr;
    bool overwrite = false;
  };
  Target target(int k, const Shape& shape) {
    if (!needs(k)) return Target{};
    Node<T>& in = input(k);
    check_shape(k, in, &shape);
    Tensor<T>& dst = in.grad_slot();
    const bool overwrite = !dst.defined() || in.grad_stale();
    if (!dst.defined() || !dst.is_unique()) {
      dst = overwrite ? Tensor<T>(shape) : dst.clone();
    }
    in.mark_grad_written();
    return Target{&dst, overwrite};
  }

  /// Number of inputs of the op.
  int size() const noexcept { return static_cast<int>(inputs_.size()); }

 private:
  friend class Node<T>;

  Grads(const char* op, detail::NodeTable nodes, const std::vector<std::uint32_t>& inputs) noexcept
      : op_(op), nodes_(nodes), inputs_(inputs) {}

  /// Throws the UsageError for a gradient of input k whose shape (null: undefined) is not the
  /// input's: a custom op's backward would otherwise leave the input a gradient of the wrong
  /// size, or add it past the end of one.
  void check_shape(int k, const Node<T>& in, const Shape* shape) const {
    if (shape && *shape == in.shape) return;
    throw UsageError(detail::cat(
        op_, ": backward() gave input ", k, ", of shape ", in.shape, " (the output of '",
        in.op_name(), "'), ",
        shape ? detail::cat("a gradient of shape ", *shape) : std::string("an undefined gradient"),
        "; the gradient of an input must have the input's shape"));
  }

  Node<T>& input(int k) const {
    if (k < 0 || k >= size()) {
      throw UsageError(
          detail::cat("Grads: input ", k, " asked for, but the op has ", size(), " input(s)"));
    }
    return detail::node_cast<T>(nodes_[inputs_[static_cast<std::size_t>(k)]].get());
  }

  const char* op_;
  detail::NodeTable nodes_;
  const std::vector<std::uint32_t>& inputs_;
};

template <class T>
void Node<T>::run_backward(detail::NodeTable nodes) {
  Grads<T> grads(op_name(), nodes, inputs);
  widen_copies();  // float copies of the bfloat16 saves, for this backward only
  backward(grad_slot(), grads);
  drop_widened();
}

}  // namespace remat
