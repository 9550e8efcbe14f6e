// softdot command: entry point. Defines the subcommands and options with
// CLI11, runs one, and turns every error into one line on stderr and exit
// status 2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "arrange_args.h"
#include "commands.h"
#include "error.h"
#include "softdot/simd.h"
#include "softdot/version.h"

namespace {

using softdot::cli::CliError;
using softdot::cli::kExitError;

void print_error(const std::string& message) {
  std::string line = "softdot: error: " + message;
  // One line, whatever the message holds.
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  while (!line.empty() && line.back() == ' ') line.pop_back();
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.c_str());
}

// The subcommands and their options, each filling its Args (which must
// outlive the parse).
CLI::App* add_dot(CLI::App& app, softdot::cli::DotArgs& dot) {
  CLI::App* dot_cmd = app.add_subcommand(
      "dot", "Dot product of two vectors, e.g. softdot dot 1,2,0 2,1,3 -> 4");
  dot_cmd
      ->add_option("vectors", dot.vectors,
                   "The two vectors X Y, each a comma separated list")
      ->type_name("X Y");
  dot_cmd->add_flag("--json", dot.json, "Print {\"dot\":VALUE}");
  dot_cmd->add_flag("--explain", dot.explain,
                    "Show the products and the terms, like the seed text");
  return dot_cmd;
}

CLI::App* add_softmax(CLI::App& app, softdot::cli::SoftmaxArgs& sm) {
  CLI::App* sm_cmd = app.add_subcommand(
      "softmax",
      "Softmax (or log-softmax) of scores from the arguments, standard input, "
      "or one per row of a CSV or .npy file");
  sm_cmd
      ->add_option("scores", sm.scores,
                   "Scores (negative numbers, inf, -inf, nan allowed); "
                   "none: read them from standard input")
      ->type_name("SCORE...");
  sm_cmd
      ->add_option("--digits", sm.digits,
                   "Decimals in the output (0-20). Default: 3 for text, "
                   "shortest round-trip for --json and .csv output")
      ->type_name("N");
  sm_cmd
      ->add_option("-t,--temperature", sm.temperature,
                   "Multiply the scores by 1/T rounded to the input's "
                   "precision first (T finite, > 0; default 1): "
                   "softmax(x * fl(1/T)), which is softmax(x / T) when 1/T is "
                   "exact (T a power of two)")
      ->type_name("T");
  sm_cmd
      ->add_option("--mask", sm.mask,
                   "Flags 1 (keep) / 0 (mask out, as -inf), one per score; "
                   "with --rows one per column or one per value")
      ->type_name("FLAGS");
  sm_cmd
      ->add_option("--rows", sm.rows,
                   "Matrix file: CSV (one row per line) or 2-D .npy "
                   "(float32/float64); '-' reads standard input. One "
                   "softmax per row")
      ->type_name("FILE");
  sm_cmd
      ->add_option("-o,--output", sm.output,
                   "Write the result to FILE.npy (input dtype, shape "
                   "[rows, cols]) or FILE.csv instead of standard output")
      ->type_name("FILE");
  sm_cmd->add_flag("--log", sm.log, "Log-softmax instead of softmax");
  sm_cmd->add_flag("--fast", sm.fast,
                   "Precision::kFast: each weight within 2.5 ulp instead of "
                   "1, faster for rows that fit in cache");
  sm_cmd->add_flag("--json", sm.json,
                   "Print {\"weights\":[...]} ({\"log_weights\":...} with "
                   "--log; a list of rows with --rows)");
  sm_cmd->add_flag("--explain", sm.explain,
                   "Explain each step: exp(score - max), the sum, the weights "
                   "and a bar per weight");
  return sm_cmd;
}

// `softdot attention`: the arrays (q, k, v, the int8 scales, --kv) and the
// output file.
void add_attention_arrays(CLI::App* cmd, softdot::cli::AttentionArgs& attn) {
  cmd->add_option("--q", attn.q,
                  "Queries, float32 .npy [n_q, d] or [batch, heads, n_q, d]")
      ->type_name("FILE")
      ->required();
  cmd->add_option("--k", attn.k,
                  "Keys, float32, float16 or int8 (with --k-scales) .npy "
                  "[n_kv, d] or [batch, kv_heads, n_kv, d]; heads must "
                  "divide q's heads (GQA)")
      ->type_name("FILE")
      ->required();
  cmd->add_option("--v", attn.v,
                  "Values, float32, float16 or int8 (with --v-scales) .npy "
                  "[n_kv, d_v] or [batch, kv_heads, n_kv, d_v]")
      ->type_name("FILE")
      ->required();
  cmd->add_option("--k-scales", attn.k_scales,
                  "The scales of int8 keys, float32 .npy [n_kv, 1] or "
                  "[batch, kv_heads, n_kv, 1], one per row: key row j is "
                  "scale_j * k_j (softdot::Int8KV, as quantize_kv makes "
                  "them); for pages, the pages' shape with a last axis of "
                  "1 (--kv-layout)")
      ->type_name("FILE");
  cmd->add_option("--v-scales", attn.v_scales,
                  "The scales of int8 values, as --k-scales")
      ->type_name("FILE");
  cmd->add_option("--kv", attn.kv,
                  "int8: quantise float32/float16 keys and values to int8 "
                  "with one scale per row (softdot::quantize_kv) before "
                  "the attention; float8_e4m3fn, float8_e5m2: to fp8 with "
                  "one scale per row (max |x| / 448 or 57344, as "
                  "softdot::write_kv writes fp8 pages)")
      ->type_name("FORMAT");
  cmd->add_option("-o,--output", attn.output,
                  "Write the output to FILE.npy: float32 [n_q, d_v] or "
                  "[batch, heads, n_q, d_v]. Required unless --explain")
      ->type_name("FILE");
}

// `softdot attention`: which keys each query sees (--causal, --mask, --bias)
// and --ring with its options.
void add_attention_masking(CLI::App* cmd, softdot::cli::AttentionArgs& attn) {
  cmd->add_flag("--causal", attn.causal,
                "Causal mask: query i sees key j only if "
                "j <= i + n_kv - n_q (the last query sees the last key)");
  cmd->add_flag(
      "--ring", attn.ring,
      "Run under mpirun -np P: one sequence (n_q = n_kv) split over the P "
      "processes, ring attention (softdot::mpi); rank 0 reads the inputs "
      "and writes the output");
  cmd->add_flag("--deterministic", attn.deterministic,
                "With --ring: the same bits for every number of "
                "processes (fixed blocks of 64 keys, merged by a fixed tree)");
  cmd->add_option("--layout", attn.layout,
                  "With --ring: zigzag (default; causal load balance) or "
                  "contiguous")
      ->type_name("LAYOUT");
  cmd->add_option("--mask", attn.mask,
                  "Bool .npy, True = attend (as PyTorch's "
                  "scaled_dot_product_attention): [n_q, n_kv] or "
                  "[batch, heads, n_q, n_kv], 1 allowed for batch, heads "
                  "and n_q (broadcast)")
      ->type_name("FILE");
  cmd->add_option("--bias", attn.bias,
                  "Float32 .npy added to the scores, shapes as --mask; "
                  "-inf masks a key")
      ->type_name("FILE");
}

// `softdot attention`: the paged cache with its ragged and draft-tree forms,
// and --alibi-slopes and --batch-invariant among them.
void add_attention_paged(CLI::App* cmd, softdot::cli::AttentionArgs& attn) {
  cmd->add_option("--block-table", attn.block_table,
                  "A paged K/V cache: int32 .npy [batch, blocks_per_seq] of "
                  "page indices; --k and --v are then pages [pages, "
                  "page_size, kv_heads, d] (--kv-layout) and q is 4-D. "
                  "Sequence b's key t lies in page block_table[b, t / "
                  "page_size], row t % page_size. Needs --seq-lens")
      ->type_name("FILE");
  cmd->add_option("--seq-lens", attn.seq_lens,
                  "With --block-table: int32 .npy [batch], the keys of each "
                  "sequence (its n_kv)")
      ->type_name("FILE");
  cmd->add_option("--query-start-loc", attn.query_start_loc,
                  "With --block-table: a ragged batch (vLLM's "
                  "query_start_loc): int32 .npy [batch + 1]; q is then "
                  "[T, heads, d], sequence b's query rows are rows "
                  "query_start_loc[b] .. query_start_loc[b + 1] - 1, and -o "
                  "is [T, heads, d_v], --lse [heads, T]")
      ->type_name("FILE");
  cmd->add_option("--draft-parents", attn.draft_parents,
                  "With --block-table: a draft tree, int32 .npy with one "
                  "entry per query row ([T] or [batch, n_q]): the row of "
                  "its parent within its sequence, or -1 after the cached "
                  "prefix; a sequence's n_q rows are its last n_q keys")
      ->type_name("FILE");
  cmd->add_option("--alibi-slopes", attn.alibi_slopes,
                  "ALiBi: float32 .npy [heads], one slope per query head; "
                  "the score gains slope (pos_j - pos_i)")
      ->type_name("FILE");
  cmd->add_flag(
      "--batch-invariant", attn.batch_invariant,
      "Every row in the decode form, keys in 512-key chunks at fixed key "
      "indices: a token's bits do not depend on its batch, its chunk or "
      "its form");
  cmd->add_option("--kv-layout", attn.kv_layout,
                  "With --block-table: the axes of the pages of --k and --v "
                  "(and of their scales, last axis 1): NHD [pages, "
                  "page_size, kv_heads, d] (default; vLLM's, and "
                  "softdot.paged_attention's default) or HND [pages, "
                  "kv_heads, page_size, d]")
      ->type_name("LAYOUT");
}

// `softdot attention`: the scores' options (--scale, the window, --softcap),
// --lse and --explain.
void add_attention_scores(CLI::App* cmd, softdot::cli::AttentionArgs& attn) {
  cmd->add_option("--scale", attn.scale,
                  "Multiply q . k by S (finite, > 0); default 1/sqrt(d)")
      ->type_name("S");
  cmd->add_option("--window-left", attn.window_left,
                  "Sliding window: query i sees key j only if "
                  "j >= i + n_kv - n_q - N")
      ->type_name("N");
  cmd->add_option("--window-right", attn.window_right,
                  "Sliding window: query i sees key j only if "
                  "j <= i + n_kv - n_q + N")
      ->type_name("N");
  cmd->add_option("--softcap", attn.softcap,
                  "Soft-cap the scaled scores: s -> C tanh(s / C) "
                  "(finite, >= 0; 0 = off)")
      ->type_name("C");
  cmd->add_option("--lse", attn.lse,
                  "Also write log(sum_j exp(s_ij)) per query to FILE.npy: "
                  "float32 [n_q] or [batch, heads, n_q]; -inf for a fully "
                  "masked row")
      ->type_name("FILE");
  cmd->add_flag("--explain", attn.explain,
                "Print the scores, the weights (numbers and a heat map) "
                "and the output rows; small inputs only (n_q, n_kv, d_v "
                "<= 64, batch x heads <= 16)");
}

// `softdot attention` and its options, added in parts: --help lists the
// options in the order they are added, and the parts keep it.
CLI::App* add_attention(CLI::App& app, softdot::cli::AttentionArgs& attn) {
  CLI::App* attn_cmd = app.add_subcommand(
      "attention",
      "Scaled dot-product attention softmax(Q K^T * scale + bias) V of .npy "
      "files: 2-D [n x d] for one head, 4-D [batch, heads, n, d] for many");
  add_attention_arrays(attn_cmd, attn);
  add_attention_masking(attn_cmd, attn);
  add_attention_paged(attn_cmd, attn);
  add_attention_scores(attn_cmd, attn);
  return attn_cmd;
}

CLI::App* add_cross_entropy(CLI::App& app,
                            softdot::cli::CrossEntropyArgs& xent) {
  CLI::App* xent_cmd = app.add_subcommand(
      "cross-entropy",
      "Fused cross-entropy of rows of logits (.npy [rows, classes], float32 "
      "or float64) against class indices (.npy int64 or int32 [rows]); "
      "prints the reduced loss");
  xent_cmd->add_option("--logits", xent.logits, "Logits .npy [rows, classes]")
      ->type_name("FILE")
      ->required();
  xent_cmd
      ->add_option("--targets", xent.targets,
                   "Targets .npy [rows], int64 or int32 class indices")
      ->type_name("FILE")
      ->required();
  xent_cmd
      ->add_option("--ignore-index", xent.ignore_index,
                   "Rows with this target get loss 0 and are not counted "
                   "(default -100)")
      ->type_name("N");
  xent_cmd
      ->add_option("--label-smoothing", xent.label_smoothing,
                   "eps in [0, 1] over the whole vocabulary (default 0)")
      ->type_name("E");
  xent_cmd
      ->add_option("--reduction", xent.reduction,
                   "mean (default), sum or none (prints the sum)")
      ->type_name("R");
  xent_cmd
      ->add_option("-o,--output", xent.output,
                   "Write the per-row losses, .npy [rows] of the logits' dtype")
      ->type_name("FILE");
  xent_cmd
      ->add_option("--grad", xent.grad,
                   "Write the gradient of the printed loss, .npy [rows, "
                   "classes]")
      ->type_name("FILE");
  xent_cmd->add_flag(
      "--ring", xent.ring,
      "Under mpirun: split the classes (columns) across the ranks; rank 0 "
      "reads and writes the files (needs softdot built with MPI)");
  xent_cmd->add_flag("--deterministic", xent.deterministic,
                     "With --ring: the same bits for every number of ranks");
  return xent_cmd;
}

// "softdot attention --help" for an error in `softdot attention ...`;
// "softdot --help" before a command is named.
std::string help_pointer(const CLI::App& app) {
  const auto parsed = app.get_subcommands();  // the command named, if any
  if (parsed.empty()) return "softdot --help";
  return "softdot " + parsed.front()->get_name() + " --help";
}

// Defines the command line, then parses it and runs the subcommand.
int run(int argc, char** argv) {
  CLI::App app{
      "softdot: dot products, numerically stable softmax and attention.\n"
      "Numbers may be negative, inf, -inf or nan; lists are separated by "
      "commas and/or spaces.",
      "softdot"};
  app.set_version_flag("--version", [] {
    return std::string("softdot ") + softdot::version() +
           " (SIMD target: " + softdot::simd_target() + ")";
  });
  app.require_subcommand(1);
  app.footer(
      "Each command's options: softdot COMMAND --help (e.g. softdot "
      "attention --help).\nErrors: one line on stderr, exit status 2. See "
      "docs/cli.md.");

  softdot::cli::DotArgs dot;
  softdot::cli::SoftmaxArgs sm;
  softdot::cli::AttentionArgs attn;
  softdot::cli::CrossEntropyArgs xent;
  const CLI::App* dot_cmd = add_dot(app, dot);
  const CLI::App* sm_cmd = add_softmax(app, sm);
  const CLI::App* attn_cmd = add_attention(app, attn);
  const CLI::App* xent_cmd = add_cross_entropy(app, xent);
  const CLI::App* demo_cmd =
      app.add_subcommand("demo", "Run the worked examples of the seed text");

  try {
    const std::vector<std::string> arranged =
        softdot::cli::arrange_arguments(app, argc, argv);
    std::vector<const char*> pointers;
    for (const std::string& s : arranged) pointers.push_back(s.c_str());
    try {
      app.parse(static_cast<int>(pointers.size()), pointers.data());
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
      print_error(std::string(e.what()) + " (see " + help_pointer(app) + ")");
      return kExitError;
    }
    int status = 0;
    if (dot_cmd->parsed()) status = softdot::cli::run_dot(dot);
    if (sm_cmd->parsed()) status = softdot::cli::run_softmax(sm);
    if (attn_cmd->parsed()) status = softdot::cli::run_attention(attn);
    if (xent_cmd->parsed()) status = softdot::cli::run_cross_entropy(xent);
    if (demo_cmd->parsed()) status = softdot::cli::run_demo();
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      throw CliError("cannot write to standard output");
    }
    return status;
  } catch (const softdot::cli::CliQuietError&) {
    return kExitError;
  } catch (const CliError& e) {
    print_error(e.what());
    return kExitError;
  } catch (const std::exception& e) {
    print_error(e.what());
    return kExitError;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // run() turns the errors of parsing and running into one line and status 2;
  // this catches what defining the options may throw (CLI11's
  // ConstructionError for a bad option definition, std::bad_alloc), which
  // would otherwise end the program in std::terminate.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    print_error(e.what());
    return kExitError;
  }
}
