// stepwise (internal): where this process stands in a launch (torchrun's or tools/launch's
// environment variables, or InitOptions), checked before anything connects.
#pragma once

#include <stepwise/distributed.h>

#include <cstdint>
#include <string>

namespace stepwise::distributed::detail {

/// This process's place in the launch: each field from InitOptions where set, else from
/// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, else the single-process
/// default (rank 0 of 1, 127.0.0.1:29500).
struct LaunchEnvironment {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  /// "addr:port", as the messages name rank 0's rendezvous store.
  std::string master() const;
};

/// Resolves and checks it: DistributedError naming the value, where it came from and the
/// fix (a world size below 1, a rank outside it, a port outside 1..65535, a variable that
/// is not an integer).
LaunchEnvironment resolve_launch_environment(const InitOptions& options);

/// WORLD_SIZE as the launcher set it (1 when unset), checked as above.
int64_t launched_world_size();

}  // namespace stepwise::distributed::detail
