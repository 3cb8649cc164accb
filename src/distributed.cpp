// The c10d context: rendezvous, the process group (Gloo or NCCL), its collectives, and
// the process-wide context that init() makes.
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

#include "check.h"
#include "collectives.h"
#include "distributed_backends.h"
#include "launch_environment.h"

namespace stepwise::distributed {

namespace {

using Clock = std::chrono::steady_clock;

std::mutex g_mutex;
std::shared_ptr<Context> g_context;

std::string list_ranks(const std::vector<int64_t>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// The store the ranks meet at: in memory for one process, else rank 0's TCPStore.
c10::intrusive_ptr<c10d::Store> make_store(const detail::LaunchEnvironment& launch,
                                           std::chrono::milliseconds timeout) {
  if (launch.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(launch.master_port);
  options.isServer = launch.rank == 0;
  options.numWorkers = static_cast<std::size_t>(launch.world_size);
  options.waitWorkers = false;  // await_every_rank names the missing ranks
  options.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(launch.master_addr, options);
  } catch (const std::exception& e) {
    throw DistributedError(c10::str(
        "stepwise: rank ", launch.rank, " of ", launch.world_size,
        launch.rank == 0 ? " could not start the rendezvous store at "
                         : " could not reach rank 0's rendezvous store at ",
        launch.master(), " within ", timeout.count(),
        " ms; check MASTER_ADDR/MASTER_PORT (the port must be free on rank 0) and that rank 0 "
        "started. c10d said: ",
        e.what()));
  }
}

// Rendezvous: every rank announces itself and waits for the others; a rank that never
// arrives is named.
void await_every_rank(c10d::Store& store, const detail::LaunchEnvironment& launch,
                      std::chrono::milliseconds timeout) {
  store.set(c10::str("stepwise/arrived/", launch.rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int64_t r = 0; r < launch.world_size; ++r) keys.push_back(c10::str("stepwise/arrived/", r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::vector<int64_t> absent;
    for (int64_t r = 0; r < launch.world_size; ++r) {
      if (!store.check({keys[r]})) absent.push_back(r);
    }
    throw DistributedError(
        c10::str("stepwise: rendezvous at ", launch.master(), " timed out after ", timeout.count(),
                 " ms on rank ", launch.rank, " of ", launch.world_size, ": ", list_ranks(absent),
                 " never arrived; start all WORLD_SIZE processes (tools/launch "
                 "-n N does) or raise the timeout"));
  }
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
  const detail::LaunchEnvironment launch = detail::resolve_launch_environment(options);
  rank_ = launch.rank;
  world_size_ = launch.world_size;
  local_rank_ = launch.local_rank;
  timeout_ = options.timeout();
  impl_->master = launch.master();
  impl_->store = make_store(launch, timeout_);
  await_every_rank(*impl_->store, launch, timeout_);
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("pg", impl_->store);
    const bool nccl = options.backend() == Backend::kNccl;
    impl_->group = nccl ? detail::make_nccl_process_group(store, rank_, world_size_, timeout_)
                        : detail::make_gloo_process_group(store, rank_, world_size_,
                                                          launch.master_addr, timeout_);
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
  detail::wait(*this, *detail::all_reduce_sum_start(*this, on_device, what));
  if (moved) tensor.copy_(on_device);
}

struct detail::PendingCollective::Impl {
  decltype(std::declval<detail::Group&>().allreduce(std::declval<std::vector<torch::Tensor>&>(),
                                                    c10d::AllreduceOptions())) work;
  std::vector<torch::Tensor> tensors;  // kept alive until the work is done
  std::string what;
  std::chrono::milliseconds timeout{};
  bool waited = false;
};

// What the internal collectives (src/collectives.h) reach of a Context and a pending one.
struct detail::ContextAccess {
  static Context::Impl& impl(Context& context) { return *context.impl_; }
  static PendingCollective::Impl& impl(PendingCollective& pending) { return *pending.impl_; }
  [[noreturn]] static void fail(Context& context, const std::string& what,
                                const std::exception& cause) {
    context.fail(what, cause);
  }
};

detail::PendingCollective::PendingCollective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

detail::PendingCollective::~PendingCollective() {
  if (!impl_ || impl_->waited || !impl_->work) return;
  try {
    impl_->work->wait(impl_->timeout);  // the backend must not write into freed memory
  } catch (const std::exception& e) {
    std::cerr << "[stepwise] " << impl_->what << " failed while unwinding: " << e.what() << "\n";
  }
}

std::unique_ptr<detail::PendingCollective> detail::all_reduce_sum_start(Context& context,
                                                                        torch::Tensor& tensor,
                                                                        const std::string& what) {
  auto& impl = ContextAccess::impl(context);
  STEPWISE_CHECK(tensor.device() == impl.device, std::invalid_argument,
                 "all_reduce_sum_start: ", what, " is on ", tensor.device(), ", the ",
                 context.backend_name(), " backend works on ", impl.device);
  auto pending = std::make_unique<PendingCollective::Impl>();
  pending->tensors = {tensor};
  pending->what = "all-reduce of " + what;
  pending->timeout = context.timeout();
  try {
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = context.timeout();
    pending->work = impl.group->allreduce(pending->tensors, options);
  } catch (const std::exception& e) {
    ContextAccess::fail(context, "all-reduce of " + what, e);
  }
  return std::make_unique<PendingCollective>(std::move(pending));
}

void detail::wait(Context& context, PendingCollective& pending) {
  auto& p = ContextAccess::impl(pending);
  if (p.waited) return;
  p.waited = true;
  try {
    p.work->wait(context.timeout());
  } catch (const std::exception& e) {
    ContextAccess::fail(context, p.what, e);
  }
}

std::unique_ptr<detail::PendingCollective> detail::reduce_sum_start(Context& context,
                                                                    torch::Tensor& tensor,
                                                                    int64_t root,
                                                                    const std::string& what) {
  auto& impl = ContextAccess::impl(context);
  STEPWISE_CHECK(tensor.device() == impl.device, std::invalid_argument, "reduce_sum_start: ", what,
                 " is on ", tensor.device(), ", the ", context.backend_name(), " backend works on ",
                 impl.device);
  auto pending = std::make_unique<PendingCollective::Impl>();
  pending->tensors = {tensor};
  pending->what = "reduce of " + what;
  pending->timeout = context.timeout();
  try {
    c10d::ReduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.rootRank = root;
    options.timeout = context.timeout();
    pending->work = impl.group->reduce(pending->tensors, options);
  } catch (const std::exception& e) {
    ContextAccess::fail(context, pending->what, e);
  }
  return std::make_unique<PendingCollective>(std::move(pending));
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
  if (!is_initialized() && detail::launched_world_size() > 1) {
    init(InitOptions().backend(params_device.is_cuda() ? Backend::kNccl : Backend::kGloo));
  }
  return world_size();
}

}  // namespace stepwise::distributed
