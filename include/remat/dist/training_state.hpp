#pragma once
/// @file
/// Saving and resuming a data-parallel run whose optimizer state is sharded (ZeRO-1) in the file
/// format one process writes (train::save_training_state), so a run can resume on any number of
/// ranks, or on one process without MPI. Both calls are collective, and work for any optimizer
/// whose constructor takes (parameters, options) and that reports its state through state() /
/// load_state() (SGD, AdamW).
///
/// Kept apart and small on purpose: the gather assembles the whole single-process state on rank
/// 0 and lets train/ write it; the load reads the whole state on every rank and keeps each
/// rank's own range. Either costs one full copy of the optimizer state for the duration of the
/// call (on rank 0 for a save, on every rank for a load).

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "remat/dist/data_parallel.hpp"
#include "remat/train/training_state.hpp"

namespace remat::dist {
namespace detail {

/// Position of `p` in `list` (by identity), or list.size().
template <class T>
std::size_t position_of(const std::vector<Parameter<T>>& list, const Parameter<T>& p) {
  const auto it = std::find_if(list.begin(), list.end(),
                               [&](const Parameter<T>& q) { return q.identity() == p.identity(); });
  return static_cast<std::size_t>(it - list.begin());
}

/// Rank 0's copy of the whole optimizer state, in the order of `all`, gathered from the owners'
/// shards: each owner broadcasts its parameter's counters, then which buffers it has, then them.
/// Frozen parameters (no owner) get zero counters and no buffers.
template <class T, class Opt>
optim::OptimizerState<T> gather_state(const std::vector<Parameter<T>>& all, DataParallel<T>& dp,
                                      const Opt& opt) {
  const Communicator& comm = dp.communicator();
  const optim::OptimizerState<T> mine = opt.state();
  const std::vector<Parameter<T>> owned = opt.parameters();
  const std::vector<std::string> counter_names = opt.counter_names(),
                                 buffer_names = opt.buffer_names();
  optim::OptimizerState<T> whole{opt.name(), 0, opt.lr(), {}, {}};
  whole.buffers.resize(all.size());
  whole.counters.resize(all.size());
  for (std::size_t k = 0; k < all.size(); ++k) {
    const int owner = dp.owner_of(all[k]);
    const std::size_t j = position_of(owned, all[k]);
    const bool here = j < owned.size();
    std::vector<std::int64_t> counters(counter_names.size(), 0);
    if (owner >= 0) {
      for (std::size_t c = 0; c < counter_names.size() && here; ++c)
        counters[c] = mine.counters[j].at(counter_names[c]);
      comm.broadcast(std::span<std::int64_t>(counters), owner);
      for (const std::string& b : buffer_names) {
        std::int64_t present = here && mine.buffers[j].count(b) ? 1 : 0;
        comm.broadcast(std::span<std::int64_t>(&present, 1), owner);
        if (!present) continue;
        Tensor<T> t = here ? mine.buffers[j].at(b) : Tensor<T>(all[k].shape());
        comm.broadcast(t, owner);
        whole.buffers[k][b] = std::move(t);
      }
    }
    for (std::size_t c = 0; c < counter_names.size(); ++c)
      whole.counters[k][counter_names[c]] = counters[c];
  }
  // A rank holding no parameter never steps its optimizer: take the most steps of any rank.
  whole.steps = comm.all_reduce(opt.steps(), ReduceOp::max);
  return whole;
}

}  // namespace detail

/// Writes on rank 0 the file train::save_training_state() writes for one process: the
/// parameters (equal on every rank), every rank's share of the optimizer state, the step count.
/// `opt` is this rank's optimizer, built over dp.optimizer_parameters().
template <class T, class Opt>
void save_training_state(const std::string& path, const nn::Module<T>& m, DataParallel<T>& dp,
                         Opt& opt, io::Metadata metadata = {}) {
  const std::vector<Parameter<T>> all = m.parameters();
  const optim::OptimizerState<T> whole = detail::gather_state(all, dp, opt);
  if (dp.communicator().rank() == 0) {
    Opt single(all, opt.options());  // the one-process optimizer this file is for
    single.load_state(whole);
    train::save_training_state(path, m, single, std::move(metadata));
  }
  dp.communicator().barrier();  // the file is complete when any rank returns
}

/// Reads a file train::save_training_state() or save_training_state() above wrote (by any
/// number of ranks) on every rank, sets the parameters, and keeps this rank's range of the
/// optimizer state in `opt` (built over dp.optimizer_parameters()). Returns the file's metadata.
template <class T, class Opt>
io::Metadata load_training_state(const std::string& path, nn::Module<T>& m, DataParallel<T>& dp,
                                 Opt& opt) {
  const std::vector<Parameter<T>> all = m.parameters();
  Opt single(all, opt.options());
  io::Metadata metadata = train::load_training_state(path, m, single);
  const optim::OptimizerState<T> whole = single.state();
  const std::vector<Parameter<T>> mine = opt.parameters();
  optim::OptimizerState<T> shard{whole.optimizer, whole.steps, whole.lr, {}, {}};
  for (std::size_t j = 0; j < mine.size(); ++j) {
    const std::size_t k = detail::position_of(all, mine[j]);
    if (k == all.size()) {
      throw ArgumentError(remat::detail::cat("dist::load_training_state on rank ", dp.rank(),
                                             ": optimizer parameter ", j,
                                             " is not a parameter of the model"));
    }
    shard.buffers.push_back(whole.buffers[k]);
    shard.counters.push_back(whole.counters[k]);
  }
  opt.load_state(shard);
  return metadata;
}

}  // namespace remat::dist
