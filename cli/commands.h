// softdot command: the subcommands. Each returns the exit status and throws
// CliError for bad input (main prints it).
#ifndef SOFTDOT_CLI_COMMANDS_H_
#define SOFTDOT_CLI_COMMANDS_H_

#include <optional>
#include <string>
#include <vector>

namespace softdot::cli {

struct DotArgs {
  std::vector<std::string> vectors;  // exactly two positional arguments
  bool json = false;
  bool explain = false;
};

struct SoftmaxArgs {
  std::vector<std::string> scores;  // positional arguments (may be empty)
  std::optional<std::string> digits;
  std::optional<std::string> temperature;
  std::optional<std::string> mask;
  std::optional<std::string> rows;
  std::optional<std::string> output;
  bool log = false;
  bool json = false;
  bool explain = false;
  bool fast = false;  // Precision::kFast
};

struct AttentionArgs {
  std::string q, k, v;  // required .npy files
  std::optional<std::string> mask;
  std::optional<std::string> bias;
  std::optional<std::string> k_scales;  // float32 scales of int8 --k
  std::optional<std::string> v_scales;  // float32 scales of int8 --v
  std::optional<std::string> kv;        // "int8": quantise float K and V
  // A paged cache: k and v are pages [pages, page_size, kv_heads, d]
  // (kv_layout "NHD", the default) or [pages, kv_heads, page_size, d]
  // ("HND"), with an int32 block table [batch, blocks_per_seq] and lengths
  // [batch].
  std::optional<std::string> block_table;
  std::optional<std::string> seq_lens;
  std::optional<std::string> kv_layout;
  // A ragged batch over the paged cache: int32 [batch + 1] row starts, q
  // then [T, heads, d] (the sequences' rows one after another); a draft
  // tree (int32, one parent per query row).
  std::optional<std::string> query_start_loc;
  std::optional<std::string> draft_parents;
  std::optional<std::string> alibi_slopes;  // float32 [heads]
  bool batch_invariant = false;
  std::optional<std::string> scale;
  std::optional<std::string> window_left;
  std::optional<std::string> window_right;
  std::optional<std::string> softcap;
  std::optional<std::string> lse;
  std::optional<std::string> output;
  bool causal = false;
  bool explain = false;
  // --ring: one sequence over the ranks of mpirun (softdot::mpi).
  bool ring = false;
  bool deterministic = false;
  std::optional<std::string> layout;  // "zigzag" (default) or "contiguous"
};

struct CrossEntropyArgs {
  std::string logits, targets;  // required .npy files
  std::optional<std::string> ignore_index;
  std::optional<std::string> label_smoothing;
  std::optional<std::string> reduction;
  std::optional<std::string> output;  // per-row losses
  std::optional<std::string> grad;    // the gradient
  bool ring = false;                  // columns split across MPI ranks
  bool deterministic = false;  // --ring: bits independent of the rank count
};

int run_dot(const DotArgs& args);
int run_cross_entropy(const CrossEntropyArgs& args);
int run_softmax(const SoftmaxArgs& args);
int run_attention(const AttentionArgs& args);
int run_demo();

// Writes to stdout; CliError when stdout cannot be written.
void print(const std::string& text);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_COMMANDS_H_
