// softdot command: `mpirun -np P softdot cross-entropy ... --ring`, the
// cross-entropy with the vocabulary (columns) split across the ranks of
// MPI_COMM_WORLD (softdot::mpi::cross_entropy). Rank 0 reads the files,
// broadcasts the options and targets, scatters contiguous column blocks
// (rank r: V / P columns, one more for the first V % P ranks), gathers the
// gradient, writes the files and prints the loss. Every failure is agreed
// on by all ranks: rank 0 prints the error, every rank exits with status 2
// (after a barrier, so that rank 0's line is out first).
// Built only with softdot::mpi (SOFTDOT_CLI_MPI).
#include <mpi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "commands.h"
#include "commands_cross_entropy.h"
#include "error.h"
#include "format.h"
#include "io_npy.h"
#include "mpi_session.h"
#include "output_file.h"
#include "softdot/mpi.h"

namespace softdot::cli {
namespace {

// Rank 0's verdict (empty: fine) sent to every rank; true when it failed.
bool shared_failure(std::string& message) {
  int n = static_cast<int>(message.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  message.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(message.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return n > 0;
}

// What rank 0 reads and broadcasts.
struct Header {
  std::int64_t is_double = 0, rows = 0, vocab = 0, ignore_index = 0;
  std::int64_t reduction = 0;
  double eps = 0.0;
};

// Every rank's exit after an agreed failure: rank 0 prints the one error
// line (as main does) before the barrier, so that no rank's early exit can
// make mpirun kill rank 0 before its message is out.
int fail_all(const MpiSession& s, const std::string& message) {
  if (s.rank() == 0) print_ring_error(message);
  MPI_Barrier(MPI_COMM_WORLD);
  return kExitError;
}

template <class T>
MPI_Datatype mpi_type() {
  return sizeof(T) == 4 ? MPI_FLOAT : MPI_DOUBLE;
}

template <class T>
int run_ranks(const MpiSession& s, const Header& h, const Matrix<T>* logits,
              const std::vector<std::int64_t>& targets,
              const CrossEntropyArgs& args) {
  const std::size_t rows = static_cast<std::size_t>(h.rows);
  const std::size_t V = static_cast<std::size_t>(h.vocab);
  const std::size_t P = static_cast<std::size_t>(s.size());
  std::vector<int> counts(P), displs(P);
  std::vector<std::size_t> begin(P + 1, 0);
  for (std::size_t r = 0; r < P; ++r) {
    const std::size_t c = V / P + (r < V % P ? 1 : 0);
    begin[r + 1] = begin[r] + c;
    counts[r] = static_cast<int>(rows * c);
    displs[r] = static_cast<int>(rows * begin[r]);
  }
  const std::size_t me = static_cast<std::size_t>(s.rank());
  const std::size_t n = begin[me + 1] - begin[me];
  // Rank 0 packs the column blocks rank after rank, each dense rows x c.
  std::vector<T> packed;
  if (s.rank() == 0) {
    packed.resize(rows * V);
    for (std::size_t r = 0; r < P; ++r) {
      const std::size_t c = begin[r + 1] - begin[r];
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < c; ++j) {
          packed[rows * begin[r] + i * c + j] =
              logits->values[i * V + begin[r] + j];
        }
      }
    }
  }
  std::vector<T> shard(std::max<std::size_t>(rows * n, 1));
  MPI_Scatterv(packed.data(), counts.data(), displs.data(), mpi_type<T>(),
               shard.data(), counts[me], mpi_type<T>(), 0, MPI_COMM_WORLD);
  CrossEntropyOptions o;
  o.ignore_index = h.ignore_index;
  o.label_smoothing = h.eps;
  o.reduction = static_cast<Reduction>(h.reduction);
  mpi::VocabOptions vo;
  vo.deterministic = args.deterministic;
  std::vector<T> loss(rows), grad(std::max<std::size_t>(rows * n, 1));
  double value = 0.0;
  std::string error;
  try {
    value = mpi::cross_entropy(
        MPI_COMM_WORLD, MatrixView<const T>(shard.data(), rows, n), begin[me],
        targets, loss,
        args.grad ? MatrixView<T>(grad.data(), rows, n) : MatrixView<T>(), o,
        vo);
  } catch (const std::exception& e) {
    error = e.what();  // the same on every rank (collective checks)
  }
  if (!error.empty()) return fail_all(s, error);
  if (args.grad) {
    MPI_Gatherv(grad.data(), counts[me], mpi_type<T>(), packed.data(),
                counts.data(), displs.data(), mpi_type<T>(), 0, MPI_COMM_WORLD);
  }
  std::string write_error;
  if (s.rank() == 0) {
    try {
      std::vector<std::pair<std::string, std::string>> files;
      if (args.output) {
        const std::size_t shape[1] = {rows};
        files.emplace_back(*args.output,
                           encode_npy(std::span<const T>(loss),
                                      std::span<const std::size_t>(shape)));
      }
      if (args.grad) {
        Matrix<T> g;
        g.rows = rows;
        g.cols = V;
        g.values.resize(rows * V);
        for (std::size_t r = 0; r < P; ++r) {
          const std::size_t c = begin[r + 1] - begin[r];
          for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < c; ++j) {
              g.values[i * V + begin[r] + j] =
                  packed[rows * begin[r] + i * c + j];
            }
          }
        }
        files.emplace_back(*args.grad, encode_npy(g));
      }
      write_files_all_or_none(files);
      print(format_number(value, kShortest) + "\n");
    } catch (const std::exception& e) {
      write_error = e.what();
    }
  }
  if (shared_failure(write_error)) return fail_all(s, write_error);
  return 0;
}

}  // namespace

int run_cross_entropy_ring(const CrossEntropyArgs& args) {
  const MpiSession s;
  Header h;
  std::optional<AnyMatrix> logits;
  std::vector<std::int64_t> targets;
  std::string error;
  if (s.rank() == 0) {
    try {
      logits = read_npy(read_file(args.logits), "--logits " + args.logits);
      std::visit(
          [&](const auto& m) {
            h.is_double = sizeof(m.values[0]) == 8;
            h.rows = static_cast<std::int64_t>(m.rows);
            h.vocab = static_cast<std::int64_t>(m.cols);
            targets = read_targets(args.targets, m.rows);
          },
          *logits);
      const CrossEntropyOptions o = parse_cross_entropy_options(args);
      h.ignore_index = o.ignore_index;
      h.eps = o.label_smoothing;
      h.reduction = static_cast<std::int64_t>(o.reduction);
      if (static_cast<std::int64_t>(s.size()) > h.vocab) {
        throw CliError("--ring: " + std::to_string(s.size()) +
                       " ranks but only " + std::to_string(h.vocab) +
                       " classes (each rank needs at least one column)");
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (shared_failure(error)) return fail_all(s, error);
  MPI_Bcast(&h, sizeof(Header), MPI_BYTE, 0, MPI_COMM_WORLD);
  targets.resize(static_cast<std::size_t>(h.rows));
  MPI_Bcast(targets.data(), static_cast<int>(h.rows), MPI_INT64_T, 0,
            MPI_COMM_WORLD);
  if (h.is_double) {
    const Matrix<double>* m =
        s.rank() == 0 ? &std::get<Matrix<double>>(*logits) : nullptr;
    return run_ranks<double>(s, h, m, targets, args);
  }
  const Matrix<float>* m =
      s.rank() == 0 ? &std::get<Matrix<float>>(*logits) : nullptr;
  return run_ranks<float>(s, h, m, targets, args);
}

}  // namespace softdot::cli
