// tightfit/distributed/mpi_communicator.hpp: the Communicator over MPI (OpenMPI 4.1 on CPUs and
// between hosts). Link tightfit::mpi.
//
// mpi_environment initialises MPI (MPI_Init_thread, checking that the library provides the
// required thread level) and finalises it when it goes out of scope, unless MPI was already
// initialised by the caller. mpi_communicator duplicates a communicator (MPI_COMM_WORLD by
// default) so that tightfit's messages never match the caller's, and sets MPI_ERRORS_RETURN on
// it: every failing call becomes a tightfit::error naming the operation and MPI's message.
// A rank that cannot go on calls abort(): MPI_Abort ends every rank of the job (a rank that
// returns from main while others wait in a collective would hang them).
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // only MPI's C API is used
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "tightfit/core/error.hpp"
#include "tightfit/distributed/communicator.hpp"

namespace tightfit {

namespace detail {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

inline void mpi_check(int code, const char* what) {
  if (code != MPI_SUCCESS) fail(what, ": ", mpi_error_text(code));
}

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else
    static_assert(sizeof(T) == 0, "mpi_communicator: value type without an MPI datatype");
}

inline int mpi_count(std::size_t n, const char* what) {
  check(n <= static_cast<std::size_t>(INT_MAX), what, ": ", n, " values exceed MPI's int count (",
        INT_MAX, "); split the buffer");
  return static_cast<int>(n);
}

inline const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

}  // namespace detail

/// Initialises MPI for the lifetime of the object (see the top comment).
class mpi_environment {
 public:
  /// `required`: MPI_THREAD_FUNNELED (default: only the thread that created the communicator
  /// calls MPI; TBB's workers never do) or stronger.
  explicit mpi_environment(int* argc = nullptr, char*** argv = nullptr,
                           int required = MPI_THREAD_FUNNELED) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&provided_);
    } else {
      detail::mpi_check(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread");
      owns_ = true;
    }
    check(provided_ >= required, "mpi_environment: MPI provides ",
          detail::thread_level_name(provided_), ", tightfit needs ",
          detail::thread_level_name(required));
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  int thread_level() const { return provided_; }

 private:
  int provided_ = MPI_THREAD_SINGLE;
  bool owns_ = false;
};

/// A Communicator over an MPI communicator (duplicated; freed on destruction).
class mpi_communicator {
 public:
  /// A pending MPI request (see CommRequest).
  class request {
   public:
    request() = default;
    explicit request(MPI_Request r) : request_(r) {}
    request(request&& o) noexcept : request_(std::exchange(o.request_, MPI_REQUEST_NULL)) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        finish_quietly();
        request_ = std::exchange(o.request_, MPI_REQUEST_NULL);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { finish_quietly(); }

    void wait() {
      if (request_ == MPI_REQUEST_NULL) return;
      detail::mpi_check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait (all_reduce_sum)");
    }
    bool done() {
      if (request_ == MPI_REQUEST_NULL) return true;
      int flag = 0;
      detail::mpi_check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      return flag != 0;
    }

   private:
    void finish_quietly() {
      if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    }
    MPI_Request request_ = MPI_REQUEST_NULL;
  };

  explicit mpi_communicator(MPI_Comm parent = MPI_COMM_WORLD) {
    detail::mpi_check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }

  template <class T>
  request all_reduce_sum(std::span<T> x) {
    ++stats_.all_reduce_calls;
    stats_.bytes += static_cast<std::int64_t>(x.size_bytes());
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi_check(
        MPI_Iallreduce(MPI_IN_PLACE, x.data(), detail::mpi_count(x.size(), "all_reduce_sum"),
                       detail::mpi_type<T>(), MPI_SUM, comm_, &r),
        "MPI_Iallreduce");
    return request(r);
  }

  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check(out.size() == in.size() * static_cast<std::size_t>(size_), "all_gather: out has ",
          out.size(), " values, expected ", in.size() * static_cast<std::size_t>(size_),
          " (ranks x in)");
    ++stats_.all_gather_calls;
    stats_.bytes += static_cast<std::int64_t>(in.size_bytes());
    const int n = detail::mpi_count(in.size(), "all_gather");
    detail::mpi_check(MPI_Allgather(in.data(), n, detail::mpi_type<T>(), out.data(), n,
                                    detail::mpi_type<T>(), comm_),
                      "MPI_Allgather");
  }

  template <class T>
  void reduce_scatter_sum(std::span<const T> in, std::span<T> out) {
    check(in.size() == out.size() * static_cast<std::size_t>(size_), "reduce_scatter_sum: in has ",
          in.size(), " values, expected ", out.size() * static_cast<std::size_t>(size_),
          " (ranks x out)");
    ++stats_.reduce_scatter_calls;
    stats_.bytes += static_cast<std::int64_t>(in.size_bytes());
    detail::mpi_check(MPI_Reduce_scatter_block(in.data(), out.data(),
                                               detail::mpi_count(out.size(), "reduce_scatter_sum"),
                                               detail::mpi_type<T>(), MPI_SUM, comm_),
                      "MPI_Reduce_scatter_block");
  }

  template <class T>
  void broadcast(std::span<T> x, int root) {
    check(root >= 0 && root < size_, "broadcast: root is ", root, ", expected in [0, ", size_, ")");
    ++stats_.broadcast_calls;
    if (rank_ == root) stats_.bytes += static_cast<std::int64_t>(x.size_bytes());
    detail::mpi_check(MPI_Bcast(x.data(), detail::mpi_count(x.size(), "broadcast"),
                                detail::mpi_type<T>(), root, comm_),
                      "MPI_Bcast");
  }

  /// out <- rank r - 1's in while in goes to rank r + 1 (MPI_Sendrecv, one message each way).
  template <class T>
  void ring_shift(std::span<const T> in, std::span<T> out) {
    check(in.size() == out.size(), "ring_shift: out has ", out.size(), " values, expected ",
          in.size());
    ++stats_.ring_shift_calls;
    stats_.bytes += static_cast<std::int64_t>(in.size_bytes());
    const int n = detail::mpi_count(in.size(), "ring_shift");
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    detail::mpi_check(MPI_Sendrecv(in.data(), n, detail::mpi_type<T>(), next, 0, out.data(), n,
                                   detail::mpi_type<T>(), prev, 0, comm_, MPI_STATUS_IGNORE),
                      "MPI_Sendrecv (ring_shift)");
  }

  void barrier() {
    ++stats_.barrier_calls;
    detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
  }

  /// Ends every rank of the job with `code` (MPI_Abort); never returns.
  [[noreturn]] void abort(int code) {
    MPI_Abort(comm_, code);
    std::abort();
  }

  comm_stats& stats() { return stats_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  comm_stats stats_;
};

static_assert(Communicator<mpi_communicator>);

}  // namespace tightfit
