// `worker zero`: ZeRO stage 1 against stage 0 on this rank (tests/distributed/zero_worker.cpp).
#pragma once

#include <cstdint>

/// Runs the matrix; prints one line per failed case; returns the number that failed.
int run_zero_matrix(int64_t rank, int64_t world);
