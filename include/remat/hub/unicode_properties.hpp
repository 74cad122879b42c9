#pragma once
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

inline constexpr UnicodeProperty kUnicodeProperties[] = {
    {"L",
     "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
     "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
     "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}"
     "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}"
     "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}"
     "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"
     "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}"
     "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"},
    {"Lu", "\\x{1C89}\\x{A7CB}-\\x{A7CC}\\x{A7DA}\\x{A7DC}\\x{10D50}-\\x{10D65}"},
    {"Ll", "\\x{1C8A}\\x{A7CD}\\x{A7DB}\\x{10D70}-\\x{10D85}\\x{1DF25}-\\x{1DF2A}"},
    {"Lt", ""},
    {"Lm",
     "\\x{10D4E}\\x{10D6F}\\x{16D40}-\\x{16D42}\\x{16D6B}-\\x{16D6C}\\x{1E030}-\\x{1E06D}"
     "\\x{1E4EB}"},
    {"Lo",
     "\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D4D}\\x{10D4F}\\x{10EC2}-\\x{10EC4}"
     "\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}"
     "\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}"
     "\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}"
     "\\x{16100}-\\x{1611D}\\x{16D43}-\\x{16D6A}\\x{18CFF}\\x{1B132}\\x{1B155}"
     "\\x{1E4D0}-\\x{1E4EA}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}"
     "\\x{31350}-\\x{323AF}"},
    {"LC",
     "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{10D50}-\\x{10D65}"
     "\\x{10D70}-\\x{10D85}\\x{1DF25}-\\x{1DF2A}"},
    {"M",
     "\\x{897}\\x{CF3}\\x{ECE}\\x{10D69}-\\x{10D6D}\\x{10EFC}-\\x{10EFF}\\x{11241}"
     "\\x{113B8}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D0}"
     "\\x{113D2}\\x{113E1}-\\x{113E2}\\x{11F00}-\\x{11F01}\\x{11F03}\\x{11F34}-\\x{11F3A}"
     "\\x{11F3E}-\\x{11F42}\\x{11F5A}\\x{13440}\\x{13447}-\\x{13455}\\x{1611E}-\\x{1612F}"
     "\\x{1E08F}\\x{1E4EC}-\\x{1E4EF}\\x{1E5EE}-\\x{1E5EF}"},
    {"", ""},
    {"Mc",
     "\\x{CF3}\\x{113B8}-\\x{113BA}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}"
     "\\x{113CC}-\\x{113CD}\\x{113CF}\\x{1171E}\\x{11F03}\\x{11F34}-\\x{11F35}"
     "\\x{11F3E}-\\x{11F3F}\\x{11F41}\\x{1612A}-\\x{1612C}"},
    {"Me", ""},
    {"N",
     "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
     "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
     "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"},
    {"Nd",
     "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
     "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1E4F0}-\\x{1E4F9}"
     "\\x{1E5F1}-\\x{1E5FA}"},
    {"Nl", ""},
    {"No", "\\x{1D2C0}-\\x{1D2D3}"},
    {"P",
     "\\x{1B4E}-\\x{1B4F}\\x{1B7F}\\x{10D6E}\\x{113D4}-\\x{113D5}\\x{113D7}-\\x{113D8}"
     "\\x{11B00}-\\x{11B09}\\x{11BE1}\\x{11F43}-\\x{11F4F}\\x{16D6D}-\\x{16D6F}\\x{1E5FF}"},
    {"Pc", ""},
    {"Pd", "\\x{10D6E}"},
    {"Ps", ""},
    {"Pe", ""},
    {"Pi", ""},
    {"Pf", ""},
    {"Po",
     "\\x{1B4E}-\\x{1B4F}\\x{1B7F}\\x{113D4}-\\x{113D5}\\x{113D7}-\\x{113D8}"
     "\\x{11B00}-\\x{11B09}\\x{11BE1}\\x{11F43}-\\x{11F4F}\\x{16D6D}-\\x{16D6F}\\x{1E5FF}"},
    {"S",
     "\\x{2427}-\\x{2429}\\x{2FFC}-\\x{2FFF}\\x{31E4}-\\x{31E5}\\x{31EF}\\x{10D8E}-\\x{10D8F}"
     "\\x{1CC00}-\\x{1CCEF}\\x{1CD00}-\\x{1CEB3}\\x{1F6DC}\\x{1F774}-\\x{1F776}"
     "\\x{1F77B}-\\x{1F77F}\\x{1F7D9}\\x{1F8B2}-\\x{1F8BB}\\x{1F8C0}-\\x{1F8C1}"
     "\\x{1FA75}-\\x{1FA77}\\x{1FA87}-\\x{1FA89}\\x{1FA8F}\\x{1FAAD}-\\x{1FAAF}"
     "\\x{1FABB}-\\x{1FABF}\\x{1FAC6}\\x{1FACE}-\\x{1FACF}\\x{1FADA}-\\x{1FADC}\\x{1FADF}"
     "\\x{1FAE8}-\\x{1FAE9}\\x{1FAF7}-\\x{1FAF8}\\x{1FBCB}-\\x{1FBEF}"},
    {"Sm", "\\x{10D8E}-\\x{10D8F}"},
    {"Sc", ""},
    {"Sk", ""},
    {"So",
     "\\x{2427}-\\x{2429}\\x{2FFC}-\\x{2FFF}\\x{31E4}-\\x{31E5}\\x{31EF}\\x{1CC00}-\\x{1CCEF}"
     "\\x{1CD00}-\\x{1CEB3}\\x{1F6DC}\\x{1F774}-\\x{1F776}\\x{1F77B}-\\x{1F77F}\\x{1F7D9}"
     "\\x{1F8B2}-\\x{1F8BB}\\x{1F8C0}-\\x{1F8C1}\\x{1FA75}-\\x{1FA77}\\x{1FA87}-\\x{1FA89}"
     "\\x{1FA8F}\\x{1FAAD}-\\x{1FAAF}\\x{1FABB}-\\x{1FABF}\\x{1FAC6}\\x{1FACE}-\\x{1FACF}"
     "\\x{1FADA}-\\x{1FADC}\\x{1FADF}\\x{1FAE8}-\\x{1FAE9}\\x{1FAF7}-\\x{1FAF8}"
     "\\x{1FBCB}-\\x{1FBEF}"},
    {"Z", ""},
    {"Zs", ""},
    {"Zl", ""},
    {"Zp", ""},
    {"", ""},
    {"Cc", ""},
    {"Cf", "\\x{13439}-\\x{1343F}"},
    {"Cs", ""},
    {"Co", ""},
    {"", ""},
    {"Alphabetic",
     "\\x{363}-\\x{36F}\\x{897}\\x{C04}\\x{CF3}\\x{F82}-\\x{F83}\\x{1C89}-\\x{1C8A}"
     "\\x{1DD3}-\\x{1DE6}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
     "\\x{10D4A}-\\x{10D65}\\x{10D69}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{10EFC}"
     "\\x{11080}-\\x{11081}\\x{1123F}-\\x{11241}\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}"
     "\\x{11390}-\\x{113B5}\\x{113B7}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}"
     "\\x{113CC}-\\x{113CD}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F00}-\\x{11F10}"
     "\\x{11F12}-\\x{11F3A}\\x{11F3E}-\\x{11F40}\\x{1342F}\\x{13441}-\\x{13446}"
     "\\x{13460}-\\x{143FA}\\x{16100}-\\x{1612E}\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}"
     "\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E08F}\\x{1E4D0}-\\x{1E4EB}"
     "\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"},
    {"White_Space", ""},
    {"Any", ""},
    {"ASCII", ""},
};

struct UnicodePropertyName {
  std::string_view name;
  std::size_t property;  ///< its index in kUnicodeProperties
};

inline constexpr UnicodePropertyName kUnicodePropertyNames[] = {
    {"alpha", 38},
    {"alphabetic", 38},
    {"any", 40},
    {"ascii", 41},
    {"c", 32},
    {"casedletter", 6},
    {"cc", 33},
    {"cf", 34},
    {"closepunctuation", 19},
    {"cn", 37},
    {"cntrl", 33},
    {"co", 36},
    {"combiningmark", 7},
    {"connectorpunctuation", 16},
    {"control", 33},
    {"cs", 35},
    {"currencysymbol", 25},
    {"dashpunctuation", 17},
    {"decimalnumber", 12},
    {"digit", 12},
    {"enclosingmark", 10},
    {"finalpunctuation", 21},
    {"format", 34},
    {"inbasiclatin", 41},
    {"initialpunctuation", 20},
    {"l", 0},
    {"lc", 6},
    {"letter", 0},
    {"letternumber", 13},
    {"lineseparator", 30},
    {"ll", 2},
    {"lm", 4},
    {"lo", 5},
    {"lowercaseletter", 2},
    {"lt", 3},
    {"lu", 1},
    {"m", 7},
    {"mark", 7},
    {"mathsymbol", 24},
    {"mc", 9},
    {"me", 10},
    {"mn", 8},
    {"modifierletter", 4},
    {"modifiersymbol", 26},
    {"n", 11},
    {"nd", 12},
    {"nl", 13},
    {"no", 14},
    {"nonspacingmark", 8},
    {"number", 11},
    {"openpunctuation", 18},
    {"other", 32},
    {"otherletter", 5},
    {"othernumber", 14},
    {"otherpunctuation", 22},
    {"othersymbol", 27},
    {"p", 15},
    {"paragraphseparator", 31},
    {"pc", 16},
    {"pd", 17},
    {"pe", 19},
    {"pf", 21},
    {"pi", 20},
    {"po", 22},
    {"privateuse", 36},
    {"ps", 18},
    {"punct", 15},
    {"punctuation", 15},
    {"s", 23},
    {"sc", 25},
    {"separator", 28},
    {"sk", 26},
    {"sm", 24},
    {"so", 27},
    {"space", 39},
    {"spaceseparator", 29},
    {"spacingmark", 9},
    {"surrogate", 35},
    {"symbol", 23},
    {"titlecaseletter", 3},
    {"unassigned", 37},
    {"uppercaseletter", 1},
    {"whitespace", 39},
    {"wspace", 39},
    {"z", 28},
    {"zl", 30},
    {"zp", 31},
    {"zs", 29},
};

/// The code points Unicode 16.0 adds to Oniguruma's \\w (Alphabetic, marks, decimal numbers
/// and Pc) since 14.0, as the inside of a class.
inline constexpr std::string_view kWordAdded =
    "\\x{363}-\\x{36F}\\x{897}\\x{C04}\\x{CF3}\\x{ECE}\\x{F82}-\\x{F83}\\x{1C89}-\\x{1C8A}"
    "\\x{1DD3}-\\x{1DE6}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
    "\\x{10D40}-\\x{10D65}\\x{10D69}-\\x{10D6D}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}"
    "\\x{10EFC}-\\x{10EFF}\\x{11080}-\\x{11081}\\x{1123F}-\\x{11241}\\x{11380}-\\x{11389}"
    "\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}-\\x{113C0}\\x{113C2}\\x{113C5}"
    "\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D3}\\x{113E1}-\\x{113E2}\\x{116D0}-\\x{116E3}"
    "\\x{11BC0}-\\x{11BE0}\\x{11BF0}-\\x{11BF9}\\x{11F00}-\\x{11F10}\\x{11F12}-\\x{11F3A}"
    "\\x{11F3E}-\\x{11F42}\\x{11F50}-\\x{11F5A}\\x{1342F}\\x{13440}-\\x{13455}"
    "\\x{13460}-\\x{143FA}\\x{16100}-\\x{16139}\\x{16D40}-\\x{16D6C}\\x{16D70}-\\x{16D79}"
    "\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1CCF0}-\\x{1CCF9}\\x{1DF25}-\\x{1DF2A}"
    "\\x{1E030}-\\x{1E06D}\\x{1E08F}\\x{1E4D0}-\\x{1E4F9}\\x{1E5D0}-\\x{1E5FA}\\x{2B739}"
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";

}  // namespace remat::hub::detail
