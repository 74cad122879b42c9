#pragma once
/// @file
/// Tensor<T>: a shape and a contiguous row-major buffer shared by reference count. Copying a
/// Tensor shares the buffer; clone() copies it. Eigen maps give the math a vectorized view.

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/shape.hpp"

namespace remat {
namespace detail {
template <class T>
class WeakTensor;
}  // namespace detail

template <class T>
class Tensor {
  static_assert(std::is_arithmetic_v<T>, "remat::Tensor holds arithmetic element types only");

 public:
  using Scalar = T;
  using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
  using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
  using MatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  using ConstMatrixMap =
      Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

  /// The most bytes one tensor may hold (far beyond any machine's memory; it keeps size
  /// arithmetic from overflowing).
  static constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 62;

  /// An undefined tensor: no shape, no storage.
  Tensor() = default;

  /// A tensor of the given shape whose elements are uninitialized.
  explicit Tensor(const Shape& shape) : shape_(shape), defined_(true) {
    // A Shape's elements fit in int64_t, but their bytes may not fit in size_t (or in the
    // allocator's rounding): no machine holds 2^62 bytes, so refuse before multiplying.
    if (static_cast<std::uint64_t>(shape.numel()) > kMaxBytes / sizeof(T)) {
      throw ShapeError(detail::cat("Tensor: shape ", shape, " holds ", shape.numel(),
                                   " elements of ", sizeof(T), " bytes, more than the 2^62 bytes ",
                                   "a tensor may hold"));
    }
    owner_ = detail::allocate_storage<T>(static_cast<std::size_t>(shape.numel()) * sizeof(T));
    data_ = owner_.get();
  }

  static Tensor full(const Shape& shape, T value) {
    Tensor t(shape);
    t.fill(value);
    return t;
  }

  static Tensor zeros(const Shape& shape) { return full(shape, T(0)); }
  static Tensor ones(const Shape& shape) { return full(shape, T(1)); }

  /// A rank-0 tensor holding one value.
  static Tensor scalar(T value) { return full(Shape{}, value); }

  /// A tensor of the given shape holding a copy of `values` (row-major).
  static Tensor from(const Shape& shape, std::span<const T> values) {
    if (static_cast<std::int64_t>(values.size()) != shape.numel()) {
      throw ShapeError(detail::cat("Tensor::from: shape ", shape, " needs ", shape.numel(),
                                   " values, got ", values.size()));
    }
    Tensor t(shape);
    if (t.has_data()) std::copy(values.begin(), values.end(), t.data());
    return t;
  }

  static Tensor from(const Shape& shape, std::initializer_list<T> values) {
    return from(shape, std::span<const T>(values.begin(), values.size()));
  }

  bool defined() const noexcept { return defined_; }
  /// False for a tensor made in a shape-only run (core/shape_only.hpp): it has a shape and no
  /// elements to read or write. True for every other defined tensor.
  bool has_data() const noexcept { return defined_ && (data_ != nullptr || numel() == 0); }
  const Shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::int64_t dim(int axis) const { return shape_[axis]; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * sizeof(T); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  /// The elements in order; these and at(), array() and matrix() throw a UsageError on a
  /// tensor made shape-only (it has none), where data() is null. operator[] stays unchecked.
  T* begin() { return values("begin"); }
  T* end() { return values("end") + numel(); }
  const T* begin() const { return values("begin"); }
  const T* end() const { return values("end") + numel(); }

  /// Flat (row-major) element access, unchecked.
  T& operator[](std::int64_t i) noexcept { return data_[i]; }
  const T& operator[](std::int64_t i) const noexcept { return data_[i]; }

  /// Element access by coordinates, checked.
  T& at(std::initializer_list<std::int64_t> index) { return values("at")[offset_of(index)]; }
  const T& at(std::initializer_list<std::int64_t> index) const {
    return values("at")[offset_of(index)];
  }

  /// The single value of a one-element tensor.
  T item() const {
    if (numel() != 1) {
      throw ShapeError(detail::cat("Tensor::item: needs exactly one element, shape is ", shape_));
    }
    if (!has_data()) {
      throw UsageError("Tensor::item: the tensor was made in a shape-only run and has no value");
    }
    return data_[0];
  }

  ArrayMap array() { return ArrayMap(values("array"), numel()); }
  ConstArrayMap array() const { return ConstArrayMap(values("array"), numel()); }

  /// The tensor as a (rows x last axis) row-major matrix.
  MatrixMap matrix() { return MatrixMap(values("matrix"), shape_.rows(), shape_.last()); }
  ConstMatrixMap matrix() const {
    return ConstMatrixMap(values("matrix"), shape_.rows(), shape_.last());
  }

  /// The same buffer seen with another shape of the same number of elements.
  Tensor reshape(const Shape& shape) const {
    if (shape.numel() != numel()) {
      throw ShapeError(detail::cat("reshape: cannot view shape ", shape_, " (", numel(),
                                   " elements) as ", shape, " (", shape.numel(), " elements)"));
    }
    Tensor t = *this;
    t.shape_ = shape;
    return t;
  }

  /// A view of entries [begin, end) along the first axis; shares the buffer.
  Tensor narrow_rows(std::int64_t begin, std::int64_t end) const {
    if (rank() == 0 || begin < 0 || end < begin || end > shape_[0]) {
      throw IndexError(detail::cat("narrow_rows: range [", begin, ", ", end,
                                   ") does not fit the first axis of shape ", shape_));
    }
    Tensor t = *this;
    t.shape_ = shape_.with(0, end - begin);
    if (data_ != nullptr) t.data_ = data_ + begin * (shape_[0] == 0 ? 0 : numel() / shape_[0]);
    return t;
  }

  /// A deep copy with its own buffer.
  Tensor clone() const {
    if (!defined_) return Tensor();
    Tensor t(shape_);
    if (numel() > 0 && has_data() && t.has_data()) std::memcpy(t.data(), data_, bytes());
    return t;
  }

  /// Sets every element (nothing to set in a shape-only tensor).
  void fill(T value) noexcept {
    if (data_ != nullptr) std::fill(data_, data_ + numel(), value);
  }

  /// True when no other Tensor shares this buffer, so writing into it is invisible elsewhere.
  bool is_unique() const noexcept { return owner_.use_count() <= 1; }

  /// True when both hold the same buffer. Compares owners, not addresses: in a shape-only run
  /// every buffer is null, and two tensors still share one only when one was copied from the
  /// other.
  bool shares_storage_with(const Tensor& other) const noexcept {
    return owner_.use_count() > 0 && !owner_.owner_before(other.owner_) &&
           !other.owner_.owner_before(owner_);
  }

  std::vector<T> to_vector() const {
    const T* first = begin();  // refuses a shape-only tensor, naming begin()
    return std::vector<T>(first, first + numel());
  }

  /// Drops the reference to the buffer; the tensor becomes undefined.
  void reset() noexcept { *this = Tensor(); }

 private:
  /// data(), refusing a tensor made shape-only (`what` names the accessor asking).
  T* values(const char* what) const {
    if (defined_ && data_ == nullptr && numel() > 0) {
      throw UsageError(detail::cat("Tensor::", what, ": the tensor ", shape_,
                                   " was made in a shape-only run (ShapeOnly) and has no values"));
    }
    return data_;
  }
  std::int64_t offset_of(std::initializer_list<std::int64_t> index) const {
    if (static_cast<int>(index.size()) != rank()) {
      throw IndexError(detail::cat("Tensor::at: ", index.size(), " indices for shape ", shape_));
    }
    std::int64_t offset = 0;
    int axis = 0;
    for (std::int64_t i : index) {
      if (i < 0 || i >= shape_[axis]) {
        throw IndexError(detail::cat("Tensor::at: index ", i, " out of range on axis ", axis,
                                     " of shape ", shape_));
      }
      offset = offset * shape_[axis] + i;
      ++axis;
    }
    return offset;
  }

  friend class detail::WeakTensor<T>;

  Shape shape_;
  std::shared_ptr<T> owner_;
  T* data_ = nullptr;
  bool defined_ = false;
};

namespace detail {

/// A Tensor that does not keep its buffer alive: lock() gives the tensor back while something
/// else holds the buffer, an undefined one after. (The BF16 save cache's entries, Note [BF16
/// saves] in core/precision.hpp.)
template <class T>
class WeakTensor {
 public:
  WeakTensor() = default;
  explicit WeakTensor(const Tensor<T>& t) : owner_(t.owner_), data_(t.data_), shape_(t.shape_) {}

  Tensor<T> lock() const {
    Tensor<T> t;
    t.owner_ = owner_.lock();
    if (t.owner_.use_count() == 0) return Tensor<T>();  // (a shape-only buffer's owner is null)
    t.data_ = data_;
    t.shape_ = shape_;
    t.defined_ = true;
    return t;
  }
  bool expired() const noexcept { return owner_.expired(); }
  /// Orders by buffer (its owner), then by the first element and the element count, so that
  /// two views of one buffer are told apart and a buffer freed and reallocated is a new one.
  bool operator<(const WeakTensor& other) const noexcept {
    if (owner_.owner_before(other.owner_)) return true;
    if (other.owner_.owner_before(owner_)) return false;
    if (data_ != other.data_) return std::less<const T*>()(data_, other.data_);
    return shape_.numel() < other.shape_.numel();
  }

 private:
  std::weak_ptr<T> owner_;
  T* data_ = nullptr;
  Shape shape_;
};

}  // namespace detail
}  // namespace remat
