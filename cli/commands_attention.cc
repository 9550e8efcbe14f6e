// softdot command: `softdot attention --q Q.npy --k K.npy --v V.npy [...]
// -o OUT.npy`, scaled dot-product attention of .npy arrays with
// softdot::attention (and softdot::attention_weights for --explain).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "commands.h"
#include "error.h"
#include "explain.h"
#include "format.h"
#include "io_npy.h"
#include "output_file.h"
#include "parse.h"
#include "softdot/attention.h"

namespace softdot::cli {
namespace {

// --explain prints every number: only for small inputs.
constexpr std::size_t kExplainMaxN = 64;      // n_q, n_kv and d_v per head
constexpr std::size_t kExplainMaxHeads = 16;  // batch x heads
constexpr int kExplainDigits = 3;
constexpr int kMaxWindow = 999999999;  // parse_small_int's 9 digits

// "[3 x 4]": a shape in messages.
std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) s += " x ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// One input array and the option that named it.
struct Input {
  std::string option;  // "--q"
  NpyArray array;

  bool present() const { return !option.empty(); }
  // "q" for messages like "(q is [3 x 4], k is [7 x 5])".
  std::string letter() const { return option.substr(2); }
  std::string text() const { return shape_text(array.shape); }
  std::size_t rank() const { return array.shape.size(); }
  // [batch, heads, rows, cols]; a 2-D array is [1, 1, rows, cols].
  std::size_t dim(int axis) const {
    if (rank() == 4) return array.shape[static_cast<std::size_t>(axis)];
    return axis < 2 ? 1 : array.shape[static_cast<std::size_t>(axis - 2)];
  }
  std::size_t batch() const { return dim(0); }
  std::size_t heads() const { return dim(1); }
  std::size_t rows() const { return dim(2); }
  std::size_t cols() const { return dim(3); }
};

// "(q is [3 x 4], k is [7 x 5])".
std::string both(const Input& a, const Input& b) {
  return "(" + a.letter() + " is " + a.text() + ", " + b.letter() + " is " +
         b.text() + ")";
}

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

bool ends_with_npy(const std::string& s) {
  if (s.size() < 4) return false;
  std::string tail = s.substr(s.size() - 4);
  for (char& c : tail)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return tail == ".npy";
}

double parse_positive(const std::optional<std::string>& text,
                      const char* option, bool allow_zero) {
  const ParsedNumber n = parse_number(*text);
  if (n.status != NumberStatus::kOk) {
    throw CliError(std::string(option) + ": " + number_error(*text, n.status));
  }
  const bool ok =
      std::isfinite(n.value) && (allow_zero ? n.value >= 0 : n.value > 0);
  if (!ok) {
    throw CliError(std::string(option) + ": " + quote(*text) +
                   (allow_zero ? " must be a finite number >= 0"
                               : " must be a finite number > 0"));
  }
  // The library works with float.
  const float f = static_cast<float>(n.value);
  if (!std::isfinite(f) || (!allow_zero && f == 0)) {
    throw CliError(std::string(option) + ": " + quote(*text) +
                   (std::isfinite(f) ? " rounds to 0" : " overflows") +
                   " in float32; need a value float32 can hold");
  }
  return n.value;
}

std::ptrdiff_t parse_window(const std::optional<std::string>& text,
                            const char* option) {
  if (!text) return -1;
  const auto n = parse_small_int(*text, kMaxWindow);
  if (!n) {
    throw CliError(std::string(option) + ": " + quote(*text) +
                   " must be a whole number from 0 to " +
                   std::to_string(kMaxWindow) + " (leave it out for no limit)");
  }
  return *n;
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

// A mask or bias: [n_q, n_kv] or [batch, heads, n_q, n_kv], each of batch,
// heads and n_q equal to the scores' or 1 (broadcast).
void check_scores_shaped(const Input& m, const Input& q, const Input& k) {
  const auto fits = [](std::size_t have, std::size_t need) {
    return have == need || have == 1;
  };
  if (fits(m.batch(), q.batch()) && fits(m.heads(), q.heads()) &&
      fits(m.rows(), q.rows()) && m.cols() == k.rows())
    return;
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

// The command's own float64 scores for --explain (the library does not
// return them): scale * (q . k), soft-capped, plus the bias, and which keys
// each query sees.
template <class KV>
void explain_scores(TensorView<const float> q, TensorView<const KV> k,
                    const AttentionOptions& o, float scale, std::size_t b,
                    std::size_t h, AttentionHeadExplain* head) {
  const std::size_t n_q = q.rows, n_kv = k.rows, d = q.cols;
  const std::size_t h_kv = h / (q.heads / k.heads);
  head->scores.assign(n_q * n_kv, 0.0);
  head->visible.assign(n_q * n_kv, true);
  for (std::size_t i = 0; i < n_q; ++i) {
    const std::ptrdiff_t p = static_cast<std::ptrdiff_t>(i + n_kv) -
                             static_cast<std::ptrdiff_t>(n_q);
    for (std::size_t j = 0; j < n_kv; ++j) {
      const std::ptrdiff_t jj = static_cast<std::ptrdiff_t>(j);
      bool visible = true;
      if (o.causal && jj > p) visible = false;
      if (o.window_left >= 0 && jj < p - o.window_left) visible = false;
      if (o.window_right >= 0 && jj > p + o.window_right) visible = false;
      if (!o.mask.empty() && !o.mask.row(b, h, i)[j]) visible = false;
      double dot = 0;
      const float* qi = q.row(b, h, i);
      const KV* kj = k.row(b, h_kv, j);
      for (std::size_t c = 0; c < d; ++c) {
        double kc;
        if constexpr (std::is_same_v<KV, float>) {
          kc = kj[c];
        } else {
          kc = to_float(kj[c]);
        }
        dot += static_cast<double>(qi[c]) * kc;
      }
      double s = static_cast<double>(scale) * dot;
      if (o.softcap > 0) s = o.softcap * std::tanh(s / o.softcap);
      if (!o.bias.empty()) s += o.bias.row(b, h, i)[j];
      head->scores[i * n_kv + j] = s;
      head->visible[i * n_kv + j] = visible;
    }
  }
}

std::string describe(const AttentionArgs& args, const Input& q, const Input& k,
                     const Input& v, const Input& mask, const Input& bias,
                     const AttentionOptions& o, float scale) {
  const std::size_t n_q = q.rows(), n_kv = k.rows();
  std::string out =
      "attention: q " + q.text() + ", k " + k.text() + ", v " + v.text() +
      ": n_q = " + std::to_string(n_q) + (n_q == 1 ? " query" : " queries") +
      ", n_kv = " + std::to_string(n_kv) + (n_kv == 1 ? " key" : " keys") +
      ", d = " + std::to_string(q.cols()) +
      ", d_v = " + std::to_string(v.cols()) + "\n";
  if (q.rank() == 4) {
    out += "batch = " + std::to_string(q.batch()) +
           ", heads = " + std::to_string(q.heads()) +
           ", k/v heads = " + std::to_string(k.heads());
    const std::size_t g = q.heads() / k.heads();
    if (g > 1) {
      out += " (grouped-query: query head h uses k/v head h / " +
             std::to_string(g) + ")";
    }
    out += "\n";
  }
  if (k.array.dtype == NpyDtype::kFloat16 ||
      v.array.dtype == NpyDtype::kFloat16) {
    out += "float16 keys/values are widened exactly to float32\n";
  }
  out +=
      "scale = " + format_number(scale, kShortest) +
      (args.scale ? " (--scale)"
                  : " = 1/sqrt(" + std::to_string(q.cols()) + ") in float32") +
      "\n";
  const std::ptrdiff_t shift =
      static_cast<std::ptrdiff_t>(n_kv) - static_cast<std::ptrdiff_t>(n_q);
  const auto position = [&](std::ptrdiff_t extra) {
    const std::ptrdiff_t total = shift + extra;
    if (total == 0) return std::string("i");
    return "i " + std::string(total < 0 ? "- " : "+ ") +
           std::to_string(total < 0 ? -total : total);
  };
  if (o.causal || o.window_left >= 0 || o.window_right >= 0) {
    out += "positions: query i is at key position " + position(0) +
           " (i + n_kv - n_q: the last query sees the last key)\n";
  }
  if (o.causal) {
    out += "causal: query i sees key j only if j <= " + position(0) + "\n";
  }
  if (o.window_left >= 0 || o.window_right >= 0) {
    out += "window: query i sees key j only if";
    if (o.window_left >= 0) out += " j >= " + position(-o.window_left);
    if (o.window_left >= 0 && o.window_right >= 0) out += " and";
    if (o.window_right >= 0) out += " j <= " + position(o.window_right);
    out += "\n";
  }
  if (mask.present()) {
    out += "mask " + mask.text() + ": key j is masked where it is False\n";
  }
  if (bias.present()) {
    out += "bias " + bias.text() + ": added to the scores (-inf masks)\n";
  }
  std::string s = "scale * (q_i · k_j)";
  if (o.softcap > 0) {
    const std::string c = format_number(o.softcap, kShortest);
    out += "softcap C = " + c + ": each scaled score x becomes C tanh(x / C)\n";
    s = c + " tanh(" + s + " / " + c + ")";
  }
  if (bias.present()) s += " + bias_ij";
  out += "\ns_ij = " + s + "   (computed here in float64)\n";
  out +=
      "w_ij = exp(s_ij - m_i) / sum_j exp(s_ij - m_i), m_i = max_j s_ij "
      "over the keys query i sees   (softdot::attention_weights)\n";
  out += "o_i  = sum_j w_ij v_j   (softdot::attention)\n";
  return out;
}

template <class KV>
int compute(const AttentionArgs& args, const Input& q, const Input& k,
            const Input& v, const Input& mask, const Input& bias,
            AttentionOptions options) {
  const std::vector<float> q_values = floats_of(q.array);
  std::vector<KV> k_values, v_values;
  if constexpr (std::is_same_v<KV, float>) {
    k_values = floats_of(k.array);
    v_values = floats_of(v.array);
  } else {
    k_values = halves_of(k.array);
    v_values = halves_of(v.array);
  }
  const std::size_t batch = q.batch(), heads = q.heads(), n_q = q.rows();
  const std::size_t d_v = v.cols();
  const TensorView<const float> qv(q_values.data(), batch, heads, n_q,
                                   q.cols());
  const TensorView<const KV> kv(k_values.data(), batch, k.heads(), k.rows(),
                                k.cols());
  const TensorView<const KV> vv(v_values.data(), batch, v.heads(), v.rows(),
                                d_v);

  std::unique_ptr<bool[]> mask_flags;
  std::vector<float> bias_values;
  if (mask.present()) {
    mask_flags = bools_of(mask.array);
    options.mask = scores_view<bool>(mask_flags.get(), mask, q);
  }
  if (bias.present()) {
    bias_values = floats_of(bias.array);
    options.bias = scores_view<float>(bias_values.data(), bias, q);
  }

  std::vector<float> out(batch * heads * n_q * d_v);
  std::vector<float> lse(batch * heads * n_q);
  const TensorView<float> ov(out.data(), batch, heads, n_q, d_v);
  std::vector<float> weights;
  try {
    softdot::attention(qv, kv, vv, ov, options,
                       args.lse ? lse.data() : nullptr);
    if (args.explain) {
      weights.resize(std::max<std::size_t>(batch * heads * n_q * k.rows(), 1));
      softdot::attention_weights(
          qv, kv,
          TensorView<float>(weights.data(), batch, heads, n_q, k.rows()),
          options);
    }
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }

  std::string out_bytes, lse_bytes;
  if (q.rank() == 4) {
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
    // The scale the library uses: --scale or 1/sqrt(d), rounded to float.
    const float scale =
        static_cast<float>(std::isnan(options.scale)
                               ? 1.0 / std::sqrt(static_cast<double>(q.cols()))
                               : options.scale);
    std::vector<AttentionHeadExplain> explained;
    const std::size_t n_kv = k.rows();
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t h = 0; h < heads; ++h) {
        AttentionHeadExplain head;
        if (q.rank() == 4) {
          head.title = "batch " + std::to_string(b) + ", head " +
                       std::to_string(h) + " (k/v head " +
                       std::to_string(h / (heads / k.heads())) + ")";
        }
        head.n_q = n_q;
        head.n_kv = n_kv;
        head.d_v = d_v;
        explain_scores(qv, kv, options, scale, b, h, &head);
        const std::size_t bh = b * heads + h;
        head.weights.assign(
            weights.begin() + static_cast<std::ptrdiff_t>(bh * n_q * n_kv),
            weights.begin() +
                static_cast<std::ptrdiff_t>((bh + 1) * n_q * n_kv));
        head.output.assign(
            out.begin() + static_cast<std::ptrdiff_t>(bh * n_q * d_v),
            out.begin() + static_cast<std::ptrdiff_t>((bh + 1) * n_q * d_v));
        explained.push_back(std::move(head));
      }
    }
    explanation =
        explain_attention(describe(args, q, k, v, mask, bias, options, scale),
                          explained, kExplainDigits);
  }

  // -o, then --lse; if --lse fails, a new -o file is removed again.
  std::vector<std::pair<std::string, std::string>> files;
  if (args.output) files.emplace_back(*args.output, out_bytes);
  if (args.lse) files.emplace_back(*args.lse, lse_bytes);
  write_files_all_or_none(files);
  if (args.explain) print(explanation);
  return 0;
}

}  // namespace

int run_attention(const AttentionArgs& args) {
  // Check every option before reading any input.
  AttentionOptions options;
  if (args.scale) options.scale = parse_positive(args.scale, "--scale", false);
  if (args.softcap) {
    options.softcap =
        static_cast<float>(parse_positive(args.softcap, "--softcap", true));
  }
  options.causal = args.causal;
  options.window_left = parse_window(args.window_left, "--window-left");
  options.window_right = parse_window(args.window_right, "--window-right");
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
  int from_stdin = 0;
  for (const std::optional<std::string>& path :
       {std::optional<std::string>(args.q), std::optional<std::string>(args.k),
        std::optional<std::string>(args.v), args.mask, args.bias})
    from_stdin += path && *path == "-";
  if (from_stdin > 1) {
    throw CliError("only one input can be read from standard input ('-')");
  }

  static constexpr NpyDtype kF32[] = {NpyDtype::kFloat32};
  static constexpr NpyDtype kKV[] = {NpyDtype::kFloat32, NpyDtype::kFloat16};
  static constexpr NpyDtype kBool[] = {NpyDtype::kBool};
  const Input q =
      read_input("--q", args.q, kF32, "[n_q x d]", "[batch x heads x n_q x d]");
  const Input k = read_input("--k", args.k, kKV, "[n_kv x d]",
                             "[batch x kv_heads x n_kv x d]");
  const Input v = read_input("--v", args.v, kKV, "[n_kv x d_v]",
                             "[batch x kv_heads x n_kv x d_v]");
  check_qkv(q, k, v);
  Input mask, bias;
  if (args.mask) {
    mask = read_input("--mask", *args.mask, kBool, "[n_q x n_kv]",
                      "[batch x heads x n_q x n_kv]");
    check_scores_shaped(mask, q, k);
  }
  if (args.bias) {
    bias = read_input("--bias", *args.bias, kF32, "[n_q x n_kv]",
                      "[batch x heads x n_q x n_kv]");
    check_scores_shaped(bias, q, k);
  }
  if (args.explain) {
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

  // Float16 keys and values go to the library as they are; with one of k
  // and v float16 and the other float32, the float16 one is widened
  // (exactly) to float32.
  if (k.array.dtype == NpyDtype::kFloat16 &&
      v.array.dtype == NpyDtype::kFloat16) {
    return compute<Float16>(args, q, k, v, mask, bias, options);
  }
  return compute<float>(args, q, k, v, mask, bias, options);
}

}  // namespace softdot::cli
