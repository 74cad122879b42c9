#pragma once
/// @file
/// The unit the tokenizer pipeline passes along: a piece of the input text, either still open
/// (normalized, split and finally cut into BPE tokens) or already one token (an added token
/// matched in the text). Mirrors Hugging Face's PreTokenizedString splits, keeping only what the
/// ids depend on.

#include <cstdint>
#include <string>
#include <vector>

namespace remat::hub {

/// One piece of the text being encoded.
struct Piece {
  /// The (normalized, pre-tokenized) text; for a token piece, the text it matched.
  std::string text;
  /// The id of the added token this piece is, or -1 while the piece is open.
  std::int64_t token = -1;
  /// Whether the piece starts at offset 0 of the original text (Metaspace's "first" scheme
  /// adds its prefix only there).
  bool at_origin = false;

  bool open() const { return token < 0; }
};

/// A piece split into parts: [begin, end) byte ranges of its text.
struct Range {
  std::size_t begin = 0, end = 0;
};

/// Replaces each open piece of `pieces` by the parts `cut(piece)` returns ([begin, end) ranges
/// of its text, in order), dropping empty parts, as Hugging Face's PreTokenizedString::split
/// does. Token pieces pass unchanged. A part keeps `at_origin` when it starts at byte 0.
template <class Cut>
void split_open_pieces(std::vector<Piece>& pieces, Cut&& cut) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  std::vector<Range> parts;
  for (Piece& piece : pieces) {
    if (!piece.open()) {
      out.push_back(std::move(piece));
      continue;
    }
    parts.clear();
    cut(piece, parts);
    for (const Range& r : parts) {
      if (r.end <= r.begin) continue;
      out.push_back(
          Piece{piece.text.substr(r.begin, r.end - r.begin), -1, piece.at_origin && r.begin == 0});
    }
  }
  pieces = std::move(out);
}

}  // namespace remat::hub
