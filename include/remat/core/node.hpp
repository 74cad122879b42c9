#pragma once
/// @file
/// Tape nodes. A node is one recorded operation: its input nodes, its forward recipe (the op and
/// its non-tensor arguments, as members of the concrete node), the tensors its backward needs,
/// and its gradient. Because the recipe is kept, a range of nodes can be run again from its
/// inputs: that is how a checkpoint segment is replayed.
///
/// Note [saved tensors]: forward() hands what backward() will need to save(); the tape decides
/// whether save() keeps it (a node recorded inside a checkpoint segment keeps nothing during the
/// first forward pass, and everything during its replay). release_saved() drops it all.

#include <array>
#include <cstring>
#include <ostream>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/hash.hpp"
#include "remat/core/parallel.hpp"
#include "remat/core/tensor.hpp"

namespace remat {
namespace detail {

inline constexpr std::uint32_t kNone = 0xffffffffU;

/// What a Parameter is: a persistent value and its accumulated gradient, shared by every handle.
/// zero_grad() only marks the gradient stale: the next backward overwrites the buffer instead of
/// allocating a new one, so a training loop's steady-state steps allocate no parameter gradients.
template <class T>
struct ParamState {
  Tensor<T> value;
  Tensor<T> grad;
  bool requires_grad = true;
  bool grad_valid = false;  // grad holds a gradient (not just a reusable buffer)
};

/// The untyped face of a node, which is all the tape's sweeps need.
class NodeBase {
 public:
  NodeBase() = default;
  NodeBase(const NodeBase&) = delete;
  NodeBase& operator=(const NodeBase&) = delete;
  virtual ~NodeBase() = default;

  /// The op's name as users call it ("matmul", "layer_norm", ...), for messages.
  virtual const char* op_name() const noexcept = 0;
  virtual bool is_leaf() const noexcept { return false; }
  /// The Parameter a leaf stands for (Parameter::identity()), null for every other node.
  virtual const void* parameter_identity() const noexcept { return nullptr; }

  /// Runs forward() again from the values held by the input nodes and keeps the output in the
  /// node's value slot (checkpoint replay).
  virtual void replay(NodeBase* const* nodes) = 0;
  /// Runs backward() with the node's gradient, accumulating into the input nodes' gradients.
  virtual void run_backward(NodeBase* const* nodes) = 0;

  virtual bool has_grad() const noexcept = 0;
  virtual bool has_value() const noexcept = 0;
  virtual void release_saved() noexcept = 0;
  virtual void release_grad() noexcept = 0;
  virtual void release_value() noexcept = 0;
  /// Fingerprint of the value slot (replay verification).
  virtual std::uint64_t value_hash() const noexcept = 0;
  /// Distinct bytes held by saved tensors (buffers shared by several slots count once).
  virtual std::size_t saved_bytes() const noexcept = 0;
  virtual bool value_is_finite() const noexcept = 0;
  virtual bool grad_is_finite() const noexcept = 0;
  virtual void print_value_shape(std::ostream& out) const = 0;

  std::vector<std::uint32_t> inputs;  ///< ids of the input nodes
  std::uint32_t id = kNone;           ///< position in the tape (kNone when not recorded)
  std::uint32_t segment = kNone;      ///< innermost checkpoint segment holding this node
  std::uint32_t last_capture = kNone; ///< last segment that kept this node's value as an input
  std::uint32_t keep_count = 0;       ///< segments keeping the value slot alive
  std::uint64_t hash = 0;             ///< fingerprint of the output taken in the forward pass
  bool has_hash = false;
  bool requires_grad = false;
  bool saving = false;                ///< whether save() keeps tensors in this forward run
};

template <class T>
class Grads;

}  // namespace detail

/// Base of every differentiable operation on Tensor<T>. An op derives from it, keeps its
/// non-tensor arguments as members, and implements forward() and backward() side by side.
template <class T>
class Node : public detail::NodeBase {
 public:
  using Inputs = std::span<const Tensor<T>>;

  /// Computes the output from the input values and save()s what backward() needs. Must be
  /// deterministic: a checkpoint replay calls it again and expects the same bits.
  virtual Tensor<T> forward(Inputs in) = 0;

  /// Adds the gradient of each input that needs one into `grads`, given `grad_out`.
  virtual void backward(const Tensor<T>& grad_out, detail::Grads<T>& grads) = 0;

  /// Where gradients for this node's output accumulate.
  virtual Tensor<T>& grad_slot() noexcept { return grad_; }
  /// True when grad_slot() holds a buffer to overwrite rather than a gradient to add to.
  virtual bool grad_stale() const noexcept { return false; }
  virtual void mark_grad_written() noexcept {}
  /// The value this node feeds its consumers during a replay.
  virtual const Tensor<T>& replay_value() const noexcept { return value_; }

  Tensor<T>& value_slot() noexcept { return value_; }

  void replay(detail::NodeBase* const* nodes) override;
  void run_backward(detail::NodeBase* const* nodes) override;

  bool has_grad() const noexcept override {
    return !grad_stale() && const_cast<Node*>(this)->grad_slot().defined();
  }
  bool has_value() const noexcept override { return replay_value().defined(); }
  void release_saved() noexcept override {
    for (Tensor<T>& s : saved_) s.reset();
  }
  void release_grad() noexcept override { grad_.reset(); }
  void release_value() noexcept override { value_.reset(); }
  std::uint64_t value_hash() const noexcept override { return detail::hash_tensor(replay_value()); }
  std::size_t saved_bytes() const noexcept override {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < saved_.size(); ++i) {
      bool seen = false;
      for (std::size_t j = 0; j < i; ++j) seen |= saved_[j].defined() && saved_[j].shares_storage_with(saved_[i]);
      if (!seen && saved_[i].defined()) bytes += saved_[i].bytes();
    }
    return bytes;
  }
  bool value_is_finite() const noexcept override { return all_finite(replay_value()); }
  bool grad_is_finite() const noexcept override {
    return all_finite(const_cast<Node*>(this)->grad_slot());
  }
  void print_value_shape(std::ostream& out) const override { out << replay_value().shape(); }

 protected:
  static constexpr int kMaxSaved = 4;

  /// Keeps `t` for backward() when the tape asks this run to save (see Note [saved tensors]).
  void save(int slot, const Tensor<T>& t) {
    if (saving) saved_[slot] = t;
  }
  const Tensor<T>& saved(int slot) const noexcept { return saved_[slot]; }

 private:
  static bool all_finite(const Tensor<T>& t) noexcept {
    if constexpr (std::is_floating_point_v<T>) {
      return !t.defined() || t.array().isFinite().all();
    } else {
      return true;
    }
  }

  std::array<Tensor<T>, kMaxSaved> saved_;
  Tensor<T> grad_;
  Tensor<T> value_;
};

namespace detail {

template <class T>
Node<T>& node_cast(NodeBase* n) noexcept {
  return static_cast<Node<T>&>(*n);
}

/// dst += src, element-wise, in parallel for large tensors.
template <class T>
void add_into(Tensor<T>& dst, const Tensor<T>& src) {
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
  if (slot.defined() && !(slot.shape() == g.shape())) {
    throw Error(cat("internal error: gradient of shape ", g.shape(), " added to one of shape ",
                    slot.shape()));
  }
  if (!slot.defined() || (stale && !slot.is_unique())) {
    slot = std::move(g);
  } else if (stale) {
    std::memcpy(slot.data(), g.data(), g.bytes());
  } else {
    if (!slot.is_unique()) slot = slot.clone();
    add_into(slot, g);
  }
}

/// The gradients of a node's inputs, as backward() sees them.
template <class T>
class Grads {
 public:
  Grads(NodeBase* const* nodes, const std::vector<std::uint32_t>& inputs) noexcept
      : nodes_(nodes), inputs_(inputs) {}

  /// Whether input k needs a gradient; backward() skips the work for those that do not.
  bool needs(int k) const noexcept { return nodes_[inputs_[k]]->requires_grad; }

  /// Adds g to input k's gradient.
  void add(int k, Tensor<T> g) {
    if (!needs(k)) return;
    Node<T>& in = input(k);
    accumulate(in.grad_slot(), in.grad_stale(), std::move(g));
    in.mark_grad_written();
  }

  /// Lets `write(dst, overwrite)` produce input k's gradient in place: with overwrite true, dst
  /// is a new uninitialized tensor of `shape` to assign; with false, dst holds the gradient so far
  /// and write must add to it. Saves a temporary and a pass for GEMM-shaped gradients.
  template <class Write>
  void add_with(int k, const Shape& shape, Write&& write) {
    if (!needs(k)) return;
    Target t = target(k, shape);
    write(*t.dst, t.overwrite);
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
    Tensor<T>& dst = in.grad_slot();
    const bool overwrite = !dst.defined() || in.grad_stale();
    if (!dst.defined() || !dst.is_unique()) {
      dst = overwrite ? Tensor<T>(shape) : dst.clone();
    }
    in.mark_grad_written();
    return Target{&dst, overwrite};
  }

 private:
  Node<T>& input(int k) noexcept { return node_cast<T>(nodes_[inputs_[k]]); }

  NodeBase* const* nodes_;
  const std::vector<std::uint32_t>& inputs_;
};

}  // namespace detail

template <class T>
void Node<T>::run_backward(detail::NodeBase* const* nodes) {
  detail::Grads<T> grads(nodes, inputs);
  backward(grad_slot(), grads);
}

template <class T>
void Node<T>::replay(detail::NodeBase* const* nodes) {
  std::vector<Tensor<T>> values;
  values.reserve(inputs.size());
  for (std::uint32_t input : inputs) {
    values.push_back(detail::node_cast<T>(nodes[input]).replay_value());
    if (!values.back().defined()) {
      throw Error(detail::cat("internal error: replay of '", op_name(), "' found input node ", input,
                              " without a value"));
    }
  }
  value_ = forward(values);
}

namespace detail {

enum class LeafKind { constant, input, parameter };

/// A leaf: a constant, a user input (with a gradient if asked), or a use of a Parameter. Leaves
/// hold their value for the tape's whole life, so a replay can always read them.
template <class T>
class Leaf final : public Node<T> {
 public:
  Leaf(LeafKind kind, Tensor<T> value, std::shared_ptr<ParamState<T>> param = nullptr)
      : kind_(kind), param_(std::move(param)) {
    this->value_slot() = std::move(value);
  }
  const char* op_name() const noexcept override {
    return kind_ == LeafKind::parameter ? "parameter" : kind_ == LeafKind::input ? "input" : "constant";
  }
  bool is_leaf() const noexcept override { return true; }
  const void* parameter_identity() const noexcept override { return param_.get(); }
  LeafKind kind() const noexcept { return kind_; }

  Tensor<T> forward(typename Node<T>::Inputs) override { return this->replay_value(); }
  void backward(const Tensor<T>&, Grads<T>&) override {}
  void replay(NodeBase* const*) override {}

  Tensor<T>& grad_slot() noexcept override { return param_ ? param_->grad : Node<T>::grad_slot(); }
  bool grad_stale() const noexcept override { return param_ && !param_->grad_valid; }
  void mark_grad_written() noexcept override {
    if (param_) param_->grad_valid = true;
  }
  const Tensor<T>& replay_value() const noexcept override {
    return param_ ? param_->value : Node<T>::replay_value();
  }

 private:
  LeafKind kind_;
  std::shared_ptr<ParamState<T>> param_;
};

}  // namespace detail
}  // namespace remat
