#!/usr/bin/env python3
"""Writes include/remat/hub/unicode_properties.hpp: the Unicode properties a tokenizer.json
pattern may name, and the code points Oniguruma (Hugging Face's regex engine) puts in each that
PCRE2's older Unicode data does not (Note [Unicode versions] in remat/hub/regex.hpp).

    tools/unicode_properties.py OLD NEW | clang-format --assume-filename=x.hpp \
        > include/remat/hub/unicode_properties.hpp

OLD and NEW are Oniguruma's src/unicode_property_data.c for the Unicode version of the PCRE2
remat is built with (Unicode 14.0: Oniguruma commit 7d74283 for Debian 12's PCRE2 10.42) and for
the one Hugging Face's tokenizers library links (Unicode 16.0: Oniguruma 94877ac, which
onig_sys 69.9 bundles; tokenizers since 0.21.2). Only what PCRE2 and Oniguruma both define alike
from the same Unicode data is listed: the general categories, Alphabetic, White_Space, Any and
ASCII. A property that lost code points from OLD to NEW cannot be mended by adding to it: it is
written with no spelling, and the rewriter refuses it.
"""
import re
import sys

PROPERTIES = ("L Lu Ll Lt Lm Lo LC M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So "
              "Z Zs Zl Zp C Cc Cf Cs Co Cn Alphabetic White_Space Any ASCII").split()
# Oniguruma's \w (a class escape, not a property): checked code point by code point against
# Hugging Face's library (tests/hub/tokenizer_test.cpp)
WORD = ("Alphabetic", "M", "Nd", "Pc")


def read(path):
    """The ranges of every table in an Oniguruma data file, and the property names it knows."""
    src = open(path, encoding="utf-8").read()
    alias = dict(re.findall(r"^#define CR_(\w+) CR_(\w+)\s*$", src, re.M))

    def canonical(name):
        while name in alias:
            name = alias[name]
        return name

    tables = {}
    for m in re.finditer(r"^CR_(\w+)\[\] = \{ (\d+),\n(.*?)\};", src, re.S | re.M):
        values = [int(x, 16) for x in re.findall(r"0x[0-9a-f]+", m.group(3))]
        if len(values) != 2 * int(m.group(2)):
            sys.exit(f"{path}: CR_{m.group(1)} has {len(values)} bounds, not 2 x {m.group(2)}")
        tables[m.group(1)] = list(zip(values[::2], values[1::2]))
    pool = dict(re.findall(r'char unicode_prop_name_pool_str(\d+)\[sizeof\("([^"]*)"\)\]', src))
    order = re.search(r"CodeRanges\[\] = \{(.*?)\};", src, re.S).group(1)
    ranges_in_order = [x.strip().rstrip(",")[3:] for x in order.split("\n") if x.strip()]
    names = {}
    for offset, index in re.findall(r"\{pool_offset\((\d+)\),\s*(\d+)\}", src):
        names.setdefault(canonical(ranges_in_order[int(index)]), []).append(pool[offset])

    def code_points(prop):
        points = set()
        for lo, hi in tables[canonical(prop)]:
            points.update(range(lo, hi + 1))
        return points

    return code_points, lambda prop: sorted(names[canonical(prop)])


def class_text(points):
    """Points as the inside of a PCRE2 character class: a list of ranges, each its own text."""
    runs = []
    for c in sorted(points):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return [f"\\\\x{{{a:X}}}" if a == b else f"\\\\x{{{a:X}}}-\\\\x{{{b:X}}}" for a, b in runs]


def cpp_string(ranges, indent):
    """A C++ string literal of the ranges, in pieces of about 90 characters, cut between ranges."""
    lines = [""]
    for r in ranges:
        if lines[-1] and len(lines[-1]) + len(r) > 90:
            lines.append("")
        lines[-1] += r
    return ("\n" + indent).join(f'"{line}"' for line in lines)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, _ = read(sys.argv[1])
    new, names = read(sys.argv[2])
    properties, aliases, word = [], [], set()
    for prop in PROPERTIES:
        added, lost = new(prop) - old(prop), old(prop) - new(prop)
        if prop in WORD:
            word |= added
        for name in names(prop):
            aliases.append((name, len(properties)))
        properties.append((prop, "" if lost else prop, class_text(added if not lost else [])))
    print("""#pragma once
/// @file
/// Written by tools/unicode_properties.py from Oniguruma's Unicode 14.0 and 16.0 data; do not
/// edit. The Unicode properties a tokenizer.json pattern may name, with PCRE2's spelling and the
/// code points Unicode 16.0 adds to them since 14.0 (Note [Unicode versions] in
/// remat/hub/regex.hpp), and every name Oniguruma knows them by (lower case, without spaces,
/// hyphens and underscores).

#include <cstddef>
#include <string_view>

namespace remat::hub::detail {

struct UnicodeProperty {
  std::string_view pcre2;  ///< PCRE2's name for it; empty: it lost code points (refused)
  std::string_view added;  ///< the inside of a class: code points added since Unicode 14.0
};

inline constexpr UnicodeProperty kUnicodeProperties[] = {""")
    for _, spelling, added in properties:
        print(f'    {{"{spelling}",\n     {cpp_string(added, "     ")}}},')
    print("};\n")
    print("struct UnicodePropertyName {\n  std::string_view name;\n  std::size_t property;  "
          "///< its index in kUnicodeProperties\n};\n")
    print("inline constexpr UnicodePropertyName kUnicodePropertyNames[] = {")
    line = "   "
    for name, index in sorted(aliases):
        item = f' {{"{name}", {index}}},'
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};\n")
    print("/// The code points Unicode 16.0 adds to Oniguruma's \\\\w (Alphabetic, marks, decimal "
          "numbers\n/// and Pc) since 14.0, as the inside of a class.")
    print(f"inline constexpr std::string_view kWordAdded =\n    {cpp_string(class_text(word), '    ')};")
    print("\n}  // namespace remat::hub::detail")


if __name__ == "__main__":
    main()
