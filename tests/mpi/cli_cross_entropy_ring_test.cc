// `mpirun -np P softdot cross-entropy --ring`: a plain program (not under
// mpirun itself) that writes the inputs, runs the command under mpirun with
// P ranks and checks the printed loss and the files against the one-process
// library (bit for bit in --deterministic mode against P = 1; within the
// bound otherwise), and that a bad target makes every rank exit 2 with one
// error line. Usage: softdot_mpi_cli_ring_test MPIRUN SOFTDOT P
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "softdot/cross_entropy.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

template <class T>
std::string npy(const std::string& descr, const std::string& shape,
                const std::vector<T>& v) {
  std::string dict = "{'descr': '" + descr +
                     "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  return out;
}

template <class T>
std::vector<T> npy_values(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(f)), {});
  if (b.size() < 10) return {};
  const std::size_t header = 10 + static_cast<unsigned char>(b[8]) +
                             256 * static_cast<unsigned char>(b[9]);
  std::vector<T> v((b.size() - header) / sizeof(T));
  std::memcpy(v.data(), b.data() + header, v.size() * sizeof(T));
  return v;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

struct Run {
  int status;
  std::string out;
};

Run run(const std::string& cmd) {
  Run r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MPIRUN SOFTDOT P\n", argv[0]);
    return 2;
  }
  const std::string mpirun = argv[1], softdot = argv[2], p = argv[3];
  char tmpl[] = "/tmp/softdot_cli_ring_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::size_t rows = 5, V = 203;
  std::mt19937_64 rng(17);
  std::vector<float> x(rows * V);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-6, 6)(rng);
  const std::vector<std::int64_t> t = {0, 202, -100, 101, 57};
  write(dir + "/l.npy", npy("<f4", "(5, 203)", x));
  write(dir + "/t.npy", npy("<i8", "(5,)", t));
  const std::string base = mpirun +
                           " --allow-run-as-root --oversubscribe --mca "
                           "btl self,tcp --mca btl_tcp_if_include lo --mca "
                           "mpi_yield_when_idle 1 -np ";
  const std::string args = " " + softdot + " cross-entropy --ring --logits " +
                           dir + "/l.npy --targets " + dir +
                           "/t.npy --label-smoothing 0.1 ";
  // The one-process library.
  softdot::CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  std::vector<float> loss(rows), grad(rows * V);
  const double mean = softdot::cross_entropy(
      softdot::MatrixView<const float>(x.data(), rows, V), t, loss,
      softdot::MatrixView<float>(grad.data(), rows, V), o);

  const Run r =
      run(base + p + args + "-o " + dir + "/loss.npy --grad " + dir + "/g.npy");
  check(r.status == 0, "status " + std::to_string(r.status) + ": " + r.out);
  check(
      std::fabs(std::stod(r.out.empty() ? "nan" : r.out) - mean) <= 1e-6 * mean,
      "printed loss " + r.out);
  const std::vector<float> l = npy_values<float>(dir + "/loss.npy");
  const std::vector<float> g = npy_values<float>(dir + "/g.npy");
  check(l.size() == rows && g.size() == rows * V, "file sizes");
  for (std::size_t i = 0; i < l.size() && i < rows; ++i) {
    check(std::fabs(l[i] - loss[i]) <= 4e-7f * std::fabs(loss[i]),
          "loss row " + std::to_string(i));
  }
  for (std::size_t k = 0; k < g.size() && k < grad.size(); ++k) {
    if (!(std::fabs(g[k] - grad[k]) <= 3e-7f * std::fabs(grad[k]) + 1e-12f)) {
      check(false, "grad " + std::to_string(k));
      break;
    }
  }
  // Deterministic: the same bytes as on one rank.
  const Run d1 =
      run(base + "1" + args + "--deterministic --grad " + dir + "/d1.npy");
  const Run dp =
      run(base + p + args + "--deterministic --grad " + dir + "/dp.npy");
  check(d1.status == 0 && dp.status == 0 && d1.out == dp.out,
        "deterministic printed loss: " + d1.out + " vs " + dp.out);
  const std::vector<float> g1 = npy_values<float>(dir + "/d1.npy");
  const std::vector<float> gp = npy_values<float>(dir + "/dp.npy");
  check(g1.size() == rows * V && g1.size() == gp.size() &&
            std::memcmp(g1.data(), gp.data(), g1.size() * 4) == 0,
        "deterministic gradient bytes differ between 1 and " + p + " ranks");
  // A bad target: status 2 everywhere, one error line, no file.
  write(dir + "/bad.npy",
        npy("<i8", "(5,)", std::vector<std::int64_t>{0, 203, 1, 2, 3}));
  const Run b =
      run(base + p + " " + softdot + " cross-entropy --ring --logits " + dir +
          "/l.npy --targets " + dir + "/bad.npy -o " + dir + "/bad_out.npy");
  check(b.status == 2, "bad target status " + std::to_string(b.status));
  check(b.out.find("targets[1] = 203") != std::string::npos,
        "bad target message: " + b.out);
  std::size_t lines = 0;
  for (std::size_t k = b.out.find("softdot: error"); k != std::string::npos;
       k = b.out.find("softdot: error", k + 1)) {
    ++lines;
  }
  check(lines == 1, "error lines: " + std::to_string(lines));
  check(!std::ifstream(dir + "/bad_out.npy").good(), "wrote a file on error");
  run("rm -rf " + dir);
  std::printf("%s (P = %s)\n", failures ? "FAILED" : "OK", p.c_str());
  return failures ? 1 : 0;
}
