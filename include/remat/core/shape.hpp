#pragma once
/// @file
/// Shape: the extents of a tensor, up to kMaxRank axes, stored inline (no allocation).
///
/// Every Shape holds at most 2^63 - 1 elements: the constructors and every method that builds a
/// new Shape throw a ShapeError naming the extents when their product does not fit in an
/// int64_t, so numel() never overflows. A shape with a zero extent holds no element whatever its
/// other extents are, and is accepted; rows() of such a shape may still overflow (a zero last
/// extent after huge ones), which it reports as a ShapeError.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>

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

  /// Number of elements: the product of the extents (1 for a rank-0 shape, 0 when an extent is
  /// 0). Never overflows: a Shape holds at most 2^63 - 1 elements (see the file comment).
  std::int64_t numel() const noexcept { return product(0, rank_).value_or(0); }

  /// Extent of the last axis (1 for a rank-0 shape).
  std::int64_t last() const noexcept { return rank_ == 0 ? 1 : dims_[rank_ - 1]; }

  /// Product of all extents but the last: the number of rows when viewed as a matrix. Throws a
  /// ShapeError when it does not fit in an int64_t, which only a shape holding no element can
  /// reach (its last extent is 0).
  std::int64_t rows() const { return checked_product(0, rank_ > 0 ? rank_ - 1 : 0, "rows"); }

  /// Product of the extents of axes [first, last) (1 when empty), or a ShapeError naming `what`
  /// and the shape when it does not fit in an int64_t (possible only when another axis is 0).
  std::int64_t checked_product(int first, int last, const char* what) const {
    if (const auto n = product(first, last)) return *n;
    std::ostringstream msg;
    msg << what << ": the product of extents " << first << " to " << last - 1 << " of ";
    print(msg);
    msg << " exceeds 2^63 - 1";
    throw ShapeError(msg.str());
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
    s.check_size();
    return s;
  }

  /// The same shape with the last axis replaced by `extent`.
  Shape with_last(std::int64_t extent) const { return with(-1, extent); }

  /// The same shape with one more axis of extent `extent` at the end.
  Shape appended(std::int64_t extent) const {
    Shape s = *this;
    s.push_back(extent);
    s.check_size();
    return s;
  }

  /// The shape without its last `count` axes.
  Shape dropped_back(int count = 1) const {
    Shape s = *this;
    s.rank_ = rank_ > count ? rank_ - count : 0;
    for (int i = s.rank_; i < kMaxRank; ++i) s.dims_[i] = 0;
    s.check_size();  // dropping a zero extent can leave huge ones
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
    check_size();
  }

  void push_back(std::int64_t extent) {
    if (rank_ == kMaxRank) {
      throw ShapeError(detail::cat("Shape: more than ", kMaxRank, " axes are not supported"));
    }
    dims_[rank_++] = check_extent(extent);
  }

  /// The product of the extents of axes [first, last): 0 as soon as one of them is 0, nullopt
  /// when it exceeds INT64_MAX.
  std::optional<std::int64_t> product(int first, int last) const noexcept {
    for (int i = first; i < last; ++i) {
      if (dims_[i] == 0) return 0;
    }
    std::int64_t n = 1;
    for (int i = first; i < last; ++i) {
      if (dims_[i] > INT64_MAX / n) return std::nullopt;
      n *= dims_[i];
    }
    return n;
  }

  /// Throws a ShapeError unless the shape holds at most INT64_MAX elements.
  void check_size() const {
    if (product(0, rank_)) return;
    std::ostringstream msg;
    msg << "Shape: extents ";
    print(msg);
    msg << " hold more than 2^63 - 1 elements";
    throw ShapeError(msg.str());
  }

  static std::int64_t check_extent(std::int64_t extent) {
    if (extent < 0) throw ShapeError(detail::cat("Shape: negative extent ", extent));
    return extent;
  }

  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace remat
