#pragma once
/// @file
/// operator<< for Tensor and Var: PyTorch's look, with the shape and dtype spelled out.
///   tensor([[ 0.1234, -1.5000],
///           [ 2.0000,  3.2500]], shape=(2, 2), dtype=float64)
/// Floats print with 4 decimals, or in scientific notation when the values span more than
/// three decades or reach 1e8 (PyTorch's rule); tensors of more than 1000 elements show the
/// first and last 3 entries of each axis around "...".

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/core/var.hpp"

namespace remat {
namespace detail {

template <class T>
constexpr const char* tensor_dtype_name() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return "float32";
  else if constexpr (std::is_same_v<T, double>)
    return "float64";
  else if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return "int8";
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return "uint8";
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return "int16";
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return "int64";
  else
    return "unknown";
}

inline constexpr std::int64_t kPrintThreshold = 1000;  // more elements than this: summarize
inline constexpr std::int64_t kPrintEdge = 3;          // entries shown at each end of an axis

/// Prints one tensor's values; `cells` holds every shown element already formatted.
class TensorPrinter {
 public:
  TensorPrinter(const Shape& shape, bool summarize) : shape_(shape), summarize_(summarize) {}

  /// The indices of axis `axis` that are shown (-1 marks the "..." between the two ends).
  std::vector<std::int64_t> shown(int axis) const {
    const std::int64_t n = shape_[axis];
    std::vector<std::int64_t> out;
    if (!summarize_ || n <= 2 * kPrintEdge) {
      for (std::int64_t i = 0; i < n; ++i) out.push_back(i);
    } else {
      for (std::int64_t i = 0; i < kPrintEdge; ++i) out.push_back(i);
      out.push_back(-1);
      for (std::int64_t i = n - kPrintEdge; i < n; ++i) out.push_back(i);
    }
    return out;
  }

  /// Calls visit(flat index) for every shown element in row-major order.
  template <class Visit>
  void for_each_shown(int axis, std::int64_t base, Visit&& visit) const {
    if (axis == shape_.rank()) {
      visit(base);
      return;
    }
    for (std::int64_t i : shown(axis)) {
      if (i >= 0) for_each_shown(axis + 1, base * shape_[axis] + i, visit);
    }
  }

  /// Writes the nested brackets; `cell(flat index)` gives an element's padded text.
  template <class Cell>
  void write(std::ostream& out, int axis, std::int64_t base, int indent, Cell&& cell) const {
    if (shape_.rank() == 0) {
      out << cell(0);
      return;
    }
    out << '[';
    bool first = true;
    for (std::int64_t i : shown(axis)) {
      if (!first) {
        out << ',';
        if (axis + 1 == shape_.rank())
          out << ' ';
        else
          out << std::string(static_cast<std::size_t>(shape_.rank() - axis - 1), '\n')
              << std::string(indent + axis + 1, ' ');
      }
      first = false;
      if (i < 0) {
        out << "...";
      } else if (axis + 1 == shape_.rank()) {
        out << cell(base * shape_[axis] + i);
      } else {
        write(out, axis + 1, base * shape_[axis] + i, indent, cell);
      }
    }
    out << ']';
  }

 private:
  const Shape& shape_;
  bool summarize_;
};

template <class T>
std::string format_value(T v, bool scientific) {
  char buf[64];
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    std::snprintf(buf, sizeof buf, scientific ? "%.4e" : "%.4f", static_cast<double>(v));
    return buf;
  }
}

}  // namespace detail

template <class T>
std::ostream& operator<<(std::ostream& out, const Tensor<T>& t) {
  if (!t.defined()) return out << "tensor(undefined)";
  const bool summarize = t.numel() > detail::kPrintThreshold;
  const detail::TensorPrinter printer(t.shape(), summarize);
  bool scientific = false;
  if constexpr (std::is_floating_point_v<T>) {
    double lo = INFINITY, hi = 0;
    printer.for_each_shown(0, 0, [&](std::int64_t i) {
      const double a = std::abs(static_cast<double>(t[i]));
      if (std::isfinite(a) && a != 0) {
        lo = std::min(lo, a);
        hi = std::max(hi, a);
      }
    });
    scientific = hi > 0 && (hi / lo > 1000 || hi >= 1e8);
  }
  std::size_t width = 0;
  printer.for_each_shown(0, 0, [&](std::int64_t i) {
    width = std::max(width, detail::format_value(t[i], scientific).size());
  });
  out << "tensor(";
  printer.write(out, 0, 0, 7, [&](std::int64_t i) {
    std::string s = detail::format_value(t[i], scientific);
    return std::string(width - s.size(), ' ') + s;
  });
  return out << ", shape=" << t.shape() << ", dtype=" << detail::tensor_dtype_name<T>() << ')';
}

/// A Var prints as its value.
template <class T>
std::ostream& operator<<(std::ostream& out, const Var<T>& v) {
  return out << v.value();
}

}  // namespace remat
