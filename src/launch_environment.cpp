#include "launch_environment.h"

#include <c10/util/StringUtil.h>

#include <cstdlib>
#include <optional>

namespace stepwise::distributed::detail {

namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int64_t> env_int(const char* name) {
  auto text = env(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const long long value = std::strtoll(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0') {
    throw DistributedError(
        c10::str("environment variable ", name, "=\"", *text,
                 "\" is not an integer; unset it or start the program with tools/launch -n N, "
                 "which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"));
  }
  return value;
}

}  // namespace

std::string LaunchEnvironment::master() const { return c10::str(master_addr, ":", master_port); }

LaunchEnvironment resolve_launch_environment(const InitOptions& options) {
  LaunchEnvironment out;
  out.world_size = options.world_size() ? *options.world_size() : launched_world_size();
  if (out.world_size < 1) {
    throw DistributedError(c10::str("world size must be >= 1, got ", out.world_size,
                                    " (from WORLD_SIZE or InitOptions::world_size)"));
  }
  out.rank = options.rank() ? *options.rank() : env_int("RANK").value_or(0);
  if (out.rank < 0 || out.rank >= out.world_size) {
    throw DistributedError(c10::str("rank ", out.rank, " is out of range for world size ",
                                    out.world_size, "; use a rank in 0..", out.world_size - 1,
                                    " (RANK or InitOptions::rank)"));
  }
  out.local_rank =
      options.local_rank() ? *options.local_rank() : env_int("LOCAL_RANK").value_or(out.rank);
  out.master_addr = options.master_addr().value_or(env("MASTER_ADDR").value_or(out.master_addr));
  out.master_port = options.master_port() ? *options.master_port()
                                          : env_int("MASTER_PORT").value_or(out.master_port);
  if (out.master_port < 1 || out.master_port > 65535) {
    throw DistributedError(c10::str("master port ", out.master_port,
                                    " is not a TCP port; use 1..65535 (MASTER_PORT or "
                                    "InitOptions::master_port)"));
  }
  return out;
}

int64_t launched_world_size() { return env_int("WORLD_SIZE").value_or(1); }

}  // namespace stepwise::distributed::detail
