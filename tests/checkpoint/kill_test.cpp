// A process killed (SIGKILL) in the middle of a save leaves the previous checkpoint and
// `latest` loadable (NOTE: [checkpoint layout]).
#include <stepwise/stepwise.h>

#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "check.h"
#include "support/scratch_dir.h"

extern char** environ;

namespace stepwise {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kElements = 4'000'000;  // 16 MB of weights, 48 MB with AdamW's moments

struct BigImpl : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::zeros({kElements}));
};
TORCH_MODULE(Big);

// Starts the saver, waits until it is `saves` saves into its loop, waits `delay` more,
// and kills it. Returns whether a partial folder was left (the kill hit a save).
bool kill_saver_mid_save(const std::string& dir, int saves, std::chrono::milliseconds delay) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const std::string elements = std::to_string(kElements);
  char* args[] = {const_cast<char*>(STEPWISE_CHECKPOINT_SAVER), const_cast<char*>(dir.c_str()),
                  const_cast<char*>(elements.c_str()), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, STEPWISE_CHECKPOINT_SAVER, &actions, nullptr, args, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  FILE* lines = fdopen(out[0], "r");
  char line[64];
  int seen = 0;
  while (seen < saves + 1 && std::fgets(line, sizeof line, lines) != nullptr) {
    if (std::string(line) == "ready\n" || std::string(line) == "saving\n") ++seen;
  }
  std::this_thread::sleep_for(delay);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  std::fclose(lines);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the saver ended before it was killed";
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(".t", 0) == 0) return true;
  }
  return false;
}

TEST(CheckpointKill, AKilledSaveLeavesThePreviousCheckpointLoadable) {
  // The kill lands at different points of a save; at least one must hit a save in the
  // middle (a partial folder is left), and every time `latest` must load.
  int mid_save = 0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    testing::ScratchDir dir("stepwise-ckpt-kill");
    mid_save += kill_saver_mid_save(dir.path(), 2, std::chrono::milliseconds(7 * attempt));
    std::ifstream latest(fs::path(dir.path()) / "latest");
    std::string tag;
    ASSERT_TRUE(std::getline(latest, tag)) << "latest must survive the kill";
    Big model;
    auto engine = initialize(model, Config::from_string(R"({"train_batch_size": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
    const auto loaded = engine.load_checkpoint(dir.path());
    EXPECT_EQ(loaded.path, (fs::path(dir.path()) / tag).string());
    EXPECT_EQ(engine.global_steps(), 1);
    // The saver took one AdamW step (lr 0.01, eps 1e-8) on mean(w^2) from w = 0.5, where
    // g = 2w/n: w = 0.5 - 0.01 * g / (g + 1e-8).
    const double g = 2 * 0.5 / static_cast<double>(kElements);
    EXPECT_TRUE(
        torch::allclose(model->w, torch::full({kElements}, 0.5 - 0.01 * g / (g + 1e-8)), 1e-6, 0.0))
        << model->w[0].item<double>();
  }
  EXPECT_GT(mid_save, 0) << "no kill landed inside a save: the test proved nothing";
}

}  // namespace
}  // namespace stepwise
