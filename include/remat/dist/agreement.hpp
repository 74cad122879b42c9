#pragma once
/// @file
/// dist::agree: the ranks of a job check, before their first collective on data, that they were
/// started alike (the same model configuration, training flags and data position). Every rank
/// describes itself as an ordered list of named settings; rank 0's list is sent in full to the
/// others, each compares it with its own, and the lowest rank that differs sends the first
/// difference to all. Then every rank throws the same dist::MismatchError, which names the
/// setting and both values: "rank 1 has --heads 4, rank 0 has --heads 2".
///
/// Why before anything else: ranks that disagree on sizes call collectives with different
/// counts (Open MPI corrupts its heap or crashes), ranks that disagree on the number of steps
/// leave one rank waiting forever in a reduction the other never joins, and ranks that agree on
/// sizes but not on a seed or a batch train on silently and diverge. The agreement itself is a
/// fixed sequence of collectives every rank runs whatever its settings are, so it cannot hang or
/// mismatch.
///
/// Because every rank throws the same error at the same point, no collective is left pending: a
/// program may end normally (MPI_Finalize) with a non-zero status on every rank, each having
/// printed the message, instead of aborting the job (see MismatchError::job_wide).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "remat/dist/communicator.hpp"

namespace remat::dist {

/// Ranks started with different settings (dist::agree). Thrown on every rank at once, with the
/// same message: no collective is pending, so the job may end without MPI_Abort.
class MismatchError : public CommError {
 public:
  using CommError::CommError;
};

/// One named setting of a rank: a flag ("--heads") or another input ("corpus digest") with its
/// value as text.
struct Setting {
  std::string name;
  std::string value;
};

namespace detail {

/// Length-prefixed names and values: any bytes survive, an entry cannot run into the next.
inline std::string encode(std::span<const Setting> settings) {
  std::string out;
  const auto put = [&](const std::string& s) {
    const std::uint64_t n = s.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += s;
  };
  for (const Setting& s : settings) put(s.name), put(s.value);
  return out;
}

inline std::vector<Setting> decode(const std::string& bytes) {
  std::vector<Setting> out;
  std::size_t at = 0;
  const auto get = [&](std::string& s) {
    std::uint64_t n = 0;
    if (bytes.size() - at < sizeof n)
      throw CommError("dist::agree: rank 0's description is cut short (internal error)");
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (bytes.size() - at < n)
      throw CommError("dist::agree: rank 0's description is cut short (internal error)");
    s.assign(bytes, at, n);
    at += n;
  };
  while (at < bytes.size()) {
    Setting s;
    get(s.name), get(s.value);
    out.push_back(std::move(s));
  }
  return out;
}

/// `root`'s `text` on every rank (its length first, then its bytes).
inline std::string broadcast_text(const Communicator& comm, std::string text, int root) {
  std::uint64_t n = text.size();
  comm.broadcast(std::span<std::uint64_t>(&n, 1), root);
  text.resize(n);
  comm.broadcast(std::span<char>(text.data(), text.size()), root);
  return text;
}

/// The first difference between this rank's settings and rank 0's, in words; empty when none.
inline std::string first_difference(std::span<const Setting> mine, std::span<const Setting> root,
                                    int rank) {
  const auto quoted = [](const Setting& s) { return cat(s.name, " ", s.value); };
  const std::size_t n = std::min(mine.size(), root.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (mine[i].name != root[i].name) {
      return cat("rank ", rank, "'s setting ", i + 1, " is ", mine[i].name, ", rank 0's is ",
                 root[i].name, " (different programs or versions?)");
    }
    if (mine[i].value != root[i].value) {
      return cat("rank ", rank, " has ", quoted(mine[i]), ", rank 0 has ", quoted(root[i]));
    }
  }
  if (mine.size() > n)
    return cat("rank ", rank, " has ", quoted(mine[n]), ", rank 0 has no ", mine[n].name);
  if (root.size() > n)
    return cat("rank 0 has ", quoted(root[n]), ", rank ", rank, " has no ", root[n].name);
  return {};
}

}  // namespace detail

/// Collective (every rank of `comm` calls it, before any collective whose arguments depend on
/// the settings): returns when every rank's `settings` equal rank 0's, name for name and value
/// for value; otherwise throws, on every rank, a MismatchError naming the lowest differing rank,
/// the first setting that differs and both values. `what` starts the message (the program's
/// name).
inline void agree(const Communicator& comm, std::span<const Setting> settings,
                  const std::string& what = "dist::agree") {
  if (comm.size() == 1) return;
  const std::string root_bytes =
      detail::broadcast_text(comm, comm.rank() == 0 ? detail::encode(settings) : std::string(), 0);
  const std::vector<Setting> root = detail::decode(root_bytes);
  const std::string mine = detail::first_difference(settings, root, comm.rank());
  // The lowest rank that differs (or size: none) tells everyone what differs.
  const int first = comm.all_reduce(mine.empty() ? comm.size() : comm.rank(), ReduceOp::min);
  if (first == comm.size()) return;
  const std::string difference = detail::broadcast_text(comm, mine, first);
  throw MismatchError(detail::cat(what, ": the ranks were not started alike: ", difference,
                                  " (every rank needs the same model, flags and data)"));
}

}  // namespace remat::dist
