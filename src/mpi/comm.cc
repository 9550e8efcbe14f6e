#include "mpi/comm.h"

#include <mpi.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

namespace softdot::mpi::detail {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw std::runtime_error(std::string("softdot::mpi: ") + call +
                           " failed: " + std::string(text, len));
}

DupComm::DupComm(MPI_Comm comm, const char* function) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    throw std::runtime_error(std::string(function) +
                             ": MPI is not initialized (call MPI_Init first)");
  }
  if (comm == MPI_COMM_NULL) {
    throw std::invalid_argument(std::string(function) +
                                ": comm is MPI_COMM_NULL");
  }
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  // Errors on the library's communicator come back as codes (check_mpi
  // turns them into exceptions) instead of aborting the job.
  if (MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
    MPI_Comm_free(&comm_);
    throw std::runtime_error(std::string(function) +
                             ": MPI_Comm_set_errhandler failed");
  }
  if (MPI_Comm_rank(comm_, &rank_) != MPI_SUCCESS ||
      MPI_Comm_size(comm_, &size_) != MPI_SUCCESS) {
    MPI_Comm_free(&comm_);
    throw std::runtime_error(std::string(function) +
                             ": MPI_Comm_rank/MPI_Comm_size failed");
  }
}

DupComm::~DupComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

namespace {

// Returns the lowest failing rank (or -1 when every rank is ok) and, on
// every rank, that rank's message.
int agree(MPI_Comm comm, bool ok, const std::string& what,
          std::string& message) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  int mine = ok ? INT_MAX : rank;
  int first = INT_MAX;
  check_mpi(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm),
            "MPI_Allreduce");
  if (first == INT_MAX) return -1;
  int len = rank == first ? static_cast<int>(what.size()) : 0;
  check_mpi(MPI_Bcast(&len, 1, MPI_INT, first, comm), "MPI_Bcast");
  std::vector<char> text(static_cast<std::size_t>(len));
  if (rank == first) text.assign(what.begin(), what.end());
  if (len > 0) {
    check_mpi(MPI_Bcast(text.data(), len, MPI_CHAR, first, comm), "MPI_Bcast");
  }
  message = "rank " + std::to_string(first) + ": " +
            std::string(text.begin(), text.end());
  return first;
}

}  // namespace

void agree_or_throw(MPI_Comm comm, bool ok, const std::string& what) {
  std::string message;
  if (agree(comm, ok, what, message) >= 0) {
    throw std::invalid_argument(message);
  }
}

void agree_or_throw_runtime(MPI_Comm comm, bool ok, const std::string& what) {
  std::string message;
  if (agree(comm, ok, what, message) >= 0) {
    throw std::runtime_error(message);
  }
}

}  // namespace softdot::mpi::detail
