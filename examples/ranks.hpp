#pragma once
// The data-parallel side of the training examples (train_gpt, train_llama). Built with MPI (the
// remat::mpi target, which defines REMAT_WITH_MPI) a program runs unchanged under
// `mpirun -np N`: every rank draws the same batch of N x --batch rows and trains on its own
// slice, gradients are averaged during backward (remat::dist::DataParallel), and only rank 0
// prints, evaluates and saves. Built without MPI, or run as one process, every call below is the
// plain single-process step.
#include <remat/core/hash.hpp>
#include <remat/remat.hpp>
#ifdef REMAT_WITH_MPI
#include <remat/dist/agreement.hpp>
#include <remat/dist/data_parallel.hpp>
#endif

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flags.hpp"

namespace ranks {

/// What a rank was started with: (flag or input, value) in a fixed order (Job::agree).
using Settings = std::vector<std::pair<std::string, std::string>>;

class Job {
 public:
  Job(int& argc, char**& argv) {
#ifdef REMAT_WITH_MPI
    env_ = std::make_unique<remat::dist::Environment>(argc, argv);
    comm_.emplace(remat::dist::Communicator::world());
    rank_ = comm_->rank(), size_ = comm_->size();
#else
    (void)argc, (void)argv;
#endif
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The rank that evaluates, prints, logs and saves.
  bool root() const noexcept { return rank_ == 0; }

  /// With several ranks: checks that every rank was started with rank 0's `settings` (model
  /// configuration, training flags, data identity and position), before any collective whose
  /// counts depend on them; otherwise every rank throws the same remat::dist::MismatchError
  /// naming the first difference (fail() then ends each rank without aborting the job). Call it
  /// once, early, on every rank.
  void agree(const char* program, const Settings& settings) {
#ifdef REMAT_WITH_MPI
    if (size_ > 1) {
      std::vector<remat::dist::Setting> list;
      for (const auto& [name, value] : settings) list.push_back({name, value});
      try {
        remat::dist::agree(*comm_, list, program);
      } catch (const remat::dist::MismatchError&) {
        job_wide_failure_ = true;  // every rank throws it: nothing is left pending
        throw;
      }
    }
#endif
    (void)program, (void)settings;
  }

  /// With several ranks: makes every rank's parameters rank 0's, and (shard: ZeRO-1) gives each
  /// rank the optimizer state of its own range only. Returns the parameters this rank's
  /// optimizer must be built over.
  std::vector<remat::Parameter<float>> replicate(std::vector<remat::Parameter<float>> params,
                                                 bool shard = false) {
#ifdef REMAT_WITH_MPI
    if (size_ > 1) {
      dp_.emplace(*comm_, std::move(params),
                  remat::dist::DataParallelOptions{.shard_optimizer_state = shard});
      return dp_->optimizer_parameters();
    }
#endif
    (void)shard;
    return params;
  }

  /// This rank's rows of the job's batch (all of them for one process).
  template <class T>
  remat::Tensor<T> slice(const remat::Tensor<T>& batch) const {
    if (size_ == 1) return batch;
    const std::int64_t rows = batch.dim(0) / size_;
    return batch.narrow_rows(rank_ * rows, (rank_ + 1) * rows).clone();
  }

  /// Backward, with the gradients averaged over the ranks when it returns.
  void backward(remat::Tape& tape, const remat::Var<float>& loss) {
#ifdef REMAT_WITH_MPI
    if (dp_) return dp_->backward(tape, loss);
#endif
    tape.backward(loss);
  }

  /// Global-norm clipping of the averaged gradients (the same on every rank).
  void clip_grad_norm(const std::vector<remat::Parameter<float>>& all, double max_norm) {
#ifdef REMAT_WITH_MPI
    if (dp_) {
      dp_->clip_grad_norm(max_norm);
      return;
    }
#endif
    remat::optim::clip_grad_norm(all, max_norm);
  }

  /// The optimizer step (with sharded state: each rank's range, then the new values to all).
  void step(remat::optim::Optimizer<float>& optimizer) {
#ifdef REMAT_WITH_MPI
    if (dp_) return dp_->step(optimizer);
#endif
    optimizer.step();
  }

  /// The mean over the ranks of a per-rank figure (the job's batch's loss).
  double mean(double value) const {
#ifdef REMAT_WITH_MPI
    if (size_ > 1) return comm_->all_reduce(value) / size_;
#endif
    return value;
  }

  /// After an error on this rank: the others may wait in a reduction it will never join, so the
  /// whole job ends (MPI_Abort) instead of hanging; one process just returns `code`. An error
  /// every rank raised together (agree()) leaves nothing pending: each rank prints it and returns
  /// `code`, so every rank says why and the job ends with MPI_Finalize.
  int fail(const char* message, int code = 1) const {
    // one write per line, so that the lines of several ranks do not interleave
    const std::string line =
        (size_ > 1 ? "rank " + std::to_string(rank_) + ": " : std::string()) + message + "\n";
    std::fputs(line.c_str(), stderr);
#ifdef REMAT_WITH_MPI
    if (size_ > 1 && !job_wide_failure_) remat::dist::abort(code);
#endif
    return code;
  }

 private:
#ifdef REMAT_WITH_MPI
  std::unique_ptr<remat::dist::Environment> env_;
  std::optional<remat::dist::Communicator> comm_;
  std::optional<remat::dist::DataParallel<float>> dp_;
  bool job_wide_failure_ = false;  // the last error was raised on every rank (agree())
#endif
  int rank_ = 0, size_ = 1;
};

/// The settings train_gpt and train_llama share (flags::Training) that change what a rank
/// computes or how many collectives it joins, then `own` (the program's flags), then the data:
/// a digest of the text and vocabulary (ranks may read it from different paths) and the
/// position of the batch stream. Left out: --threads (results do not depend on it), and the
/// outputs only rank 0 writes (--log, --sample, --json, --save, --trace).
template <class Training, class Corpus>
Settings settings(const Training& o, const Settings& own, const Corpus& corpus,
                  std::uint64_t data_position, std::int64_t first_step) {
  Settings s = {{"--layers", std::to_string(o.layers)},
                {"--width", std::to_string(o.width)},
                {"--heads", std::to_string(o.heads)},
                {"--context", std::to_string(o.context)},
                {"--batch", std::to_string(o.batch)},
                {"--steps", std::to_string(o.steps)},
                {"--lr", flags::exact_text(o.lr)},
                {"--seed", std::to_string(o.seed)},
                {"--checkpoint", o.checkpoint},
                {"--eval-every", std::to_string(o.eval_every)},
                {"--eval-batches", std::to_string(o.eval_batches)}};
  s.insert(s.end(), own.begin(), own.end());
  std::uint64_t h = remat::detail::hash_bytes(corpus.vocab.data(), corpus.vocab.size());
  for (const auto* part : {&corpus.train, &corpus.val})
    h = remat::detail::mix64(h ^ remat::detail::hash_bytes(part->data(), part->size() * 4));
  char digest[24];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(h));
  s.push_back({"text (digest of the --data characters)", digest});
  s.push_back({"vocabulary size", std::to_string(corpus.vocab.size())});
  s.push_back({"first step", std::to_string(first_step)});
  s.push_back({"data position", std::to_string(data_position)});
  return s;
}

}  // namespace ranks
