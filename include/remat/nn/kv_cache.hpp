#pragma once
/// @file
/// KvCache: the keys and values of the positions a decoder has already seen, per layer, so that
/// generating one more token runs the model on that token alone: its query attends over the
/// cache instead of the whole sequence being recomputed. Inference only: nothing here records
/// onto a tape.
///
/// Storage is allocated once, for `capacity` positions, through the counting allocator:
/// 2 x layers x batch x capacity x kv_width elements of T (KvCache::bytes_for), and never grows.
/// A layer's keys are stored rotated (RoPE applied at their own positions, through the same
/// detail::RopeTable as the training ops), so a new query is rotated once and reads them as they
/// are.
///
/// Note [cached attention order]: attend() computes the rows offset..offset+n-1 of the causal
/// attention with the same calls, in the same order, as the training ops' forward
/// (ops/attention.hpp): per (batch, head) one GEMM for the scores, the
/// shared softmax_rows over rows [offset, offset + n) of a (length x length) block, one
/// GEMM for the weighted values. A prefill of the whole prompt (offset 0) is therefore the
/// training forward's arithmetic exactly; a later step differs only where a GEMM of n rows rounds
/// differently from one of n + offset rows (BLAS blocking), at the level of rounding.

#include <cmath>
#include <cstring>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/tensor.hpp"
#include "remat/ops/attention_rows.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/rope.hpp"

namespace remat::nn {

/// Keys and values of `layers` attention layers for `batch` sequences of up to `capacity`
/// positions, kv_width = kv_heads x head_dim wide.
template <class T = float>
class KvCache {
 public:
  KvCache(std::int64_t layers, std::int64_t batch, std::int64_t capacity, std::int64_t kv_width)
      : batch_(batch), capacity_(capacity), width_(kv_width) {
    if (layers < 1 || batch < 1 || capacity < 1 || kv_width < 1) {
      throw ArgumentError(
          detail::cat("nn::KvCache: layers, batch, capacity and kv_width must be "
                      "positive; got layers ",
                      layers, ", batch ", batch, ", capacity ", capacity, ", kv_width ", kv_width));
    }
    keys_.reserve(static_cast<std::size_t>(layers));
    values_.reserve(static_cast<std::size_t>(layers));
    for (std::int64_t l = 0; l < layers; ++l) {
      keys_.emplace_back(Shape{batch, capacity, kv_width});
      values_.emplace_back(Shape{batch, capacity, kv_width});
    }
  }

  /// Bytes a cache of these extents allocates: 2 x layers x batch x capacity x kv_width x
  /// sizeof(T).
  static std::size_t bytes_for(std::int64_t layers, std::int64_t batch, std::int64_t capacity,
                               std::int64_t kv_width) {
    return 2 * static_cast<std::size_t>(layers * batch * capacity * kv_width) * sizeof(T);
  }
  std::size_t bytes() const { return bytes_for(layers(), batch_, capacity_, width_); }

  std::int64_t layers() const noexcept { return static_cast<std::int64_t>(keys_.size()); }
  std::int64_t batch() const noexcept { return batch_; }
  std::int64_t capacity() const noexcept { return capacity_; }
  std::int64_t kv_width() const noexcept { return width_; }
  /// Positions stored (the same in every layer once a forward pass has gone through all).
  std::int64_t length() const noexcept { return length_; }

  /// Keys (rotated) and values of layer l, (batch, capacity, kv_width); positions from length()
  /// on hold stale data.
  const Tensor<T>& keys(std::int64_t l) const { return keys_.at(static_cast<std::size_t>(l)); }
  const Tensor<T>& values(std::int64_t l) const { return values_.at(static_cast<std::size_t>(l)); }

  /// Throws unless n more positions fit (called before a forward pass changes anything).
  void check_room(const char* op, std::int64_t n) const {
    if (n < 1 || length_ + n > capacity_) {
      throw UsageError(detail::cat(op, ": ", n, " new positions do not fit the KV cache (", length_,
                                   " of ", capacity_, " positions used)"));
    }
  }

  /// Layer l's attention for n new positions at length()..length()+n-1: q (batch, n, heads x D),
  /// k and v (batch, n, kv_width) with kv_width = kv_heads x D, kv_heads dividing heads. Rotates
  /// q and k by their positions when `rope` is given (rope->offset is where the cache's first
  /// position sits, 0 for a model's), stores k and v in the cache and returns the causal
  /// attention of the new queries over the stored positions (batch, n, heads x D): all of them,
  /// or the last `window` ones up to each query under a sliding window (ops/attention_rows.hpp).
  /// Call it for every layer, then advance(n).
  Tensor<T> attend(std::int64_t l, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                   std::int64_t heads, const RopeOptions* rope, std::int64_t window = 0) {
    check_attend(l, q, k, v, heads, rope);
    detail::check_window("KvCache::attend", window);
    const std::int64_t n = q.dim(1), d = q.dim(2) / heads, kv_heads = width_ / d;
    const std::int64_t offset = length_, len = offset + n;
    const std::int64_t cq = heads * d, rep = heads / kv_heads;
    Tensor<T>& kc = keys_[static_cast<std::size_t>(l)];
    Tensor<T>& vc = values_[static_cast<std::size_t>(l)];
    Tensor<T> qr = q;
    if (rope) {
      detail::check_rope_options("KvCache::attend", *rope);
      qr = Tensor<T>(q.shape());
      RopeOptions at = *rope;  // every field the model's rotation has, shifted to these positions
      at.offset += offset;
      const detail::RopeTable<T> table(n, d, at);
      table.apply(q.data(), cq, qr.data(), cq, batch_ * n, n, heads, false);
      for (std::int64_t b = 0; b < batch_; ++b) {
        table.apply(k.data() + b * n * width_, width_, row(kc, b, offset), width_, n, n, kv_heads,
                    false);
      }
    } else {
      for (std::int64_t b = 0; b < batch_; ++b)
        std::memcpy(row(kc, b, offset), k.data() + b * n * width_, sizeof(T) * n * width_);
    }
    for (std::int64_t b = 0; b < batch_; ++b)
      std::memcpy(row(vc, b, offset), v.data() + b * n * width_, sizeof(T) * n * width_);

    Tensor<T> y(q.shape());
    // Rows offset..len-1 of one head's (len x len) scores. The training ops keep every head's
    // scores in one (B, H, T, T) tensor, and the softmax's vectorized reductions round by the
    // address alignment of a row; placing this head's rows at the alignment they have there
    // keeps a prefill bitwise equal to the training forward (Note [cached attention order]).
    constexpr std::int64_t align = std::int64_t(detail::kTensorAlignment / sizeof(T));
    Tensor<T> scratch(Shape{n * len + align});
    const T scale = T(1) / std::sqrt(T(d));
    for (std::int64_t b = 0; b < batch_; ++b) {
      for (std::int64_t h = 0; h < heads; ++h) {
        T* scores = scratch.data() + ((b * heads + h) * n * len) % align;
        const T* qh = qr.data() + b * n * cq + h * d;
        const T* kh = row(kc, b, 0) + (h / rep) * d;
        const T* vh = row(vc, b, 0) + (h / rep) * d;
        detail::gemm<T>(false, true, n, len, d, scale, qh, cq, kh, width_, T(0), scores, len);
        detail::softmax_rows<T>(scores, len, nullptr, offset, len,
                                detail::KeyRange{.window = window});
        detail::gemm<T>(false, false, n, d, len, T(1), scores, len, vh, width_, T(0),
                        y.data() + b * n * cq + h * d, cq);
      }
    }
    return y;
  }

  /// Marks n more positions as stored, once every layer has attended over them.
  void advance(std::int64_t n) {
    check_room("KvCache::advance", n);
    length_ += n;
  }

  /// Forgets every position (the storage stays allocated).
  void clear() noexcept { length_ = 0; }

 private:
  T* row(Tensor<T>& t, std::int64_t b, std::int64_t pos) const {
    return t.data() + (b * capacity_ + pos) * width_;
  }

  void check_attend(std::int64_t l, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                    std::int64_t heads, const RopeOptions* rope) const {
    const bool dims = q.rank() == 3 && q.dim(0) == batch_ && heads >= 1 && q.dim(2) % heads == 0 &&
                      q.dim(2) >= heads;
    const std::int64_t d = dims ? q.dim(2) / heads : 1;
    const bool ok = dims && l >= 0 && l < layers() && width_ % d == 0 &&
                    heads % (width_ / d) == 0 && (!rope || d % 2 == 0) &&
                    k.shape() == Shape{batch_, q.dim(1), width_} && v.shape() == k.shape();
    if (!ok) {
      throw ShapeError(detail::cat("KvCache::attend: needs a layer below ", layers(), ", q (",
                                   batch_, ", n, heads x D) with D even under RoPE, k and v (",
                                   batch_, ", n, ", width_, ") with kv_heads x D = ", width_,
                                   " and kv_heads dividing heads; got layer ", l, ", q ", q.shape(),
                                   ", k ", k.shape(), ", v ", v.shape(), ", heads ", heads));
    }
    check_room("KvCache::attend", q.dim(1));
  }

  std::int64_t batch_, capacity_, width_;
  std::int64_t length_ = 0;
  std::vector<Tensor<T>> keys_, values_;
};

}  // namespace remat::nn
