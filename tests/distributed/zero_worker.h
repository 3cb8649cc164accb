// `worker zero`: ZeRO stage 1 against stage 0 on this rank (tests/distributed/zero_worker.cpp).
#pragma once

#include <cstdint>
#include <string>

/// Runs the matrix; prints one line per failed case; returns the number that failed.
int run_zero_matrix(int64_t rank, int64_t world);

/// Saves and resumes under stage 1 (NOTE: [ZeRO resume test]) in `dir`; returns the
/// number of failures.
int run_zero_checkpoint(const std::string& dir, int64_t rank, int64_t world);

/// W = 1: loads the stage-1 checkpoints of run_zero_checkpoint and saves them again; W = 2:
/// resumes those and compares (NOTE: [resharding]).
int run_zero_reshard(const std::string& dir, int64_t rank, int64_t world);
