// The skeleton of softdot::mpi: the duplicated communicator and the
// collective argument check (every rank throws when one rank is bad).
#include "mpi/comm.h"

#include <mpi.h>

#include <stdexcept>
#include <string>

#include "mpi_test_util.h"
#include "softdot/mpi.h"

namespace {

using softdot::mpi::detail::agree_or_throw;
using softdot::mpi::detail::agree_or_throw_runtime;
using softdot::mpi::detail::DupComm;
using softdot_test::world_rank;
using softdot_test::world_size;

void dup_is_private() {
  DupComm c(MPI_COMM_WORLD, "test");
  MPI_EXPECT(c.rank() == world_rank());
  MPI_EXPECT(c.size() == world_size());
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(c.get(), MPI_COMM_WORLD, &cmp);
  MPI_EXPECT(cmp == MPI_CONGRUENT);  // same group, different context
  // A message on the duplicate is not seen on the original.
  const int p = world_size(), r = world_rank();
  int token = 1000 + r, got = -1;
  MPI_Sendrecv(&token, 1, MPI_INT, (r + 1) % p, 7, &got, 1, MPI_INT,
               (r + p - 1) % p, 7, c.get(), MPI_STATUS_IGNORE);
  MPI_EXPECT(got == 1000 + (r + p - 1) % p);
  int flag = 1;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
             MPI_STATUS_IGNORE);
  MPI_EXPECT(flag == 0);
}

void all_ok_returns() {
  DupComm c(MPI_COMM_WORLD, "test");
  agree_or_throw(c.get(), true, "");
  agree_or_throw_runtime(c.get(), true, "");
}

// Rank `bad` (and, when `also` >= 0, rank `also` too) fails: every rank
// throws with the lowest failing rank's message.
void one_rank_fails(int bad, int also) {
  const int r = world_rank();
  DupComm c(MPI_COMM_WORLD, "test");
  const bool ok = r != bad && r != also;
  const std::string mine = "f: argument x on rank " + std::to_string(r);
  bool threw = false;
  try {
    agree_or_throw(c.get(), ok, ok ? "" : mine);
  } catch (const std::invalid_argument& e) {
    threw = true;
    const int first = also >= 0 && also < bad ? also : bad;
    const std::string want = "rank " + std::to_string(first) +
                             ": f: argument x on rank " + std::to_string(first);
    MPI_EXPECT_MSG(std::string(e.what()) == want,
                   std::string("message: ") + e.what() + " want " + want);
  }
  MPI_EXPECT(threw);
  // The communicator still works afterwards (no message left in flight).
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, c.get());
  MPI_EXPECT(sum == world_size());
}

void runtime_kind() {
  DupComm c(MPI_COMM_WORLD, "test");
  const int last = world_size() - 1;
  bool threw = false;
  try {
    agree_or_throw_runtime(c.get(), world_rank() != last, "compute failed");
  } catch (const std::runtime_error& e) {
    threw = std::string(e.what()) ==
            "rank " + std::to_string(last) + ": compute failed";
  }
  MPI_EXPECT(threw);
}

// An MPI error on the duplicate returns (MPI_ERRORS_RETURN) and check_mpi
// makes it std::runtime_error naming the call.
void mpi_error_is_runtime_error() {
  DupComm c(MPI_COMM_WORLD, "test");
  int x = 0;
  bool threw = false;
  try {
    softdot::mpi::detail::check_mpi(
        MPI_Send(&x, 1, MPI_INT, c.size() + 5, 0, c.get()), "MPI_Send");
  } catch (const std::runtime_error& e) {
    threw = std::string(e.what()).find("MPI_Send failed") != std::string::npos;
  }
  MPI_EXPECT(threw);
}

void null_comm_throws() {
  bool threw = false;
  try {
    DupComm c(MPI_COMM_NULL, "softdot::mpi::f");
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("softdot::mpi::f") != std::string::npos;
  }
  MPI_EXPECT(threw);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int p = world_size();
  const int rc = softdot_test::run_cases({
      {"dup_is_private", dup_is_private},
      {"all_ok_returns", all_ok_returns},
      {"last_rank_fails", [p] { one_rank_fails(p - 1, -1); }},
      {"rank0_fails", [] { one_rank_fails(0, -1); }},
      {"two_ranks_fail", [p] { one_rank_fails(p - 1, p / 2); }},
      {"runtime_kind", runtime_kind},
      {"null_comm_throws", null_comm_throws},
      {"mpi_error_is_runtime_error", mpi_error_is_runtime_error},
  });
  MPI_Finalize();
  return rc;
}
