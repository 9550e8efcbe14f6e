// Internal helpers of softdot::mpi: the library's own communicator and the
// collective checks every function makes before its first exchange.
#ifndef SOFTDOT_SRC_MPI_COMM_H_
#define SOFTDOT_SRC_MPI_COMM_H_

#include <mpi.h>

#include <string>

namespace softdot::mpi::detail {

// Throws std::runtime_error naming `call` (an MPI function) and the MPI
// error string when rc != MPI_SUCCESS.
void check_mpi(int rc, const char* call);

// A duplicate of the caller's communicator (MPI_Comm_dup in the
// constructor, MPI_Comm_free in the destructor), so that the library's
// messages never match the caller's, with the error handler
// MPI_ERRORS_RETURN (an MPI error on it is a code for check_mpi, not an
// abort). Collective: every rank of the caller's communicator constructs
// one. Not copyable or movable.
class DupComm {
 public:
  // `function` names the public function (for the error messages).
  DupComm(MPI_Comm comm, const char* function);
  ~DupComm();
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;

  MPI_Comm get() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

// Collective agreement on a local check. Every rank passes ok (its own
// verdict) and, when !ok, what (the message of its error). When every rank
// is ok this returns on every rank; otherwise every rank throws
// std::invalid_argument with the message of the lowest failing rank,
// prefixed with "rank R: " (R that rank), so that one bad rank never
// leaves the others waiting in an exchange.
void agree_or_throw(MPI_Comm comm, bool ok, const std::string& what);

// As agree_or_throw, but throws std::runtime_error (for a failure inside
// local compute: an exception other than a bad argument).
void agree_or_throw_runtime(MPI_Comm comm, bool ok, const std::string& what);

}  // namespace softdot::mpi::detail

#endif  // SOFTDOT_SRC_MPI_COMM_H_
