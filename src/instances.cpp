// The float instantiations declared `extern template` by remat/instances.hpp, compiled once into
// the opt-in remat_instances library (CMake option REMAT_PRECOMPILE_HEADERS): every TU that
// sees the declarations links these instead of instantiating them itself.
#include "remat/instances.hpp"

/// `template` (an explicit instantiation definition) for one entry of REMAT_FLOAT_INSTANCES.
#define REMAT_DETAIL_DEFINE_INSTANCE(...) template __VA_ARGS__;

REMAT_FLOAT_INSTANCES(REMAT_DETAIL_DEFINE_INSTANCE)
