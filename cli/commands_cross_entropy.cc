// softdot command: `softdot cross-entropy --logits L.npy --targets T.npy`,
// the fused cross-entropy of rows of logits (softdot::cross_entropy): prints
// the reduced loss, writes the per-row losses (-o) and the gradient (--grad).
#include "commands_cross_entropy.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "commands.h"
#include "error.h"
#include "format.h"
#include "io_npy.h"
#include "output_file.h"
#include "parse.h"
#include "softdot/cross_entropy.h"
#include "softdot/float16.h"

namespace softdot::cli {
namespace {

std::int64_t parse_ignore_index(const std::optional<std::string>& text) {
  if (!text) return -100;
  std::int64_t v = 0;
  const char* end = text->data() + text->size();
  const auto r = std::from_chars(text->data(), end, v);
  if (text->empty() || r.ec != std::errc() || r.ptr != end) {
    throw CliError("--ignore-index: " + quote(*text) +
                   " is not an integer in the int64 range");
  }
  return v;
}

double parse_smoothing(const std::optional<std::string>& text) {
  if (!text) return 0.0;
  const ParsedNumber e = parse_number(*text);
  if (e.status != NumberStatus::kOk) {
    throw CliError("--label-smoothing: " + number_error(*text, e.status));
  }
  if (!(e.value >= 0.0 && e.value <= 1.0)) {
    throw CliError("--label-smoothing: " + quote(*text) + " must be in [0, 1]");
  }
  return e.value;
}

Reduction parse_reduction(const std::optional<std::string>& text) {
  if (!text || *text == "mean") return Reduction::kMean;
  if (*text == "sum") return Reduction::kSum;
  if (*text == "none") return Reduction::kNone;
  throw CliError("--reduction: " + quote(*text) +
                 " is not one of mean, sum, none");
}

template <class T>
int run_typed(const Matrix<T>& logits, const CrossEntropyArgs& args) {
  const std::vector<std::int64_t> targets =
      read_targets(args.targets, logits.rows);
  const CrossEntropyOptions o = parse_cross_entropy_options(args);
  std::vector<T> loss(logits.rows);
  Matrix<T> grad;
  if (args.grad) {
    grad.rows = logits.rows;
    grad.cols = logits.cols;
    grad.values.resize(logits.rows * logits.cols);
  }
  const double value = cross_entropy(
      logits.view(), std::span<const std::int64_t>(targets.data(), logits.rows),
      loss, args.grad ? grad.view() : MatrixView<T>(), o);
  std::vector<std::pair<std::string, std::string>> files;
  if (args.output) {
    const std::size_t shape[1] = {logits.rows};
    files.emplace_back(*args.output,
                       encode_npy(std::span<const T>(loss),
                                  std::span<const std::size_t>(shape)));
  }
  if (args.grad) files.emplace_back(*args.grad, encode_npy(grad));
  write_files_all_or_none(files);
  print(format_number(value, kShortest) + "\n");
  return 0;
}

// float16 / bfloat16 logits (.npy '<f2', or '<V2' as ml_dtypes writes
// bfloat16): the 16-bit cross_entropy; the per-row losses and the gradient
// are written in the logits' dtype (each rounded once), the reduced loss
// printed as the double it is.
template <class H>
int run_16(const Matrix16& logits, const CrossEntropyArgs& args) {
  const std::vector<std::int64_t> targets =
      read_targets(args.targets, logits.rows);
  const CrossEntropyOptions o = parse_cross_entropy_options(args);
  std::vector<H> loss(logits.rows);
  std::vector<H> grad(args.grad ? logits.rows * logits.cols : 0);
  const double value = cross_entropy(
      MatrixView<const H>(reinterpret_cast<const H*>(logits.bits.data()),
                          logits.rows, logits.cols),
      std::span<const std::int64_t>(targets.data(), logits.rows),
      std::span<H>(loss),
      args.grad ? MatrixView<H>(grad.data(), logits.rows, logits.cols)
                : MatrixView<H>(),
      o);
  const auto bits_of = [](const std::vector<H>& v) {
    std::vector<std::uint16_t> b(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
    return b;
  };
  std::vector<std::pair<std::string, std::string>> files;
  if (args.output) {
    const std::size_t shape[1] = {logits.rows};
    files.emplace_back(
        *args.output,
        encode_npy16(bits_of(loss), std::span<const std::size_t>(shape),
                     logits.descr));
  }
  if (args.grad) {
    const std::size_t shape[2] = {logits.rows, logits.cols};
    files.emplace_back(
        *args.grad,
        encode_npy16(bits_of(grad), std::span<const std::size_t>(shape),
                     logits.descr));
  }
  write_files_all_or_none(files);
  print(format_number(value, kShortest) + "\n");
  return 0;
}

}  // namespace

CrossEntropyOptions parse_cross_entropy_options(const CrossEntropyArgs& args) {
  CrossEntropyOptions o;
  o.ignore_index = parse_ignore_index(args.ignore_index);
  o.label_smoothing = parse_smoothing(args.label_smoothing);
  o.reduction = parse_reduction(args.reduction);
  return o;
}

std::vector<std::int64_t> read_targets(const std::string& path,
                                       std::size_t rows) {
  static constexpr NpyDtype kInts[] = {NpyDtype::kInt64, NpyDtype::kInt32};
  const NpyArray a = read_npy_array(read_file(path), "--targets " + path,
                                    std::span<const NpyDtype>(kInts));
  if (a.shape.size() != 1 || a.shape[0] != rows) {
    std::string shape = "(";
    for (std::size_t i = 0; i < a.shape.size(); ++i) {
      shape += (i ? ", " : "") + std::to_string(a.shape[i]);
    }
    throw CliError("--targets " + path + ": shape " + shape +
                   (a.shape.size() == 1 ? ",)" : ")") + " but --logits has " +
                   std::to_string(rows) + " rows; expected (" +
                   std::to_string(rows) + ",)");
  }
  return int64s_of(a);
}

int run_cross_entropy(const CrossEntropyArgs& args) {
  if (args.ring) {
#ifdef SOFTDOT_CLI_MPI
    return run_cross_entropy_ring(args);
#else
    throw CliError(
        "--ring: this softdot was built without MPI (softdot::mpi); "
        "configure with MPI installed (SOFTDOT_MPI=ON)");
#endif
  }
  if (args.deterministic) {
    throw CliError(
        "--deterministic: only with --ring (one process is "
        "always deterministic)");
  }
  const std::string bytes = read_file(args.logits);
  const std::string name = "--logits " + args.logits;
  if (looks_like_npy(bytes)) {
    if (auto m16 = read_npy16(bytes, name)) {
      return m16->bf16 ? run_16<BFloat16>(*m16, args)
                       : run_16<Float16>(*m16, args);
    }
  }
  const AnyMatrix logits = read_npy(bytes, name);
  return std::visit([&](const auto& m) { return run_typed(m, args); }, logits);
}

}  // namespace softdot::cli
