// The checkpoint fuzz test: damaged and foreign checkpoints, built here from one good one.
// Each is refused with a CheckpointError, the engine unchanged and still training bit for
// bit as it would have without the load, or it loads and the run continues bit for bit
// as the saved one did. No other outcome passes: another exception type, a load that
// trains from other numbers, a crash.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "support/scratch_dir.h"

namespace stepwise {
namespace {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(width, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

constexpr int64_t kSaveAt = 3;  // inside the second window of GAS 2: a gradient pending
constexpr int64_t kTotal = 7;
constexpr uint64_t kSavedData = 100;  // the seeds of the saved run's micro-batches
constexpr uint64_t kOwnData = 1000;   // ... of the loading engine's own first ones

// One engine: a small MLP, AdamW, clipping, WarmupLR, GAS 2.
struct FuzzRun {
  explicit FuzzRun(int64_t width = 8) : width(width) {
    torch::manual_seed(0);
    model = Net(width);
    engine = std::make_unique<Engine>(initialize(model, Config::from_string(R"({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "steps_per_print": 1000000,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01,
                      "warmup_num_steps": 4}}})")));
  }
  void train(int64_t first, int64_t last, uint64_t seed) {
    for (int64_t t = first; t < last; ++t) {
      torch::manual_seed(seed + static_cast<uint64_t>(t));
      auto x = torch::randn({2, width});
      auto y = torch::randn({2, 1});
      engine->backward(torch::mse_loss(model->forward(x), y));
      engine->step();
    }
  }
  torch::Tensor weights() const {
    std::vector<torch::Tensor> all;
    for (const auto& p : model->parameters()) all.push_back(p.detach().flatten());
    return torch::cat(all);
  }
  int64_t width;
  Net model{nullptr};
  std::unique_ptr<Engine> engine;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
// The sidecar save_checkpoint writes (NOTE: [checkpoint checksums]), for damaged bytes:
// the damage then passes the checksum and must be caught by what reads the file.
void write_sum(const std::string& path) {
  const std::string bytes = read_bytes(path);
  write_bytes(path + ".sum",
              c10::str("xxh3 ", bytes.size(), " ", XXH3_64bits(bytes.data(), bytes.size()), "\n"));
}

const std::vector<std::string> kPickles = {"mp_rank_00_model_states.pt", "optimizer_states.pt",
                                           "window_rank_0.pt"};

// A checkpoint folder as files: "latest" and "good/<file>".
struct Folder {
  std::vector<std::string> files;
  void copy(const std::string& from, const std::string& to) const {
    std::filesystem::create_directories(to + "/good");
    for (const auto& f : files) {
      if (std::filesystem::exists(from + "/" + f))
        write_bytes(to + "/" + f, read_bytes(from + "/" + f));
    }
  }
};

struct Case {
  std::string name;
  std::function<void(const std::string& dir)> damage;
};

std::vector<Case> cases(const std::string& foreign, const std::string& later) {
  std::vector<Case> out;
  std::vector<std::string> all = {"latest"};
  for (const auto& p : kPickles) {
    all.push_back("good/" + p);
    all.push_back("good/" + p + ".sum");
  }
  // Truncated and missing files.
  for (const auto& f : all) {
    for (int cut = 0; cut < 4; ++cut) {
      out.push_back({c10::str(f, " truncated (", cut, ")"), [f, cut](const std::string& dir) {
                       const std::string path = dir + "/" + f;
                       const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
                       const int64_t keep[] = {0, 1, size / 2, size - 1};
                       std::filesystem::resize_file(path, static_cast<uintmax_t>(keep[cut]));
                     }});
    }
    out.push_back(
        {f + " missing", [f](const std::string& dir) { std::filesystem::remove(dir + "/" + f); }});
  }
  for (const auto& p : kPickles) {
    const std::string f = "good/" + p;
    // A byte flipped anywhere: the checksum differs.
    for (int k = 0; k < 16; ++k) {
      out.push_back({c10::str(f, " byte flipped at ", k, "/16"), [f, k](const std::string& dir) {
                       std::string bytes = read_bytes(dir + "/" + f);
                       bytes[bytes.size() * static_cast<size_t>(k) / 16] ^= '\xff';
                       write_bytes(dir + "/" + f, bytes);
                     }});
    }
    // The zip's structure damaged (its first entry's header, its central directory and
    // end record), with a sidecar that passes.
    for (int k = 0; k < 32; ++k) {
      out.push_back({c10::str(f, " zip structure damaged at ", k, ", checksum recomputed"),
                     [f, k](const std::string& dir) {
                       std::string bytes = read_bytes(dir + "/" + f);
                       const size_t at =
                           k < 16 ? static_cast<size_t>(k) * 4 : bytes.size() - 1 - (k - 16) * 4;
                       bytes[at] ^= '\x5a';
                       write_bytes(dir + "/" + f, bytes);
                       write_sum(dir + "/" + f);
                     }});
    }
    // Sidecars that do not parse or do not match.
    const std::vector<std::string> sums = {"", "xxh3", "xxh3 12 34\n", "xxh3 abc def\n",
                                           "sha256 1 2\n"};
    for (size_t k = 0; k < sums.size(); ++k) {
      out.push_back(
          {c10::str(f, ".sum replaced (", k, ")"), [f, text = sums[k]](const std::string& dir) {
             write_bytes(dir + "/" + f + ".sum", text);
           }});
    }
    // The file of another model (width 9), with its own valid sidecar, or with ours.
    out.push_back({f + " from another model", [f, foreign](const std::string& dir) {
                     write_bytes(dir + "/" + f, read_bytes(foreign + "/" + f));
                     write_bytes(dir + "/" + f + ".sum", read_bytes(foreign + "/" + f + ".sum"));
                   }});
    out.push_back({f + " from another model, our sidecar", [f, foreign](const std::string& dir) {
                     write_bytes(dir + "/" + f, read_bytes(foreign + "/" + f));
                   }});
  }
  out.push_back({"every file from another model", [foreign](const std::string& dir) {
                   for (const auto& p : kPickles) {
                     for (const std::string ext : {"", ".sum"}) {
                       write_bytes(dir + "/good/" + p + ext,
                                   read_bytes(foreign + "/good/" + p + ext));
                     }
                   }
                 }});
  out.push_back({"the window file of a later save", [later](const std::string& dir) {
                   for (const std::string ext : {"", ".sum"}) {
                     write_bytes(dir + "/good/window_rank_0.pt" + ext,
                                 read_bytes(later + "/good/window_rank_0.pt" + ext));
                   }
                 }});
  // What `latest` may hold.
  const std::vector<std::string> latest = {std::string(5000, 'a'),
                                           std::string(300, 'b'),
                                           "",
                                           "\n",
                                           "good\n",
                                           "../good",
                                           "a/b",
                                           ".good",
                                           "latest",
                                           std::string("go\0od", 5),
                                           "good\x01",
                                           "absent",
                                           "\xff\xfe"};
  for (size_t k = 0; k < latest.size(); ++k) {
    out.push_back(
        {c10::str("latest replaced (", k, ")"),
         [text = latest[k]](const std::string& dir) { write_bytes(dir + "/latest", text); }});
  }
  return out;
}

TEST(CheckpointFuzz, EveryDamagedOrForeignCheckpointIsRefusedOrLoadsExactly) {
  testing::ScratchDir scratch("stepwise-ckpt-fuzz");
  const std::string good = scratch.path() + "/good", foreign = scratch.path() + "/foreign",
                    later = scratch.path() + "/later";
  // The saved run, and the weights it reaches; the loading engine's own run, and its weights.
  torch::Tensor saved_end, own_end;
  {
    FuzzRun saved;
    saved.train(0, kSaveAt, kSavedData);
    saved.engine->save_checkpoint(good, SaveOptions().tag("good"));
    saved.train(kSaveAt, kSaveAt + 1, kSavedData);
    saved.engine->save_checkpoint(later, SaveOptions().tag("good"));
    FuzzRun whole;
    whole.train(0, kTotal, kSavedData);
    saved_end = whole.weights();
    FuzzRun own;
    own.train(0, kSaveAt, kOwnData);
    own.train(kSaveAt, kTotal, kSavedData);
    own_end = own.weights();
    FuzzRun other(9);
    other.train(0, kSaveAt, kSavedData);
    other.engine->save_checkpoint(foreign, SaveOptions().tag("good"));
  }
  Folder folder{{"latest"}};
  for (const auto& p : kPickles) {
    folder.files.push_back("good/" + p);
    folder.files.push_back("good/" + p + ".sum");
  }
  const auto all = cases(foreign, later);
  ASSERT_GE(all.size(), 200u);
  int refused = 0, loaded = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    const std::string dir = c10::str(scratch.path(), "/case", i);
    folder.copy(good, dir);
    c.damage(dir);
    FuzzRun run;
    run.train(0, kSaveAt, kOwnData);
    const auto weights = run.weights();
    const int64_t micro = run.engine->micro_steps(), global = run.engine->global_steps();
    const double lr = run.engine->get_lr().at(0);
    bool refusal = false;
    try {
      run.engine->load_checkpoint(dir);
    } catch (const CheckpointError& e) {
      refusal = true;
      if (c.name == "good/optimizer_states.pt from another model") {
        // The state of another model's shapes fits the groups: each entry is checked.
        EXPECT_NE(std::string(e.what()).find("the exp_avg of parameter \"fc1.weight\" is "
                                             "Float of shape [9, 9], the parameter Float of "
                                             "shape [8, 8]"),
                  std::string::npos)
            << e.what();
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << ": not a CheckpointError: " << e.what();
      continue;
    }
    if (refusal) {
      ++refused;
      EXPECT_TRUE(torch::equal(run.weights(), weights)) << c.name << ": the weights changed";
      EXPECT_EQ(run.engine->micro_steps(), micro) << c.name;
      EXPECT_EQ(run.engine->global_steps(), global) << c.name;
      EXPECT_EQ(run.engine->get_lr().at(0), lr) << c.name;
      run.train(kSaveAt, kTotal, kSavedData);
      EXPECT_TRUE(torch::equal(run.weights(), own_end))
          << c.name << ": after a refused load the engine trains differently";
    } else {
      ++loaded;
      run.train(kSaveAt, kTotal, kSavedData);
      EXPECT_TRUE(torch::equal(run.weights(), saved_end))
          << c.name << ": it loaded, but the run does not continue as the saved one";
    }
  }
  std::cout << "checkpoint fuzz: " << all.size() << " cases, " << refused << " refused, " << loaded
            << " loaded and continued exactly\n";
}

}  // namespace
}  // namespace stepwise
