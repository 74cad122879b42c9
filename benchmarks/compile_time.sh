#!/usr/bin/env bash
# Compile time of the small trainer (tests/consumers/small_trainer.cpp: a residual MLP, AdamW,
# checkpointing), in user CPU seconds on one core (the compiler is single-threaded; user time,
# unlike wall time, barely moves when other jobs share the machine):
#   1. the trainer alone at -O2, without a precompiled header;
#   2. a trivial TU including only remat/core/tensor.hpp (the floor: Eigen and the standard library);
#   3. a TU that includes remat/remat.hpp and uses little of it (tests/consumers/pch/second_tu.cpp);
#   4. the trainer and that TU starting from three precompiled headers: remat/remat.hpp alone
#      (what REMAT_PRECOMPILE_HEADERS did before remat_instances); remat.hpp with
#      remat/instances.hpp's extern templates; and remat/precompiled.hpp, what the option
#      precompiles now (the same without the JSON file formats). The last trainer figure is what
#      every TU after the first pays in a project using the option;
#   5. src/instances.cpp, the remat_instances library the option compiles once per build.
# Each figure is the median of --runs compilations (default 3). Prints one JSON object per line;
# the ratios divide a TU's time with a precompiled header by the same TU's time without one.
# With clang (CXX=clang++-14) the headers are precompiled with -fpch-instantiate-templates, as
# CMake does for clang.
#
#   benchmarks/compile_time.sh [--runs N]      (CXX picks the compiler, g++ by default)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
if [ "${1:-}" = "--runs" ]; then runs=$2; fi
cxx=${CXX:-g++}
compiler=$($cxx --version | head -n 1)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
# dependencies as system headers, as CMake passes imported targets' directories
flags=(-std=c++20 -O2 -DREMAT_USE_BLAS=1 -Iinclude $(pkg-config --cflags eigen3 openblas | sed "s/-I/-isystem /g"))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# median user CPU seconds of `runs` runs of the command given
cpu_seconds() {
  local times=()
  for _ in $(seq "$runs"); do
    /usr/bin/time -f "%U" -o "$work/time" "$@" >/dev/null
    times+=("$(awk '{ printf "%.2f", $1 }' "$work/time")")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

report() {
  printf '{"bench": "compile_time", "what": "%s", "user_cpu_s": %s, "compiler": "%s", "cpu": "%s"}\n' \
    "$1" "$2" "$compiler" "$cpu"
}
ratio() {
  awk -v w="$1" -v a="$2" -v b="$3" -v c="$compiler" \
    'BEGIN { printf "{\"bench\": \"compile_time\", \"what\": \"%s\", \"ratio\": %.2f, \"compiler\": \"%s\"}\n", w, b / a, c }'
}

# precompile <dir> <what> <header text>: writes $work/<dir>/pch.hpp and its precompiled form,
# reports the time, and sets pch_flags to the flags a TU uses it with
pch_flags=()
precompile() {
  local dir="$work/$1"
  mkdir -p "$dir"
  printf '%b' "$3" > "$dir/pch.hpp"
  if [[ "$compiler" == *clang* ]]; then
    report "precompiling $2" "$(cpu_seconds "$cxx" "${flags[@]}" -fpch-instantiate-templates \
      -x c++-header "$dir/pch.hpp" -o "$dir/pch.hpp.pch")"
    pch_flags=(-include-pch "$dir/pch.hpp.pch")
  else
    report "precompiling $2" "$(cpu_seconds "$cxx" "${flags[@]}" -x c++-header "$dir/pch.hpp" \
      -o "$dir/pch.hpp.gch")"
    # -include finds pch.hpp.gch next to the header and uses it (-Winvalid-pch says if it cannot)
    pch_flags=(-Winvalid-pch -Werror=invalid-pch -include "$dir/pch.hpp")
  fi
}

printf '#include <remat/core/tensor.hpp>\nint main() { return remat::Tensor<float>({2}).numel() == 2 ? 0 : 1; }\n' > "$work/trivial.cpp"
trainer=tests/consumers/small_trainer.cpp
light_tu=tests/consumers/pch/second_tu.cpp
alone=$(cpu_seconds "$cxx" "${flags[@]}" -c "$trainer" -o "$work/a.o")
report "small trainer, no precompiled header" "$alone"
report "trivial TU (remat/core/tensor.hpp)" "$(cpu_seconds "$cxx" "${flags[@]}" -c "$work/trivial.cpp" -o "$work/t.o")"
light=$(cpu_seconds "$cxx" "${flags[@]}" -c "$light_tu" -o "$work/c.o")
report "light TU including remat/remat.hpp, no precompiled header" "$light"

# with_pch <dir> <what> <header text>: the trainer and the light TU starting from that header
with_pch() {
  precompile "$1" "$2" "$3"
  local t l
  t=$(cpu_seconds "$cxx" "${flags[@]}" "${pch_flags[@]}" -c "$trainer" -o "$work/$1/trainer.o")
  report "small trainer, precompiled $2" "$t"
  ratio "small trainer, precompiled $2 / no precompiled header" "$alone" "$t"
  l=$(cpu_seconds "$cxx" "${flags[@]}" "${pch_flags[@]}" -c "$light_tu" -o "$work/$1/light.o")
  report "light TU, precompiled $2" "$l"
  ratio "light TU, precompiled $2 / no precompiled header" "$light" "$l"
}

with_pch plain "remat.hpp alone" '#include <remat/remat.hpp>\n'
with_pch json "remat.hpp and instances.hpp" \
  '#include <remat/remat.hpp>\n#include <remat/instances.hpp>\n'
with_pch full "remat/precompiled.hpp (REMAT_PRECOMPILE_HEADERS)" '#include <remat/precompiled.hpp>\n'
report "compiling remat_instances (src/instances.cpp), once per build" \
  "$(cpu_seconds "$cxx" "${flags[@]}" -c src/instances.cpp -o "$work/instances.o")"
# the objects must link into the program the consumer test runs, and it must train
"$cxx" "$work/full/trainer.o" "$work/full/light.o" "$work/instances.o" $(pkg-config --libs openblas) \
  -pthread -o "$work/trainer"
"$work/trainer" >/dev/null
