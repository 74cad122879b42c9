#pragma once
/// @file
/// Shape: the extents of a tensor, up to kMaxRank axes, stored inline (no allocation).

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>

#include "remat/core/error.hpp"

namespace remat {

class Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(std::span<const std::int64_t> dims) { assign(dims.begin(), dims.end()); }

  int rank() const noexcept { return rank_; }

  /// Extent of an axis; negative axes count from the end (-1 is the last).
  std::int64_t operator[](int axis) const { return dims_[normalize_axis(axis)]; }

  /// Number of elements: the product of the extents (1 for a rank-0 shape).
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }

  /// Extent of the last axis (1 for a rank-0 shape).
  std::int64_t last() const noexcept { return rank_ == 0 ? 1 : dims_[rank_ - 1]; }

  /// Product of all extents but the last: the number of rows when viewed as a matrix.
  std::int64_t rows() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i + 1 < rank_; ++i) n *= dims_[i];
    return n;
  }

  /// Maps a possibly negative axis into [0, rank) or throws an IndexError naming it.
  int normalize_axis(int axis) const {
    const int a = axis < 0 ? axis + rank_ : axis;
    if (a < 0 || a >= rank_) {
      std::ostringstream msg;
      msg << "axis " << axis << " is out of range for a tensor of shape ";
      print(msg);
      throw IndexError(msg.str());
    }
    return a;
  }

  /// The same shape with one axis set to a new extent.
  Shape with(int axis, std::int64_t extent) const {
    Shape s = *this;
    s.dims_[normalize_axis(axis)] = check_extent(extent);
    return s;
  }

  /// The same shape with the last axis replaced by `extent`.
  Shape with_last(std::int64_t extent) const { return with(-1, extent); }

  /// The same shape with one more axis of extent `extent` at the end.
  Shape appended(std::int64_t extent) const {
    Shape s = *this;
    s.push_back(extent);
    return s;
  }

  /// The shape without its last `count` axes.
  Shape dropped_back(int count = 1) const {
    Shape s = *this;
    s.rank_ = rank_ > count ? rank_ - count : 0;
    for (int i = s.rank_; i < kMaxRank; ++i) s.dims_[i] = 0;
    return s;
  }

  const std::int64_t* begin() const noexcept { return dims_.data(); }
  const std::int64_t* end() const noexcept { return dims_.data() + rank_; }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    return a.rank_ == b.rank_ && a.dims_ == b.dims_;
  }

  void print(std::ostream& out) const {
    out << '(';
    for (int i = 0; i < rank_; ++i) out << (i ? ", " : "") << dims_[i];
    out << (rank_ == 1 ? ",)" : ")");
  }

  friend std::ostream& operator<<(std::ostream& out, const Shape& s) {
    s.print(out);
    return out;
  }

 private:
  template <class It>
  void assign(It first, It last) {
    for (; first != last; ++first) push_back(*first);
  }

  void push_back(std::int64_t extent) {
    if (rank_ == kMaxRank) {
      throw ShapeError(detail::cat("Shape: more than ", kMaxRank, " axes are not supported"));
    }
    dims_[rank_++] = check_extent(extent);
  }

  static std::int64_t check_extent(std::int64_t extent) {
    if (extent < 0) throw ShapeError(detail::cat("Shape: negative extent ", extent));
    return extent;
  }

  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace remat
