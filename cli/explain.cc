// softdot command: explanations (see explain.h). The attention one shows
// what the library computed (attention_scores, attention_weights,
// attention); nothing here recomputes a score or a key's visibility.
#include "explain.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "format.h"
#include "softdot/dot.h"
#include "softdot/softmax.h"

namespace softdot::cli {
namespace {

constexpr int kBarWidth = 40;

// Fixed notation for table cells, scientific once a value has more than 9
// integer digits (exp(700) would otherwise fill a line).
std::string cell(double value, int digits) {
  if (std::isfinite(value) && std::fabs(value) >= 1e9) {
    char buffer[64];
    const auto r = std::to_chars(buffer, buffer + sizeof buffer, value,
                                 std::chars_format::scientific, digits);
    return std::string(buffer, r.ptr);
  }
  return format_number(value, digits);
}

// A factor inside a product: negative numbers in parentheses.
std::string factor(double value) {
  std::string s = format_number(value, kShortest);
  if (!(value < 0 || std::signbit(value))) return s;
  std::string out = "(";
  out += s;
  out += ')';
  return out;
}

std::string list(std::span<const double> values, int digits) {
  // Appended piecewise: "[" + std::string&& trips GCC 12's -Wrestrict.
  std::string out = "[";
  out += join_numbers(values, digits, ", ");
  out += ']';
  return out;
}

// Characters on screen of a UTF-8 string (every byte but continuation
// bytes).
std::size_t display_width(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Right-aligns (left-aligns for the last column) the cells of a table.
std::string render(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (std::size_t c = 0; c < row.size(); ++c)
      width[c] = std::max(width[c], display_width(row[c]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (c != 0) line += "  ";
      if (c + 1 == row.size() && c + 1 == width.size()) {
        line += row[c];  // the bar: no padding
      } else {
        line.append(width[c] - display_width(row[c]), ' ');
        line += row[c];
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string weight_bar(double weight) {
  if (!(weight >= 0)) return "";
  const double clamped = weight > 1 ? 1 : weight;
  return std::string(static_cast<std::size_t>(std::lround(clamped * kBarWidth)),
                     '#');
}

std::string explain_dot(std::span<const double> x, std::span<const double> y,
                        std::string_view x_name, std::string_view y_name) {
  std::string products, terms;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double term = x[i] * y[i];
    if (i != 0) {
      products += " + ";
      terms += std::signbit(term) && !std::isnan(term) ? " - " : " + ";
    }
    products += factor(x[i]) + "·" + factor(y[i]);
    terms += format_number(
        i != 0 && std::signbit(term) && !std::isnan(term) ? -term : term,
        kShortest);
  }
  const std::string head = std::string(x_name) + " · " + std::string(y_name);
  const std::string indent(display_width(head), ' ');
  std::string out = head + " = " + products + "\n";
  out += indent + " = " + terms + "\n";
  out += indent + " = " + format_number(softdot::dot(x, y), kShortest) + "\n";
  return out;
}

namespace {

// What explain_softmax shows, computed once: the scores as the softmax sees
// them, their max and softdot's weights.
struct SoftmaxWork {
  std::span<const double> scores;
  std::span<const bool> mask;
  double temperature = 1.0;
  bool scaled = false;  // temperature != 1
  bool log = false;
  int digits = 0;
  std::string x_name;  // "score" or "score/T"
  // masked -> -inf, else score * (1/T), scaled the way the library scales
  // them.
  std::vector<double> x;
  double m = -std::numeric_limits<double>::infinity();  // max of x, no NaN
  bool any_nan = false;
  std::vector<std::string> masked_numbers;  // "3": 1-based
  std::vector<double> weights, log_weights;
  double weight_sum = 0;

  bool masked(std::size_t i) const { return !mask.empty() && !mask[i]; }
  // "score_i" or "score_i/T" in formulas.
  std::string x_of(const char* index) const {
    return "score_" + std::string(index) + (scaled ? "/T" : "");
  }
};

SoftmaxWork softmax_work(std::span<const double> scores,
                         std::span<const bool> mask, double temperature,
                         bool log, int digits) {
  const std::size_t n = scores.size();
  SoftmaxWork w;
  w.scores = scores;
  w.mask = mask;
  w.temperature = temperature;
  w.scaled = temperature != 1.0;
  w.log = log;
  w.digits = digits;
  w.x_name = w.scaled ? "score/T" : "score";
  const double inv_t = 1.0 / temperature;
  w.x.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool masked = w.masked(i);
    if (masked) w.masked_numbers.push_back(std::to_string(i + 1));
    w.x[i] = masked ? -std::numeric_limits<double>::infinity()
                    : (w.scaled ? scores[i] * inv_t : scores[i]);
    if (std::isnan(w.x[i]))
      w.any_nan = true;
    else if (w.x[i] > w.m)
      w.m = w.x[i];
  }
  SoftmaxOptions options;
  options.temperature = temperature;
  options.mask = mask;
  w.weights.resize(n);
  softdot::softmax(scores, w.weights, options);
  if (log) {
    w.log_weights.resize(n);
    softdot::log_softmax(scores, w.log_weights, options);
  }
  for (double v : w.weights) w.weight_sum += v;
  return w;
}

// The scores, the temperature and the masked scores.
std::string softmax_intro(const SoftmaxWork& w) {
  const std::size_t n = w.scores.size();
  std::string out = "softmax of " + std::to_string(n) +
                    (n == 1 ? " score: " : " scores: ") +
                    list(w.scores, kShortest) + "\n";
  if (w.scaled) {
    out += "temperature T = " + format_number(w.temperature, kShortest) +
           (w.temperature > 1 ? " (T > 1 flattens the weights)"
                              : " (T < 1 sharpens the weights)") +
           ": the scores are divided by T first\n";
  }
  if (!w.masked_numbers.empty()) {
    out += "masked out (count as -inf, weight 0): score";
    out += w.masked_numbers.size() == 1 ? " " : "s ";
    for (std::size_t i = 0; i < w.masked_numbers.size(); ++i)
      out += (i ? ", " : "") + w.masked_numbers[i];
    out += "\n";
  }
  out += "\n";
  return out;
}

// Special rows (a NaN, every score -inf, or a +inf score): the
// special-value contract (README, "Special values";
// include/softdot/softmax.h), then the weights.
std::string softmax_special(const SoftmaxWork& w) {
  const std::size_t n = w.scores.size();
  std::string out;
  if (w.any_nan) {
    out +=
        "A score is NaN, so every weight is NaN: softdot never hides a "
        "NaN.\n\n";
  } else if (w.m < 0) {
    out +=
        "Every score is -inf (masked out), so there is nothing to "
        "share: softdot\ngives every weight exactly 0, never NaN";
    out += w.log ? ", and every log weight -inf.\n\n" : ".\n\n";
  } else {
    std::size_t k = 0;
    for (double v : w.x) k += v == w.m;
    out += std::to_string(k) + (k == 1 ? " score is" : " scores are") +
           " +inf: each +inf score gets 1/" + std::to_string(k) +
           " of the weight and the\nothers get 0, the limit as those "
           "scores grow.\n\n";
  }
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"i", "score", "weight"};
  if (w.log) header.push_back("log weight");
  header.push_back("");
  table.push_back(header);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::string> row = {std::to_string(i + 1),
                                    format_number(w.scores[i], kShortest),
                                    cell(w.weights[i], w.digits)};
    if (w.log) row.push_back(cell(w.log_weights[i], w.digits));
    row.push_back(weight_bar(w.weights[i]));
    table.push_back(row);
  }
  return out + render(table);
}

// The formula as written, with the naive exp(score), and where it goes
// wrong.
std::string softmax_naive(const SoftmaxWork& w) {
  const std::size_t n = w.scores.size();
  const int digits = w.digits;
  std::vector<double> naive(n), naive_weights(n);
  double naive_sum = 0, rounded_sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    naive[i] = std::exp(w.x[i]);
    naive_sum += naive[i];
    // The sum of the values as printed, as one adds them by hand.
    rounded_sum += std::stod(format_number(naive[i], digits));
  }
  for (std::size_t i = 0; i < n; ++i) naive_weights[i] = naive[i] / naive_sum;
  const bool naive_works = std::isfinite(naive_sum) && naive_sum > 0;
  std::string out = "weight_i = exp(" + w.x_of("i") + ") / sum_j exp(" +
                    w.x_of("j") + ")\n\n";
  std::string exp_line = "exp:    " + list(naive, digits);
  std::string weight_line =
      "weight: " + list(naive_works ? w.weights : naive_weights, digits);
  const std::size_t pad = std::max(exp_line.size(), weight_line.size()) + 4;
  exp_line.append(pad - exp_line.size(), ' ');
  weight_line.append(pad - weight_line.size(), ' ');
  out += exp_line + "sum = ";
  if (naive_works &&
      format_number(rounded_sum, digits) != format_number(naive_sum, digits)) {
    out += format_number(rounded_sum, digits) +
           " (adding the rounded values; unrounded " +
           format_number(naive_sum, digits + 2) + ")\n";
  } else {
    out += cell(naive_sum, digits) + "\n";
  }
  if (naive_works) {
    out +=
        weight_line + "sums to " + format_number(w.weight_sum, digits) + "\n";
  } else if (std::isinf(naive_sum)) {
    std::size_t overflowed = 0;
    for (double v : naive) overflowed += std::isinf(v);
    out += weight_line + "wrong: exp() overflowed to inf for " +
           std::to_string(overflowed) + " of " + std::to_string(n) +
           ", and inf / inf = nan\n";
  } else {
    out += weight_line + "wrong: exp() underflowed to 0 for every " + w.x_name +
           ", and 0 / 0 = nan\n";
  }
  return out;
}

// The stable form that softdot computes: exp(x - m), as a table.
std::string softmax_stable(const SoftmaxWork& w) {
  const std::size_t n = w.scores.size();
  const int digits = w.digits;
  const std::string& x_name = w.x_name;
  std::vector<double> shifted(n);
  double shifted_sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    shifted[i] = std::exp(w.x[i] - w.m);
    shifted_sum += shifted[i];
  }
  std::string out = "\nSubtract the max before exponentiating: m = " +
                    format_number(w.m, kShortest) + ".\n";
  out +=
      "exp() of a large score overflows (exp(710) is already inf in "
      "float64), but\nexp(" +
      x_name +
      " - m) is at most 1. The weights "
      "do not change, because the same\nfactor exp(-m) appears on top and "
      "bottom. This is what softdot computes:\n\n";
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"i", "score"};
  if (w.scaled) header.push_back(x_name);
  header.push_back(x_name + " - m");
  header.push_back("exp(" + x_name + " - m)");
  header.push_back("weight");
  if (w.log) header.push_back("log weight");
  header.push_back("");
  table.push_back(header);
  for (std::size_t i = 0; i < n; ++i) {
    const bool masked = w.masked(i);
    std::vector<std::string> row = {std::to_string(i + 1),
                                    format_number(w.scores[i], kShortest)};
    if (w.scaled) row.push_back(masked ? "masked" : cell(w.x[i], digits));
    row.push_back(masked ? "masked" : cell(w.x[i] - w.m, digits));
    row.push_back(cell(shifted[i], digits));
    row.push_back(cell(w.weights[i], digits));
    if (w.log) row.push_back(cell(w.log_weights[i], digits));
    row.push_back(weight_bar(w.weights[i]));
    table.push_back(row);
  }
  std::vector<std::string> sum_row = {"sum", ""};
  if (w.scaled) sum_row.push_back("");
  sum_row.push_back("");
  sum_row.push_back(cell(shifted_sum, digits));
  sum_row.push_back(cell(w.weight_sum, digits));
  table.push_back(sum_row);
  out += render(table) + "\n";
  out += "weight_i = exp(" + w.x_of("i") + " - m) / " +
         cell(shifted_sum, digits) + "\n";
  if (w.log) {
    out += "log weight_i = (" + w.x_of("i") + " - m) - log(" +
           cell(shifted_sum, digits) + ") = (" + w.x_of("i") + " - m) - " +
           cell(std::log(shifted_sum), digits) + "\n";
  }
  return out;
}

}  // namespace

std::string explain_softmax(std::span<const double> scores,
                            std::span<const bool> mask, double temperature,
                            bool log, int digits) {
  const SoftmaxWork w = softmax_work(scores, mask, temperature, log, digits);
  std::string out = softmax_intro(w);
  if (w.any_nan || !std::isfinite(w.m)) return out + softmax_special(w);
  return out + softmax_naive(w) + softmax_stable(w);
}

namespace {

// "q3": a row or column label (appended piecewise, see list()).
std::string label(char letter, std::size_t index) {
  std::string out(1, letter);
  out += std::to_string(index);
  return out;
}

// What was computed: shapes, the scale, positions, causal, window, mask,
// bias, soft-cap, and the formulas with the function behind each.
std::string describe(const AttentionInputs& in, const AttentionPlan& plan,
                     bool scale_given) {
  const AttentionOptions& o = plan.request().options;
  const float scale = plan.scale();
  const Input &q = in.q, &k = in.k, &v = in.v, &mask = in.mask, &bias = in.bias;
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
  if (in.quantize && in.kv_format != KvStorage::kInt8) {
    const bool e4m3 = in.kv_format == KvStorage::kFloat8E4M3;
    out += std::string("--kv ") + (e4m3 ? "float8_e4m3fn" : "float8_e5m2") +
           ": each key/value row is quantised to fp8 values and one scale "
           "(max |x| / " +
           (e4m3 ? "448" : "57344") + "); the attention reads scale * value\n";
  } else if (in.quantize) {
    out +=
        "--kv int8: each key/value row is quantised to int8 values and one "
        "scale (max |x| / 127); the attention reads scale * value\n";
  } else if (k.is_int8()) {
    out +=
        "int8 keys/values: each row is its scale (--k-scales, --v-scales) "
        "times its int8 values, rounded to float32\n";
  }
  out +=
      "scale = " + format_number(scale, kShortest) +
      (scale_given ? " (--scale)"
                   : " = 1/sqrt(" + std::to_string(q.cols()) + ") in float32") +
      "\n";
  // Query i sits at key position i + shift (the plan's: n_kv - n_q).
  const auto shift = static_cast<std::ptrdiff_t>(plan.data().q_shift);
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
  out += "\ns_ij = " + s +
         "   (softdot::attention_scores; -inf, shown as masked, where query i "
         "does not see key j)\n";
  out +=
      "w_ij = exp(s_ij - m_i) / sum_j exp(s_ij - m_i), m_i = max_j s_ij "
      "over the keys query i sees   (softdot::attention_weights)\n";
  out += "o_i  = sum_j w_ij v_j   (softdot::attention)\n";
  return out;
}

}  // namespace

std::string attention_heat_cell(double weight) {
  if (std::isnan(weight)) return "??";
  if (weight <= 0) return "··";
  if (weight <= 0.25) return "░░";
  if (weight <= 0.5) return "▒▒";
  if (weight <= 0.75) return "▓▓";
  return "██";
}

std::string explain_attention(std::string_view preamble,
                              std::span<const AttentionHeadExplain> heads,
                              int digits) {
  std::string out(preamble);
  for (const AttentionHeadExplain& head : heads) {
    const std::size_t n_q = head.n_q, n_kv = head.n_kv, d_v = head.d_v;
    out += "\n";
    if (!head.title.empty()) {
      out += "== ";
      out += head.title;
      out += " ==\n\n";
    }
    const auto q_label = [](std::size_t i) { return label('q', i); };

    std::vector<std::vector<std::string>> scores;
    std::vector<std::string> header = {""};
    for (std::size_t j = 0; j < n_kv; ++j) header.push_back(label('k', j));
    header.push_back("");  // keeps the last column right-aligned
    scores.push_back(header);
    for (std::size_t i = 0; i < n_q; ++i) {
      std::vector<std::string> row = {q_label(i)};
      for (std::size_t j = 0; j < n_kv; ++j) {
        const std::size_t ij = i * n_kv + j;
        const float s = head.scores[ij];
        row.push_back(s == -std::numeric_limits<float>::infinity()
                          ? "masked"
                          : cell(s, digits));
      }
      scores.push_back(row);
    }
    out += "scores s_ij:\n";
    out += render(scores);
    out += "\n";

    std::vector<std::vector<std::string>> weights;
    header.back() = "sum";
    header.push_back("");
    weights.push_back(header);
    bool any_nan = false;
    for (std::size_t i = 0; i < n_q; ++i) {
      std::vector<std::string> row = {q_label(i)};
      double sum = 0;
      for (std::size_t j = 0; j < n_kv; ++j) {
        const double w = head.weights[i * n_kv + j];
        any_nan = any_nan || std::isnan(w);
        sum += w;
        row.push_back(cell(w, digits));
      }
      row.push_back(cell(sum, digits));
      weights.push_back(row);
    }
    out +=
        "weights w_ij (each row sums to 1; 0 where every key is "
        "masked):\n";
    out += render(weights);
    out += "\n";

    out +=
        "heat map of the weights (·· 0, ░░ <= 0.25, ▒▒ <= 0.5, ▓▓ <= 0.75, "
        "██ > 0.75";
    out += any_nan ? ", ?? nan):\n" : "):\n";
    const std::size_t label_width = q_label(n_q == 0 ? 0 : n_q - 1).size();
    std::string key_line(label_width + 2, ' ');
    for (std::size_t j = 0; j < n_kv; ++j) {
      key_line += static_cast<char>('0' + j % 10);
      key_line += ' ';
    }
    while (!key_line.empty() && key_line.back() == ' ') key_line.pop_back();
    out += key_line + (n_kv > 10 ? "   (key index mod 10)\n" : "\n");
    for (std::size_t i = 0; i < n_q; ++i) {
      std::string line = q_label(i);
      line.append(label_width - line.size() + 2, ' ');
      for (std::size_t j = 0; j < n_kv; ++j)
        line += attention_heat_cell(head.weights[i * n_kv + j]);
      out += line + "\n";
    }
    out += "\n";

    std::vector<std::vector<std::string>> output;
    std::vector<std::string> out_header = {""};
    for (std::size_t c = 0; c < d_v; ++c)
      out_header.push_back(std::to_string(c));
    out_header.push_back("");
    output.push_back(out_header);
    for (std::size_t i = 0; i < n_q; ++i) {
      std::vector<std::string> row = {label('o', i)};
      for (std::size_t c = 0; c < d_v; ++c)
        row.push_back(cell(head.output[i * d_v + c], digits));
      output.push_back(row);
    }
    out += "output o_i = sum_j w_ij v_j (columns 0 to ";
    out += std::to_string(d_v - 1);
    out += "):\n";
    out += render(output);
  }
  return out;
}

std::string explain_attention_call(const AttentionInputs& in,
                                   const AttentionPlan& plan, bool scale_given,
                                   std::span<const float> scores,
                                   std::span<const float> weights,
                                   std::span<const float> out, int digits) {
  const std::size_t batch = in.q.batch(), heads = in.q.heads();
  const std::size_t n_q = in.q.rows(), n_kv = in.k.rows(), d_v = in.v.cols();
  const auto slice = [](std::span<const float> all, std::size_t index,
                        std::size_t size) {
    const auto part = all.subspan(index * size, size);
    return std::vector<float>(part.begin(), part.end());
  };
  std::vector<AttentionHeadExplain> explained;
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      AttentionHeadExplain head;
      if (in.q.rank() == 4) {
        head.title = "batch " + std::to_string(b) + ", head " +
                     std::to_string(h) + " (k/v head " +
                     std::to_string(h / (heads / in.k.heads())) + ")";
      }
      head.n_q = n_q;
      head.n_kv = n_kv;
      head.d_v = d_v;
      const std::size_t bh = b * heads + h;
      head.scores = slice(scores, bh, n_q * n_kv);
      head.weights = slice(weights, bh, n_q * n_kv);
      head.output = slice(out, bh, n_q * d_v);
      explained.push_back(std::move(head));
    }
  }
  return explain_attention(describe(in, plan, scale_given), explained, digits);
}

}  // namespace softdot::cli
