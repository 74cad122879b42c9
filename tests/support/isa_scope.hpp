#pragma once
// Tests that force an instruction set (remat::set_isa) put the active one back when they end.
#include <remat/core/cpu.hpp>

namespace remat::test {

/// Restores the active instruction set when a test ends.
struct IsaScope {
  remat::Isa isa = remat::active_isa();
  ~IsaScope() { remat::set_isa(isa); }
};

}  // namespace remat::test
