// The first GEMM a program runs makes the kernel choice (Note [GEMM kernel choice]), without the
// program asking for gemm_backend(). CTest starts it with OPENBLAS_CORETYPE=Prescott, OpenBLAS's
// SSE3 kernels, as Debian's OpenBLAS picks on CPUs newer than its table: after one matmul the
// kernels in use must match the CPU's instructions again. Exits non-zero if they do not.
#include <remat/core/cpu.hpp>
#include <remat/core/tape.hpp>
#include <remat/ops/matmul.hpp>
#include <remat/ops/reduce.hpp>

#include <cstdio>

int main() {
  remat::Tape tape;
  const auto a = tape.input(remat::Tensor<float>::from({2, 2}, {1, 2, 3, 4}));
  const float total = remat::sum(remat::matmul(a, a)).item();  // [[7, 10], [15, 22]]
  const char* core = openblas_get_corename();
  const remat::Isa used = remat::detail::openblas_kernel_isa(core);
  std::printf("OpenBLAS kernels after the first GEMM: %s (%s) on a CPU with %s; sum %g\n", core,
              remat::to_string(used), remat::to_string(remat::cpu_isa()), double(total));
  return total == 54.0f && used >= remat::cpu_isa() ? 0 : 1;
}
