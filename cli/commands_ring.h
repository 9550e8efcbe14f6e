// softdot command: `softdot attention ... --ring` (cli/commands_ring.cc,
// built when softdot::mpi is).
#ifndef SOFTDOT_CLI_COMMANDS_RING_H_
#define SOFTDOT_CLI_COMMANDS_RING_H_

#include <functional>

#include "attention_inputs.h"
#include "commands.h"
#include "softdot/attention.h"

namespace softdot::cli {

using ReadInputs = std::function<AttentionInputs()>;

// Runs under mpirun: rank 0 reads the inputs with `read`, scatters them,
// every rank runs softdot::mpi::ring_attention, rank 0 writes the files.
// CliError on rank 0 and CliQuietError on the others for an error.
int run_attention_ring(const AttentionArgs& args,
                       const AttentionOptions& options, const ReadInputs& read);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_COMMANDS_RING_H_
