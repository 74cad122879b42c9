#pragma once
/// @file
/// DataParallel: the same model on every rank, a different slice of each batch on each, and
/// gradients averaged over the ranks while the backward sweep is still running (PyTorch DDP's
/// buckets, Horovod's tensor fusion, over MPI). Optionally shards the optimizer state (ZeRO
/// stage 1): each rank updates only its own contiguous range of the parameters.
///
/// Note [buckets]: the tape tells backward()'s BackwardHooks when a parameter's gradient is final
/// (the sweep has passed its first use). Its gradient is then copied into its bucket, and a full
/// bucket starts a non-blocking reduction. Buckets are filled in the order gradients become final,
/// read from the first tape (Tape::parameters_by_first_use(), reversed), and every rank checks that
/// all agree on that layout. Buckets start strictly in layout order, so every rank issues the same
/// collectives in the same order, and the sums are the same bits from one run to the next. The
/// first bucket is small (1 MiB, as DDP's), so the first reduction starts early in the sweep.
/// Open MPI moves non-blocking collectives forward only inside MPI calls, so the hook also tests
/// the oldest pending request after every node the sweep passes (after_op), and writes a finished
/// bucket's averages into the gradients there and then: after the sweep, only the buckets still in
/// flight are waited for and unpacked. A bucket holds at most bucket_bytes and at most
/// 1/min_buckets of the gradient bytes: with DDP's 25 MiB alone, a model of a few MiB has one
/// bucket that can only start when the sweep ends, and nothing overlaps.
///
/// Note [ZeRO-1]: with shard_optimizer_state, the trainable parameters are split into one
/// contiguous range per rank, balanced by bytes. A bucket holds its parameters in list order, so
/// each rank's share of a bucket is one slice and the bucket is reduce-scattered (each rank gets
/// the sum of its own slice only). Each rank's optimizer is a normal one over
/// optimizer_parameters(); step() runs it and all-gathers the new values through the same buckets.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/core/hash.hpp"
#include "remat/core/parameter.hpp"
#include "remat/core/tape.hpp"
#include "remat/dist/communicator.hpp"
#include "remat/optim/clip.hpp"
#include "remat/optim/optimizer.hpp"

namespace remat::dist {

struct DataParallelOptions {
  /// Gradient bytes per bucket at most (PyTorch DDP's default, 25 MiB). Larger: fewer, more
  /// efficient messages; smaller: the first reduction starts earlier in the sweep.
  std::size_t bucket_bytes = std::size_t(25) << 20;
  /// The first bucket's size: the gradients final first go out early (DDP's 1 MiB).
  std::size_t first_bucket_bytes = std::size_t(1) << 20;
  /// Buckets per step at least, parameters permitting (a bucket holds at most 1/min_buckets of
  /// the gradient bytes), so that a small model's reductions overlap its backward too. 1: only
  /// bucket_bytes decides (DDP); on many machines each bucket pays the ring's latency.
  std::size_t min_buckets = 8;
  /// ZeRO stage 1 (Note [ZeRO-1]): each rank keeps optimizer state for 1/N of the parameters.
  bool shard_optimizer_state = false;
};

/// What the last synchronized backward() did.
struct ReductionStats {
  double backward_seconds = 0;  ///< the sweep, with the reductions progressed inside it
  double wait_seconds = 0;      ///< after the sweep, until every bucket was reduced and unpacked
  std::size_t buckets = 0;      ///< buckets reduced per step
  std::size_t started_during_backward = 0;  ///< of which started before the sweep ended
  std::size_t bytes = 0;                    ///< gradient bytes each rank contributes per step
};

template <class T = float>
class DataParallel {
 public:
  /// Makes every rank's parameters equal to rank 0's (a broadcast of each, frozen ones too).
  /// Which parameters are trainable is read here: freeze or unfreeze before, not after.
  DataParallel(Communicator comm, std::vector<Parameter<T>> params,
               DataParallelOptions options = {})
      : comm_(comm), params_(std::move(params)), options_(options) {
    if (options_.bucket_bytes == 0 || options_.first_bucket_bytes == 0 ||
        options_.min_buckets == 0) {
      throw ArgumentError(
          "DataParallel: bucket_bytes, first_bucket_bytes and min_buckets must be positive");
    }
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Parameter<T>& p = params_[i];
      if (!p.defined())
        throw ArgumentError(remat::detail::cat("DataParallel: parameter ", i, " is undefined"));
      // a shape-only model has no values to agree on: price one rank's step without DataParallel
      // (its buckets hold one more copy of the gradients)
      if (!p.value().has_data()) {
        throw UsageError(remat::detail::cat("DataParallel: parameter ", i, " (shape ", p.shape(),
                                            ") was made in a shape-only run and has no values"));
      }
      if (!index_.emplace(p.identity(), i).second) {
        throw ArgumentError(remat::detail::cat("DataParallel: parameter ", i, " (shape ", p.shape(),
                                               ") is listed twice"));
      }
      comm_.broadcast(p.data(), 0);
      if (!p.frozen()) trainable_.push_back(i);
    }
    partition();
  }

  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const Communicator& communicator() const noexcept { return comm_; }
  int rank() const noexcept { return comm_.rank(); }
  int size() const noexcept { return comm_.size(); }

  /// The parameters this rank's optimizer must hold: all of them, or with sharded state this
  /// rank's contiguous range of the trainable ones (possibly none when ranks outnumber them).
  std::vector<Parameter<T>> optimizer_parameters() const {
    if (!options_.shard_optimizer_state) return params_;
    std::vector<Parameter<T>> mine;
    for (std::size_t k = owned_begin(rank()); k < owned_begin(rank() + 1); ++k)
      mine.push_back(params_[trainable_[k]]);
    return mine;
  }

  /// The rank whose optimizer updates `p` (rank 0 for all without sharded state), or -1 for a
  /// frozen parameter or one this DataParallel does not hold.
  int owner_of(const Parameter<T>& p) const {
    const auto it = index_.find(p.identity());
    if (it == index_.end() || !std::binary_search(trainable_.begin(), trainable_.end(), it->second))
      return -1;
    return owner(it->second);
  }

  /// Backward from `loss` with the gradients averaged over the ranks when it returns (with
  /// sharded state: those of this rank's parameters; the others' are dropped). Inside a
  /// no_sync() scope it only accumulates this rank's gradients, to be reduced by the next
  /// backward() outside it: gradient accumulation reduces once per optimizer step.
  void backward(Tape& tape, const Var<T>& loss) {
    if (no_sync_depth_ > 0) {
      tape.backward(loss);
      return;
    }
    check_trainable();
    const auto t0 = std::chrono::steady_clock::now();
    scan(tape);
    if (buckets_.empty() && !trainable_.empty()) build_layout();
    begin_step();
    try {
      tape.backward(loss, BackwardHooks{.gradient_ready = [this](const void* p) { final(p); },
                                        .after_op = [this] { poll(); }});
    } catch (...) {
      abandon();  // the job is about to abort: do not wait for peers (Request::abandon)
      throw;
    }
    const auto t1 = std::chrono::steady_clock::now();
    stats_.started_during_backward = launched_;
    finish();
    stats_.backward_seconds = std::chrono::duration<double>(t1 - t0).count();
    stats_.wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }

  /// RAII scope in which backward() does not reduce (micro-batches of one optimizer step).
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp) noexcept : dp_(&dp) { ++dp_->no_sync_depth_; }
    ~NoSync() { --dp_->no_sync_depth_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel* dp_;
  };
  [[nodiscard]] NoSync no_sync() noexcept { return NoSync(*this); }

  /// Global-norm clipping of the averaged gradients (optim::clip_grad_norm); with sharded state
  /// each rank sums the squares of its own range and the sums are all-reduced.
  double clip_grad_norm(double max_norm) {
    if (!options_.shard_optimizer_state) return optim::clip_grad_norm(params_, max_norm);
    const std::vector<Parameter<T>> mine = optimizer_parameters();
    double local = 0;
    for (const Parameter<T>& p : mine) {
      const Tensor<T> g = p.grad();
      if (g.defined()) {
        for (const T v : g) local += double(v) * double(v);
      }
    }
    if (!(max_norm > 0) || !std::isfinite(max_norm)) {
      throw ArgumentError(remat::detail::cat(
          "DataParallel::clip_grad_norm: max_norm must be positive and finite, got ", max_norm));
    }
    const double norm = std::sqrt(comm_.all_reduce(local));
    if (norm > max_norm) {
      const T scale = static_cast<T>(max_norm / (norm + 1e-6));
      for (const Parameter<T>& p : mine) {
        Tensor<T> g = p.grad();
        if (g.defined()) g.array() *= scale;
      }
    }
    return norm;
  }

  /// Runs the optimizer (built over optimizer_parameters()); with sharded state, then copies
  /// every rank's updated range to all ranks.
  void step(optim::Optimizer<T>& optimizer) {
    check_optimizer(optimizer);
    if (!optimizer.parameters().empty()) optimizer.step();
    if (options_.shard_optimizer_state && size() > 1) gather_parameters();
  }

  /// Time to reduce every bucket with nothing else running (median of `repeats`): the figure the
  /// wait after backward is compared with. Collective: every rank must call it.
  double time_reduction_alone(int repeats = 5) {
    if (buckets_.empty())
      throw UsageError(
          "DataParallel::time_reduction_alone: call backward() once first (it lays out the "
          "buckets)");
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      for (Bucket& b : buckets_) b.data.fill(T(0));
      comm_.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t b = 0; b < buckets_.size(); ++b) launch(b);
      for (Bucket& b : buckets_) b.request.wait();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  const ReductionStats& stats() const noexcept { return stats_; }

  /// Index in the parameter list of the trainable parameters of each bucket, in layout order.
  std::vector<std::vector<std::size_t>> bucket_layout() const {
    std::vector<std::vector<std::size_t>> out;
    for (const Bucket& b : buckets_) out.push_back(b.members);
    return out;
  }

 private:
  struct Bucket {
    std::vector<std::size_t> members;   // parameter indices, ascending (Note [ZeRO-1])
    std::vector<std::int64_t> offsets;  // of each member in data
    Tensor<T> data;                     // the members' gradients, then (ZeRO) their new values
    Tensor<T> mine;                     // ZeRO: this rank's reduced slice
    std::vector<int> counts;            // ZeRO: elements of each rank's slice
    std::vector<int> displs;
    std::size_t remaining = 0;  // members whose gradient is not final yet, this step
    Request request;
  };

  std::int64_t numel(std::size_t p) const { return params_[p].value().numel(); }

  /// Trainable parameters [owned_begin(r), owned_begin(r + 1)) (positions in trainable_) are
  /// rank r's: contiguous, and cut where the running byte count is nearest r/N of the total.
  std::size_t owned_begin(int r) const noexcept { return cuts_[static_cast<std::size_t>(r)]; }

  void partition() {
    const auto n = static_cast<std::size_t>(size());
    cuts_.assign(n + 1, trainable_.size());
    cuts_[0] = 0;
    owner_.assign(params_.size(), 0);
    if (!options_.shard_optimizer_state) return;
    std::int64_t total = 0;
    for (std::size_t p : trainable_) total += numel(p);
    std::int64_t before = 0;
    std::size_t k = 0;
    for (std::size_t r = 1; r < n; ++r) {
      const double target = double(total) * double(r) / double(n);
      // take the next parameter while that brings the cut nearer the target
      while (k < trainable_.size() && std::abs(double(before + numel(trainable_[k])) - target) <=
                                          std::abs(double(before) - target)) {
        before += numel(trainable_[k++]);
      }
      cuts_[r] = k;
    }
    owner_.assign(params_.size(), 0);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = cuts_[r]; j < cuts_[r + 1]; ++j)
        owner_[trainable_[j]] = static_cast<int>(r);
    }
  }

  int owner(std::size_t p) const noexcept { return owner_[p]; }

  void check_trainable() const {
    std::size_t k = 0;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const bool listed = k < trainable_.size() && trainable_[k] == i;
      if (listed) ++k;
      if (listed == params_[i].frozen()) {
        throw UsageError(remat::detail::cat(
            "DataParallel: parameter ", i, " (shape ", params_[i].shape(), ") was ",
            listed ? "frozen" : "unfrozen",
            " after the DataParallel was made; freeze or unfreeze before making it"));
      }
    }
  }

  void check_optimizer(const optim::Optimizer<T>& optimizer) const {
    const std::vector<Parameter<T>> expected = optimizer_parameters();
    const auto& held = optimizer.parameters();
    bool same = held.size() == expected.size();
    for (std::size_t i = 0; same && i < held.size(); ++i)
      same = held[i].identity() == expected[i].identity();
    if (!same) {
      throw UsageError(remat::detail::cat(
          "DataParallel::step on rank ", rank(), ": the optimizer holds ", held.size(),
          " parameters, not the ", expected.size(),
          " of optimizer_parameters(); build it over dp.optimizer_parameters()"));
    }
  }

  /// Where each parameter is first used on this tape (Note [buckets]).
  void scan(const Tape& tape) {
    first_use_.assign(params_.size(), kUnused);
    const std::vector<const void*> used = tape.parameters_by_first_use();
    for (std::size_t k = 0; k < used.size(); ++k) {
      const auto it = index_.find(used[k]);
      if (it != index_.end()) first_use_[it->second] = k;
    }
  }

  /// Buckets in the order gradients become final (latest first use first; parameters this tape
  /// does not use last), checked to be the same on every rank.
  void build_layout() {
    std::vector<std::size_t> order = trainable_;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const bool ua = first_use_[a] != kUnused, ub = first_use_[b] != kUnused;
      if (ua != ub) return ua;
      return ua ? first_use_[a] > first_use_[b] : a > b;
    });
    std::size_t total = 0;
    for (std::size_t p : order) total += params_[p].value().bytes();
    const std::size_t share = std::max<std::size_t>(total / options_.min_buckets, 1);
    std::uint64_t fingerprint = 0;
    std::size_t bytes = 0, cap = std::min(options_.first_bucket_bytes, share);
    bucket_of_.assign(params_.size(), 0);
    for (std::size_t p : order) {
      const std::size_t b = params_[p].value().bytes();
      if (buckets_.empty() || (bytes > 0 && bytes + b > cap)) {
        if (!buckets_.empty()) cap = std::min(options_.bucket_bytes, share);
        buckets_.emplace_back();
        bytes = 0;
        fingerprint = remat::detail::mix64(fingerprint ^ 0x9e3779b97f4a7c15ULL);
      }
      buckets_.back().members.push_back(p);
      bucket_of_[p] = buckets_.size() - 1;
      bytes += b;
      fingerprint = remat::detail::mix64(fingerprint ^ p);
    }
    const std::uint64_t lo = comm_.all_reduce(fingerprint, ReduceOp::min),
                        hi = comm_.all_reduce(fingerprint, ReduceOp::max);
    if (lo != hi) {
      buckets_.clear();
      throw CommError(remat::detail::cat(
          "DataParallel on rank ", rank(),
          ": the ranks' tapes use the parameters in different "
          "orders; every rank must run the same model code (data may differ, control flow not)"));
    }
    stats_.bytes = 0;
    for (Bucket& bucket : buckets_) {
      std::sort(bucket.members.begin(), bucket.members.end());
      std::int64_t at = 0;
      bucket.counts.assign(static_cast<std::size_t>(size()), 0);
      for (std::size_t p : bucket.members) {
        bucket.offsets.push_back(at);
        at += numel(p);
        bucket.counts[static_cast<std::size_t>(owner(p))] += static_cast<int>(numel(p));
      }
      bucket.data = Tensor<T>({at});
      stats_.bytes += bucket.data.bytes();
      if (options_.shard_optimizer_state)
        bucket.mine = Tensor<T>({std::max(1, bucket.counts[static_cast<std::size_t>(rank())])});
    }
    stats_.buckets = buckets_.size();
  }

  void begin_step() {
    for (Bucket& b : buckets_) b.remaining = b.members.size();
    ready_.assign(params_.size(), false);
    launched_ = tested_ = 0;
  }

  /// The sweep's hooks (Note [buckets]): parameter `p`'s gradient is final; and, after every
  /// node, a look at whether the oldest reduction in flight is done.
  void final(const void* p) {
    const auto it = index_.find(p);
    if (it != index_.end() && !params_[it->second].frozen()) ready(it->second);
  }
  void poll() {
    if (tested_ < launched_ && buckets_[tested_].request.test()) unpack(buckets_[tested_++]);
  }

  /// Parameter p's gradient is final: copy it into its bucket, and start every bucket that is
  /// full and whose predecessors have started.
  void ready(std::size_t p) {
    if (ready_[p]) return;
    ready_[p] = true;
    Bucket& b = buckets_[bucket_of_[p]];
    const std::size_t k = static_cast<std::size_t>(
        std::lower_bound(b.members.begin(), b.members.end(), p) - b.members.begin());
    T* dst = b.data.data() + b.offsets[k];
    // No gradient (none made, or a stale one after zero_grad): this rank's gradient is zero
    // (the parameter did not reach the loss on this rank).
    if (const Tensor<T> grad = params_[p].grad(); grad.defined())
      std::memcpy(dst, grad.data(), grad.bytes());
    else
      std::fill(dst, dst + numel(p), T(0));
    --b.remaining;
    while (launched_ < buckets_.size() && buckets_[launched_].remaining == 0) launch(launched_++);
  }

  void launch(std::size_t index) {
    Bucket& b = buckets_[index];
    const std::span<T> all(b.data.data(), static_cast<std::size_t>(b.data.numel()));
    if (options_.shard_optimizer_state) {
      b.request = comm_.reduce_scatter_async(
          std::span<const T>(all),
          std::span<T>(b.mine.data(), static_cast<std::size_t>(b.mine.numel())),
          std::span<const int>(b.counts));
    } else {
      b.request = comm_.all_reduce_async(all);
    }
  }

  /// After the sweep: parameters it never reached contribute zeros; wait for the buckets still in
  /// flight and write their averages into the gradients.
  void finish() {
    for (Bucket& b : buckets_) {
      for (std::size_t p : b.members) ready(p);
    }
    for (; tested_ < buckets_.size(); ++tested_) {
      buckets_[tested_].request.wait();
      unpack(buckets_[tested_]);
    }
  }

  /// A reduced bucket's averages into its members' gradients (with sharded state: this rank's
  /// members only; the others' gradients are marked stale).
  void unpack(Bucket& b) {
    const T scale = T(1) / T(size());
    std::int64_t mine_at = 0;
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      const std::size_t p = b.members[k];
      if (options_.shard_optimizer_state && owner(p) != rank()) {
        params_[p].zero_grad();  // another rank updates p; this rank's sum is not its gradient
        continue;
      }
      const T* src =
          options_.shard_optimizer_state ? b.mine.data() + mine_at : b.data.data() + b.offsets[k];
      mine_at += numel(p);
      T* dst = params_[p].overwrite_grad().data();
      for (std::int64_t i = 0; i < numel(p); ++i) dst[i] = src[i] * scale;
    }
  }

  /// Every rank's updated range, to every rank, through the buckets (Note [ZeRO-1]).
  void gather_parameters() {
    if (buckets_.empty())
      throw UsageError(
          "DataParallel::step: with sharded state, call backward() before the first step");
    for (Bucket& b : buckets_) {
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        const std::size_t p = b.members[k];
        if (owner(p) == rank())
          std::memcpy(b.data.data() + b.offsets[k], params_[p].value().data(),
                      params_[p].value().bytes());
      }
      b.request = comm_.all_gather_async(
          std::span<T>(b.data.data(), static_cast<std::size_t>(b.data.numel())),
          std::span<const int>(b.counts), b.displs);
    }
    for (Bucket& b : buckets_) {
      b.request.wait();
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        Parameter<T> p = params_[b.members[k]];
        std::memcpy(p.data().data(), b.data.data() + b.offsets[k], p.value().bytes());
      }
    }
  }

  /// Forgets the pending reductions and leaks their buffers (Request::abandon).
  void abandon() noexcept {
    auto* kept =
        new std::vector<Tensor<T>>();  // intentionally never freed: MPI may still write into them
    for (Bucket& b : buckets_) {
      if (!b.request.pending()) continue;
      b.request.abandon();
      kept->push_back(b.data);
      kept->push_back(b.mine);
    }
    buckets_.clear();
  }

  Communicator comm_;
  std::vector<Parameter<T>> params_;
  DataParallelOptions options_;
  std::unordered_map<const void*, std::size_t> index_;  // Parameter::identity() -> position
  std::vector<std::size_t> trainable_;                  // positions of the trainable parameters
  std::vector<std::size_t> cuts_;                       // ZeRO ranges over trainable_
  std::vector<int> owner_;                              // ZeRO rank of each parameter
  static constexpr std::size_t kUnused = static_cast<std::size_t>(-1);
  std::vector<std::size_t> first_use_;  // per parameter: its rank in the tape's first uses
  std::vector<std::size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<bool> ready_;
  std::size_t launched_ = 0, tested_ = 0;
  int no_sync_depth_ = 0;
  ReductionStats stats_;
};

}  // namespace remat::dist
