#pragma once
/// @file
/// Saving and resuming a data-parallel run whose AdamW state is sharded (ZeRO-1) in the file
/// format one process writes (io::save_training_state), so a run can resume on any number of
/// ranks, or on one process without MPI. Both calls are collective.
///
/// Kept apart and small on purpose: the gather assembles a whole single-process optimizer on
/// rank 0 and lets io write it; the load reads that whole optimizer on every rank and keeps each
/// rank's own range. Either costs one full copy of the optimizer state for the duration of the
/// call (on rank 0 for a save, on every rank for a load).

#include <algorithm>
#include <optional>
#include <string>

#include "remat/dist/data_parallel.hpp"
#include "remat/io/parameters.hpp"

namespace remat::dist {
namespace detail {

/// Position of `p` in `list` (by identity), or list.size().
template <class T>
std::size_t position_of(const std::vector<Parameter<T>>& list, const Parameter<T>& p) {
  const auto it = std::find_if(list.begin(), list.end(), [&](const Parameter<T>& q) { return q.identity() == p.identity(); });
  return static_cast<std::size_t>(it - list.begin());
}

}  // namespace detail

/// Writes on rank 0 the file io::save_training_state() writes for one process: the parameters
/// (equal on every rank), every rank's AdamW moments and update counts, the step count.
/// `opt` is this rank's optimizer, built over dp.optimizer_parameters().
template <class T>
void save_training_state(const std::string& path, const nn::Module<T>& m, DataParallel<T>& dp, optim::AdamW<T>& opt,
                         io::Metadata metadata = {}) {
  const Communicator& comm = dp.communicator();
  const std::vector<Parameter<T>> all = m.parameters();
  std::optional<optim::AdamW<T>> whole;  // rank 0's single-process optimizer, filled from the shards
  if (comm.rank() == 0) whole.emplace(all, opt.options());
  const std::vector<Parameter<T>> mine = opt.parameters();
  for (std::size_t k = 0; k < all.size(); ++k) {
    // The owner broadcasts its count, then its moments (frozen parameters: no owner, count 0).
    const int owner = dp.owner_of(all[k]);
    const std::size_t j = detail::position_of(mine, all[k]);
    std::int64_t updates = j < mine.size() ? opt.updates(j) : 0;
    if (owner < 0) continue;
    comm.broadcast(std::span<std::int64_t>(&updates, 1), owner);
    if (whole) whole->updates(k) = updates;
    if (updates == 0) continue;
    Tensor<T> m1 = j < mine.size() ? opt.first_moment(j) : Tensor<T>(all[k].shape());
    Tensor<T> m2 = j < mine.size() ? opt.second_moment(j) : Tensor<T>(all[k].shape());
    comm.broadcast(m1, owner);
    comm.broadcast(m2, owner);
    if (whole) {
      whole->first_moment(k) = m1;
      whole->second_moment(k) = m2;
    }
  }
  // a rank holding no parameter never steps its optimizer: take the most steps of any rank
  const std::int64_t steps = comm.all_reduce(opt.steps(), ReduceOp::max);
  if (whole) {
    whole->set_steps(steps);
    whole->set_lr(opt.lr());
    io::save_training_state(path, m, *whole, std::move(metadata));
  }
  comm.barrier();  // the file is complete when any rank returns
}

/// Reads a file io::save_training_state() or save_training_state() above wrote (by any number
/// of ranks) on every rank, sets the parameters, and keeps this rank's range of the AdamW state
/// in `opt` (built over dp.optimizer_parameters()). Returns the file's metadata.
template <class T>
io::Metadata load_training_state(const std::string& path, nn::Module<T>& m, DataParallel<T>& dp, optim::AdamW<T>& opt) {
  const std::vector<Parameter<T>> all = m.parameters();
  optim::AdamW<T> whole(all, opt.options());
  const io::Metadata metadata = io::load_training_state(path, m, whole);
  const std::vector<Parameter<T>> mine = opt.parameters();
  for (std::size_t j = 0; j < mine.size(); ++j) {
    const std::size_t k = detail::position_of(all, mine[j]);
    if (k == all.size()) {
      throw UsageError(remat::detail::cat("dist::load_training_state on rank ", dp.rank(), ": optimizer parameter ", j,
                                          " is not a parameter of the model"));
    }
    opt.updates(j) = whole.updates(k);
    opt.first_moment(j) = whole.first_moment(k);
    opt.second_moment(j) = whole.second_moment(k);
  }
  opt.set_steps(whole.steps());
  return metadata;
}

}  // namespace remat::dist
