#pragma once
/// @file
/// Communicator: remat's face of an MPI communicator (rank, size, broadcast, all-reduce,
/// reduce-scatter, all-gather, barrier, and non-blocking forms returning a Request). This part
/// (remat/dist/, the CMake target remat::mpi) is the only one that includes <mpi.h>; the rest of
/// remat neither needs nor knows MPI.
///
/// Every call checks its arguments and MPI's return code: the communicator's error handler is set
/// to MPI_ERRORS_RETURN, so a failure becomes a dist::CommError naming the call and the rank
/// instead of MPI's default abort without context.

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/tensor.hpp"

namespace remat::dist {

/// A failed MPI call, or a collective called with arguments that cannot fit together.
class CommError : public Error {
 public:
  using Error::Error;
};

/// How all_reduce combines the ranks' values.
enum class ReduceOp { sum, max, min };

namespace detail {

using remat::detail::cat;

template <class T>
MPI_Datatype datatype() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return MPI_UINT64_T;
  else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, unsigned char>)
    return MPI_BYTE;
  else
    static_assert(sizeof(T) == 0,
                  "remat::dist: element type must be float, double, (u)int32/64 or char");
}

inline MPI_Op mpi_op(ReduceOp op) noexcept {
  return op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::max ? MPI_MAX : MPI_MIN;
}

/// MPI counts are int: refuse a message that does not fit rather than truncating it.
inline int count_of(std::size_t n, const char* call) {
  if (n > static_cast<std::size_t>(INT32_MAX)) {
    throw CommError(cat("dist: ", call, ": ", n,
                        " elements exceed MPI's int count (2^31 - 1); split the message"));
  }
  return static_cast<int>(n);
}

/// Rank of this process in `comm` (in MPI_COMM_WORLD when `comm` is not valid), or -1 when
/// even that cannot be asked (MPI finalized).
inline int rank_in(MPI_Comm comm) noexcept {
  int finalized = 0, rank = -1;
  MPI_Finalized(&finalized);
  if (finalized) return -1;
  if (comm == MPI_COMM_NULL || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// Turns an MPI return code into a CommError naming the call, the rank and MPI's explanation.
inline void check(int rc, MPI_Comm comm, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  throw CommError(cat("dist: ", call, " failed on rank ", rank_in(comm), ": ",
                      std::string(text, static_cast<std::size_t>(length)), " (MPI error ", rc,
                      ")"));
}

}  // namespace detail

/// Ends every process of the job with `code` (MPI_Abort): what a rank that failed must do, since
/// returning from main() would wait in MPI_Finalize for peers that wait for it. mpirun then
/// stops the other ranks and exits non-zero.
[[noreturn]] inline void abort(int code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps the promise if it does
}

/// RAII MPI_Init / MPI_Finalize for a program's main(). Asks for no thread support beyond
/// MPI_THREAD_FUNNELED: remat's worker pool never calls MPI, only the thread running main() does.
/// An exception leaving the scope of an Environment aborts the whole job (dist::abort) instead of
/// finalizing, for the same reason.
class Environment {
 public:
  Environment(int& argc, char**& argv) : exceptions_(std::uncaught_exceptions()) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // someone else owns MPI's lifetime
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      throw CommError(
          "dist: MPI_Init_thread failed (is the program started by mpirun, or MPI installed "
          "right?)");
    }
    owner_ = true;
  }
  ~Environment() {
    if (!owner_) return;
    if (std::uncaught_exceptions() > exceptions_) dist::abort(1);
    MPI_Finalize();
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

 private:
  int exceptions_;
  bool owner_ = false;
};

/// A pending non-blocking operation. wait() finishes it (throwing on failure); the destructor of
/// a request still pending waits for it too, because MPI may still write into its buffer.
class Request {
 public:
  Request() = default;
  Request(MPI_Request request, MPI_Comm comm, const char* call) noexcept
      : request_(request), comm_(comm), call_(call) {}
  Request(Request&& other) noexcept { *this = std::move(other); }
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
      comm_ = other.comm_;
      call_ = other.call_;
    }
    return *this;
  }
  ~Request() { finish_quietly(); }

  /// Whether the operation has completed; also lets MPI make progress on every pending
  /// operation (Open MPI moves non-blocking collectives forward only inside MPI calls).
  bool test() {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    detail::check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), comm_, call_);
    return done != 0;
  }

  void wait() {
    if (request_ == MPI_REQUEST_NULL) return;
    detail::check(MPI_Wait(&request_, MPI_STATUS_IGNORE), comm_, call_);
  }

  bool pending() const noexcept { return request_ != MPI_REQUEST_NULL; }

  /// Forgets the operation without waiting. Only for a rank that is about to abort the job
  /// (dist::abort): waiting would hang on peers that will never join, and MPI forbids freeing
  /// a pending collective. The buffer must then never be freed (leak it).
  void abandon() noexcept { request_ = MPI_REQUEST_NULL; }

 private:
  void finish_quietly() noexcept {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    request_ = MPI_REQUEST_NULL;
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  MPI_Comm comm_ = MPI_COMM_NULL;
  const char* call_ = "";
};

/// A communicator: a group of ranks that run collectives together. Copies refer to the same
/// MPI communicator (which this class does not free: MPI_COMM_WORLD lives until MPI_Finalize).
class Communicator {
 public:
  /// Wraps `comm` and makes its MPI errors return codes (turned into CommError) instead of
  /// aborting. MPI must be initialized (dist::Environment).
  explicit Communicator(MPI_Comm comm) : comm_(comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      throw CommError(
          "dist: Communicator made before MPI_Init (create a dist::Environment in main first)");
    detail::check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), comm_,
                  "MPI_Comm_set_errhandler");
    detail::check(MPI_Comm_rank(comm_, &rank_), comm_, "MPI_Comm_rank");
    detail::check(MPI_Comm_size(comm_, &size_), comm_, "MPI_Comm_size");
  }

  /// Every process of the job.
  static Communicator world() { return Communicator(MPI_COMM_WORLD); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm native() const noexcept { return comm_; }

  void barrier() const { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  /// Copies root's `data` into every rank's `data` (same length everywhere).
  template <class T>
  void broadcast(std::span<T> data, int root = 0) const {
    check_root(root, "broadcast");
    check(MPI_Bcast(data.data(), detail::count_of(data.size(), "broadcast"), detail::datatype<T>(),
                    root, comm_),
          "MPI_Bcast");
  }
  template <class T>
  void broadcast(Tensor<T>& t, int root = 0) const {
    T* first = t.begin();  // refuses a shape-only tensor, naming begin()
    broadcast(std::span<T>(first, static_cast<std::size_t>(t.numel())), root);
  }

  /// Combines `data` over all ranks in place: every rank ends with the same result.
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::sum) const {
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), detail::count_of(data.size(), "all_reduce"),
                        detail::datatype<T>(), detail::mpi_op(op), comm_),
          "MPI_Allreduce");
  }
  template <class T>
  T all_reduce(T value, ReduceOp op = ReduceOp::sum) const {
    all_reduce(std::span<T>(&value, 1), op);
    return value;
  }

  /// all_reduce() that returns at once; `data` must stay alive and untouched until the request
  /// completes.
  template <class T>
  Request all_reduce_async(std::span<T> data, ReduceOp op = ReduceOp::sum) const {
    MPI_Request r = MPI_REQUEST_NULL;
    check(
        MPI_Iallreduce(MPI_IN_PLACE, data.data(), detail::count_of(data.size(), "all_reduce_async"),
                       detail::datatype<T>(), detail::mpi_op(op), comm_, &r),
        "MPI_Iallreduce");
    return Request(r, comm_, "MPI_Iallreduce");
  }

  /// Sums `in` (the same length on every rank, sum(counts)) over the ranks and leaves rank r the
  /// slice of counts[r] elements that starts after the first r counts, in `out`.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const int> counts) const {
    check_scatter(in.size(), out.size(), counts, "reduce_scatter");
    check(MPI_Reduce_scatter(in.data(), out.data(), counts.data(), detail::datatype<T>(), MPI_SUM,
                             comm_),
          "MPI_Reduce_scatter");
  }
  /// reduce_scatter() that returns at once; `in`, `out` and `counts` must stay alive until the
  /// request completes (MPI reads the counts while the operation runs).
  template <class T>
  Request reduce_scatter_async(std::span<const T> in, std::span<T> out,
                               std::span<const int> counts) const {
    check_scatter(in.size(), out.size(), counts, "reduce_scatter_async");
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter(in.data(), out.data(), counts.data(), detail::datatype<T>(), MPI_SUM,
                              comm_, &r),
          "MPI_Ireduce_scatter");
    return Request(r, comm_, "MPI_Ireduce_scatter");
  }

  /// In place: rank r's counts[r] elements, found in `data` after the first r counts, are copied
  /// into the same place on every rank.
  template <class T>
  void all_gather(std::span<T> data, std::span<const int> counts) const {
    const std::vector<int> displs = displacements(data.size(), counts, "all_gather");
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(),
                         displs.data(), detail::datatype<T>(), comm_),
          "MPI_Allgatherv");
  }
  /// all_gather() that returns at once, filling `displs` with the slices' offsets; `data`,
  /// `counts` and `displs` must stay alive until the request completes.
  template <class T>
  Request all_gather_async(std::span<T> data, std::span<const int> counts,
                           std::vector<int>& displs) const {
    displs = displacements(data.size(), counts, "all_gather_async");
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(),
                          displs.data(), detail::datatype<T>(), comm_, &r),
          "MPI_Iallgatherv");
    return Request(r, comm_, "MPI_Iallgatherv");
  }

 private:
  void check(int rc, const char* call) const { detail::check(rc, comm_, call); }

  void check_root(int root, const char* call) const {
    if (root < 0 || root >= size_) {
      throw CommError(detail::cat("dist: ", call, " on rank ", rank_, ": root ", root,
                                  " is not a rank of this communicator (size ", size_, ")"));
    }
  }

  void check_scatter(std::size_t in, std::size_t out, std::span<const int> counts,
                     const char* call) const {
    displacements(in, counts, call);
    if (out < static_cast<std::size_t>(counts[static_cast<std::size_t>(rank_)])) {
      throw CommError(detail::cat("dist: ", call, " on rank ", rank_, ": output holds ", out,
                                  " elements, this rank receives ",
                                  counts[static_cast<std::size_t>(rank_)]));
    }
  }

  /// Offsets of each rank's slice; checks there is one count per rank and that they add up.
  std::vector<int> displacements(std::size_t total, std::span<const int> counts,
                                 const char* call) const {
    if (counts.size() != static_cast<std::size_t>(size_)) {
      throw CommError(detail::cat("dist: ", call, " on rank ", rank_, ": ", counts.size(),
                                  " counts given for ", size_, " ranks"));
    }
    std::vector<int> displs(counts.size());
    std::size_t at = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] < 0)
        throw CommError(detail::cat("dist: ", call, " on rank ", rank_, ": count ", counts[r],
                                    " for rank ", r));
      displs[r] = detail::count_of(at, call);
      at += static_cast<std::size_t>(counts[r]);
    }
    if (at != total) {
      throw CommError(detail::cat("dist: ", call, " on rank ", rank_, ": the counts add up to ", at,
                                  " elements, the buffer holds ", total));
    }
    return displs;
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace remat::dist
