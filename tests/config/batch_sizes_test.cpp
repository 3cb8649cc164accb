// SEMANTICS section 2: every row of the batch-size table, and its errors.
#include <stepwise/config.h>
#include <stepwise/errors.h>

#include <gtest/gtest.h>

#include "support/error_of.h"

namespace stepwise {
namespace {

struct Row {
  const char* name;
  const char* json;
  int64_t world;
  BatchSizes expected;
};

void PrintTo(const Row& row, std::ostream* os) { *os << row.name; }

class BatchSizeTable : public ::testing::TestWithParam<Row> {};

TEST_P(BatchSizeTable, ResolvesTheMissingValues) {
  const auto& row = GetParam();
  const auto sizes = Config::from_string(row.json).resolve_batch_sizes(row.world);
  EXPECT_EQ(sizes.train_batch_size, row.expected.train_batch_size);
  EXPECT_EQ(sizes.micro_batch, row.expected.micro_batch);
  EXPECT_EQ(sizes.gradient_accumulation_steps, row.expected.gradient_accumulation_steps);
  EXPECT_EQ(sizes.world_size, row.world);
}

INSTANTIATE_TEST_SUITE_P(
    Semantics, BatchSizeTable,
    ::testing::Values(
        Row{"AllThree",
            R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 4})",
            2,
            {32, 4, 4, 2}},
        Row{"TbMbs",
            R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})",
            2,
            {32, 4, 4, 2}},
        Row{"TbGas",
            R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})",
            2,
            {32, 4, 4, 2}},
        Row{"MbsGas",
            R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})",
            2,
            {32, 4, 4, 2}},
        Row{"TbOnly", R"({"train_batch_size": 32})", 2, {32, 16, 1, 2}},
        Row{"MbsOnly", R"({"train_micro_batch_size_per_gpu": 4})", 2, {8, 4, 1, 2}},
        Row{"TbMbsWorld1",
            R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2})",
            1,
            {8, 2, 4, 1}}),
    [](const auto& info) { return std::string(info.param.name); });

std::string sizes_error_of(const std::string& json, int64_t world = 1) {
  return testing::error_of<ConfigError>(
      [&] { Config::from_string(json).resolve_batch_sizes(world); });
}

TEST(BatchSizes, ProductsThatOverflowInt64AreConfigErrors) {
  EXPECT_EQ(sizes_error_of(R"({"train_micro_batch_size_per_gpu": 4611686018427387904,
                         "gradient_accumulation_steps": 4})"),
            "batch sizes too large: 4611686018427387904 * 4 overflows a 64-bit integer; check "
            "train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps");
}

TEST(BatchSizes, NeitherTbNorMbsIsAnError) {
  EXPECT_EQ(sizes_error_of(R"({"gradient_accumulation_steps": 4})"),
            "neither train_batch_size nor train_micro_batch_size_per_gpu is set; set at least "
            "one of them");
}

TEST(BatchSizes, InconsistentTripleNamesAllValues) {
  EXPECT_EQ(sizes_error_of(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                         "gradient_accumulation_steps": 4})",
                           2),
            "inconsistent batch sizes: train_batch_size (30) must equal "
            "train_micro_batch_size_per_gpu (4) * gradient_accumulation_steps (4) * world size "
            "(2); change one of the values so the product matches");
}

TEST(BatchSizes, DivisionThatDoesNotGoEvenlyIsAnErrorNotAFloor) {
  // DeepSpeed floors 10 / (4 * 1) to 2 and then fails an assertion.
  EXPECT_EQ(sizes_error_of(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})"),
            "inconsistent batch sizes: train_batch_size (10) must equal "
            "train_micro_batch_size_per_gpu (4) * gradient_accumulation_steps (2) * world size "
            "(1) after dividing; make train_batch_size a multiple of the other two times the "
            "world size");
}

TEST(BatchSizes, TooSmallToDivideIsAnError) {
  EXPECT_EQ(sizes_error_of(R"({"train_batch_size": 2, "gradient_accumulation_steps": 4})"),
            "inconsistent batch sizes: train_batch_size (2) must equal "
            "train_micro_batch_size_per_gpu (0) * gradient_accumulation_steps (4) * world size "
            "(1) after dividing; make train_batch_size a multiple of the other two times the "
            "world size");
}

TEST(BatchSizes, NonPositiveValuesAreErrors) {
  EXPECT_EQ(sizes_error_of(R"({"train_batch_size": 0})"),
            "train_batch_size must be a positive integer, got 0");
  EXPECT_EQ(sizes_error_of(R"({"train_micro_batch_size_per_gpu": -2})"),
            "train_micro_batch_size_per_gpu must be a positive integer, got -2");
  EXPECT_EQ(sizes_error_of(R"({"train_batch_size": 8, "gradient_accumulation_steps": 0})"),
            "gradient_accumulation_steps must be a positive integer, got 0");
}

}  // namespace
}  // namespace stepwise
