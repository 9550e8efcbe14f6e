// softdot command: the parts of `softdot cross-entropy` shared by the
// one-process form and the MPI form (--ring).
#ifndef SOFTDOT_CLI_COMMANDS_CROSS_ENTROPY_H_
#define SOFTDOT_CLI_COMMANDS_CROSS_ENTROPY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"
#include "softdot/cross_entropy.h"

namespace softdot::cli {

// --ignore-index, --label-smoothing and --reduction; CliError when bad.
CrossEntropyOptions parse_cross_entropy_options(const CrossEntropyArgs& args);

// The targets file: int64 or int32 .npy of shape (rows,).
std::vector<std::int64_t> read_targets(const std::string& path,
                                       std::size_t rows);

// The --ring form (commands_cross_entropy_ring.cc, built with MPI only).
int run_cross_entropy_ring(const CrossEntropyArgs& args);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_COMMANDS_CROSS_ENTROPY_H_
