#!/usr/bin/env python3
"""The arrows of docs/design.md ("Layers"): each directory of include/remat includes only itself
and the directories below it. A header that includes a layer above its own, or a directory that is
in no layer, fails with the file, the line and the include."""
import pathlib
import re
import sys

# each layer and what it may include besides itself
BELOW = {
    "core": set(),
    "ops": {"core"},
    "checkpoint": {"core", "ops"},
    "nn": {"core", "ops", "checkpoint"},
    "optim": {"core"},
    "io": {"core"},
    "check": {"core", "ops", "checkpoint"},
    "train": {"core", "ops", "checkpoint", "nn", "optim", "io"},
    "dist": {"core", "ops", "checkpoint", "nn", "optim", "io", "train"},
    "hub": {"core", "ops", "checkpoint", "nn", "io"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]remat/([a-z_]+)/')


def main(root: pathlib.Path) -> int:
    failures = []
    headers = sorted((root / "include" / "remat").glob("*/**/*.hpp"))
    if not headers:
        failures.append(f"no headers under {root / 'include' / 'remat'}")
    for header in headers:
        layer = header.relative_to(root / "include" / "remat").parts[0]
        if layer not in BELOW:
            failures.append(f"{header}: directory '{layer}' is in no layer of docs/design.md")
            continue
        for number, line in enumerate(header.read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if match and match.group(1) != layer and match.group(1) not in BELOW[layer]:
                failures.append(f"{header}:{number}: {layer}/ includes {match.group(1)}/, "
                                f"a layer above it: {line.strip()}")
    for failure in failures:
        print("layers_test:", failure)
    print(f"layers_test: {len(headers)} headers, {len(failures)} wrong arrows")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
