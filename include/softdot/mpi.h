// softdot::mpi: softdot across processes over MPI (the C API of any MPI;
// tested with Open MPI). Built as the library softdot::mpi (CMake target
// softdot_mpi) when CMake finds MPI; the core library never needs it.
//
// Every function here is collective over the communicator it is given: each
// rank of it calls the function with its own shard. The library duplicates
// the communicator for the length of the call (MPI_Comm_dup), so its
// messages never match the caller's; MPI_THREAD_FUNNELED is enough (calls
// from the thread that initialised MPI). Arguments are checked on every rank
// and the verdicts combined before any data moves: when one rank's arguments
// are bad, every rank throws std::invalid_argument naming the function, the
// argument and the first failing rank, and no rank is left waiting. An
// error of an MPI call becomes std::runtime_error naming the call.
#ifndef SOFTDOT_MPI_H_
#define SOFTDOT_MPI_H_

#include <mpi.h>

#include "softdot/attention.h"
#include "softdot/mpi_vocab.h"

namespace softdot::mpi {}  // namespace softdot::mpi

#endif  // SOFTDOT_MPI_H_
