// The c10d process group (Gloo or NCCL), the global context and the bucketed reducer.
#include <stepwise/distributed.h>
#include <stepwise/errors.h>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "distributed_backends.h"

namespace stepwise::distributed {

namespace {

using Clock = std::chrono::steady_clock;

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

std::mutex g_mutex;
std::shared_ptr<Context> g_context;

std::string list_ranks(const std::vector<int64_t>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

}  // namespace

struct Context::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<detail::Group> group;
  std::string master;
  int64_t failures = 0;
  torch::Device device = torch::kCPU;  // where the backend's tensors live
};

// NOTE: [naming the missing rank] c10d's errors name a peer's socket address
// (or only say "timed out"), not its rank. After a failed collective every
// surviving rank writes "stepwise/alive/<failure>/<rank>" to rank 0's store and
// waits a moment for the others; whoever did not write is reported. If the store
// itself is unreachable, rank 0 (its host) is the one that is gone.
void Context::fail(const std::string& what, const std::exception& cause) {
  const int64_t failure = impl_->failures++;
  std::string missing;
  try {
    auto& store = *impl_->store;
    store.set(c10::str("stepwise/alive/", failure, "/", rank_), std::vector<uint8_t>{1});
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(
                                             timeout_, std::chrono::milliseconds(3000));
    std::vector<int64_t> absent;
    do {
      absent.clear();
      for (int64_t r = 0; r < world_size_; ++r) {
        if (!store.check({c10::str("stepwise/alive/", failure, "/", r)})) absent.push_back(r);
      }
      if (absent.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (Clock::now() < deadline);
    missing = absent.empty() ? "every rank is alive (the collective itself failed)"
                             : list_ranks(absent) + " did not respond (exited, crashed or hangs)";
  } catch (const std::exception&) {
    missing = c10::str("rank 0 (host of the rendezvous store at ", impl_->master,
                       ") is unreachable: it exited, crashed or hangs");
  }
  throw DistributedError(c10::str("stepwise: ", what, " failed on rank ", rank_, " of ",
                                  world_size_, ": ", missing, "; collective timeout ",
                                  timeout_.count(), " ms. c10d said: ", cause.what()));
}

Context::Context(const InitOptions& options) : impl_(std::make_unique<Impl>()) {
  world_size_ = options.world_size() ? *options.world_size() : env_int("WORLD_SIZE").value_or(1);
  if (world_size_ < 1) {
    throw DistributedError(c10::str("world size must be >= 1, got ", world_size_,
                                    " (from WORLD_SIZE or InitOptions::world_size)"));
  }
  rank_ = options.rank() ? *options.rank() : env_int("RANK").value_or(0);
  if (rank_ < 0 || rank_ >= world_size_) {
    throw DistributedError(c10::str("rank ", rank_, " is out of range for world size ", world_size_,
                                    "; use a rank in 0..", world_size_ - 1,
                                    " (RANK or InitOptions::rank)"));
  }
  local_rank_ =
      options.local_rank() ? *options.local_rank() : env_int("LOCAL_RANK").value_or(rank_);
  timeout_ = options.timeout();
  const std::string addr = options.master_addr().value_or(env("MASTER_ADDR").value_or("127.0.0.1"));
  const int64_t port =
      options.master_port() ? *options.master_port() : env_int("MASTER_PORT").value_or(29500);
  if (port < 1 || port > 65535) {
    throw DistributedError(c10::str("master port ", port,
                                    " is not a TCP port; use 1..65535 (MASTER_PORT or "
                                    "InitOptions::master_port)"));
  }
  impl_->master = c10::str(addr, ":", port);

  if (world_size_ == 1) {
    impl_->store = c10::make_intrusive<c10d::HashStore>();
  } else {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(port);
    store_options.isServer = rank_ == 0;
    store_options.numWorkers = static_cast<std::size_t>(world_size_);
    store_options.waitWorkers = false;  // our own arrival check names the missing ranks
    store_options.timeout = timeout_;
    try {
      impl_->store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
    } catch (const std::exception& e) {
      throw DistributedError(c10::str(
          "stepwise: rank ", rank_, " of ", world_size_,
          rank_ == 0 ? " could not start the rendezvous store at "
                     : " could not reach rank 0's rendezvous store at ",
          impl_->master, " within ", timeout_.count(),
          " ms; check MASTER_ADDR/MASTER_PORT (the port must be free on rank 0) and that rank 0 "
          "started. c10d said: ",
          e.what()));
    }
  }
  // Rendezvous: every rank announces itself; a rank that never arrives is named.
  impl_->store->set(c10::str("stepwise/arrived/", rank_), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int64_t r = 0; r < world_size_; ++r) keys.push_back(c10::str("stepwise/arrived/", r));
  try {
    impl_->store->wait(keys, timeout_);
  } catch (const std::exception& e) {
    std::vector<int64_t> absent;
    for (int64_t r = 0; r < world_size_; ++r) {
      if (!impl_->store->check({keys[r]})) absent.push_back(r);
    }
    throw DistributedError(c10::str("stepwise: rendezvous at ", impl_->master, " timed out after ",
                                    timeout_.count(), " ms on rank ", rank_, " of ", world_size_,
                                    ": ", list_ranks(absent),
                                    " never arrived; start all WORLD_SIZE processes (tools/launch "
                                    "-n N does) or raise the timeout"));
  }
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("pg", impl_->store);
    const bool nccl = options.backend() == Backend::kNccl;
    impl_->group = nccl
                       ? detail::make_nccl_process_group(store, rank_, world_size_, timeout_)
                       : detail::make_gloo_process_group(store, rank_, world_size_, addr, timeout_);
    if (nccl)
      impl_->device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank_));
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    fail("creating the process group", e);
  }
}

Context::~Context() = default;

std::string Context::backend_name() const { return impl_->group->getBackendName(); }

torch::Device Context::device() const { return impl_->device; }

void Context::all_reduce_sum(torch::Tensor& tensor, const std::string& what) {
  // NCCL takes CUDA tensors only, Gloo CPU ones (see device()).
  const bool moved = tensor.device() != impl_->device;
  torch::Tensor on_device = moved ? tensor.to(impl_->device) : tensor;
  wait(*all_reduce_sum_start(on_device, what));
  if (moved) tensor.copy_(on_device);
}

struct Context::Pending::Impl {
  decltype(std::declval<detail::Group&>().allreduce(std::declval<std::vector<torch::Tensor>&>(),
                                                    c10d::AllreduceOptions())) work;
  std::vector<torch::Tensor> tensors;  // kept alive until the work is done
  std::string what;
  std::chrono::milliseconds timeout{};
  bool waited = false;
};

Context::Pending::Pending(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Context::Pending::~Pending() {
  if (!impl_ || impl_->waited || !impl_->work) return;
  try {
    impl_->work->wait(impl_->timeout);  // the backend must not write into freed memory
  } catch (const std::exception& e) {
    std::cerr << "[stepwise] " << impl_->what << " failed while unwinding: " << e.what() << "\n";
  }
}

std::unique_ptr<Context::Pending> Context::all_reduce_sum_start(torch::Tensor& tensor,
                                                                const std::string& what) {
  STEPWISE_CHECK(tensor.device() == impl_->device, std::invalid_argument,
                 "all_reduce_sum_start: ", what, " is on ", tensor.device(), ", the ",
                 backend_name(), " backend works on ", impl_->device);
  auto pending = std::make_unique<Pending::Impl>();
  pending->tensors = {tensor};
  pending->what = what;
  pending->timeout = timeout_;
  try {
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = timeout_;
    pending->work = impl_->group->allreduce(pending->tensors, options);
  } catch (const std::exception& e) {
    fail("all-reduce of " + what, e);
  }
  return std::unique_ptr<Pending>(new Pending(std::move(pending)));
}

void Context::wait(Pending& pending) {
  auto& p = *pending.impl_;
  if (p.waited) return;
  p.waited = true;
  try {
    p.work->wait(timeout_);
  } catch (const std::exception& e) {
    fail("all-reduce of " + p.what, e);
  }
}

void Context::broadcast(torch::Tensor& tensor, int64_t root, const std::string& what) {
  const bool moved = tensor.device() != impl_->device;
  std::vector<torch::Tensor> tensors{moved ? tensor.to(impl_->device) : tensor};
  try {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    impl_->group->broadcast(tensors, options)->wait(timeout_);
  } catch (const std::exception& e) {
    fail("broadcast of " + what, e);
  }
  if (moved) tensor.copy_(tensors[0]);
}

std::vector<torch::Tensor> Context::all_gather(const torch::Tensor& tensor,
                                               const std::string& what) {
  std::vector<torch::Tensor> input{tensor.to(impl_->device).contiguous()};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < world_size_; ++r) output[0].push_back(torch::empty_like(input[0]));
  try {
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    impl_->group->allgather(output, input, options)->wait(timeout_);
  } catch (const std::exception& e) {
    fail("all-gather of " + what, e);
  }
  if (tensor.device() != impl_->device) {
    for (auto& t : output[0]) t = t.to(tensor.device());
  }
  return output[0];
}

void Context::barrier(const std::string& what) {
  try {
    c10d::BarrierOptions options;
    options.timeout = timeout_;
    // NCCL (2.x) otherwise guesses the barrier's GPU, with a warning, when no collective
    // has run yet; device_ids exists in 1.13 and 2.x alike. Gloo ignores it.
    if (impl_->device.is_cuda()) options.device_ids = {impl_->device.index()};
    impl_->group->barrier(options)->wait(timeout_);
  } catch (const std::exception& e) {
    fail("barrier (" + what + ")", e);
  }
}

std::shared_ptr<Context> init(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_context) {
    throw DistributedError(
        c10::str("stepwise::distributed::init was called twice (this process is already rank ",
                 g_context->rank(), " of ", g_context->world_size(),
                 "); call it once, before stepwise::initialize, or call shutdown() first"));
  }
  g_context = std::make_shared<Context>(options);
  return g_context;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_context != nullptr;
}

std::shared_ptr<Context> default_context() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_context;
}

int64_t rank() {
  auto context = default_context();
  return context ? context->rank() : 0;
}

int64_t world_size() {
  auto context = default_context();
  return context ? context->world_size() : 1;
}

void shutdown() {
  std::shared_ptr<Context> context;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    context.swap(g_context);
  }
  if (context && context->world_size() > 1) context->barrier("shutdown");
}

int64_t world_size_for_engine(const torch::Device& params_device) {
  if (!is_initialized() && env_int("WORLD_SIZE").value_or(1) > 1) {
    init(InitOptions().backend(params_device.is_cuda() ? Backend::kNccl : Backend::kGloo));
  }
  return world_size();
}

}  // namespace stepwise::distributed
