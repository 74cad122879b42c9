// A second TU of the same target: built from the same precompiled header, and linked with the
// first, so that remat's inline variables and functions must merge across TUs.
#include <remat/remat.hpp>

float second_tu_sum(const remat::Tensor<float>& t) {
  remat::Tape tape;
  return remat::sum(tape.input(t)).item();
}
