// A small test harness for programs run under mpirun: every rank runs every
// check; a failure is printed by the rank that sees it, and the program's
// exit status (on every rank) says whether any rank failed anywhere.
#ifndef SOFTDOT_TESTS_MPI_MPI_TEST_UTIL_H_
#define SOFTDOT_TESTS_MPI_MPI_TEST_UTIL_H_

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace softdot_test {

inline int& failures() {
  static int n = 0;
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::fprintf(stderr, "rank %d: %s:%d: FAILED: %s\n", world_rank(), file, line,
               what.c_str());
}

#define MPI_EXPECT(cond)                                          \
  do {                                                            \
    if (!(cond)) ::softdot_test::fail(__FILE__, __LINE__, #cond); \
  } while (0)
#define MPI_EXPECT_MSG(cond, msg)                                 \
  do {                                                            \
    if (!(cond)) ::softdot_test::fail(__FILE__, __LINE__, (msg)); \
  } while (0)

struct TestCase {
  const char* name;
  std::function<void()> body;
};

// Runs each case on every rank (an escaped exception is a failure of that
// case), then combines the failure counts: returns the exit status.
inline int run_cases(const std::vector<TestCase>& cases) {
  for (const TestCase& c : cases) {
    const int before = failures();
    try {
      c.body();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__,
           std::string(c.name) + ": exception: " + e.what());
    }
    int mine = failures() - before, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::printf("[%s] %s (P = %d)\n", all == 0 ? "  OK  " : "FAILED", c.name,
                  world_size());
    }
  }
  int mine = failures(), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return all == 0 ? 0 : 1;
}

}  // namespace softdot_test

#endif  // SOFTDOT_TESTS_MPI_MPI_TEST_UTIL_H_
