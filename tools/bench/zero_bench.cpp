// ZeRO stages 1 and 2 against stage 0 at W = 2 (two ranks, each a fresh process started
// from this one): per rank and stage, the bytes held for weights, gradients (on .grad) and
// optimizer state (measured from the tensors) next to the ZeRO paper's formulas, the peak
// resident memory that training adds to the model's, and the time per optimizer step (GAS
// micro-steps). fp32 AdamW or bf16. Every stage uses the same reduce bucket, one layer.
//
//   zero_bench [--params-millions N] [--steps N] [--gas N] [--bf16] [--no-overlap]
//
// --no-overlap sets overlap_comm false (every stage; it changes stages 0 and 1 at the
// window's last backward, stage 2 at every one). Each stage runs twice: once for the times,
// once for the peak memory (see rank_main).
#include <stepwise/stepwise.h>

#include <nlohmann/json.hpp>

#include <malloc.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "support/free_port.h"

namespace {

using stepwise::testing::free_port;

using Clock = std::chrono::steady_clock;

// Resident memory now, and at its peak, in MiB (from /proc/self/status).
double rss_mib(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::string(field).size())) / 1024;
  }
  return 0;
}

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return n;
}

// One rank: builds the model, trains `steps` optimizer steps, prints one line of results.
int rank_main(int64_t stage, int64_t width, int64_t layers, int64_t steps, int64_t gas, bool bf16,
              bool overlap, bool memory_pass) {
  torch::set_num_threads(1);
  // The memory pass: blocks of 1 MiB and more come from mmap and go back to the system
  // when freed (glibc otherwise raises this threshold as blocks are freed and serves them
  // from a heap that only grows), so the peak measures the tensors alive at once, at every
  // stage alike. Its page faults slow every step, so the times come from a pass without.
  if (memory_pass) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  stepwise::distributed::init();
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t l = 0; l < layers; ++l) model->push_back(torch::nn::Linear(width, width));
  const double model_rss = rss_mib("VmRSS:");
  auto engine = stepwise::initialize(
      model.ptr(),
      stepwise::Config::from_json(
          {{"train_micro_batch_size_per_gpu", 4},
           {"gradient_accumulation_steps", gas},
           {"steps_per_print", 1000000},
           {"stepwise", {{"reduce_bucket_size", width * width + width}, {"overlap_comm", overlap}}},
           {"bf16", {{"enabled", bf16}}},
           {"zero_optimization", {{"stage", stage}}},
           {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-5}}}}}}));
  const auto dtype = bf16 ? torch::kBFloat16 : torch::kFloat;
  auto x = torch::randn({4, width}).to(dtype);
  double ms = 0;
  for (int64_t s = 0; s <= steps; ++s) {
    const auto start = Clock::now();
    for (int64_t m = 0; m < gas; ++m) {
      engine.backward(model->forward(x).to(torch::kFloat).pow(2).mean());
      engine.step();
    }
    if (s > 0) ms += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  std::vector<torch::Tensor> weights, grads, state;
  for (const auto& p : model->parameters()) {
    weights.push_back(p);
    grads.push_back(p.grad());
  }
  const auto masters = engine.master_params();
  for (const auto& kv : engine.optimizer().state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
    state.push_back(s.exp_avg());
    state.push_back(s.exp_avg_sq());
  }
  const int64_t master_bytes = bf16 ? bytes_of(masters) : 0;  // fp32: the weights themselves
  std::cout << stepwise::distributed::rank() << " " << bytes_of(weights) << " " << bytes_of(grads)
            << " " << master_bytes << " " << bytes_of(state) << " " << rss_mib("VmHWM:") - model_rss
            << " " << ms / static_cast<double>(steps) << std::endl;
  stepwise::distributed::shutdown();
  return 0;
}

struct RankResult {
  int64_t weights = 0, grads = 0, masters = 0, state = 0;
  double added_mib = 0, ms = 0;
};

// Starts two ranks of this program at `stage`; reads their lines.
std::vector<RankResult> run_stage(const char* self, int64_t stage,
                                  const std::vector<std::string>& args) {
  const std::string port = std::to_string(free_port());
  std::vector<RankResult> out(2);
  std::vector<std::pair<pid_t, FILE*>> ranks;
  for (int r = 0; r < 2; ++r) {
    const std::string file = "/tmp/zero_bench." + port + "." + std::to_string(r);
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      if (!freopen(file.c_str(), "w", stdout)) _exit(126);
      std::vector<std::string> a = {self, "--rank-of-stage", std::to_string(stage)};
      a.insert(a.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& s : a) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    ranks.push_back({pid, nullptr});
  }
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    waitpid(ranks[r].first, &status, 0);
    const std::string file = "/tmp/zero_bench." + port + "." + std::to_string(r);
    std::ifstream in(file);
    int64_t rank = -1;
    RankResult res;
    in >> rank >> res.weights >> res.grads >> res.masters >> res.state >> res.added_mib >> res.ms;
    std::remove(file.c_str());
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) || rank != r) {
      std::cerr << "zero_bench: rank " << r << " of stage " << stage << " failed\n";
      std::exit(1);
    }
    out[r] = res;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t millions = 50, steps = 3, gas = 2, stage = -1;
  bool bf16 = false, overlap = true, memory_pass = false;
  std::vector<std::string> pass;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rank-of-stage" && i + 1 < argc) {
      stage = std::stoll(argv[++i]);
    } else if (a == "--params-millions" && i + 1 < argc) {
      millions = std::stoll(argv[++i]);
      pass.insert(pass.end(), {a, argv[i]});
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::stoll(argv[++i]);
      pass.insert(pass.end(), {a, argv[i]});
    } else if (a == "--gas" && i + 1 < argc) {
      gas = std::stoll(argv[++i]);
      pass.insert(pass.end(), {a, argv[i]});
    } else if (a == "--memory-pass") {  // internal: a rank of the memory pass
      memory_pass = true;
    } else if (a == "--no-overlap") {
      overlap = false;
      pass.push_back(a);
    } else if (a == "--bf16") {
      bf16 = true;
      pass.push_back(a);
    } else {
      std::cerr << "usage: zero_bench [--params-millions N] [--steps N] [--gas N] [--bf16] "
                   "[--no-overlap]\n";
      return 2;
    }
  }
  const int64_t width = 2048;
  const int64_t per_layer = width * width + width;
  const int64_t layers = std::max<int64_t>(1, (millions * 1000000 + per_layer / 2) / per_layer);
  if (stage >= 0) return rank_main(stage, width, layers, steps, gas, bf16, overlap, memory_pass);

  const double params = static_cast<double>(layers * (width * width + width));
  std::cout << "ZeRO at W = 2, " << (bf16 ? "bf16" : "fp32") << " AdamW, " << layers << " Linear("
            << width << ", " << width << ") = " << std::fixed << std::setprecision(1)
            << params / 1e6 << "M parameters, GAS " << gas << ", overlap_comm "
            << (overlap ? "true" : "false") << ", " << steps << " steps (after one warm-up)\n";
  // The ZeRO paper's bytes per parameter: weights, gradients, masters + AdamW state.
  const double wb = bf16 ? 2 : 4, state_b = bf16 ? 12 : 8;
  std::vector<std::vector<RankResult>> results;
  std::cout.flush();  // before the forks, or each child prints it again
  auto memory_args = pass;
  memory_args.push_back("--memory-pass");
  for (int64_t s : {0, 1, 2}) {
    results.push_back(run_stage(argv[0], s, pass));
    const auto memory = run_stage(argv[0], s, memory_args);
    for (int r = 0; r < 2; ++r) results.back()[r].added_mib = memory[r].added_mib;
  }
  const double mib = 1024.0 * 1024.0;
  std::cout << "stage rank  weights MiB  grads MiB  masters+state MiB (formula)  "
               "peak RSS added MiB  ms/step\n";
  for (int64_t s : {0, 1, 2}) {
    for (int r = 0; r < 2; ++r) {
      const auto& x = results[s][r];
      const double formula = params * state_b / (s == 0 ? 1 : 2) / mib;
      std::cout << std::setw(5) << s << std::setw(5) << r << std::setw(13) << x.weights / mib
                << std::setw(11) << x.grads / mib << std::setw(12) << (x.masters + x.state) / mib
                << " (" << std::setw(7) << formula << ")" << std::setw(20) << x.added_mib
                << std::setw(9) << x.ms << "\n";
    }
  }
  const auto mean = [&](int64_t s, double RankResult::*f) {
    return (results[s][0].*f + results[s][1].*f) / 2;
  };
  // The paper's bytes per parameter that training adds to the model's weights: gradients,
  // masters and state; stage 1 halves the state, stage 2 the gradients too (which it keeps
  // inside the engine, not on .grad: the grads column shows 0).
  const double formula[] = {wb + state_b, wb + state_b / 2, wb / 2 + state_b / 2};
  for (int64_t s : {1, 2}) {
    std::cout << std::setprecision(3) << "stage " << s << " / stage 0: peak RSS added "
              << mean(s, &RankResult::added_mib) / mean(0, &RankResult::added_mib) << "x (formula "
              << formula[s] / formula[0] << "x), ms/step "
              << mean(s, &RankResult::ms) / mean(0, &RankResult::ms) << "x\n";
  }
  return 0;
}
