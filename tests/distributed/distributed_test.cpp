// Data parallel: W processes on 127.0.0.1 (the worker, tests/distributed/worker.cpp)
// against in-process W=1 runs and DeepSpeed's ws2 trace; tools/launch itself.
#include <stepwise/stepwise.h>

#include <gtest/gtest.h>

#include <filesystem>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "distributed/token_problem.h"
#include "gradient_reducer.h"  // internal: the reducer's counters
#include "support/error_of.h"
#include "support/free_port.h"
#include "support/reference_problem.h"
#include "support/remove_tree.h"

namespace stepwise {
namespace {

using stepwise::testing::free_port;

using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RankResult {
  int exit_code = -1;  // 128 + signal when killed; -1 when it outlived the deadline
  double seconds = 0;
  std::string output;
};

// Starts `world` workers (or only the ranks in `only`) with torchrun's
// variables and waits up to `limit`; stragglers are killed.
std::vector<RankResult> run_ranks(int world, const std::vector<std::string>& args,
                                  std::chrono::seconds limit, std::vector<int> only = {}) {
  if (only.empty()) {
    for (int r = 0; r < world; ++r) only.push_back(r);
  }
  const int port = free_port();
  const std::string dir = ::testing::TempDir();
  std::vector<pid_t> pids(world, -1);
  std::vector<RankResult> results(world);
  const auto start = Clock::now();
  for (int r : only) {
    const std::string log =
        dir + "/stepwise_rank_" + std::to_string(port) + "_" + std::to_string(r) + ".log";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!freopen(log.c_str(), "w", stdout) || ::dup2(::fileno(stdout), 2) < 0) _exit(126);
      std::vector<char*> argv{const_cast<char*>(STEPWISE_DIST_WORKER)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    pids[r] = pid;
    results[r].output = log;  // the path, until the rank ends
  }
  for (int r : only) {
    int status = 0;
    while (true) {
      const pid_t done = ::waitpid(pids[r], &status, WNOHANG);
      if (done == pids[r]) {
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (Clock::now() - start > limit) {
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    results[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
    results[r].output = read_file(results[r].output);
  }
  return results;
}

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(STEPWISE_DIST_WORKER, X_OK) != 0) {
      GTEST_SKIP() << "the worker " << STEPWISE_DIST_WORKER << " is not executable";
    }
    if (free_port() < 0) GTEST_SKIP() << "cannot bind a TCP socket on 127.0.0.1";
    ::unsetenv("WORLD_SIZE");  // the in-process runs are W = 1
  }
};

std::vector<float> weights_of(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::vector<float> train_in_process(int64_t mbs, int64_t gas, int64_t steps) {
  auto model = testing::reference_linear();
  auto engine = initialize(
      model, Config::from_json({{"train_micro_batch_size_per_gpu", mbs},
                                {"gradient_accumulation_steps", gas},
                                {"gradient_clipping", 0.5},
                                {"steps_per_print", 1000000000},
                                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}}}));
  for (int64_t t = 0; t < steps * gas; ++t) {
    auto [x, y] = testing::reference_samples(testing::reference_start(t, gas, mbs, 1, 0), mbs);
    engine.backward(torch::mse_loss(model->forward(x), y));
    engine.step();
  }
  EXPECT_EQ(engine.gradient_reducer().all_reduce_calls(), 0) << "W = 1 must not all-reduce";
  std::vector<float> out;
  for (const auto& p : model->parameters()) {
    auto c = p.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

TEST_F(DataParallel, TwoRanksMatchOneRankWithTheSameGlobalBatch) {
  const std::string out = ::testing::TempDir() + "/stepwise_dp_weights";
  auto ranks = run_ranks(2, {"train", "2", "2", "6", "1000", out}, std::chrono::seconds(120));
  double losses[2] = {0.0, 0.0};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
    const std::string key = "rank " + std::to_string(r) + ": window_loss ";
    const size_t at = ranks[r].output.find(key);
    ASSERT_NE(at, std::string::npos) << ranks[r].output;
    losses[r] = std::stod(ranks[r].output.substr(at + key.size()));
  }
  EXPECT_NE(ranks[0].output.find("(data parallel: 2 ranks over gloo)"), std::string::npos)
      << "the first progress line names the backend chosen for CPU parameters\n"
      << ranks[0].output;
  EXPECT_EQ(ranks[1].output.find("[stepwise] step="), std::string::npos)
      << "rank 0 alone prints the progress line\n"
      << ranks[1].output;
  // Its loss is the ranks' mean: one all-reduce at the print step.
  EXPECT_NE(losses[0], losses[1]) << "the ranks' data differ, so must their losses";
  std::ostringstream mean;
  mean << std::setprecision(6) << (losses[0] + losses[1]) / 2;
  EXPECT_NE(ranks[0].output.find("[stepwise] step=6 loss=" + mean.str() + " "), std::string::npos)
      << "the progress line's loss is the mean over the ranks (" << mean.str() << ")\n"
      << ranks[0].output;
  const std::string bytes0 = read_file(out + ".0");
  ASSERT_FALSE(bytes0.empty());
  EXPECT_EQ(bytes0, read_file(out + ".1")) << "ranks must end bit-identical";
  const auto w2 = weights_of(bytes0);
  for (auto [mbs, gas] : {std::pair<int64_t, int64_t>{8, 1}, {4, 2}}) {
    const auto w1 = train_in_process(mbs, gas, 6);
    ASSERT_EQ(w1.size(), w2.size());
    for (size_t i = 0; i < w1.size(); ++i) {
      EXPECT_NEAR(w2[i], w1[i], 1e-6) << "element " << i << " vs W=1 mbs " << mbs << " GAS " << gas;
    }
  }
}

TEST_F(DataParallel, ZeroStagesOneAndTwoAgainstStageZero) {
  // fp32, bf16 and fp16 (with overflows: skipped steps) at GAS 1, 2 and 4, a flushed window,
  // hand-set boundaries, the token-level loss, a client SGD, parameter groups and FusedAdamW,
  // overlap_comm on and off, a gradient_predivide_factor, all clipped: see
  // tests/distributed/zero_worker.cpp. Stage 1 is
  // stage 0 bit for bit;
  // stage 2 too with one micro-step per window, and within rounding with more (NOTE:
  // [stage 2 gradients]), with no gradient left on .grad between micro-steps.
  auto ranks = run_ranks(2, {"zero"}, std::chrono::seconds(240));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("stage 1 equals stage 0 bit for bit in 19 of 19 cases (114 "
                                   "boundaries; in fp16, 7 skipped for overflow and 17 applied)"),
              std::string::npos)
        << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("stage 2 equals stage 0 bit for bit in 4 cases of one "
                                   "micro-step per window, and within tolerance in 15"),
              std::string::npos)
        << ranks[r].output;
  }
}

TEST_F(DataParallel, ZeroCheckpointsResumeBitForBit) {
  // fp32 and fp16 at stages 1 and 2, saved inside a window and at a boundary (NOTE: [ZeRO
  // resume test]), resharded to stage 0 and back and across world sizes (NOTE:
  // [resharding]); a stage-2 window is not continued at stage 1.
  const std::string dir =
      ::testing::TempDir() + "/stepwise_zero_ckpt_" + std::to_string(::getpid());
  testing::remove_tree(dir);
  auto ranks = run_ranks(2, {"zero-checkpoint", dir}, std::chrono::seconds(240));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("ZeRO stages 1 and 2 resumed bit for bit from 8 "
                                   "checkpoints, resharded to stage 0 and back from 4, 0 failures"),
              std::string::npos)
        << ranks[r].output;
  }
  // NOTE: [resharding] across world sizes: 2 -> 1 (unsharded) -> 2, bit for bit.
  for (int world : {1, 2}) {
    auto reshard = run_ranks(world, {"zero-reshard", dir}, std::chrono::seconds(240));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(reshard[r].exit_code, 0) << reshard[r].output;
      EXPECT_NE(reshard[r].output.find(c10::str("rank ", r, " of ", world,
                                                ": resharded across world sizes, 0 failures")),
                std::string::npos)
          << reshard[r].output;
    }
  }
  // tools/zero-to-fp32 gathers the two ranks' fp16 masters into one fp32 state dict that
  // Python's torch.load reads: each value rounds to the saved fp16 weight, and they are the
  // masters (not all half-exact), not the weights.
  const std::string python = STEPWISE_TEST_PYTHON;
  if (std::system((python + " -c 'import torch' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import torch (Debian: python3-torch)";
  }
  const std::string out = dir + "/consolidated.pt";
  const std::string tool = std::string(STEPWISE_SOURCE_DIR) + "/tools/zero-to-fp32 " + dir + " ";
  ASSERT_EQ(std::system((tool + out + " --tag fp16_at8").c_str()), 0);
  const std::string check = python +
                            " -c \"import torch\n"
                            "out = torch.load('" +
                            out +
                            "')\n"
                            "m = torch.load('" +
                            dir +
                            "/fp16_at8/mp_rank_00_model_states.pt')['module']\n"
                            "assert set(out) == set(m) and len(m) == 6, sorted(out)\n"
                            "assert all(out[n].dtype == torch.float32 for n in out)\n"
                            "assert all(torch.equal(out[n].half(), m[n]) for n in m)\n"
                            "assert any(not torch.equal(out[n], m[n].float()) for n in m)\n\"";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  // A shard missing: the tool says which.
  std::filesystem::remove(dir + "/fp16_at8/zero_pp_rank_1_mp_rank_00_optim_states.pt");
  const std::string log = dir + "/tool.log";
  EXPECT_NE(std::system((tool + out + " --tag fp16_at8 2> " + log).c_str()), 0);
  EXPECT_NE(read_file(log).find("zero_pp_rank_1_mp_rank_00_optim_states.pt is missing"),
            std::string::npos)
      << read_file(log);
  testing::remove_tree(dir);
}

TEST_F(DataParallel, PrescaleAndPredivideAverageAsDeepSpeedDoes) {
  // NOTE: [predivide] With W = 2, dividing by 2 before the sum or after it is exact, as is
  // a predivide factor of 4 (1/4 before, 4/2 after): all three end bit-identical. A factor
  // of 3 rounds differently, and must still give the same mean.
  const auto train = [](const char* predivide, bool bucketed) {
    if (predivide == nullptr) {
      ::unsetenv("STEPWISE_WORKER_PREDIVIDE");
    } else {
      ::setenv("STEPWISE_WORKER_PREDIVIDE", predivide, 1);
    }
    const std::string out = ::testing::TempDir() + "/stepwise_dp_predivide";
    auto ranks = run_ranks(2, {"train", "2", "2", "4", bucketed ? "4" : "1000", out},
                           std::chrono::seconds(120));
    for (int r = 0; r < 2; ++r) EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
    const std::string bytes = read_file(out + ".0");
    EXPECT_EQ(bytes, read_file(out + ".1")) << "ranks must end bit-identical";
    return bytes;
  };
  for (const bool bucketed : {false, true}) {
    const std::string plain = train(nullptr, bucketed);
    ASSERT_FALSE(plain.empty());
    EXPECT_EQ(train("prescale", bucketed), plain) << "prescale_gradients, buckets " << bucketed;
    EXPECT_EQ(train("4", bucketed), plain) << "gradient_predivide_factor 4";
    const auto by_three = weights_of(train("3", bucketed));
    const auto expected = weights_of(plain);
    ASSERT_EQ(by_three.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(by_three[i], expected[i], 1e-6) << "gradient_predivide_factor 3, element " << i;
    }
  }
  ::unsetenv("STEPWISE_WORKER_PREDIVIDE");
}

TEST_F(DataParallel, AllReduceCallsPerStepEqualBucketsAndNoneOffTheBoundary) {
  // Linear(4, 1): weight (4 elements) and bias (1). Bucket 4: 2 buckets; 1000: 1. With
  // stepwise.overlap_comm (the default) every bucket's all-reduce starts during the
  // backward() that ends the window (the loss reaches every parameter); without, in step().
  for (const bool overlap : {true, false}) {
    ::setenv("STEPWISE_WORKER_OVERLAP_COMM", overlap ? "1" : "0", 1);
    for (const char* bucket : {"4", "1000"}) {
      const std::string out = ::testing::TempDir() + "/stepwise_dp_count";
      auto ranks = run_ranks(2, {"train", "2", "3", "2", bucket, out}, std::chrono::seconds(120));
      const int calls = std::string(bucket) == "4" ? 4 : 2;
      const std::string expected =
          c10::str(calls / 2, " buckets, ", calls, " all-reduce calls in 2 steps, ",
                   overlap ? calls : 0, " started during backward");
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
        EXPECT_NE(ranks[r].output.find(expected), std::string::npos)
            << "expected \"" << expected << "\"\n"
            << ranks[r].output;
      }
    }
  }
  ::unsetenv("STEPWISE_WORKER_OVERLAP_COMM");
}

struct CkptScaleImpl : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::linspace(0.2, 0.8, 4));
  torch::Tensor b = register_parameter("b", torch::full({1}, 0.1));
  torch::Tensor forward(const torch::Tensor& x) { return (x * w).sum(1) + b; }
};

Engine ckpt_engine(const std::shared_ptr<CkptScaleImpl>& model) {
  return initialize(model, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 4, "gradient_clipping": 0.5, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})"));
}

TEST_F(DataParallel, CheckpointsResumeBitForBitOnEveryRank) {
  // Each rank saves its own window file, rank 0 the shared state; fresh engines on both
  // ranks load and end bit-identical to the uninterrupted run, pending gradients included.
  char pattern[] = "/tmp/stepwise-dp-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  {
    // A W = 1 checkpoint inside a window (2 micro-batches pending), which the ranks refuse.
    auto model = std::make_shared<CkptScaleImpl>();
    auto engine = ckpt_engine(model);
    for (int t = 0; t < 6; ++t) {
      engine.backward((model->forward(torch::randn({2, 4})) - torch::randn({2})).pow(2).mean());
      engine.step();
    }
    engine.save_checkpoint(pattern, SaveOptions().tag("w1-mid"));
  }
  auto ranks = run_ranks(2, {"checkpoint", pattern}, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("checkpoint resume checked in 42 save/load cycles, 0 failures"),
              std::string::npos)
        << ranks[r].output;
  }
  EXPECT_TRUE(
      std::filesystem::exists(std::string(pattern) + "/fp16-sched-gas4-k6/window_rank_1.pt"));
  EXPECT_FALSE(std::filesystem::exists(std::string(pattern) + "/Fail-rank0"))
      << "a save refused by tag validation writes nothing";
  EXPECT_TRUE(std::filesystem::exists(std::string(pattern) + "/Warn-rank0/window_rank_1.pt"))
      << "with Warn, every rank saves under rank 0's tag";
  // One process (W = 1) loads the W = 2 checkpoint taken at a boundary, not the one
  // taken inside a window.
  auto model = std::make_shared<CkptScaleImpl>();
  auto engine = ckpt_engine(model);
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              engine.load_checkpoint(pattern, LoadOptions().tag("fp32-gas4-k6"));
            }).find("with world size 2 (now 1)"),
            std::string::npos);
  engine.load_checkpoint(pattern, LoadOptions().tag("fp32-gas4-k8"));
  EXPECT_EQ(engine.global_steps(), 2);
  EXPECT_EQ(engine.global_samples(), 32) << "the samples of 2 steps of 16 at W = 2";
  testing::remove_tree(pattern);
}

TEST_F(DataParallel, ARankKilledInsideASaveLeavesThePreviousCheckpoint) {
  char pattern[] = "/tmp/stepwise-dp-kill-save-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  auto ranks = run_ranks(2, {"kill-save", dir}, std::chrono::seconds(120));
  EXPECT_EQ(ranks[1].exit_code, 128 + SIGKILL) << ranks[1].output;
  EXPECT_EQ(ranks[0].exit_code, 0) << ranks[0].output;
  EXPECT_NE(ranks[0].output.find("rank 0 save failed: "), std::string::npos) << ranks[0].output;
  EXPECT_EQ(read_file(dir + "/latest"), "before\n");
  EXPECT_FALSE(std::filesystem::exists(dir + "/after"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/.after.partial"))
      << "rank 0 removes what the failed save wrote";
  torch::nn::Linear model(4096, 4096);
  auto engine = initialize(model, Config::from_string(R"({"train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": 2, "steps_per_print": 1000000,
      "optimizer": {"type": "Adam", "params": {"lr": 0.05}}})"));
  EXPECT_EQ(engine.load_checkpoint(dir).path, dir + "/before");
  testing::remove_tree(dir);
}

TEST_F(DataParallel, AnFp16OverflowOnOneRankSkipsTheStepOnEveryRank) {
  auto ranks = run_ranks(2, {"overflow"}, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("overflow on rank 1 skipped 1 step on this rank"),
              std::string::npos)
        << ranks[r].output;
  }
}

TEST_F(DataParallel, DeepSpeedWs2TracePerMicroStepAndRank) {
  // The recorded two-rank DeepSpeed run (stage 0), replayed at ZeRO stages 0, 1 and 2.
  for (const char* stage : {"0", "1", "2"}) {
    auto ranks = run_ranks(2, {"trace", "linear_adam_none_ws2_mbs2_gas2.txt", "cpu", stage},
                           std::chrono::seconds(120));
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r].exit_code, 0) << "stage " << stage << ": " << ranks[r].output;
      EXPECT_NE(ranks[r].output.find("12 micro-steps compared, 0 failures"), std::string::npos)
          << "stage " << stage << ": " << ranks[r].output;
    }
  }
}

// The CUDA path end to end: parameters on cuda:LOCAL_RANK make initialize choose NCCL,
// whose collectives take only CUDA tensors (the cross-rank checks included). Needs two
// GPUs and a CUDA LibTorch; docs/cuda.md lists what stays unverified until it runs.
TEST_F(DataParallel, TwoGpusOverNcclMatchTheTraceAndOneRank) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs 2 CUDA GPUs and a CUDA-enabled LibTorch; this machine has "
                 << (torch::cuda::is_available() ? torch::cuda::device_count() : 0)
                 << " usable GPU(s)";
  }
  auto trace = run_ranks(2, {"trace", "linear_adam_none_ws2_mbs2_gas2.txt", "cuda"},
                         std::chrono::seconds(300));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(trace[r].exit_code, 0) << trace[r].output;
    EXPECT_NE(trace[r].output.find("12 micro-steps compared, 0 failures"), std::string::npos)
        << trace[r].output;
  }
  const std::string out = ::testing::TempDir() + "/stepwise_dp_cuda_weights";
  auto ranks =
      run_ranks(2, {"train", "2", "2", "6", "1000", out, "cuda"}, std::chrono::seconds(300));
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
  const auto w2 = weights_of(read_file(out + ".0"));
  EXPECT_EQ(read_file(out + ".0"), read_file(out + ".1")) << "ranks must end bit-identical";
  const auto w1 = train_in_process(4, 2, 6);
  ASSERT_EQ(w1.size(), w2.size());
  for (size_t i = 0; i < w1.size(); ++i) EXPECT_NEAR(w2[i], w1[i], 1e-5) << "element " << i;
}

TEST_F(DataParallel, SurvivorOfAKilledRankExitsWithinTheTimeoutNamingIt) {
  auto ranks = run_ranks(2, {"kill"}, std::chrono::seconds(60));
  EXPECT_EQ(ranks[1].exit_code, 128 + SIGKILL);
  EXPECT_EQ(ranks[0].exit_code, 3) << ranks[0].output;
  EXPECT_LT(ranks[0].seconds, 30.0) << "collective timeout is 10 s";
  EXPECT_NE(ranks[0].output.find("failed on rank 0 of 2: rank 1 did not respond (exited, "
                                 "crashed or hangs); collective timeout 10000 ms"),
            std::string::npos)
      << ranks[0].output;
}

// The DistributedError that creating a context from `options` throws, or "no error".
std::string init_error(const distributed::InitOptions& options) {
  return testing::error_of<distributed::DistributedError>(
      [&] { distributed::Context context(options); });
}

TEST_F(DataParallel, RankThatNeverArrivesIsNamedAfterTheRendezvousTimeout) {
  const auto start = Clock::now();
  const std::string message = init_error(distributed::InitOptions()
                                             .rank(0)
                                             .world_size(2)
                                             .master_port(free_port())
                                             .timeout(std::chrono::milliseconds(1500)));
  EXPECT_NE(message.find("timed out after 1500 ms on rank 0 of 2: rank 1 never arrived; start "
                         "all WORLD_SIZE processes (tools/launch -n N does) or raise the timeout"),
            std::string::npos)
      << message;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
}

TEST_F(DataParallel, MissingRankZeroIsNamed) {
  const int port = free_port();
  const std::string message =
      init_error(distributed::InitOptions().rank(1).world_size(2).master_port(port).timeout(
          std::chrono::milliseconds(1500)));
  EXPECT_NE(message.find("stepwise: rank 1 of 2 could not reach rank 0's rendezvous store at "
                         "127.0.0.1:" +
                         std::to_string(port) + " within 1500 ms"),
            std::string::npos)
      << message;
}

TEST(DistributedOptions, BadValuesAreNamedWithTheFix) {
  EXPECT_EQ(init_error(distributed::InitOptions().rank(2).world_size(2)),
            "rank 2 is out of range for world size 2; use a rank in 0..1 (RANK or "
            "InitOptions::rank)");
  EXPECT_EQ(init_error(distributed::InitOptions().world_size(0)),
            "world size must be >= 1, got 0 (from WORLD_SIZE or InitOptions::world_size)");
  EXPECT_EQ(init_error(distributed::InitOptions().world_size(1).master_port(70000)),
            "master port 70000 is not a TCP port; use 1..65535 (MASTER_PORT or "
            "InitOptions::master_port)");
  ::setenv("WORLD_SIZE", "two", 1);
  EXPECT_EQ(init_error(distributed::InitOptions()),
            "environment variable WORLD_SIZE=\"two\" is not an integer; unset it or start the "
            "program with tools/launch -n N, which sets RANK, WORLD_SIZE, LOCAL_RANK, "
            "MASTER_ADDR and MASTER_PORT");
  ::unsetenv("WORLD_SIZE");
}

// Without NCCL compiled in (STEPWISE_HAS_NCCL, from CMake): the message says why. With it:
// a world of one on NCCL all-reduces a CUDA tensor (skipped, saying so, without a GPU).
TEST(DistributedOptions, NcclBackendRunsOrSaysWhyNot) {
  const auto options =
      distributed::InitOptions().world_size(1).rank(0).backend(distributed::Backend::kNccl);
  if (!STEPWISE_TEST_HAS_NCCL) {
    const std::string message = init_error(options);
    EXPECT_EQ(message.rfind("the NCCL backend was requested, but stepwise was built without ", 0),
              0u)
        << message;
    EXPECT_NE(message.find("; use Backend::kGloo, or rebuild with NCCL"), std::string::npos)
        << message;
    const bool why =
        message.find("built without CUDA (no CUDA-enabled LibTorch") != std::string::npos ||
        message.find("built without NCCL (nccl.h was not found") != std::string::npos;
    EXPECT_TRUE(why) << message;
    return;
  }
  if (!torch::cuda::is_available()) GTEST_SKIP() << "NCCL is compiled in, but there is no GPU";
  ::unsetenv("WORLD_SIZE");
  auto context = distributed::init(options);
  EXPECT_EQ(context->backend_name(), "nccl");
  auto t = torch::ones({3}, torch::kCUDA);
  context->all_reduce_sum(t, "a test tensor");
  EXPECT_TRUE(t.cpu().equal(torch::ones({3})));
  distributed::shutdown();
}

// docs/data-parallel.md: rank() and world_size() describe the joined group, so a launched
// process that asks before initialize() joins it is rank 0 of 1, whatever RANK says.
TEST(DistributedOptions, BeforeTheGroupIsJoinedEveryRankIsRankZeroOfOne) {
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "1", 1);
  EXPECT_FALSE(distributed::is_initialized());
  EXPECT_EQ(distributed::rank(), 0);
  EXPECT_EQ(distributed::world_size(), 1);
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("RANK");
}

TEST(DistributedOptions, WorldOfOneIsANoOpAndInitTwiceIsAnError) {
  ::unsetenv("WORLD_SIZE");
  EXPECT_FALSE(distributed::is_initialized());
  EXPECT_EQ(distributed::world_size(), 1);
  auto context = distributed::init(distributed::InitOptions().world_size(1).rank(0));
  EXPECT_EQ(context->backend_name(), "gloo");
  EXPECT_EQ(distributed::world_size(), 1);
  try {
    distributed::init();
    ADD_FAILURE() << "init twice did not throw";
  } catch (const distributed::DistributedError& e) {
    EXPECT_STREQ(e.what(),
                 "stepwise::distributed::init was called twice (this process is already rank 0 "
                 "of 1); call it once, before stepwise::initialize, or call shutdown() first");
  }
  auto t = torch::ones({3});
  context->all_reduce_sum(t, "a test tensor");
  EXPECT_TRUE(t.equal(torch::ones({3})));
  distributed::shutdown();
  EXPECT_FALSE(distributed::is_initialized());
}

TEST(DistributedOptions, ReducerBucketsAndBadBucketSize) {
  std::vector<torch::Tensor> params{torch::zeros({4}), torch::zeros({1}), torch::zeros({3})};
  EXPECT_EQ(distributed::BucketedReducer(nullptr, 4).num_buckets(params), 2);  // [4] [1, 3]
  EXPECT_EQ(distributed::BucketedReducer(nullptr, 5).num_buckets(params), 2);
  EXPECT_EQ(distributed::BucketedReducer(nullptr, 8).num_buckets(params), 1);
  EXPECT_EQ(distributed::BucketedReducer(nullptr, 2).num_buckets(params), 3);
  try {
    distributed::BucketedReducer(nullptr, 0);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "bucket_size must be > 0, got 0");
  }
}

TEST_F(DataParallel, DifferentGasAcrossRanksIsReportedAtInitialize) {
  auto ranks = run_ranks(2, {"mismatch-gas"}, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 3) << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("stepwise::initialize: the ranks disagree on the "
                                   "gradient_accumulation_steps (2 on rank 0, 3 on rank 1). "
                                   "Every rank must run the same model with the same config"),
              std::string::npos)
        << ranks[r].output;
  }
}

TEST_F(DataParallel, DifferentParameterShapesAcrossRanksAreReportedAtInitialize) {
  auto ranks = run_ranks(2, {"mismatch-shape"}, std::chrono::seconds(120));
  EXPECT_EQ(ranks[0].exit_code, 3) << ranks[0].output;
  EXPECT_NE(ranks[0].output.find("the ranks disagree on the number of trainable elements (5 on "
                                 "rank 0, 6 on rank 1)"),
            std::string::npos)
      << ranks[0].output;
  EXPECT_NE(ranks[0].output.find("this rank (0) has parameter shapes [1, 4], [1]"),
            std::string::npos)
      << ranks[0].output;
}

// see NOTE: [construction order] in src/engine.cpp and the worker's broadcast-fp16.
TEST_F(DataParallel, RankZerosWeightsReachEveryRankBeforeTheFp16Cast) {
  auto ranks = run_ranks(2, {"broadcast-fp16"}, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
}

// docs/accumulation-in-depth.md's recipe for a token-level loss over ranks (the worker's
// token-recipe): two ranks with 12 and 8 of a window's 20 tokens, in micro-batches of 3, 9
// and 6, 2, end with the weights of one batch of all 20 tokens on one rank.
TEST_F(DataParallel, TokenLevelLossOverRanksWithUnequalCountsIsOneBigBatch) {
  auto ranks = run_ranks(2, {"token-recipe"}, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
  auto [model, engine, all] = stepwise::testing::token_problem(20, 1);
  engine.backward(model->forward(all).pow(2).mean());
  engine.step();
  const auto weights = torch::cat({model->weight.flatten(), model->bias});
  const auto at = ranks[0].output.find("tokens 20 weights");
  ASSERT_NE(at, std::string::npos) << ranks[0].output;
  std::istringstream printed(ranks[0].output.substr(at + 17));
  for (int64_t i = 0; i < weights.numel(); ++i) {
    double w = 0;
    printed >> w;
    EXPECT_NEAR(w, weights[i].item<double>(), 1e-6) << "weight " << i << "\n" << ranks[0].output;
  }
}

struct Launched {
  int exit_code = -1;
  std::string output;
};

Launched launch(const std::string& args) {
  Launched out;
  const std::string command = std::string(STEPWISE_LAUNCH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.output.append(buffer, n);
  const int status = ::pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class Launcher : public DataParallel {
 protected:
  void SetUp() override {
    DataParallel::SetUp();
    if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "tools/launch needs python3";
  }
};

TEST_F(Launcher, PrefixesEveryLineWithItsRank) {
  auto run = launch(std::string("-n 2 -- ") + STEPWISE_DIST_WORKER +
                    " trace linear_adam_none_ws2_mbs2_gas2.txt");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[rank 0] rank 0: 12 micro-steps compared, 0 failures"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[rank 1] rank 1: 12 micro-steps compared, 0 failures"),
            std::string::npos)
      << run.output;
}

TEST_F(Launcher, FailsFastWithTheFailingRanksCode) {
  const auto start = Clock::now();
  auto run = launch(std::string("-n 2 -- ") + STEPWISE_DIST_WORKER + " kill");
  EXPECT_EQ(run.exit_code, 128 + SIGKILL) << run.output;
  EXPECT_NE(run.output.find("[launch] rank 1 exited with code 137; stopped the other ranks"),
            std::string::npos)
      << run.output;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
}

TEST_F(Launcher, UsageErrors) {
  auto run = launch("-n 0 -- true");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("-n must be >= 1, got 0"), std::string::npos) << run.output;
  run = launch("-n 2");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("no program given; usage: tools/launch -n N -- PROGRAM [ARGS...]"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace stepwise
