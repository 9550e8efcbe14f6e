// softdot command: the inputs of `softdot attention`: reading the .npy
// arrays, checking their shapes against each other, and assembling them
// into the library's TensorViews.
#ifndef SOFTDOT_CLI_ATTENTION_INPUTS_H_
#define SOFTDOT_CLI_ATTENTION_INPUTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "commands.h"
#include "io_npy.h"
#include "softdot/attention.h"

namespace softdot::cli {

// "[3 x 4]": a shape in messages.
std::string shape_text(const std::vector<std::size_t>& shape);

// The order of a paged cache's axes in the user's files (--kv-layout):
// NHD [pages, page_size, kv_heads, d] (the default, as vLLM's caches and
// softdot.paged_attention's default) or HND [pages, kv_heads, page_size, d].
enum class KvLayout { kNHD, kHND };

// One input array and the option that named it.
struct Input {
  std::string option;  // "--q"; "" when the option was not given
  std::string file;    // the path, or "<stdin>"
  NpyArray array;
  // Pages (or their scales) in the NHD layout: array.shape is [pages,
  // page_size, kv_heads, d], which dim() reads as [pages, kv_heads,
  // page_size, d]. Messages show array.shape, the user's order.
  bool nhd = false;

  bool present() const { return !option.empty(); }
  // "q" for messages like "(q is [3 x 4], k is [7 x 5])".
  std::string letter() const { return option.substr(2); }
  bool is_int8() const { return array.dtype == NpyDtype::kInt8; }
  std::string text() const { return shape_text(array.shape); }
  std::size_t rank() const { return array.shape.size(); }
  // [batch, heads, rows, cols]; a 2-D array is [1, 1, rows, cols]. Pages:
  // [pages, kv_heads, page_size, d] whatever the layout.
  std::size_t dim(int axis) const {
    if (rank() == 4) {
      if (nhd && (axis == 1 || axis == 2)) axis = 3 - axis;
      return array.shape[static_cast<std::size_t>(axis)];
    }
    return axis < 2 ? 1 : array.shape[static_cast<std::size_t>(axis - 2)];
  }
  std::size_t batch() const { return dim(0); }
  std::size_t heads() const { return dim(1); }
  std::size_t rows() const { return dim(2); }
  std::size_t cols() const { return dim(3); }
};

// "(q is [3 x 4], k is [7 x 5])".
std::string both(const Input& a, const Input& b);

// How keys and values go to the library (kv_storage below).
enum class KvStorage { kFloat, kFloat16, kInt8, kFloat8E4M3, kFloat8E5M2 };

// The arrays of one attention call, read and checked against each other:
// q, k, v all 2-D or all 4-D with matching batch, heads (a multiple for
// GQA), d and n_kv; mask and bias (when given) [n_q x n_kv] or
// [batch x heads x n_q x n_kv] with 1 allowed for batch, heads and n_q.
// int8 k and v come with their scales, [n_kv x 1] or
// [batch x kv_heads x n_kv x 1] float32, each finite and >= 0.
// With a paged cache (block_table and seq_lens present): q 4-D, k and v
// pages [pages x page_size x kv_heads x d] (--kv-layout NHD, the default)
// or [pages x kv_heads x page_size x d] (HND), int8 scales in the same
// layout with a last axis of 1, block_table int32 [batch x blocks_per_seq]
// with each entry a sequence reads a page of k, seq_lens int32 [batch]
// each >= 0 and within its blocks_per_seq pages, and mask and bias with at
// least max(seq_lens) columns.
struct AttentionInputs {
  Input q, k, v, mask, bias, k_scales, v_scales, block_table, seq_lens;
  // --query-start-loc (q, read as [T, heads, d], is held as [1, heads, T,
  // d]: q_packed), --draft-parents, --alibi-slopes.
  Input query_start_loc, draft_parents, alibi_slopes;
  bool q_packed = false;
  // Sequences of the paged cache: q's batch, or seq_lens' length when
  // ragged.
  std::size_t sequences() const {
    return q_packed ? seq_lens.array.shape[0] : q.batch();
  }
  bool quantize = false;  // --kv: float k and v quantised (to kv_format)
  // --kv's format: kInt8, kFloat8E4M3 or kFloat8E5M2 (quantize only).
  KvStorage kv_format = KvStorage::kInt8;
  KvLayout layout = KvLayout::kNHD;  // of paged k, v and their scales
  bool paged() const { return block_table.present(); }
};

// The format --kv quantises into (kInt8, kFloat8E4M3 or kFloat8E5M2), or
// kFloat without --kv; CliError for any other value.
KvStorage quantize_kv_option(const AttentionArgs& args);

// --kv-layout NHD or HND (NHD without the option); CliError for any other
// value, or for --kv-layout without --block-table.
KvLayout kv_layout_option(const AttentionArgs& args);

// Reads args' q, k, v (and mask, bias, k_scales, v_scales) and checks their
// dtypes, shapes and scales; CliError naming the option, the file and both
// shapes otherwise (or when more than one of them is read from standard
// input).
AttentionInputs read_attention_inputs(const AttentionArgs& args);

// How the library takes the keys and values of an attention call.

// int8 for int8 keys and values (read with their scales) and for --kv int8
// (quantised); fp8 for --kv float8_e4m3fn / float8_e5m2 (quantised per row
// as write_kv quantises into fp8 pages with scales); float16 when both are
// float16, which go to the library as they are; float32 otherwise (with one of
// k and v float16 and the other float32, the float16 one is widened, exactly,
// to float32).
KvStorage kv_storage(const AttentionInputs& in);

// The library's views of the inputs, with the values they point into. KV is
// float, Float16 or std::int8_t (the keys and values as the library takes
// them; int8 with its scales). Not copyable: the views point into the
// members.
template <class KV>
struct AttentionTensors {
  std::vector<float> q_values;
  std::vector<KV> k_values, v_values;
  std::vector<float> k_scale_values, v_scale_values;  // int8 and fp8 only
  std::unique_ptr<bool[]> mask_flags;
  std::vector<float> bias_values;
  std::vector<std::int32_t> table_values, len_values, qsl_values, parent_values;
  std::vector<float> alibi_values;
  TensorView<const float> q;
  TensorView<const KV> k, v;
  TensorView<const float> k_scales, v_scales;  // int8 and fp8 only
  PagedKVTable table;                          // paged inputs only

  AttentionTensors() = default;
  AttentionTensors(const AttentionTensors&) = delete;
  AttentionTensors& operator=(const AttentionTensors&) = delete;
};

// Fills `t` from `in` and points options->mask and options->bias at the
// mask and bias (as [batch, heads, n_q, n_kv] views with stride 0 on the
// broadcast dimensions). With KV = float, float16 keys or values are widened
// exactly to float32. With KV = std::int8_t, int8 keys and values are taken
// with their scales, or (in.quantize) float32/float16 ones are quantised
// by softdot::quantize_kv (CliError naming the option and the file for inf
// or NaN).
template <class KV>
void assemble_tensors(const AttentionInputs& in, AttentionTensors<KV>* t,
                      AttentionOptions* options);

// The keys and values as the library's attention functions take them: the
// views, or for int8 the views with their scales.
template <class KV>
auto key_arg(const AttentionTensors<KV>& t) {
  if constexpr (std::is_same_v<KV, std::int8_t>) {
    return Int8KV{t.k, t.k_scales};
  } else if constexpr (std::is_same_v<KV, Float8E4M3> ||
                       std::is_same_v<KV, Float8E5M2>) {
    return Float8KV<KV>{t.k, t.k_scales};
  } else {
    return t.k;
  }
}
template <class KV>
auto value_arg(const AttentionTensors<KV>& t) {
  if constexpr (std::is_same_v<KV, std::int8_t>) {
    return Int8KV{t.v, t.v_scales};
  } else if constexpr (std::is_same_v<KV, Float8E4M3> ||
                       std::is_same_v<KV, Float8E5M2>) {
    return Float8KV<KV>{t.v, t.v_scales};
  } else {
    return t.v;
  }
}

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_ATTENTION_INPUTS_H_
