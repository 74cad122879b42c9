#pragma once
/// @file
/// detail::KernelScratch: the calling thread's reusable buffers for kernels that pack their
/// operands.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

namespace remat::detail {

/// A thread's scratch for kernels that pack their operands (gemm_bf16: Note [BF16 GEMM packing]),
/// kept from call to call: fresh pages for every call cost more than the packing. Outside the
/// allocator's count, like OpenBLAS's own buffers. Grows to the largest request;
/// memory::release_cache() gives the calling thread's back.
class KernelScratch {
 public:
  /// Room for `a` and then `b` values of T (contents unspecified), as two pointers, each
  /// 64-byte aligned.
  template <class T>
  std::pair<T*, T*> reserve(std::int64_t a, std::int64_t b) {
    const std::size_t b_offset = round_up(static_cast<std::size_t>(a) * sizeof(T));
    const std::size_t bytes = b_offset + static_cast<std::size_t>(b) * sizeof(T);
    if (bytes > bytes_) {
      release();  // before the new allocation: never both at once, nothing held if it throws
      data_.reset(static_cast<std::byte*>(::operator new(bytes, kAlign)));
      bytes_ = bytes;
    }
    return {reinterpret_cast<T*>(data_.get()), reinterpret_cast<T*>(data_.get() + b_offset)};
  }
  /// Bytes held.
  std::size_t bytes() const noexcept { return bytes_; }
  void release() noexcept {
    data_.reset();
    bytes_ = 0;
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  struct Free {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, kAlign); }
  };
  static std::size_t round_up(std::size_t bytes) noexcept { return (bytes + 63) / 64 * 64; }

  std::unique_ptr<std::byte, Free> data_;
  std::size_t bytes_ = 0;
};

inline KernelScratch& kernel_scratch() noexcept {
  thread_local KernelScratch scratch;
  return scratch;
}

}  // namespace remat::detail
