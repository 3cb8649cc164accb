// Real DeepSpeed configs, copied verbatim from public repositories
// (tests/data/deepspeed-configs/SOURCES.tsv names each one's repository, path and commit):
// each goes through Config::from_file, initialize and two optimizer steps, as a user's
// would, and must end as EXPECTED.tsv says: "runs", or "refused: " and what it names.
// A client AdamW is passed when the file has no "optimizer" section, as HF Trainer and
// Megatron do, and HF's "auto" values are filled from a typical HF Trainer run's
// arguments. STEPWISE_RECORD_CORPUS=FILE writes the verdicts found to FILE instead.
#include <stepwise/config.h>
#include <stepwise/engine.h>
#include <stepwise/errors.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace stepwise {
namespace {

const std::string kCorpus = std::string(STEPWISE_TEST_DATA) + "/deepspeed-configs";

// An element-wise model: its ops have Half and BFloat16 kernels on the CPU.
struct CorpusModel : torch::nn::Module {
  CorpusModel() {
    w = register_parameter("w", torch::full({4}, 0.5));
    b = register_parameter("b", torch::zeros({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x.to(w.scalar_type()) * w + b; }
  torch::Tensor w, b;
};

// What one problem of a ConfigError names: a quoted key, an unknown key, an "auto", a ZeRO
// stage, or the option its message starts with.
std::string corpus_label(const std::string& problem) {
  if (problem.rfind("\"", 0) == 0) return problem.substr(1, problem.find('"', 1) - 1);
  if (problem.rfind("unknown key ", 0) == 0) {
    return "unknown " + problem.substr(12, problem.find(' ', 12) - 12);
  }
  if (problem.rfind("zero_optimization.stage ", 0) == 0) {
    return "zero stage " + problem.substr(24, problem.find(' ', 24) - 24);
  }
  if (problem.find("fp32 master weights") != std::string::npos) {
    return "client optimizer in fp16/bf16";
  }
  if (problem.find("train_batch_size nor") != std::string::npos) return "no batch size";
  // DeepSpeed refuses it too (zero_force_ds_cpu_optimizer): NOTE: [ZeRO-Offload].
  if (problem.find("with an optimizer passed to initialize") != std::string::npos) {
    return "client optimizer with offload";
  }
  const std::string path = problem.substr(0, problem.find(' '));
  if (problem.find(" is \"auto\"") != std::string::npos) return "auto " + path;
  return path;
}

// "refused: a, b" from an error that holds one problem or a numbered list of them.
std::string corpus_refusal(const std::string& message) {
  std::vector<std::string> problems;
  const std::string marker = "\n  ";
  if (message.find("problems in the configuration") == std::string::npos) {
    problems.push_back(message);
  } else {
    for (size_t at = message.find(marker); at != std::string::npos;) {
      const size_t next = message.find(marker, at + 1);
      const std::string line = message.substr(at + marker.size(), next - at - marker.size());
      problems.push_back(line.substr(line.find(". ") + 2));
      at = next;
    }
  }
  std::set<std::string> labels;
  for (const auto& p : problems) labels.insert(corpus_label(p));
  std::string out = "refused:";
  for (const auto& l : labels) out += (out.back() == ':' ? " " : ", ") + l;
  return out;
}

std::string corpus_verdict(const std::string& path) {
  try {
    auto config = Config::from_file(path, AutoValues()
                                              .per_device_train_batch_size(4)
                                              .gradient_accumulation_steps(2)
                                              .max_grad_norm(1.0)
                                              .learning_rate(2e-5)
                                              .adam_beta1(0.9)
                                              .adam_beta2(0.999)
                                              .adam_epsilon(1e-8)
                                              .weight_decay(0.0)
                                              .warmup_steps(0)
                                              .num_training_steps(100)
                                              .fp16(false)
                                              .bf16(true));
    auto model = std::make_shared<CorpusModel>();
    std::unique_ptr<torch::optim::Optimizer> client;
    if (!config.optimizer) {
      client = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                     torch::optim::AdamWOptions(1e-3));
    }
    auto engine = initialize(model, config, std::move(client));
    const auto sizes = engine.batch_sizes();
    torch::manual_seed(0);
    for (int64_t i = 0; i < 2 * sizes.gradient_accumulation_steps; ++i) {
      const auto x = torch::randn({sizes.micro_batch, 4});
      const auto loss = (model->forward(x).to(torch::kFloat) - x).pow(2).mean();
      engine.backward(loss);
      engine.step();
    }
    return engine.global_steps() == 2 ? "runs" : "ran, but not 2 steps";
  } catch (const ConfigError& e) {
    std::string message = e.what();
    if (message.rfind(path + ": ", 0) == 0) message = message.substr(path.size() + 2);
    if (std::getenv("STEPWISE_RECORD_CORPUS") != nullptr)
      std::cerr << path << ": " << message << "\n";
    return corpus_refusal(message);
  }
}

TEST(DeepSpeedCorpus, EveryRealConfigRunsOrIsRefusedByNameAsExpected) {
  std::map<std::string, std::string> expected;
  std::ifstream in(kCorpus + "/EXPECTED.tsv");
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    expected[line.substr(0, line.find('\t'))] = line.substr(line.find('\t') + 1);
  }
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 50u);
  std::map<std::string, int> by_feature;
  int runs = 0;
  std::ostringstream found;
  found << "# file\tverdict (tests/config/deepspeed_corpus_test.cpp)\n";
  for (const auto& file : files) {
    const std::string got = corpus_verdict(kCorpus + "/" + file);
    found << file << "\t" << got << "\n";
    if (got == "runs") runs += 1;
    std::istringstream labels(got.rfind("refused: ", 0) == 0 ? got.substr(9) : "");
    for (std::string l; std::getline(labels, l, ',');)
      by_feature[l.substr(l.find_first_not_of(' '))] += 1;
    if (std::getenv("STEPWISE_RECORD_CORPUS") == nullptr) EXPECT_EQ(got, expected[file]) << file;
  }
  std::cout << runs << " of " << files.size() << " configs run; refusals by what they name:\n";
  for (const auto& [feature, count] : by_feature)
    std::cout << "  " << count << "  " << feature << "\n";
  if (const char* record = std::getenv("STEPWISE_RECORD_CORPUS"))
    std::ofstream(record) << found.str();
}

}  // namespace
}  // namespace stepwise
