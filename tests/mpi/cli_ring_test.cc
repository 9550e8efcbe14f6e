// `mpirun -np P softdot attention ... --ring`: against the one-process
// command on the same files. Usage: softdot_mpi_cli_ring_test SOFTDOT
// MPIRUN [MPIRUN ARGS...]. Writes its inputs with the tests' own .npy
// writer (tests/cli/npy_test_io.cc), runs the commands with std::system.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "npy_test_io.h"

namespace {

int failures = 0;
#define CHECK(cond, what)                                             \
  do {                                                                \
    if (!(cond)) {                                                    \
      ++failures;                                                     \
      std::fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, \
                   std::string(what).c_str());                        \
    }                                                                 \
  } while (0)

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string dir;
std::string softdot, mpirun;

// Runs a shell command line; its stderr into dir/err.txt. Exit status.
int sh(const std::string& cmd) {
  const std::string full = "cd '" + dir + "' && " + cmd + " 2> err.txt";
  const int rc = std::system(full.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::vector<float> floats(const std::string& file) {
  return softdot_test::values_of<float>(
      softdot_test::parse_npy(slurp(dir + "/" + file)).data);
}

std::string f32(std::mt19937& g, std::size_t n, float amp) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> x(n);
  for (float& e : x) e = u(g);
  return softdot_test::raw_bytes(x);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SOFTDOT MPIRUN [ARGS...]\n", argv[0]);
    return 2;
  }
  softdot = argv[1];
  mpirun = argv[2];
  for (int i = 3; i < argc; ++i) mpirun += std::string(" ") + argv[i];
  char tmpl[] = "/tmp/softdot_cli_ring_XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  dir = tmpl;

  // q [2, 4, 101, 16], k and v [2, 2, 101, 16 / 8] (GQA), a mask with
  // query 7 masked everywhere.
  const std::size_t n = 101;
  std::mt19937 g(42);
  spit(dir + "/q.npy", softdot_test::make_npy("<f4", "(2, 4, 101, 16)",
                                              f32(g, n * 2 * 4 * 16, 1.5f)));
  spit(dir + "/k.npy", softdot_test::make_npy("<f4", "(2, 2, 101, 16)",
                                              f32(g, n * 2 * 2 * 16, 1.5f)));
  spit(dir + "/v.npy", softdot_test::make_npy("<f4", "(2, 2, 101, 8)",
                                              f32(g, n * 2 * 2 * 8, 1.0f)));
  std::string mask(n * n, '\1');
  for (std::size_t j = 0; j < n; ++j) mask[7 * n + j] = '\0';
  for (std::size_t i = 0; i < n * n; i += 7) mask[i] = '\0';
  spit(dir + "/mask.npy", softdot_test::make_npy("|b1", "(101, 101)", mask));
  // ALiBi slopes, one per query head, and a bias [101, 101].
  spit(dir + "/alibi.npy",
       softdot_test::make_npy("<f4", "(4,)",
                              softdot_test::raw_bytes(std::vector<float>{
                                  0.5f, 0.125f, 0.25f, 0.0625f})));
  spit(dir + "/bias.npy",
       softdot_test::make_npy("<f4", "(101, 101)", f32(g, n * n, 2.0f)));

  const std::string in = softdot + " attention --q q.npy --k k.npy --v v.npy";
  const std::string ring = mpirun + " -np ";
  // Every option of the command that reaches the ring, each against the
  // one-process command for P = 1 to 4 (options that are read from files
  // reach rank 0 only and must travel to the others).
  const std::string alibi_all =
      std::string(" --alibi-slopes alibi.npy --window-left 20") +
      " --window-right 5 --softcap 3 --scale 0.2 --mask mask.npy";
  for (const std::string& extra :
       {std::string(" --causal"), std::string(" --mask mask.npy"),
        std::string(" --kv int8 --causal"),
        std::string(" --causal --alibi-slopes alibi.npy"), alibi_all,
        std::string(" --bias bias.npy --window-left 30")}) {
    CHECK(sh(in + extra + " -o ref.npy --lse ref_lse.npy") == 0,
          "one process" + extra);
    // P = 1, contiguous: attention()'s bits.
    CHECK(sh(ring + "1 " + in + extra +
             " --ring --layout contiguous -o r1.npy --lse r1_lse.npy") == 0,
          "ring P=1" + extra);
    CHECK(slurp(dir + "/r1.npy") == slurp(dir + "/ref.npy"),
          "P=1 contiguous bits" + extra);
    CHECK(slurp(dir + "/r1_lse.npy") == slurp(dir + "/ref_lse.npy"),
          "P=1 lse bits" + extra);
    const std::vector<float> ref = floats("ref.npy"),
                             ref_lse = floats("ref_lse.npy");
    std::string det1;
    for (int p = 1; p <= 4; ++p) {
      const std::string P = std::to_string(p);
      for (const std::string lay : {"zigzag", "contiguous"}) {
        CHECK(sh(ring + P + " " + in + extra + " --ring --layout " + lay +
                 " -o r.npy --lse r_lse.npy") == 0,
              "ring P=" + P + " " + lay + extra);
        const std::vector<float> r = floats("r.npy"), rl = floats("r_lse.npy");
        CHECK(r.size() == ref.size() && rl.size() == ref_lse.size(),
              "sizes P=" + P);
        for (std::size_t i = 0; i < r.size() && i < ref.size(); ++i)
          CHECK(std::fabs(r[i] - ref[i]) <= 4e-6f,
                "out P=" + P + " " + lay + extra + " at " + std::to_string(i));
        for (std::size_t i = 0; i < rl.size() && i < ref_lse.size(); ++i)
          CHECK(rl[i] == ref_lse[i] || std::fabs(rl[i] - ref_lse[i]) <=
                                           1e-5f * (1 + std::fabs(ref_lse[i])),
                "lse P=" + P + extra);
      }
      CHECK(sh(ring + P + " " + in + extra +
               " --ring --deterministic -o d.npy") == 0,
            "det P=" + P);
      if (p == 1) det1 = slurp(dir + "/d.npy");
      CHECK(!det1.empty() && slurp(dir + "/d.npy") == det1,
            "deterministic P=" + P + " bits of P=1" + extra);
    }
  }
  // A missing file on rank 0: every rank fails, one message.
  CHECK(sh(ring + "3 " + softdot +
           " attention --q nope.npy --k k.npy --v v.npy --ring -o x.npy") != 0,
        "missing file fails");
  const std::string err = slurp(dir + "/err.txt");
  std::size_t count = 0;
  for (std::size_t at = err.find("softdot: error:"); at != std::string::npos;
       at = err.find("softdot: error:", at + 1))
    ++count;
  CHECK(count == 1 && err.find("--q: nope.npy") != std::string::npos,
        "one message naming --q: " + err);

  std::system(("rm -rf '" + dir + "'").c_str());
  std::printf("%s: %d failures\n", argv[0], failures);
  return failures == 0 ? 0 : 1;
}
