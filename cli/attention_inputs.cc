// softdot command: the inputs of `softdot attention` (see attention_inputs.h).
#include "attention_inputs.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "error.h"
#include "output_file.h"

namespace softdot::cli {

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) s += " x ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string both(const Input& a, const Input& b) {
  // Appended piecewise: "(" + std::string&& trips GCC 12's -Wrestrict.
  std::string out = "(";
  out += a.letter();
  out += " is " + a.text() + ", " + b.letter() + " is " + b.text() + ")";
  return out;
}

namespace {

Input read_input(const std::string& option, const std::string& path,
                 std::span<const NpyDtype> allowed, const char* axes_2d,
                 const char* axes_4d) {
  Input input;
  input.option = option;
  const std::string name = path == "-" ? "<stdin>" : path;
  try {
    input.array = read_npy_array(read_file(path), name, allowed);
  } catch (const CliError& e) {
    throw CliError(option + ": " + e.what());
  }
  if (input.rank() != 2 && input.rank() != 4) {
    throw CliError(option + ": " + name + ": shape " + input.text() + " has " +
                   std::to_string(input.rank()) +
                   (input.rank() == 1 ? " dimension" : " dimensions") +
                   "; need a 2-D array " + axes_2d + " or a 4-D array " +
                   axes_4d);
  }
  return input;
}

// An input of any rank (the block table, the lengths; the caller checks the
// shape).
Input read_any(const std::string& option, const std::string& path,
               std::span<const NpyDtype> allowed) {
  Input input;
  input.option = option;
  const std::string name = path == "-" ? "<stdin>" : path;
  try {
    input.array = read_npy_array(read_file(path), name, allowed);
  } catch (const CliError& e) {
    throw CliError(option + ": " + e.what());
  }
  return input;
}

// The q, k, v shapes: all 2-D or all 4-D, matching batch, heads (GQA), d,
// n_kv, with every size >= 1 except n_kv.
void check_qkv(const Input& q, const Input& k, const Input& v) {
  const char* q_axes[] = {"batch", "heads", "n_q", "d"};
  for (int axis = 0; axis < 4; ++axis) {
    if (q.dim(axis) == 0) {
      throw CliError("--q is " + q.text() + ": " + q_axes[axis] +
                     " must be at least 1");
    }
  }
  for (const Input* x : {&k, &v}) {
    if (x->rank() != q.rank()) {
      throw CliError(x->option + " is " + std::to_string(x->rank()) +
                     "-D but --q is " + std::to_string(q.rank()) + "-D " +
                     both(q, *x) +
                     "; q, k and v must all be 2-D [n x d] or all 4-D "
                     "[batch x heads x n x d]");
    }
  }
  const auto differ = [](const Input& ref, const Input& x, const char* what,
                         std::size_t ref_value, std::size_t x_value) {
    throw CliError(x.option + " has " + what + " = " + std::to_string(x_value) +
                   " but " + ref.option + " has " + what + " = " +
                   std::to_string(ref_value) + " " + both(ref, x));
  };
  if (k.batch() != q.batch()) differ(q, k, "batch", q.batch(), k.batch());
  if (k.heads() == 0)
    throw CliError("--k is " + k.text() + ": heads must be at least 1");
  if (q.heads() % k.heads() != 0) {
    throw CliError("--q has heads = " + std::to_string(q.heads()) +
                   ", not a multiple of --k's heads = " +
                   std::to_string(k.heads()) + " " + both(q, k) +
                   "; grouped-query attention shares each k/v head among "
                   "heads(q) / heads(k) query heads");
  }
  if (k.cols() != q.cols()) differ(q, k, "d", q.cols(), k.cols());
  if (v.batch() != k.batch()) differ(k, v, "batch", k.batch(), v.batch());
  if (v.heads() != k.heads()) differ(k, v, "heads", k.heads(), v.heads());
  if (v.rows() != k.rows()) differ(k, v, "n_kv", k.rows(), v.rows());
  if (v.cols() == 0) {
    throw CliError("--v is " + v.text() + ": d_v must be at least 1");
  }
}

// A paged cache's shapes: q 4-D; k and v pages [pages, kv_heads,
// page_size, d] matching each other, heads dividing q's, d equal to q's;
// block_table [batch, blocks_per_seq] and seq_lens [batch] int32.
void check_paged(const Input& q, const Input& k, const Input& v,
                 const Input& table, const Input& lens) {
  if (q.rank() != 4) {
    throw CliError("--q is " + q.text() +
                   ": a paged cache (--block-table) needs a 4-D q [batch x "
                   "heads x n_q x d]");
  }
  for (const Input* x : {&k, &v}) {
    if (x->rank() != 4) {
      throw CliError(x->option + " is " + x->text() +
                     ": with --block-table it holds pages, a 4-D array "
                     "[pages x kv_heads x page_size x d]");
    }
  }
  const char* q_axes[] = {"batch", "heads", "n_q", "d"};
  for (int axis = 0; axis < 4; ++axis) {
    if (q.dim(axis) == 0) {
      throw CliError("--q is " + q.text() + ": " + q_axes[axis] +
                     " must be at least 1");
    }
  }
  if (k.heads() == 0 || q.heads() % k.heads() != 0) {
    throw CliError("--q has heads = " + std::to_string(q.heads()) +
                   ", not a multiple of --k's kv_heads = " +
                   std::to_string(k.heads()) + " " + both(q, k));
  }
  if (k.cols() != q.cols()) {
    throw CliError("--k has d = " + std::to_string(k.cols()) +
                   " but --q has d = " + std::to_string(q.cols()) + " " +
                   both(q, k));
  }
  if (k.rows() == 0) {
    throw CliError("--k is " + k.text() + ": page_size must be at least 1");
  }
  if (v.batch() != k.batch() || v.heads() != k.heads() ||
      v.rows() != k.rows()) {
    throw CliError("--v is " + v.text() + " but --k is " + k.text() +
                   ": they need the same pages, kv_heads and page_size");
  }
  if (v.cols() == 0) {
    throw CliError("--v is " + v.text() + ": d_v must be at least 1");
  }
  if (table.array.shape.size() != 2 || table.array.shape[0] != q.batch()) {
    throw CliError("--block-table is " + table.text() +
                   " but need [batch x blocks_per_seq] with batch = " +
                   std::to_string(q.batch()) + " (q is " + q.text() + ")");
  }
  if (lens.array.shape.size() != 1 || lens.array.shape[0] != q.batch()) {
    throw CliError("--seq-lens is " + lens.text() +
                   " but need [batch] with batch = " +
                   std::to_string(q.batch()) + " (q is " + q.text() + ")");
  }
}

// A mask or bias: [n_q, n_kv] or [batch, heads, n_q, n_kv], each of batch,
// heads and n_q equal to the scores' or 1 (broadcast). Paged: at least
// n_kv = max(seq_lens) columns.
void check_scores_shaped(const Input& m, const Input& q, const Input& k,
                         std::size_t n_kv, bool paged) {
  const auto fits = [](std::size_t have, std::size_t need) {
    return have == need || have == 1;
  };
  if (fits(m.batch(), q.batch()) && fits(m.heads(), q.heads()) &&
      fits(m.rows(), q.rows()) && (paged ? m.cols() >= n_kv : m.cols() == n_kv))
    return;
  if (paged) {
    throw CliError(m.option + " is " + m.text() + " but q is " + q.text() +
                   " and the longest sequence has " + std::to_string(n_kv) +
                   " keys; " + m.option +
                   " must be [n_q x cols] or [batch x heads x n_q x cols] "
                   "with cols >= max(seq_lens), 1 allowed for batch, heads "
                   "and n_q");
  }
  std::vector<std::size_t> scores = {q.rows(), k.rows()};
  if (q.rank() == 4) scores = {q.batch(), q.heads(), q.rows(), k.rows()};
  throw CliError(m.option + " is " + m.text() + " but the scores are " +
                 shape_text(scores) + " " + both(q, k) + "; " + m.option +
                 " must be [n_q x n_kv] or [batch x heads x n_q x n_kv], "
                 "with 1 allowed for batch, heads and n_q");
}

// A mask or bias as a TensorView over the full [B, H, n_q, n_kv], stride 0
// for the broadcast dimensions.
template <class T>
TensorView<const T> scores_view(const T* data, const Input& m, const Input& q) {
  const std::size_t n_kv = m.cols();
  const std::size_t row_stride = m.rows() == 1 ? 0 : n_kv;
  const std::size_t head_stride = m.heads() == 1 ? 0 : m.rows() * n_kv;
  const std::size_t batch_stride =
      m.batch() == 1 ? 0 : m.heads() * m.rows() * n_kv;
  return TensorView<const T>(data, q.batch(), q.heads(), q.rows(), n_kv,
                             batch_stride, head_stride, row_stride);
}

}  // namespace

AttentionInputs read_attention_inputs(const AttentionArgs& args) {
  int from_stdin = 0;
  for (const std::optional<std::string>& path :
       {std::optional<std::string>(args.q), std::optional<std::string>(args.k),
        std::optional<std::string>(args.v), args.mask, args.bias,
        args.block_table, args.seq_lens})
    from_stdin += path && *path == "-";
  if (from_stdin > 1) {
    throw CliError("only one input can be read from standard input ('-')");
  }
  if (args.block_table.has_value() != args.seq_lens.has_value()) {
    throw CliError(
        "--block-table and --seq-lens go together: a paged cache needs "
        "both");
  }

  static constexpr NpyDtype kF32[] = {NpyDtype::kFloat32};
  static constexpr NpyDtype kKV[] = {NpyDtype::kFloat32, NpyDtype::kFloat16};
  static constexpr NpyDtype kBool[] = {NpyDtype::kBool};
  static constexpr NpyDtype kI32[] = {NpyDtype::kInt32};
  AttentionInputs in;
  in.q =
      read_input("--q", args.q, kF32, "[n_q x d]", "[batch x heads x n_q x d]");
  std::size_t n_kv = 0;
  if (args.block_table) {
    in.k = read_any("--k", args.k, kKV);
    in.v = read_any("--v", args.v, kKV);
    in.block_table = read_any("--block-table", *args.block_table, kI32);
    in.seq_lens = read_any("--seq-lens", *args.seq_lens, kI32);
    check_paged(in.q, in.k, in.v, in.block_table, in.seq_lens);
    for (std::int32_t n : int32s_of(in.seq_lens.array)) {
      if (n > 0) n_kv = std::max(n_kv, static_cast<std::size_t>(n));
    }
  } else {
    in.k = read_input("--k", args.k, kKV, "[n_kv x d]",
                      "[batch x kv_heads x n_kv x d]");
    in.v = read_input("--v", args.v, kKV, "[n_kv x d_v]",
                      "[batch x kv_heads x n_kv x d_v]");
    check_qkv(in.q, in.k, in.v);
    n_kv = in.k.rows();
  }
  if (args.mask) {
    in.mask = read_input("--mask", *args.mask, kBool, "[n_q x n_kv]",
                         "[batch x heads x n_q x n_kv]");
    check_scores_shaped(in.mask, in.q, in.k, n_kv, in.paged());
  }
  if (args.bias) {
    in.bias = read_input("--bias", *args.bias, kF32, "[n_q x n_kv]",
                         "[batch x heads x n_q x n_kv]");
    check_scores_shaped(in.bias, in.q, in.k, n_kv, in.paged());
  }
  return in;
}

template <class KV>
void assemble_tensors(const AttentionInputs& in, AttentionTensors<KV>* t,
                      AttentionOptions* options) {
  const Input &q = in.q, &k = in.k, &v = in.v;
  t->q_values = floats_of(q.array);
  if constexpr (std::is_same_v<KV, float>) {
    t->k_values = floats_of(k.array);
    t->v_values = floats_of(v.array);
  } else {
    t->k_values = halves_of(k.array);
    t->v_values = halves_of(v.array);
  }
  t->q = TensorView<const float>(t->q_values.data(), q.batch(), q.heads(),
                                 q.rows(), q.cols());
  t->k = TensorView<const KV>(t->k_values.data(), k.batch(), k.heads(),
                              k.rows(), k.cols());
  t->v = TensorView<const KV>(t->v_values.data(), v.batch(), v.heads(),
                              v.rows(), v.cols());
  if (in.mask.present()) {
    t->mask_flags = bools_of(in.mask.array);
    options->mask = scores_view<bool>(t->mask_flags.get(), in.mask, q);
  }
  if (in.bias.present()) {
    t->bias_values = floats_of(in.bias.array);
    options->bias = scores_view<float>(t->bias_values.data(), in.bias, q);
  }
  if (in.paged()) {
    t->table_values = int32s_of(in.block_table.array);
    t->len_values = int32s_of(in.seq_lens.array);
    const std::size_t bps = in.block_table.array.shape[1];
    t->table = PagedKVTable{
        std::span<const std::int32_t>(t->table_values.data(), q.batch() * bps),
        bps, std::span<const std::int32_t>(t->len_values.data(), q.batch())};
  }
}

template void assemble_tensors<float>(const AttentionInputs&,
                                      AttentionTensors<float>*,
                                      AttentionOptions*);
template void assemble_tensors<Float16>(const AttentionInputs&,
                                        AttentionTensors<Float16>*,
                                        AttentionOptions*);

}  // namespace softdot::cli
