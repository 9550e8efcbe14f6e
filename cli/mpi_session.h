// softdot command: what the two --ring commands (cli/commands_ring.cc and
// cli/commands_cross_entropy_ring.cc) share around MPI: the session and the
// one error line. Built only with softdot::mpi (SOFTDOT_CLI_MPI).
#ifndef SOFTDOT_CLI_MPI_SESSION_H_
#define SOFTDOT_CLI_MPI_SESSION_H_

#include <mpi.h>

#include <cstdio>
#include <string>

#include "error.h"

namespace softdot::cli {

// MPI_Init_thread on entry (unless the program already did), MPI_Finalize on
// exit; rank() and size() are those of MPI_COMM_WORLD. A failed
// MPI_Init_thread is a CliError: without MPI no rank can run the command, and
// the ranks that did start would otherwise wait for the others forever.
class MpiSession {
 public:
  MpiSession() {
    int done = 0;
    MPI_Initialized(&done);
    if (!done) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) !=
          MPI_SUCCESS) {
        throw CliError("--ring: MPI_Init_thread failed");
      }
      owner_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiSession() {
    if (owner_) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  bool owner_ = false;
  int rank_ = 0, size_ = 1;
};

// Rank 0's report of an error every rank has met: "softdot: error: MESSAGE"
// on one line of stderr, as main() prints it, flushed at once. The ranks
// then meet at a barrier before they exit, so that mpirun, which stops the
// job when the first rank exits with an error, cannot stop it before the
// line is out.
inline void print_ring_error(const std::string& message) {
  std::string line = "softdot: error: " + message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_MPI_SESSION_H_
