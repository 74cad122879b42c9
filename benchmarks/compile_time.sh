#!/usr/bin/env bash
# Compile time of the small trainer (tests/consumers/small_trainer.cpp: a residual MLP, AdamW,
# checkpointing), in CPU seconds (user + system, so a busy machine inflates it little):
#   1. the trainer alone at -O2, without a precompiled header;
#   2. a trivial TU including only remat/core/tensor.hpp (the floor: Eigen and the standard library);
#   3. remat/remat.hpp precompiled, as REMAT_PRECOMPILE_HEADERS does it;
#   4. the trainer again, starting from that precompiled header (what every TU after the first
#      pays in a project using it);
#   5. a TU that includes remat/remat.hpp and uses little of it (tests/consumers/pch/second_tu.cpp),
#      without and with the precompiled header.
# Each figure is the median of --runs compilations (default 3). Prints one JSON object per line.
#
#   benchmarks/compile_time.sh [--runs N]      (CXX picks the compiler, g++ by default)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
if [ "${1:-}" = "--runs" ]; then runs=$2; fi
cxx=${CXX:-g++}
# dependencies as system headers, as CMake passes imported targets' directories
flags=(-std=c++20 -O2 -DREMAT_USE_BLAS=1 -Iinclude $(pkg-config --cflags eigen3 openblas | sed "s/-I/-isystem /g"))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# median CPU seconds of `runs` runs of the command given
cpu_seconds() {
  local times=()
  for _ in $(seq "$runs"); do
    /usr/bin/time -f "%U %S" -o "$work/time" "$@" >/dev/null
    times+=("$(awk '{ printf "%.2f", $1 + $2 }' "$work/time")")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

report() { printf '{"bench": "compile_time", "what": "%s", "cpu_s": %s, "compiler": "%s"}\n' "$1" "$2" "$($cxx --version | head -n 1)"; }

printf '#include <remat/core/tensor.hpp>\nint main() { return remat::Tensor<float>({2}).numel() == 2 ? 0 : 1; }\n' > "$work/trivial.cpp"
alone=$(cpu_seconds "$cxx" "${flags[@]}" -c tests/consumers/small_trainer.cpp -o "$work/a.o")
report "small trainer, no precompiled header" "$alone"
report "trivial TU (remat/core/tensor.hpp)" "$(cpu_seconds "$cxx" "${flags[@]}" -c "$work/trivial.cpp" -o "$work/t.o")"
mkdir -p "$work/pch/remat"
cp include/remat/remat.hpp "$work/pch/remat/remat.hpp"
report "precompiling remat/remat.hpp" "$(cpu_seconds "$cxx" "${flags[@]}" -x c++-header "$work/pch/remat/remat.hpp" -o "$work/pch/remat/remat.hpp.gch")"
# -include finds remat.hpp.gch next to the header and uses it (-Winvalid-pch says if it cannot)
with_pch=$(cpu_seconds "$cxx" "${flags[@]}" -Winvalid-pch -Werror=invalid-pch -include "$work/pch/remat/remat.hpp" \
           -c tests/consumers/small_trainer.cpp -o "$work/b.o")
report "small trainer, with the precompiled header" "$with_pch"
ratio() { awk -v w="$1" -v a="$2" -v b="$3" 'BEGIN { printf "{\"bench\": \"compile_time\", \"what\": \"%s\", \"ratio\": %.2f}\n", w, b / a }'; }
ratio "small trainer, with/without the precompiled header" "$alone" "$with_pch"
light=$(cpu_seconds "$cxx" "${flags[@]}" -c tests/consumers/pch/second_tu.cpp -o "$work/c.o")
report "light TU including remat/remat.hpp, no precompiled header" "$light"
light_pch=$(cpu_seconds "$cxx" "${flags[@]}" -Winvalid-pch -Werror=invalid-pch -include "$work/pch/remat/remat.hpp" \
            -c tests/consumers/pch/second_tu.cpp -o "$work/d.o")
report "light TU including remat/remat.hpp, with the precompiled header" "$light_pch"
ratio "light TU, with/without the precompiled header" "$light" "$light_pch"
