// softdot command: the inputs of `softdot attention` (see attention_inputs.h).
#include "attention_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "error.h"
#include "format.h"
#include "output_file.h"
#include "parse.h"
#include "softdot/kv_cache.h"

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

// The dtypes each input may have.
constexpr NpyDtype kF32[] = {NpyDtype::kFloat32};
constexpr NpyDtype kKV[] = {NpyDtype::kFloat32, NpyDtype::kFloat16,
                            NpyDtype::kInt8};
constexpr NpyDtype kBool[] = {NpyDtype::kBool};
constexpr NpyDtype kI32[] = {NpyDtype::kInt32};

// An input of any rank (pages, the block table, the lengths; the caller
// checks the shape).
Input read_any(const std::string& option, const std::string& path,
               std::span<const NpyDtype> allowed) {
  Input input;
  input.option = option;
  const std::string name = path == "-" ? "<stdin>" : path;
  input.file = name;
  try {
    input.array = read_npy_array(read_file(path), name, allowed);
  } catch (const CliError& e) {
    throw CliError(option + ": " + e.what());
  }
  return input;
}

// An input that must be 2-D (`axes_2d` in the message) or 4-D (`axes_4d`).
Input read_input(const std::string& option, const std::string& path,
                 std::span<const NpyDtype> allowed, const char* axes_2d,
                 const char* axes_4d) {
  Input input = read_any(option, path, allowed);
  if (input.rank() != 2 && input.rank() != 4) {
    throw CliError(option + ": " + input.file + ": shape " + input.text() +
                   " has " + std::to_string(input.rank()) +
                   (input.rank() == 1 ? " dimension" : " dimensions") +
                   "; need a 2-D array " + axes_2d + " or a 4-D array " +
                   axes_4d);
  }
  return input;
}

// Every size of q (read as [batch, heads, n_q, d]) at least 1.
void check_q_sizes(const Input& q) {
  const char* q_axes[] = {"batch", "heads", "n_q", "d"};
  for (int axis = 0; axis < 4; ++axis) {
    if (q.dim(axis) == 0) {
      throw CliError("--q is " + q.text() + ": " + q_axes[axis] +
                     " must be at least 1");
    }
  }
}

// The q, k, v shapes: all 2-D or all 4-D, matching batch, heads (GQA), d,
// n_kv, with every size >= 1 except n_kv.
void check_qkv(const Input& q, const Input& k, const Input& v) {
  check_q_sizes(q);
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

// "[pages x page_size x kv_heads x LAST]" (NHD) or "[pages x kv_heads x
// page_size x LAST]" (HND): the axes of pages in the user's layout.
std::string page_axes(KvLayout layout, const char* last) {
  return std::string(layout == KvLayout::kNHD
                         ? "[pages x page_size x kv_heads x "
                         : "[pages x kv_heads x page_size x ") +
         last + "]";
}

// "--kv-layout NHD (the default) reads pages as ...": the layout the pages
// were read in, and the other one, for the messages about their shapes.
std::string layout_clause(KvLayout layout) {
  if (layout == KvLayout::kNHD) {
    return "--kv-layout NHD (the default) reads pages as " +
           page_axes(KvLayout::kNHD, "d") + ", HND as " +
           page_axes(KvLayout::kHND, "d");
  }
  return "--kv-layout HND reads pages as " + page_axes(KvLayout::kHND, "d");
}

// A paged cache's shapes: q 4-D; k and v pages [pages, page_size,
// kv_heads, d] (NHD) or [pages, kv_heads, page_size, d] (HND) matching each
// other, heads dividing q's, d equal to q's; block_table [batch,
// blocks_per_seq] and seq_lens [batch] int32. The messages show the shapes
// as the files hold them.
void check_paged(const Input& q, const Input& k, const Input& v,
                 const Input& table, const Input& lens, KvLayout layout,
                 std::size_t batch) {
  if (q.rank() != 4) {
    throw CliError("--q is " + q.text() +
                   ": a paged cache (--block-table) needs a 4-D q [batch x "
                   "heads x n_q x d]");
  }
  for (const Input* x : {&k, &v}) {
    if (x->rank() != 4) {
      throw CliError(x->option + " is " + x->text() +
                     ": with --block-table it holds pages, a 4-D array; " +
                     layout_clause(layout));
    }
  }
  check_q_sizes(q);
  if (k.heads() == 0 || q.heads() % k.heads() != 0) {
    throw CliError(
        "--q has heads = " + std::to_string(q.heads()) +
        ", not a multiple of --k's kv_heads = " + std::to_string(k.heads()) +
        " " + both(q, k) + "; " + layout_clause(layout));
  }
  if (k.cols() != q.cols()) {
    throw CliError("--k has d = " + std::to_string(k.cols()) +
                   " but --q has d = " + std::to_string(q.cols()) + " " +
                   both(q, k));
  }
  if (k.rows() == 0) {
    throw CliError("--k is " + k.text() + ": page_size must be at least 1; " +
                   layout_clause(layout));
  }
  if (v.batch() != k.batch() || v.heads() != k.heads() ||
      v.rows() != k.rows()) {
    throw CliError("--v is " + v.text() + " but --k is " + k.text() +
                   ": they need the same pages, kv_heads and page_size; " +
                   layout_clause(layout));
  }
  if (v.cols() == 0) {
    throw CliError("--v is " + v.text() + ": d_v must be at least 1");
  }
  const std::string of = batch == q.batch()
                             ? " (q is " + q.text() + ")"
                             : " (--query-start-loc has batch + 1 entries)";
  if (table.array.shape.size() != 2 || table.array.shape[0] != batch) {
    throw CliError("--block-table is " + table.text() +
                   " but need [batch x blocks_per_seq] with batch = " +
                   std::to_string(batch) + of);
  }
  if (lens.array.shape.size() != 1 || lens.array.shape[0] != batch) {
    throw CliError("--seq-lens is " + lens.text() +
                   " but need [batch] with batch = " + std::to_string(batch) +
                   of);
  }
}

// The lengths and the table entries each sequence reads, checked here (the
// library checks them too, but names its own view of the pages): each
// length >= 0 and within its blocks_per_seq pages, each entry a page of k.
void check_table(const Input& table, const Input& lens, const Input& k) {
  const std::vector<std::int32_t> entries = int32s_of(table.array);
  const std::vector<std::int32_t> lengths = int32s_of(lens.array);
  const std::size_t bps = table.array.shape[1];
  const std::size_t pages = k.batch(), page_size = k.rows();
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const std::string seq = "seq_lens[" + std::to_string(b) +
                            "] = " + std::to_string(lengths[b]) +
                            " (sequence " + std::to_string(b) + ")";
    if (lengths[b] < 0) {
      throw CliError("--seq-lens: " + lens.file + ": " + seq +
                     " is negative; a length is a number of keys, >= 0");
    }
    const auto n = static_cast<std::size_t>(lengths[b]);
    const std::size_t blocks = (n + page_size - 1) / page_size;
    if (blocks > bps) {
      throw CliError("--seq-lens: " + lens.file + ": " + seq +
                     " is more keys than its " + std::to_string(bps) +
                     " pages of page_size " + std::to_string(page_size) +
                     " hold (--block-table is " + table.text() + ", --k is " +
                     k.text() + ")");
    }
    for (std::size_t i = 0; i < blocks; ++i) {
      const std::int32_t page = entries[b * bps + i];
      if (page < 0 || static_cast<std::size_t>(page) >= pages) {
        throw CliError("--block-table: " + table.file + ": block_table[" +
                       std::to_string(b) + ", " + std::to_string(i) +
                       "] = " + std::to_string(page) + " (sequence " +
                       std::to_string(b) + ", entry " + std::to_string(i) +
                       ") is not a page of --k " + k.text() + " (0 to " +
                       std::to_string(pages - 1) + ")");
      }
    }
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

// "[3, 0]": the index of element `flat` of an array of `shape` (C order).
std::string index_text(std::size_t flat,
                       const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> index(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = flat % shape[a];
    flat /= shape[a];
  }
  std::string s = "[";
  for (std::size_t a = 0; a < index.size(); ++a) {
    if (a != 0) s += ", ";
    s += std::to_string(index[a]);
  }
  return s + "]";
}

std::string dtype_of(const Input& x) {
  return std::string(npy_dtype_name(x.array.dtype));
}

// The scales of int8 keys or values: kv's shape with a last axis of 1 (one
// per row: [n_kv x 1], [batch x kv_heads x n_kv x 1], or pages in their
// layout), each finite and >= 0.
void check_scales(const Input& s, const Input& kv) {
  std::vector<std::size_t> want = kv.array.shape;
  want.back() = 1;
  if (s.array.shape != want) {
    throw CliError(s.option + " is " + s.text() + " but " + kv.option + " is " +
                   kv.text() + "; " + s.option + " must be " +
                   shape_text(want) + ", one scale per row of " + kv.option);
  }
  const std::vector<float> values = floats_of(s.array);
  for (std::size_t i = 0; i < s.array.size(); ++i) {
    if (!(std::isfinite(values[i]) && values[i] >= 0)) {
      throw CliError(s.option + ": " + s.file + ": the scale at " +
                     index_text(i, s.array.shape) + " is " +
                     format_number(values[i], kShortest) +
                     "; scales must be finite and >= 0");
    }
  }
}

// int8 --k and --v: both or neither, each with its scales; the scales only
// with int8 ones, --kv int8 only with float ones.
void read_int8_scales(const AttentionArgs& args, AttentionInputs* in) {
  const Input &k = in->k, &v = in->v;
  if (k.is_int8() != v.is_int8()) {
    const Input& i8 = k.is_int8() ? k : v;
    const Input& other = k.is_int8() ? v : k;
    throw CliError(i8.option + " " + i8.file + " is int8 but " + other.option +
                   " " + other.file + " is " + dtype_of(other) +
                   "; int8 keys and values go together, each with its "
                   "scales (--k-scales, --v-scales)");
  }
  if (k.is_int8() && in->quantize) {
    throw CliError("--kv " + *args.kv +
                   " quantises float32 or float16 keys and values, "
                   "but --k " +
                   k.file +
                   " is int8 already (give its scales with --k-scales and "
                   "--v-scales instead)");
  }
  const struct {
    const Input* kv;
    const std::optional<std::string>* path;
    const char* option;
    Input* scales;
  } items[] = {{&k, &args.k_scales, "--k-scales", &in->k_scales},
               {&v, &args.v_scales, "--v-scales", &in->v_scales}};
  for (const auto& it : items) {
    if (!k.is_int8()) {
      if (*it.path) {
        throw CliError(std::string(it.option) + " is for int8 " +
                       (it.kv == &k ? "keys" : "values") + ", but " +
                       it.kv->option + " " + it.kv->file + " is " +
                       dtype_of(*it.kv));
      }
      continue;
    }
    if (!*it.path) {
      throw CliError(it.kv->option + " " + it.kv->file +
                     " is int8 and needs its scales: " + it.option +
                     " FILE.npy, float32 " +
                     (in->paged() ? page_axes(in->layout, "1") +
                                        (in->layout == KvLayout::kNHD
                                             ? " (--kv-layout NHD, the default)"
                                             : " (--kv-layout HND)")
                                  : "[n_kv x 1] or "
                                    "[batch x kv_heads x n_kv x 1]"));
    }
    *it.scales = in->paged()
                     ? read_any(it.option, **it.path, kF32)
                     : read_input(it.option, **it.path, kF32, "[n_kv x 1]",
                                  "[batch x kv_heads x n_kv x 1]");
    it.scales->nhd = it.kv->nhd;
    check_scales(*it.scales, *it.kv);
  }
}

// x's values as floats, each finite (else CliError naming the first).
std::vector<float> finite_floats(const Input& x, const std::string& name) {
  std::vector<float> f = floats_of(x.array);
  for (std::size_t i = 0; i < x.array.size(); ++i) {
    if (!std::isfinite(f[i])) {
      throw CliError(x.option + ": " + x.file + ": the value at " +
                     index_text(i, x.array.shape) + " is " +
                     format_number(f[i], kShortest) + "; --kv " + name +
                     " quantises finite values only");
    }
  }
  return f;
}

// --kv int8: x quantised by softdot::quantize_kv into values and one scale
// per row, both in x's own order (NHD pages: scales [pages, page_size,
// kv_heads, 1]); --kv float8_e4m3fn / float8_e5m2 (T fp8): as write_kv
// quantises into fp8 pages with scales (max |x| / 448 or 57344), each row of
// x, in the file's order [B, A, C, d], written to a page of one slot laid
// out in that order. One scale per row of d, so the rows may be taken in
// the file's order.
template <class T>
void quantize_input(const Input& x, std::vector<T>* values,
                    std::vector<float>* scales, const std::string& name) {
  const std::vector<float> f = finite_floats(x, name);
  const std::size_t B = x.batch(), d = x.cols();
  const std::size_t A = x.nhd ? x.array.shape[1] : x.heads();
  const std::size_t C = x.nhd ? x.array.shape[2] : x.rows();
  values->assign(std::max<std::size_t>(B * A * C * d, 1), T{});
  scales->assign(std::max<std::size_t>(B * A * C, 1), 0.0f);
  try {
    if constexpr (std::is_same_v<T, std::int8_t>) {
      quantize_kv(TensorView<const float>(f.data(), B, A, C, d),
                  TensorView<std::int8_t>(values->data(), B, A, C, d),
                  TensorView<float>(scales->data(), B, A, C, 1));
    } else {
      std::vector<std::int64_t> slots(C);
      for (std::size_t t = 0; t < C; ++t) slots[t] = std::int64_t(t);
      // Slot t of head a of batch b: element (b, a, t) of the file's order.
      for (std::size_t b = 0, n = A * C; b < B && C != 0; ++b) {
        const Float8Pages<T> p{
            TensorView<T>(values->data() + b * n * d, C, A, 1, d, d, C * d, d),
            TensorView<float>(scales->data() + b * n, C, A, 1, 1, 1, C, 1)};
        const TensorView<const float> r(f.data() + b * n * d, 1, A, C, d);
        write_kv(r, r, p, p, slots);
      }
    }
  } catch (const std::invalid_argument& e) {
    throw CliError(x.option + ": " + x.file + ": " + e.what());
  }
}

// A view of x's values (`data`, in the file's order) as [batch, heads,
// rows, d], d = x.cols() or 1 for x's scales; NHD pages are strided.
template <class T>
TensorView<const T> view_of(const T* data, const Input& x, std::size_t d) {
  const std::size_t B = x.batch(), H = x.heads(), n = x.rows();
  if (!x.nhd) return TensorView<const T>(data, B, H, n, d);
  return TensorView<const T>(data, B, H, n, d, n * H * d, d, H * d);
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

// The options' combinations, before any file is read: at most one input from
// standard input, and the paged cache's options together.
void check_input_options(const AttentionArgs& args) {
  int from_stdin = 0;
  for (const std::optional<std::string>& path :
       {std::optional<std::string>(args.q), std::optional<std::string>(args.k),
        std::optional<std::string>(args.v), args.mask, args.bias, args.k_scales,
        args.v_scales, args.block_table, args.seq_lens})
    from_stdin += path && *path == "-";
  if (from_stdin > 1) {
    throw CliError("only one input can be read from standard input ('-')");
  }
  if (args.block_table.has_value() != args.seq_lens.has_value()) {
    throw CliError(
        "--block-table and --seq-lens go together: a paged cache needs "
        "both");
  }
  if ((args.query_start_loc || args.draft_parents) && !args.block_table) {
    throw CliError(std::string(args.query_start_loc ? "--query-start-loc"
                                                    : "--draft-parents") +
                   " is an option of --block-table (a paged cache)");
  }
}

// --query-start-loc: q's packed rows [T, heads, d], held as [1, heads, T, d],
// and the row starts.
void read_packed_q(const AttentionArgs& args, AttentionInputs* in) {
  in->q = read_any("--q", args.q, kF32);
  if (in->q.rank() != 3) {
    throw CliError("--q is " + in->q.text() +
                   ": with --query-start-loc it holds every sequence's "
                   "rows one after another, [T x heads x d]");
  }
  const std::size_t T = in->q.array.shape[0], H = in->q.array.shape[1],
                    d = in->q.array.shape[2];
  std::string packed(in->q.array.data.size(), '\0');
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t h = 0; h < H; ++h)
      std::memcpy(&packed[((h * T + t) * d) * 4],
                  &in->q.array.data[((t * H + h) * d) * 4], d * 4);
  in->q.array.data = std::move(packed);
  in->q.array.shape = {1, H, T, d};
  in->q_packed = true;
  in->query_start_loc =
      read_any("--query-start-loc", *args.query_start_loc, kI32);
  if (in->query_start_loc.rank() != 1 ||
      in->query_start_loc.array.shape[0] == 0) {
    throw CliError("--query-start-loc is " + in->query_start_loc.text() +
                   ": need [batch + 1] row starts");
  }
}

// A paged cache: pages of float32, float16 or int8 (with scales in the same
// layout, last axis 1, or quantised per page row by --kv int8), the block
// table and the lengths. Returns n_kv, the longest sequence's keys.
std::size_t read_paged_kv(const AttentionArgs& args, AttentionInputs* in) {
  in->k = read_any("--k", args.k, kKV);
  in->v = read_any("--v", args.v, kKV);
  in->k.nhd = in->v.nhd = in->layout == KvLayout::kNHD;
  in->block_table = read_any("--block-table", *args.block_table, kI32);
  in->seq_lens = read_any("--seq-lens", *args.seq_lens, kI32);
  const std::size_t batch =
      in->q_packed ? in->query_start_loc.array.shape[0] - 1 : in->q.batch();
  check_paged(in->q, in->k, in->v, in->block_table, in->seq_lens, in->layout,
              batch);
  check_table(in->block_table, in->seq_lens, in->k);
  read_int8_scales(args, in);
  std::size_t n_kv = 0;
  for (std::int32_t n : int32s_of(in->seq_lens.array)) {
    if (n > 0) n_kv = std::max(n_kv, static_cast<std::size_t>(n));
  }
  return n_kv;
}

// --mask or --bias, checked against the scores' shape (n_kv keys).
Input read_scores_shaped(const char* option, const std::string& path,
                         std::span<const NpyDtype> allowed,
                         const AttentionInputs& in, std::size_t n_kv) {
  Input m = read_input(option, path, allowed, "[n_q x n_kv]",
                       "[batch x heads x n_q x n_kv]");
  check_scores_shaped(m, in.q, in.k, n_kv, in.paged());
  return m;
}

}  // namespace

KvLayout kv_layout_option(const AttentionArgs& args) {
  if (!args.kv_layout) return KvLayout::kNHD;
  if (!args.block_table) {
    throw CliError(
        "--kv-layout is an option of --block-table: it orders the axes of "
        "paged k and v");
  }
  if (*args.kv_layout == "NHD") return KvLayout::kNHD;
  if (*args.kv_layout == "HND") return KvLayout::kHND;
  throw CliError("--kv-layout " + quote(*args.kv_layout) +
                 ": must be NHD (pages " + page_axes(KvLayout::kNHD, "d") +
                 ", the default) or HND (pages " +
                 page_axes(KvLayout::kHND, "d") + ")");
}

KvStorage quantize_kv_option(const AttentionArgs& args) {
  if (!args.kv) return KvStorage::kFloat;
  if (*args.kv == "int8") return KvStorage::kInt8;
  if (*args.kv == "float8_e4m3fn") return KvStorage::kFloat8E4M3;
  if (*args.kv == "float8_e5m2") return KvStorage::kFloat8E5M2;
  throw CliError("--kv: " + quote(*args.kv) +
                 " is not a key/value format; the ones there are: int8, "
                 "float8_e4m3fn, float8_e5m2 (leave out --kv to use the "
                 "files' own dtypes)");
}

AttentionInputs read_attention_inputs(const AttentionArgs& args) {
  check_input_options(args);
  AttentionInputs in;
  const KvStorage to = quantize_kv_option(args);
  in.quantize = to != KvStorage::kFloat;
  if (in.quantize) in.kv_format = to;
  in.layout = kv_layout_option(args);
  if (args.query_start_loc) {
    read_packed_q(args, &in);
  } else {
    in.q = read_input("--q", args.q, kF32, "[n_q x d]",
                      "[batch x heads x n_q x d]");
  }
  if (args.draft_parents) {
    in.draft_parents = read_any("--draft-parents", *args.draft_parents, kI32);
  }
  if (args.alibi_slopes) {
    in.alibi_slopes = read_any("--alibi-slopes", *args.alibi_slopes, kF32);
    if (in.alibi_slopes.rank() != 1) {
      throw CliError("--alibi-slopes is " + in.alibi_slopes.text() +
                     ": need [heads], one slope per query head");
    }
  }
  std::size_t n_kv = 0;
  if (args.block_table) {
    n_kv = read_paged_kv(args, &in);
  } else {
    in.k = read_input("--k", args.k, kKV, "[n_kv x d]",
                      "[batch x kv_heads x n_kv x d]");
    in.v = read_input("--v", args.v, kKV, "[n_kv x d_v]",
                      "[batch x kv_heads x n_kv x d_v]");
    check_qkv(in.q, in.k, in.v);
    read_int8_scales(args, &in);
    n_kv = in.k.rows();
  }
  if (args.mask) {
    in.mask = read_scores_shaped("--mask", *args.mask, kBool, in, n_kv);
  }
  if (args.bias) {
    in.bias = read_scores_shaped("--bias", *args.bias, kF32, in, n_kv);
  }
  return in;
}

KvStorage kv_storage(const AttentionInputs& in) {
  if (in.quantize) return in.kv_format;
  if (in.k.is_int8()) return KvStorage::kInt8;
  if (in.k.array.dtype == NpyDtype::kFloat16 &&
      in.v.array.dtype == NpyDtype::kFloat16) {
    return KvStorage::kFloat16;
  }
  return KvStorage::kFloat;
}

template <class KV>
void assemble_tensors(const AttentionInputs& in, AttentionTensors<KV>* t,
                      AttentionOptions* options) {
  const Input &q = in.q, &k = in.k, &v = in.v;
  t->q_values = floats_of(q.array);
  if constexpr (std::is_same_v<KV, float>) {
    t->k_values = floats_of(k.array);
    t->v_values = floats_of(v.array);
  } else if constexpr (std::is_same_v<KV, std::int8_t>) {
    if (in.quantize) {
      quantize_input(k, &t->k_values, &t->k_scale_values, "int8");
      quantize_input(v, &t->v_values, &t->v_scale_values, "int8");
    } else {
      t->k_values = int8s_of(k.array);
      t->v_values = int8s_of(v.array);
      t->k_scale_values = floats_of(in.k_scales.array);
      t->v_scale_values = floats_of(in.v_scales.array);
    }
    // The scales have their keys' or values' layout (read in it, or made
    // by quantize_input in the file's order).
    t->k_scales = view_of<float>(t->k_scale_values.data(), k, 1);
    t->v_scales = view_of<float>(t->v_scale_values.data(), v, 1);
  } else if constexpr (std::is_same_v<KV, Float8E4M3> ||
                       std::is_same_v<KV, Float8E5M2>) {
    const std::string name =
        std::is_same_v<KV, Float8E4M3> ? "float8_e4m3fn" : "float8_e5m2";
    quantize_input(k, &t->k_values, &t->k_scale_values, name);
    quantize_input(v, &t->v_values, &t->v_scale_values, name);
    t->k_scales = view_of<float>(t->k_scale_values.data(), k, 1);
    t->v_scales = view_of<float>(t->v_scale_values.data(), v, 1);
  } else {
    t->k_values = halves_of(k.array);
    t->v_values = halves_of(v.array);
  }
  t->q = TensorView<const float>(t->q_values.data(), q.batch(), q.heads(),
                                 q.rows(), q.cols());
  t->k = view_of<KV>(t->k_values.data(), k, k.cols());
  t->v = view_of<KV>(t->v_values.data(), v, v.cols());
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
    const std::size_t batch = in.sequences();
    t->table = PagedKVTable{
        std::span<const std::int32_t>(t->table_values.data(), batch * bps), bps,
        std::span<const std::int32_t>(t->len_values.data(), batch)};
    if (in.q_packed) {
      t->qsl_values = int32s_of(in.query_start_loc.array);
      t->table.query_start_loc = t->qsl_values;
    }
    if (in.draft_parents.present()) {
      t->parent_values = int32s_of(in.draft_parents.array);
      t->table.draft_parents = t->parent_values;
    }
  }
  if (in.alibi_slopes.present()) {
    t->alibi_values = floats_of(in.alibi_slopes.array);
    options->alibi_slopes = t->alibi_values;
  }
}

template void assemble_tensors<float>(const AttentionInputs&,
                                      AttentionTensors<float>*,
                                      AttentionOptions*);
template void assemble_tensors<Float16>(const AttentionInputs&,
                                        AttentionTensors<Float16>*,
                                        AttentionOptions*);
template void assemble_tensors<std::int8_t>(const AttentionInputs&,
                                            AttentionTensors<std::int8_t>*,
                                            AttentionOptions*);
template void assemble_tensors<Float8E4M3>(const AttentionInputs&,
                                           AttentionTensors<Float8E4M3>*,
                                           AttentionOptions*);
template void assemble_tensors<Float8E5M2>(const AttentionInputs&,
                                           AttentionTensors<Float8E5M2>*,
                                           AttentionOptions*);

}  // namespace softdot::cli
