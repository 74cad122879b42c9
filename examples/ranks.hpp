#pragma once
// The data-parallel side of the training examples (train_gpt, train_llama). Built with MPI (the
// remat::mpi target, which defines REMAT_WITH_MPI) a program runs unchanged under
// `mpirun -np N`: every rank draws the same batch of N x --batch rows and trains on its own
// slice, gradients are averaged during backward (remat::dist::DataParallel), and only rank 0
// prints, evaluates and saves. Built without MPI, or run as one process, every call below is the
// plain single-process step.
#include <remat/remat.hpp>
#ifdef REMAT_WITH_MPI
#include <remat/dist/data_parallel.hpp>
#endif

#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

namespace ranks {

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
  /// whole job ends (MPI_Abort) instead of hanging; one process just returns `code`.
  int fail(const char* message, int code = 1) const {
    if (size_ > 1) std::fprintf(stderr, "rank %d: ", rank_);
    std::fprintf(stderr, "%s\n", message);
#ifdef REMAT_WITH_MPI
    if (size_ > 1) remat::dist::abort(code);
#endif
    return code;
  }

 private:
#ifdef REMAT_WITH_MPI
  std::unique_ptr<remat::dist::Environment> env_;
  std::optional<remat::dist::Communicator> comm_;
  std::optional<remat::dist::DataParallel<float>> dp_;
#endif
  int rank_ = 0, size_ = 1;
};

}  // namespace ranks
