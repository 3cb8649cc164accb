#include "monitor.h"

#include <stepwise/errors.h>

#include "check.h"
#include "window_losses.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace stepwise::detail {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The process's peak resident memory (Linux reports KiB).
double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return text;
}

// One CSV file: DeepSpeed's name (the event's, '/' and ' ' made '_') and header
// ("step" and the name's last part); the header only in a new or empty file, so a resumed
// run appends rows to the same table.
void append_rows(const std::string& folder, const std::string& event,
                 const std::vector<std::pair<int64_t, double>>& rows) {
  if (rows.empty()) return;
  std::string file = event;
  for (auto& c : file) c = (c == '/' || c == ' ') ? '_' : c;
  const fs::path path = fs::path(folder) / (file + ".csv");
  const bool fresh = !fs::exists(path) || fs::file_size(path) == 0;
  std::ofstream out(path, std::ios::app);
  if (fresh) out << "step," << event.substr(event.rfind('/') + 1) << "\n";
  out << std::setprecision(9);
  for (const auto& [step, value] : rows) out << step << "," << value << "\n";
  STEPWISE_CHECK(out.good(), TrainingError, "csv_monitor: could not write ", path.string(),
                 ": check that the folder is writable and the disk has room");
}

// A step's loss as a 0-dim double tensor on the loss's device (NaN for a step without a
// backward(), which only a manual boundary with strict_cadence off allows).
torch::Tensor loss_of(const StepReport& r) {
  const auto mean = window_mean(r.window_losses, r.loss_factor);
  if (!mean.defined()) return torch::full({}, std::nan(""), torch::kDouble);
  return mean.to(torch::kDouble).reshape({});
}

}  // namespace

Monitor::Monitor(const CsvMonitorOptions& csv, int64_t steps_per_print, bool writes,
                 std::optional<int64_t> total_steps, AllReduceSum all_reduce_sum,
                 int64_t world_size)
    : csv_(csv),
      steps_per_print_(steps_per_print),
      writes_(writes),
      total_steps_(total_steps),
      all_reduce_sum_(std::move(all_reduce_sum)),
      world_size_(world_size) {
  if (!csv_.enabled()) return;
  folder_ = (fs::path(csv_.output_path()) / csv_.job_name()).string();
  if (!writes_) return;
  std::error_code error;
  fs::create_directories(folder_, error);
  STEPWISE_CHECK(!error, ConfigError, "csv_monitor: cannot create the folder ", folder_, " (",
                 error.message(),
                 "): set csv_monitor.output_path to a writable folder, or disable csv_monitor");
}

Monitor::~Monitor() {
  try {
    write_rows();
  } catch (const std::exception& e) {
    std::cerr << "stepwise: warning: " << e.what() << "\n";
  }
}

void Monitor::on_backward(int64_t tokens) {
  if (!last_print_) last_print_ = Clock::now();  // the run's time starts at its first backward
  tokens_ += tokens;
  tokens_reported_ = tokens_reported_ || tokens > 0;
}

void Monitor::write_rows() {
  if (!writes_ || !csv_.enabled() || pending_.empty()) return;
  std::vector<torch::Tensor> losses;
  for (const auto& r : pending_) {
    losses.push_back(loss_of(r).reshape({1}));
  }
  const auto host = torch::cat(losses).cpu();  // one copy for every pending step
  std::vector<std::pair<int64_t, double>> loss_rows, lr_rows, scale_rows;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const StepReport& r = pending_[i];
    loss_rows.emplace_back(r.global_samples, host[static_cast<int64_t>(i)].item<double>());
    lr_rows.emplace_back(r.global_samples, r.lrs.empty() ? 0.0 : r.lrs.front());
    if (r.loss_scale) scale_rows.emplace_back(r.global_samples, *r.loss_scale);
  }
  pending_.clear();
  append_rows(folder_, "Train/Samples/train_loss", loss_rows);
  append_rows(folder_, "Train/Samples/lr", lr_rows);
  append_rows(folder_, "Train/Samples/loss_scale", scale_rows);
}

std::string Monitor::on_step(StepReport report) {
  const bool print = report.global_steps % steps_per_print_ == 0;
  if (!csv_.enabled()) pending_.clear();  // only the last step is needed, for the line
  pending_.push_back(std::move(report));
  if (!print) return "";
  const StepReport last = pending_.back();  // a copy: write_rows() empties pending_
  // The mean loss over the ranks and the tokens of every rank: one all-reduce, one copy.
  const auto loss_now = loss_of(last);
  auto totals = torch::stack(
      {loss_now, torch::scalar_tensor(static_cast<double>(tokens_), loss_now.options())});
  if (all_reduce_sum_) all_reduce_sum_(totals);
  const auto host = totals.cpu();
  const double loss = host[0].item<double>() / static_cast<double>(world_size_);
  const double tokens = host[1].item<double>();
  const auto now = Clock::now();
  const double seconds =
      last_print_ ? std::chrono::duration<double>(now - *last_print_).count() : 0.0;
  const int64_t steps = last.global_steps - last_print_steps_;
  const int64_t samples = last.global_samples - last_print_samples_;
  std::ostringstream line;
  if (writes_) {
    line << "[stepwise] step=" << last.global_steps << " loss=" << std::setprecision(6) << loss
         << " lr=";
    for (size_t i = 0; i < last.lrs.size(); ++i) line << (i ? "," : "") << last.lrs[i];
    line << " grad_norm=" << last.grad_norm;
    if (last.loss_scale) line << " loss_scale=" << *last.loss_scale;
    line << " skipped=" << last.skipped_steps << " samples=" << last.global_samples;
    if (seconds > 0.0) {
      line << std::fixed << std::setprecision(1) << " samples/s=" << samples / seconds;
      if (tokens_reported_) line << " tokens/s=" << tokens / seconds;
      line << " ms/step=" << std::setprecision(2) << 1000.0 * seconds / std::max<int64_t>(steps, 1);
      if (total_steps_ && *total_steps_ > last.global_steps && steps > 0) {
        line << " eta=" << duration_text(seconds / steps * (*total_steps_ - last.global_steps));
      }
    }
    line << std::fixed << std::setprecision(0) << " peak_rss=" << peak_rss_mib() << "MiB";
  }
  write_rows();
  tokens_ = 0;
  last_print_ = now;
  last_print_steps_ = last.global_steps;
  last_print_samples_ = last.global_samples;
  return line.str();
}

}  // namespace stepwise::detail
