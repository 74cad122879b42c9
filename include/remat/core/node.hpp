#pragma once
/// @file
/// Tape nodes. A node is one recorded operation: its input nodes, its forward recipe (the op and
/// its non-tensor arguments, as members of the concrete node), the tensors its backward needs,
/// and its gradient. Because the recipe is kept, a range of nodes can be run again from its
/// inputs: that is how a checkpoint segment is replayed.
///
/// Node<T> is also the public base of a custom op (docs/guide.md, "Writing your own op"): derive
/// from it, implement op_type(), forward() and backward(), and record it with remat::apply().
///
/// Note [saved tensors]: forward() hands what backward() will need to save(); the tape decides
/// whether save() keeps it (a node recorded inside a checkpoint segment keeps nothing during the
/// first forward pass, and everything during its replay). release_saved() drops it all. Under
/// Precision::bf16 what it keeps may be a bfloat16 copy (Note [BF16 saves] in
/// core/precision.hpp).

#include <array>
#include <cstdint>
#include <memory>
#include <ostream>
#include <span>
#include <type_traits>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/hash.hpp"
#include "remat/core/op_type.hpp"
#include "remat/core/parallel.hpp"
#include "remat/core/precision.hpp"
#include "remat/core/tensor.hpp"

namespace remat {
namespace detail {

inline constexpr std::uint32_t kNone = 0xffffffffU;

/// True when t is undefined or holds no NaN and no infinity (always true for integers).
template <class T>
bool all_finite(const Tensor<T>& t) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    return !t.has_data() || t.array().isFinite().all();
  } else {
    return true;
  }
}

class NodeBase;
/// The tape's node list as the sweeps hand it to nodes: node i is table[i].
using NodeTable = const std::unique_ptr<NodeBase>*;

/// The untyped face of a node, which is all the tape's sweeps need.
class NodeBase {
 public:
  NodeBase() = default;
  NodeBase(const NodeBase&) = delete;
  NodeBase& operator=(const NodeBase&) = delete;
  virtual ~NodeBase() = default;

  /// The op's identity (core/op_type.hpp): what save policies match on.
  virtual const OpType& op_type() const noexcept = 0;
  /// The op's name as users call it ("matmul", "layer_norm", ...), for messages.
  const char* op_name() const noexcept { return op_type().name(); }
  virtual bool is_leaf() const noexcept { return false; }
  /// Whether forward() and backward() run shape-only (Note [shape-only execution] in
  /// core/shape_only.hpp): allocate exactly what they allocate in a real run and skip their
  /// arithmetic when remat::is_shape_only(). Every built-in op does; a custom op says so by
  /// overriding this, and a shape-only run refuses one that does not.
  virtual bool runs_shape_only() const noexcept { return false; }
  /// The Parameter a leaf stands for (Parameter::identity()), null for every other node.
  virtual const void* parameter_identity() const noexcept { return nullptr; }

  /// Runs forward() again from the values held by the input nodes and keeps the output in the
  /// node's value slot (checkpoint replay). Returns the FLOPs it cost (forward_flops()).
  virtual double replay(NodeTable nodes) = 0;
  /// Runs backward() with the node's gradient, accumulating into the input nodes' gradients.
  virtual void run_backward(NodeTable nodes) = 0;

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

  std::vector<std::uint32_t> inputs;   ///< ids of the input nodes
  std::uint32_t id = kNone;            ///< position in the tape (kNone when not recorded)
  std::uint32_t segment = kNone;       ///< innermost checkpoint segment holding this node
  std::uint32_t last_capture = kNone;  ///< last segment that kept this node's value as an input
  std::uint32_t keep_count = 0;        ///< segments keeping the value slot alive
  std::uint64_t hash = 0;              ///< fingerprint of the output taken in the forward pass
  /// The output's shape, kept when the value is released: the shape every gradient added for
  /// this node must have (Grads checks what a custom op's backward hands it).
  Shape shape;
  bool has_hash = false;
  bool requires_grad = false;
  bool saving = false;        ///< whether save() keeps tensors in this forward run
  bool kept = false;          ///< kept by its segment's save policy (Note [kept nodes])
  bool replay_reads = false;  ///< kept, and a replayed op reads its value slot
  bool resaved = false;       ///< kept, and its replay re-saves instead of recomputing
  /// In a segment whose policy may keep it, what its first forward's tentative save() held:
  /// anything, and anything that is not one of its inputs (Note [chained segments]).
  bool saved_any = false;
  bool saved_fresh = false;
  /// Recorded under Precision::bf16: its GEMMs round to bfloat16 and save() keeps bfloat16
  /// copies of activations (Note [BF16 saves] in core/precision.hpp).
  bool bf16 = false;
  /// Bit k: input k holds what a parameter holds, which save() keeps as it is (Note [BF16
  /// saves]). Inputs past the 64th count as such.
  std::uint64_t parameter_inputs = ~std::uint64_t{0};
  /// Its output is (a view of) what a parameter holds: a reshape of a weight, a pass-through.
  bool parameter_view = false;
  /// Whether its value is what a parameter holds: a parameter's leaf, or a view of one.
  bool holds_parameter() const noexcept {
    return parameter_identity() != nullptr || parameter_view;
  }
  /// Whether `t` is (a view of) what one of the inputs in[k] that hold a parameter holds.
  template <class Values, class Value>
  bool parameter_held(const Values& in, const Value& t) const noexcept {
    for (std::size_t k = 0; k < in.size(); ++k) {
      const bool parameter = k >= 64 || ((parameter_inputs >> k) & 1u) != 0;
      if (parameter && in[k].shares_storage_with(t)) return true;
    }
    return false;
  }
};

}  // namespace detail

template <class T>
class Grads;

/// Base of every differentiable operation on Tensor<T>, built-in or custom. An op derives from
/// it, keeps its non-tensor arguments as members, and implements op_type(), forward() and
/// backward() side by side; remat::apply() records it. The members below "Internals" are the
/// tape's; an op does not override them.
template <class T>
class Node : public detail::NodeBase {
 public:
  using Scalar = T;
  using Inputs = std::span<const Tensor<T>>;

  /// Computes the output from the input values and save()s what backward() needs. Must be
  /// deterministic: a checkpoint replay calls it again and expects the same bits. Must not write
  /// into its inputs (they are shared with the rest of the step).
  virtual Tensor<T> forward(Inputs in) = 0;

  /// Adds the gradient of each input that needs one into `grads`, given `grad_out` (the
  /// gradient of the output, shaped like it).
  virtual void backward(const Tensor<T>& grad_out, Grads<T>& grads) = 0;

  /// Estimated FLOPs of forward(), for save policies (OpInfo::flops): one per output element
  /// unless the op says otherwise (GEMMs do).
  virtual double forward_flops(Inputs in, const Tensor<T>& out) const {
    (void)in;
    return static_cast<double>(out.numel());
  }

  /// Whether resave() can stand in for forward() during a replay (Note [kept nodes]).
  virtual bool can_resave() const noexcept { return false; }
  /// save()s what backward() needs from the inputs and the output forward() computed before,
  /// without computing anything. Ops whose backward needs only those (GEMMs) override it.
  /// `out` is undefined when no replayed op reads the kept output (it was dropped early, Note
  /// [chained segments] in tape_state.hpp): an op whose backward needs its output must not
  /// claim can_resave().
  virtual void resave(Inputs in, const Tensor<T>& out) {
    (void)in;
    (void)out;
  }

  // ---- Internals (the tape's) ---------------------------------------------------------------

  /// Where gradients for this node's output accumulate.
  virtual Tensor<T>& grad_slot() noexcept { return grad_; }
  /// True when grad_slot() holds a buffer to overwrite rather than a gradient to add to.
  virtual bool grad_stale() const noexcept { return false; }
  virtual void mark_grad_written() noexcept {}
  /// The value this node feeds its consumers during a replay.
  virtual const Tensor<T>& replay_value() const noexcept { return value_; }

  Tensor<T>& value_slot() noexcept { return value_; }

  double replay(detail::NodeTable nodes) override;
  /// forward(in), with save() knowing the inputs (which of them leaves hold).
  Tensor<T> run_forward(Inputs in) {
    const InputsWhileForward scope(*this, in);
    return forward(in);
  }
  void run_backward(detail::NodeTable nodes) override;  // defined in grads.hpp

  bool has_grad() const noexcept override {
    return !grad_stale() && const_cast<Node*>(this)->grad_slot().defined();
  }
  bool has_value() const noexcept override { return replay_value().defined(); }
  void release_saved() noexcept override {
    for (Tensor<T>& s : saved_) s.reset();
    for (Tensor<std::uint16_t>& s : copies_) s.reset();
  }
  void release_grad() noexcept override { grad_.reset(); }
  void release_value() noexcept override { value_.reset(); }
  std::uint64_t value_hash() const noexcept override { return detail::hash_tensor(replay_value()); }
  std::size_t saved_bytes() const noexcept override {
    return distinct_bytes(saved_) + distinct_bytes(copies_);
  }
  bool value_is_finite() const noexcept override { return detail::all_finite(replay_value()); }
  bool grad_is_finite() const noexcept override {
    return detail::all_finite(const_cast<Node*>(this)->grad_slot());
  }
  void print_value_shape(std::ostream& out) const override { out << replay_value().shape(); }

  /// Records in saved_any and saved_fresh what save() holds, `in` being the input values.
  void note_saved(std::span<const Tensor<T>> in) noexcept {
    saved_any = saved_fresh = false;
    for (const Tensor<std::uint16_t>& c : copies_)  // a copy is a new buffer: fresh
      if (c.defined()) saved_any = saved_fresh = true;
    for (const Tensor<T>& t : saved_) {
      if (!t.defined()) continue;
      saved_any = true;
      bool input = false;
      for (const Tensor<T>& v : in) input |= v.defined() && v.shares_storage_with(t);
      saved_fresh |= !input;
    }
  }

 protected:
  /// Slots save() offers: 0 .. kMaxSaved - 1.
  static constexpr int kMaxSaved = 4;

  /// Keeps `t` in `slot` for backward() when the tape asks this run to save (see Note [saved
  /// tensors]); a no-op otherwise, so forward() calls it unconditionally.
  /// Under Precision::bf16 it keeps a bfloat16 copy of an activation (Note [BF16 saves]).
  void save(int slot, const Tensor<T>& t) {
    const auto s = checked_slot(slot);
    if (!saving) return;
    if constexpr (std::is_same_v<T, float>) {
      if (bf16 && t.defined() && t.numel() > 0 && !parameter_held(forward_inputs_, t)) {
        copies_[s] = detail::bf16_save_cache().copy_of(t);
        saved_[s].reset();
        return;
      }
    }
    saved_[s] = t;
    copies_[s].reset();
  }
  /// save(), but always the tensor itself: statistics and values that stay float32 in BF16
  /// training (a norm's reciprocal deviations, a loss's log-sum-exp).
  void save_exact(int slot, const Tensor<T>& t) {
    const auto s = checked_slot(slot);
    if (!saving) return;
    saved_[s] = t;
    copies_[s].reset();
  }
  /// What forward() saved in `slot` (valid inside backward()); not defined for a slot whose
  /// copy the op reads itself (reads_copy()).
  const Tensor<T>& saved(int slot) const noexcept { return saved_[static_cast<std::size_t>(slot)]; }
  /// The bfloat16 copy save() kept in `slot` (Note [BF16 saves]), or an undefined tensor; valid
  /// in forward() once save() ran, and inside backward().
  const Tensor<std::uint16_t>& saved_copy(int slot) const noexcept {
    return copies_[static_cast<std::size_t>(slot)];
  }
  /// The shape of what forward() saved in `slot`, a copy or the tensor.
  Shape saved_shape(int slot) const {
    const Tensor<std::uint16_t>& copy = saved_copy(slot);
    return copy.defined() ? copy.shape() : saved(slot).shape();
  }
  /// Whether backward() reads `slot` only through saved_copy() (a GEMM packs the bfloat16
  /// values as they are): the tape then leaves that copy as it is, no float tensor is made of it
  /// for the backward pass.
  virtual bool reads_copy(int slot) const noexcept {
    (void)slot;
    return false;
  }

 private:
  /// Sets what save() reads for the duration of one forward() or resave().
  class InputsWhileForward {
   public:
    InputsWhileForward(Node& n, Inputs in) noexcept : n_(n) { n_.forward_inputs_ = in; }
    ~InputsWhileForward() { n_.forward_inputs_ = {}; }
    InputsWhileForward(const InputsWhileForward&) = delete;
    InputsWhileForward& operator=(const InputsWhileForward&) = delete;

   private:
    Node& n_;
  };

  std::size_t checked_slot(int slot) const {
    if (slot < 0 || slot >= kMaxSaved) {
      throw UsageError(
          detail::cat(op_name(), ": save() slot ", slot, " is out of range [0, ", kMaxSaved, ")"));
    }
    return static_cast<std::size_t>(slot);
  }
  /// Widens the bfloat16 copies into saved_ for backward() (a copy two slots share, once).
  void widen_copies() {
    if constexpr (std::is_same_v<T, float>) {  // only float ops save copies
      for (std::size_t i = 0; i < copies_.size(); ++i) {
        if (!copies_[i].defined() || reads_copy(static_cast<int>(i))) continue;
        for (std::size_t j = 0; j < i && !saved_[i].defined(); ++j)
          if (saved_[j].defined() && copies_[j].shares_storage_with(copies_[i]))
            saved_[i] = saved_[j].reshape(copies_[i].shape());
        if (!saved_[i].defined()) saved_[i] = detail::widened(copies_[i]);
      }
    }
  }
  /// Frees what widen_copies() made.
  void drop_widened() noexcept {
    for (std::size_t i = 0; i < copies_.size(); ++i)
      if (copies_[i].defined()) saved_[i].reset();
  }
  template <class U>
  static std::size_t distinct_bytes(const std::array<Tensor<U>, kMaxSaved>& slots) noexcept {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      bool seen = false;
      for (std::size_t j = 0; j < i; ++j)
        seen |= slots[j].defined() && slots[j].shares_storage_with(slots[i]);
      if (!seen && slots[i].defined()) bytes += slots[i].bytes();
    }
    return bytes;
  }

  std::array<Tensor<T>, kMaxSaved> saved_;
  std::array<Tensor<std::uint16_t>, kMaxSaved> copies_;  ///< bfloat16 saves (Note [BF16 saves])
  Inputs forward_inputs_;
  Tensor<T> grad_;
  Tensor<T> value_;
};

namespace detail {

template <class T>
Node<T>& node_cast(NodeBase* n) noexcept {
  return static_cast<Node<T>&>(*n);
}

}  // namespace detail

template <class T>
double Node<T>::replay(detail::NodeTable nodes) {
  std::vector<Tensor<T>> values;
  values.reserve(inputs.size());
  for (std::uint32_t input : inputs) {
    values.push_back(detail::node_cast<T>(nodes[input].get()).replay_value());
    REMAT_ASSERT(values.back().defined(), "replay of '", op_name(), "' found input node ", input,
                 " without a value");
  }
  if (resaved) {
    const InputsWhileForward scope(*this, values);
    resave(values, value_);  // the output kept from the first pass (Note [kept nodes])
    return 0;
  }
  value_ = run_forward(values);
  return forward_flops(values, value_);
}

}  // namespace remat

#include "remat/core/grads.hpp"  // Grads and Node::run_backward, which need Node complete
