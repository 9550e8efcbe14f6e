// softdot command: `softdot attention --q Q.npy --k K.npy --v V.npy [...]
// -o OUT.npy`, scaled dot-product attention of .npy arrays (float32,
// float16 or int8 keys and values) with
// softdot::attention (softdot::paged_attention with --block-table and
// --seq-lens; softdot::attention_scores and softdot::attention_weights for
// --explain): the options, the library calls
// and the output files. The inputs are read and assembled in
// attention_inputs.cc, the --explain text is written in explain.cc.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "commands.h"
#ifdef SOFTDOT_CLI_MPI
#include "commands_ring.h"
#endif
#include "error.h"
#include "explain.h"
#include "format.h"
#include "io_npy.h"
#include "output_file.h"
#include "parse.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::cli {
namespace {

// --explain prints every number: only for small inputs.
constexpr std::size_t kExplainMaxN = 64;      // n_q, n_kv and d_v per head
constexpr std::size_t kExplainMaxHeads = 16;  // batch x heads
constexpr int kExplainDigits = 3;
constexpr int kMaxWindow = 999999999;  // parse_small_int's 9 digits

bool ends_with_npy(const std::string& s) {
  if (s.size() < 4) return false;
  std::string tail = s.substr(s.size() - 4);
  for (char& c : tail)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return tail == ".npy";
}

// The number of a value option (--scale, --softcap); its value is checked
// by the library (check_attention_options), with the library's message.
double parse_value(const std::optional<std::string>& text, const char* option) {
  const ParsedNumber n = parse_number(*text);
  if (n.status != NumberStatus::kOk) {
    throw CliError(std::string(option) + ": " + number_error(*text, n.status));
  }
  return n.value;
}

// A window bound: a whole number, -1 for no limit (as the library's and
// Python's); other values are checked by the library.
std::ptrdiff_t parse_window(const std::optional<std::string>& text,
                            const char* option) {
  if (!text) return -1;
  const bool negative = !text->empty() && (*text)[0] == '-';
  const auto n =
      parse_small_int(negative ? text->substr(1) : *text, kMaxWindow);
  if (!n) {
    throw CliError(std::string(option) + ": " + quote(*text) +
                   " must be a whole number from -1 (no limit) to " +
                   std::to_string(kMaxWindow));
  }
  return negative ? -static_cast<std::ptrdiff_t>(*n) : *n;
}

// The library's message of a std::invalid_argument without its C++
// namespace: "attention: softcap must be finite and >= 0, got -1".
std::string library_message(const std::invalid_argument& e) {
  std::string m = e.what();
  const std::string ns = "softdot::";
  if (m.rfind(ns, 0) == 0) m.erase(0, ns.size());
  return m;
}

// An output name: FILE.npy in a directory we can write to, checked before
// any work so that a bad --lse does not leave a finished -o behind.
void check_output_name(const std::string& path, const char* option) {
  if (!ends_with_npy(path)) {
    throw CliError(std::string(option) + " " + quote(path) +
                   ": unknown file type; the name must end in .npy");
  }
  const std::size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw CliError(path +
                   ": cannot create a file there: " + std::strerror(errno));
  }
}

// Runs the library on the inputs, writes -o and --lse, prints --explain.
template <class KV>
int compute(const AttentionArgs& args, const AttentionInputs& in,
            AttentionOptions options) {
  AttentionTensors<KV> t;
  assemble_tensors(in, &t, &options);
  const std::size_t batch = in.q.batch(), heads = in.q.heads();
  const std::size_t n_q = in.q.rows(), n_kv = in.k.rows(), d_v = in.v.cols();

  std::vector<float> out(batch * heads * n_q * d_v);
  std::vector<float> lse(batch * heads * n_q);
  std::vector<float> scores, weights;
  // The checked request; --explain reads its derived values (the float
  // scale, the query positions) rather than deriving them again.
  std::optional<AttentionPlan> plan;
  try {
    // One request (attention_request.h): the library checks every argument
    // and option (naming the sequence and the entry of a bad table) before
    // it reads a page, and derives the scale --explain prints.
    AttentionRequest request;
    request.name = in.paged() ? "paged_attention" : "attention";
    request.q = t.q;
    request.kv = in.paged() ? KVSource::pages(key_arg(t), value_arg(t), t.table)
                            : KVSource::contiguous(key_arg(t), value_arg(t));
    request.target = AttentionTarget::output(
        TensorView<float>(out.data(), batch, heads, n_q, d_v),
        args.lse ? lse.data() : nullptr);
    request.options = options;
    plan.emplace(AttentionPlan::make(request));
    plan->run();
    if (args.explain) {
      // The scores and the weights from one routine of the library, so the
      // tables cannot disagree; -inf scores are the keys a query does not
      // see.
      scores.resize(std::max<std::size_t>(batch * heads * n_q * n_kv, 1));
      weights.resize(scores.size());
      softdot::attention_scores(
          t.q, key_arg(t),
          TensorView<float>(scores.data(), batch, heads, n_q, n_kv), options);
      softdot::attention_weights(
          t.q, key_arg(t),
          TensorView<float>(weights.data(), batch, heads, n_q, n_kv), options);
    }
  } catch (const std::invalid_argument& e) {
    throw CliError(library_message(e));
  }

  std::string out_bytes, lse_bytes;
  if (in.q_packed) {
    // [1, heads, T, d_v] back to the packed rows [T, heads, d_v]; lse
    // [heads, T] as the library writes it.
    std::vector<float> rows(out.size());
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t r = 0; r < n_q; ++r)
        std::copy_n(out.data() + (h * n_q + r) * d_v, d_v,
                    rows.data() + (r * heads + h) * d_v);
    const std::size_t out_shape[] = {n_q, heads, d_v};
    const std::size_t lse_shape[] = {heads, n_q};
    if (args.output) out_bytes = encode_npy(rows, out_shape);
    if (args.lse) lse_bytes = encode_npy(lse, lse_shape);
  } else if (in.q.rank() == 4) {
    const std::size_t out_shape[] = {batch, heads, n_q, d_v};
    const std::size_t lse_shape[] = {batch, heads, n_q};
    if (args.output) out_bytes = encode_npy(out, out_shape);
    if (args.lse) lse_bytes = encode_npy(lse, lse_shape);
  } else {
    const std::size_t out_shape[] = {n_q, d_v};
    const std::size_t lse_shape[] = {n_q};
    if (args.output) out_bytes = encode_npy(out, out_shape);
    if (args.lse) lse_bytes = encode_npy(lse, lse_shape);
  }

  std::string explanation;
  if (args.explain) {
    explanation = explain_attention_call(in, *plan, args.scale.has_value(),
                                         scores, weights, out, kExplainDigits);
  }

  // -o, then --lse; if --lse fails, a new -o file is removed again.
  std::vector<std::pair<std::string, std::string>> files;
  if (args.output) files.emplace_back(*args.output, out_bytes);
  if (args.lse) files.emplace_back(*args.lse, lse_bytes);
  write_files_all_or_none(files);
  if (args.explain) print(explanation);
  return 0;
}

// The attention options of the command line, checked as the library checks
// them (one place, one message).
AttentionOptions parse_options(const AttentionArgs& args) {
  AttentionOptions options;
  if (args.scale) {
    // A NaN typed here is the library's error (scale must be finite).
    options.scale = parse_value(args.scale, "--scale");
  }
  if (args.softcap) {
    options.softcap =
        static_cast<float>(parse_value(args.softcap, "--softcap"));
  }
  options.causal = args.causal;
  options.batch_invariant = args.batch_invariant;
  options.window_left = parse_window(args.window_left, "--window-left");
  options.window_right = parse_window(args.window_right, "--window-right");
  try {
    check_attention_options(options, "attention");
  } catch (const std::invalid_argument& e) {
    throw CliError(library_message(e));
  }
  return options;
}

// -o (required unless --explain) and --lse: names we can write, and not the
// same file.
void check_outputs(const AttentionArgs& args) {
  if (!args.output && !args.explain) {
    throw CliError(
        "--output is required: -o FILE.npy for the result (only "
        "--explain prints to standard output)");
  }
  if (args.output) check_output_name(*args.output, "--output");
  if (args.lse) {
    check_output_name(*args.lse, "--lse");
    if (args.output && *args.lse == *args.output) {
      throw CliError("--lse and --output name the same file " +
                     quote(*args.lse));
    }
  }
}

// --deterministic and --layout only with --ring, and --ring only with
// contiguous inputs and without --explain.
void check_ring_options(const AttentionArgs& args) {
  if (args.deterministic && !args.ring) {
    throw CliError("--deterministic is an option of --ring");
  }
  if (args.layout && !args.ring) {
    throw CliError("--layout is an option of --ring");
  }
  if (!args.ring) return;
  if (args.layout && *args.layout != "zigzag" && *args.layout != "contiguous") {
    throw CliError("--layout " + quote(*args.layout) +
                   ": must be zigzag or contiguous");
  }
  if (args.explain || args.block_table || args.seq_lens) {
    throw CliError(
        "--ring takes contiguous q, k and v of one sequence; leave out "
        "--explain, --block-table and --seq-lens");
  }
}

// --explain prints every number: the inputs must be small.
void check_explain_size(const AttentionInputs& in) {
  const Input &q = in.q, &k = in.k, &v = in.v;
  const std::size_t per_head[] = {q.rows(), k.rows(), v.cols()};
  const char* names[] = {"n_q", "n_kv", "d_v"};
  for (int i = 0; i < 3; ++i) {
    if (per_head[i] > kExplainMaxN) {
      throw CliError(
          "--explain prints every number, so it is for small "
          "inputs: " +
          std::string(names[i]) + " = " + std::to_string(per_head[i]) + " " +
          both(q, k) + ", at most " + std::to_string(kExplainMaxN) +
          " (leave out --explain and use -o)");
    }
  }
  if (q.batch() * q.heads() > kExplainMaxHeads) {
    throw CliError(
        "--explain prints every number, so it is for small "
        "inputs: batch x heads = " +
        std::to_string(q.batch() * q.heads()) + " (q is " + q.text() +
        "), at most " + std::to_string(kExplainMaxHeads) +
        " (leave out --explain and use -o)");
  }
}

}  // namespace

int run_attention(const AttentionArgs& args) {
  // Check every option before reading any input.
  const AttentionOptions options = parse_options(args);
  quantize_kv_option(args);
  kv_layout_option(args);
  check_outputs(args);
  if (args.explain && args.block_table) {
    throw CliError(
        "--explain is for contiguous k and v; leave out --block-table (or "
        "--explain)");
  }
  check_ring_options(args);
  if (args.ring) {
#ifdef SOFTDOT_CLI_MPI
    return run_attention_ring(args, options,
                              [&args] { return read_attention_inputs(args); });
#else
    throw CliError(
        "--ring: this softdot was built without MPI (softdot::mpi); "
        "configure with MPI installed (-DSOFTDOT_MPI=ON)");
#endif
  }
  const AttentionInputs in = read_attention_inputs(args);
  if (args.explain) check_explain_size(in);

  // int8 keys and values and float16 ones go to the library as they are
  // (kv_storage).
  switch (kv_storage(in)) {
    case KvStorage::kInt8:
      return compute<std::int8_t>(args, in, options);
    case KvStorage::kFloat8E4M3:
      return compute<Float8E4M3>(args, in, options);
    case KvStorage::kFloat8E5M2:
      return compute<Float8E5M2>(args, in, options);
    case KvStorage::kFloat16:
      return compute<Float16>(args, in, options);
    case KvStorage::kFloat:
      break;
  }
  return compute<float>(args, in, options);
}

}  // namespace softdot::cli
