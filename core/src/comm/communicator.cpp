// communicator.cpp — one live backend's life and calls: made (rendezvous choice, agreement on
// the backend, init), bounded (the watchdog's deadlines, the runner for plugins without abort,
// the deadline stamped on each call), broken and aborted, finalized. Its collectives are in
// collective_calls.cpp, its children in split.cpp, the hierarchical allreduce in
// hierarchical_allreduce.cpp.
#include "comm/communicator.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "bootstrap/host.hpp"
#include "comm/agreement.hpp"
#include "comm/host_services.hpp"
#include "common/call_checks.hpp"
#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/sdk/deadline.hpp"
#include "hvd/sdk/env.hpp"
#include "hvd/sdk/fnv.hpp"

namespace hvd::core {
namespace {

// A plugin call's outcome, taken on the thread that made it (its message is thread-local).
Status outcome_of(hvd_status code) {
  return code == HVD_SUCCESS ? Status::success() : Status(code, backend_call_message(code));
}

// What calls walked away from may still use, kept (reachable, never freed) for the life of the
// process: the plugin's communicator, the host services, the store they read.
void keep_for_stuck_calls(std::shared_ptr<void> kept) {
  static auto* const mutex = new std::mutex;
  static auto* const graveyard = new std::vector<std::shared_ptr<void>>;
  std::lock_guard<std::mutex> lock(*mutex);
  graveyard->push_back(std::move(kept));
}

// Each hvd_init of a process takes the next epoch; every rank inits the same number of times,
// so keys of one init never collide with keys of an earlier one on the same store.
std::atomic<int> g_epoch{0};

// Derived alike on every rank: the world communicator of the epoch-th hvd_init (FNV-1a).
uint64_t world_comm_id(int epoch) {
  return hvd::sdk::Fnv1a().add("hvd world " + std::to_string(epoch)).digest();
}

}  // namespace

// ---- a rendezvous made through the launcher ------------------------------------------------

// Under mpirun (or another launcher) without HVD_RENDEZVOUS_ADDR: open a short-lived
// communicator on a self-bootstrapping backend (HVD_BOOTSTRAP_BACKEND, default mpi), let rank 0
// serve a store on an address its peers can reach, and broadcast that address and a fresh secret.
// The bootstrap communicator's world, not the launcher's, decides whether loopback reaches every
// rank: its local places come from the host identities.
Result<SharedRendezvous> rendezvous_through_launcher(const std::string& for_backend,
                                                     std::chrono::milliseconds timeout,
                                                     const Settings& settings,
                                                     const EnvLookup& env) {
  const std::string helper = settings.text(Knob::kBootstrapBackend);
  HVD_ASSIGN_OR_RETURN(Plugin plugin, resolve_backend(helper, plugin_search_path(settings)));
  if ((plugin.capabilities & HVD_CAP_SELF_BOOTSTRAP) == 0) {
    return error(HVD_ERR_UNSUPPORTED, "bootstrap backend '" + helper +
                                          "' cannot find its peers by itself (no self_bootstrap)");
  }
  CommOptions options;
  options.backend = plugin.path.string();
  options.timeout = timeout;
  options.purpose = "the bootstrap of " + for_backend;
  HVD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> bootstrap,
                       Communicator::create(options, settings, env));

  HVD_ASSIGN_OR_RETURN(
      SharedRendezvous made,
      share_rendezvous(bootstrap->world(), settings, [&](void* record, size_t size) {
        return bootstrap->broadcast(bootstrap->control_args(record, record, size));
      }));
  log(HVD_LOG_INFO, "rendezvous made through '" + helper + "' at " + made.address.to_string());
  return made;
}

// ---- Communicator -------------------------------------------------------------------------

Result<std::unique_ptr<Communicator>> Communicator::create(const CommOptions& options,
                                                           const EnvLookup& env) {
  HVD_ASSIGN_OR_RETURN(const Settings settings, Settings::read(env));
  return create(options, settings, env);
}

Result<std::unique_ptr<Communicator>> Communicator::create(const CommOptions& options,
                                                           const Settings& settings,
                                                           const EnvLookup& env) {
  std::unique_ptr<Communicator> comm(new Communicator);
  comm->settings_ = settings;
  comm->device_memory_ = options.device_memory ? options.device_memory : &cuda_memory();
  HVD_ASSIGN_OR_RETURN(comm->world_, discover_world(env));
  const World& world = comm->world_;
  set_log_rank(world.rank);
  comm->timeout_ = options.timeout ? *options.timeout : settings.timeout();

  const int epoch = g_epoch++;
  const std::string prefix = "hvd/" + std::to_string(epoch) + "/";
  const std::string spec = options.backend ? *options.backend : settings.text(Knob::kBackend);
  Result<Plugin> loaded = resolve_backend(spec, plugin_search_path(settings));
  std::string choice = describe_backend_choice(loaded);
  if (loaded.ok() && !options.purpose.empty()) choice += " as " + options.purpose;
  // Hierarchical allreduce makes communicators every rank must make alike: part of the choice.
  const auto chunk_bytes = static_cast<uint64_t>(settings.number(Knob::kHierarchicalChunkBytes));
  const bool wants_hierarchical =
      settings.flag(Knob::kHierarchicalAllreduce) && options.purpose.empty();
  // The chunks are collectives of their own: every rank must cut alike.
  if (loaded.ok() && wants_hierarchical) {
    choice +=
        " with HVD_HIERARCHICAL_ALLREDUCE=1 in chunks of " + std::to_string(chunk_bytes) + " bytes";
  }
  // The fusion scheduler's batches are collectives every rank must cut alike (the backend is told
  // so: HVD_CALL_RANKS_AGREE): a threshold other than the default is part of the choice.
  const double fusion = settings.number(Knob::kFusionThreshold);
  if (loaded.ok() && options.purpose.empty() &&
      fusion != std::stod(hvd::core::spec(Knob::kFusionThreshold).fallback)) {
    choice += " with HVD_FUSION_THRESHOLD=" + std::to_string(static_cast<uint64_t>(fusion));
  }
  const std::string record = format_init_record(host_identity(settings), world, choice);

  // Rendezvous: the job's TCP store, at HVD_RENDEZVOUS_ADDR or made through the launcher; an
  // in-process one for a lone process; none at all for a self-bootstrapping backend (MPI under
  // mpirun), which then checks the agreement itself.
  std::optional<HostPort> where;
  std::string secret;
  bool agree_after_init = false;
  if (const auto address = settings.optional(Knob::kRendezvousAddr)) {
    HVD_ASSIGN_OR_RETURN(where, parse_host_port(*address));
    const auto given = settings.optional(Knob::kSecret);
    if (!given) {
      return error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_RENDEZVOUS_ADDR is set but HVD_SECRET is not: every rank needs the "
                   "job's shared secret (hvdrun sets both)");
    }
    secret = *given;
    if (world.rank == 0 && settings.text(Knob::kRendezvousServer) != "external") {
      Result<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::start(*where, secret);
      if (!server.ok()) {
        return server.status().with_context("rank 0 could not serve the rendezvous at " +
                                            where->to_string());
      }
      comm->server_ = std::move(server).value();
    }
  } else if (world.size > 1) {
    if (!loaded.ok()) return loaded.status();  // no one to agree with: report it here
    if ((loaded->capabilities & HVD_CAP_SELF_BOOTSTRAP) != 0) {
      agree_after_init = true;
    } else {
      // Without a launcher to lean on, or when leaning on it failed, say how to give one.
      auto no_rendezvous = [&](hvd_status code, const std::string& why) {
        return error(code, "this is rank " + std::to_string(world.rank) + " of " +
                               std::to_string(world.size) + " (from " + world.source +
                               ") and backend '" + loaded->name +
                               "' needs a rendezvous to find its peers, but HVD_RENDEZVOUS_ADDR "
                               "is not set" +
                               why +
                               ". Start the job with hvdrun, or set HVD_RENDEZVOUS_ADDR=host:port "
                               "(rank 0 serves it there) and HVD_SECRET on every rank");
      };
      if (!world.from_launcher) return no_rendezvous(HVD_ERR_INVALID_ARGUMENT, "");
      Result<SharedRendezvous> made =
          rendezvous_through_launcher(loaded->name, comm->timeout_, settings, env);
      if (made.status().code() == HVD_ERR_MISMATCH) return made.status();  // same on every rank
      if (!made.ok()) {
        return no_rendezvous(
            made.status().code(),
            " and none could be made through the launcher (" + made.status().message() + ")");
      }
      where = made->address;
      secret = made->secret;
      comm->server_ = std::move(made->server);
    }
  } else {
    comm->store_ = std::make_unique<InMemoryStore>();
  }
  std::string local_address = "127.0.0.1";
  if (where) {
    HVD_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreClient> client,
                         TcpStoreClient::connect(*where, secret, comm->timeout_));
    local_address = client->local_address();
    comm->store_ = std::move(client);
    comm->store_where_ = where;
    comm->store_secret_ = secret;
  }

  // Make sure every rank loaded the same backend before initializing it: a disagreement is the
  // same clear error everywhere instead of a hang inside the backend.
  if (comm->store_) {
    std::vector<std::string> records{record};
    if (world.size > 1) {
      HVD_ASSIGN_OR_RETURN(std::vector<Bytes> all,
                           exchange(*comm->store_, prefix + "backend-choice",
                                    Bytes(record.begin(), record.end()), world, comm->timeout_));
      records.clear();
      for (const Bytes& b : all) records.emplace_back(b.begin(), b.end());
    }
    HVD_RETURN_IF_ERROR(comm->agree_and_place(records).status());
  }
  comm->plugin_ = std::move(loaded).value();
  comm->host_staging_device_ = comm->device_for_host_memory();
  comm->comm_id_ = world_comm_id(epoch);
  comm->local_address_ = local_address;
  comm->prefix_ = prefix;
  comm->services_prefix_ = prefix + "backend/";
  HVD_RETURN_IF_ERROR(comm->init_backend());
  if (agree_after_init) {
    HVD_ASSIGN_OR_RETURN(const bool relocated, comm->agree_through_backend(record));
    // The backend was told what the launcher said of each rank's host; where the host identities
    // say otherwise for any rank, every rank makes it again with the places they agree on.
    if (relocated) {
      HVD_RETURN_IF_ERROR(comm->finalize_backend());
      HVD_RETURN_IF_ERROR(comm->init_backend());
    }
  }
  if (wants_hierarchical) HVD_RETURN_IF_ERROR(comm->enable_hierarchical(chunk_bytes));
  log(HVD_LOG_INFO, "rank " + std::to_string(world.rank) + "/" + std::to_string(world.size) + " (" +
                        world.source + ") on backend " + comm->plugin_.name + " from " +
                        comm->plugin_.path.string());
  return comm;
}

hvd_backend_init_args Communicator::prepare_backend(std::vector<int32_t>* members) {
  const World& world = world_;
  if (!child_) {  // the world: every rank of the job, placed as the host identities say
    members_.resize(static_cast<size_t>(world.size));
    for (int32_t r = 0; r < world.size; ++r) members_[static_cast<size_t>(r)] = r;
    job_local_rank_ = world.local_rank;
    job_local_size_ = world.local_size;
  }
  *members = members_;
  services_ = std::make_unique<HostServices>(store_.get(), services_prefix_, world);
  hvd_backend_init_args args{};
  args.struct_size = sizeof args;
  args.rank = world.rank;
  args.size = world.size;
  args.local_rank = job_local_rank_;
  args.local_size = job_local_size_;
  args.timeout_ms = timeout_.count();
  args.local_address = local_address_.c_str();
  args.host = services_->table();
  args.members = members->data();
  args.member_count = world.size;
  args.comm_id = comm_id_;
  args.member_local_rank = world.local_rank;
  args.member_local_size = world.local_size;
  if (plugin_.abi_minor == 0) {  // to a 1.0 plugin its communicator is the job
    args.local_rank = args.member_local_rank;
    args.local_size = args.member_local_size;
  }
  if (log_enabled(HVD_LOG_DEBUG)) {
    log(HVD_LOG_DEBUG,
        std::string(child_ ? "split" : "init") + " of backend '" + plugin_.name + "': rank " +
            std::to_string(args.rank) + " of " + std::to_string(args.size) + ", local rank " +
            std::to_string(args.local_rank) + " of " + std::to_string(args.local_size) +
            ", communicator " + std::to_string(args.comm_id));
  }
  if (!watched_) {
    Watchdog::watch(this);
    watched_ = true;
  }
  return args;
}

Status Communicator::init_backend() {
  std::vector<int32_t> members;
  const hvd_backend_init_args args = prepare_backend(&members);
  // On the application's thread (NCCL binds the current device, MPI its main thread), so it
  // cannot be walked away from; the watchdog reports it if it overruns.
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    in_call_ = true;
    call_abortable_ = false;
    call_what_ = "init";
    call_deadline_ = Clock::now() + timeout_ + kMargin;
    overran_ = false;
  }
  hvd_backend_comm* backend = nullptr;
  begin_backend_call();
  const hvd_status code =
      guarded(plugin_.name, "init", [&] { return plugin_.table->init(&args, &backend); });
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    in_call_ = false;
  }
  if (code != HVD_SUCCESS) return failed("init", code, backend_call_message(code));
  std::lock_guard<std::mutex> lock(abort_mutex_);
  backend_ = backend;
  backend_aborted_ = false;
  return Status::success();
}

Status Communicator::finalize_backend() {
  hvd_backend_comm* backend = nullptr;
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    backend = std::exchange(backend_, nullptr);
  }
  if (backend == nullptr) return Status::success();
  // On the runner: finalize may talk to peers (Gloo's leaving barrier), and a plugin must never be
  // aborted under its own finalize; so a finalize that overruns is walked away from.
  const hvd_backend_v1* table = plugin_.table;
  const std::optional<Status> outcome = runner_.run(
      [table, backend, name = plugin_.name] {
        begin_backend_call();
        return outcome_of(guarded(name, "finalize", [&] { return table->finalize(backend); }));
      },
      Clock::now() + timeout_ + kMargin, /*interruptible=*/false);
  if (!outcome) {
    keep_for_stuck_calls(std::shared_ptr<void>(backend, [](void*) {}));
    leak_for_stuck_call();
    return timed_out("finalize");
  }
  if (outcome->ok()) return Status::success();
  return failed("finalize", outcome->code(), outcome->message());
}

Status Communicator::failed(const char* what, hvd_status code, const std::string& message) const {
  return error(known_error(code, HVD_ERR_INTERNAL),
               std::string(what) + " on backend '" + plugin_.name + "' failed: " + message);
}

Result<bool> Communicator::agree_through_backend(const std::string& record) {
  // A fixed-size record per rank, gathered by the backend itself (a choice too long for it is
  // cut: it comes last).
  constexpr size_t kRecord = 1024;
  std::vector<char> mine(kRecord, '\0');
  std::memcpy(mine.data(), record.data(), std::min(record.size(), kRecord - 1));
  std::vector<char> all(kRecord * static_cast<size_t>(world_.size));
  HVD_RETURN_IF_ERROR(allgather(control_args(mine.data(), all.data(), kRecord))
                          .with_context("checking that every rank uses the same backend"));
  std::vector<std::string> records;
  for (int r = 0; r < world_.size; ++r) {
    const char* at = all.data() + kRecord * static_cast<size_t>(r);
    records.emplace_back(at, strnlen(at, kRecord));
  }
  return agree_and_place(records);
}

Result<bool> Communicator::agree_and_place(const std::vector<std::string>& records) {
  std::vector<std::string> hosts, choices;
  std::vector<LocalPlace> said;  // by each rank's launcher
  for (const std::string& record : records) {
    InitRecord parsed = parse_init_record(record);
    hosts.push_back(std::move(parsed.host));
    said.push_back(parsed.said);
    choices.push_back(std::move(parsed.choice));
  }
  HVD_RETURN_IF_ERROR(check_backend_agreement(choices));
  // Local rank and size are what the host identities say, whatever a launcher said: a launcher
  // that groups ranks by host name puts network-namespace hosts together.
  bool relocated = false;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    const LocalPlace place = local_place(hosts, r);
    const LocalPlace& before = said[static_cast<size_t>(r)];
    relocated = relocated || place.rank != before.rank || place.size != before.size;
  }
  hosts_ = hosts;
  const LocalPlace mine = local_place(hosts, world_.rank);
  if (mine.rank != world_.local_rank || mine.size != world_.local_size) {
    log(HVD_LOG_INFO, "local rank " + std::to_string(mine.rank) + " of " +
                          std::to_string(mine.size) + " on host " +
                          hosts[static_cast<size_t>(world_.rank)] + " (" + world_.source +
                          " said " + std::to_string(world_.local_rank) + " of " +
                          std::to_string(world_.local_size) + ")");
    world_.local_rank = mine.rank;
    world_.local_size = mine.size;
  }
  return relocated;
}

int32_t Communicator::device_for_host_memory() const {
  const uint64_t caps = plugin_.capabilities;
  if ((caps & HVD_CAP_HOST_MEMORY) != 0 || (caps & HVD_CAP_CUDA_MEMORY) == 0) return -1;
  const Result<int32_t> device = device_memory_->current_device();
  return device.ok() ? *device : -1;  // none: host memory is refused, naming the capabilities
}

Communicator::~Communicator() {
  const Status s = finalize();
  if (!s.ok()) log(HVD_LOG_WARNING, s.message());
}

Status Communicator::finalize() {
  if (finalized_) return *finalized_;
  // Children before their parent (hierarchical allreduce's); their errors are this one's too.
  for (auto* child : {&cross_, &local_}) {
    if (*child) (void)(*child)->finalize();
  }
  if (watched_) {
    Watchdog::unwatch(this);
    watched_ = false;
  }
  const Status broken = health();
  bool busy = false;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    closing_ = true;  // no call starts from now on
    busy = in_call_;
  }
  if (busy || runner_.stuck()) {
    // A call still runs in the plugin (walked away from, or made on another thread): finalizing
    // or freeing under it could crash the process, so it keeps everything it may use.
    leak_for_stuck_call();
    finalized_ = broken.ok() ? error(HVD_ERR_STATE, "finalize on backend '" + plugin_.name +
                                                        "': a call is still in progress on it; "
                                                        "its communicator is left unreleased")
                             : broken;
    return *finalized_;
  }
  const Status released = finalize_backend();
  finalized_ = broken.ok() ? released : broken;
  return *finalized_;
}

void Communicator::leak_for_stuck_call() {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (backend_ != nullptr) {
    keep_for_stuck_calls(std::shared_ptr<void>(backend_, [](void*) {}));
    backend_ = nullptr;
  }
  if (services_) keep_for_stuck_calls(std::move(services_));
  if (store_) keep_for_stuck_calls(std::move(store_));
}

Status Communicator::health() const {
  if (!broken_.load(std::memory_order_acquire)) return Status::success();
  std::lock_guard<std::mutex> lock(call_mutex_);
  return broken_status_;
}

void Communicator::break_locked(const Status& why) {
  if (broken_.load(std::memory_order_relaxed)) return;  // the first reason sticks
  broken_status_ = why;
  broken_.store(true, std::memory_order_release);
}

void Communicator::abort(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    break_locked(why);
  }
  abort_backend();
  if (local_) local_->abort(why);
  if (cross_) cross_->abort(why);
}

void Communicator::abort_backend() {
  runner_.interrupt();
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (services_) services_->abort();
  if (backend_aborted_ || backend_ == nullptr || plugin_.abort == nullptr) return;
  backend_aborted_ = true;
  begin_backend_call();
  const hvd_status code = guarded(plugin_.name, "abort", [&] { return plugin_.abort(backend_); });
  if (code != HVD_SUCCESS) {
    log(HVD_LOG_WARNING,
        "abort on backend '" + plugin_.name + "' failed: " + backend_call_message(code));
  }
}

Status Communicator::finalized_already(const char* what) const {
  return error(HVD_ERR_STATE, std::string(what) + " on backend '" + plugin_.name +
                                  "': the communicator is being finalized");
}

Status Communicator::another_call(const char* what) const {
  return error(HVD_ERR_STATE, std::string(what) + " on backend '" + plugin_.name +
                                  "': another call is in progress on this communicator (one "
                                  "thread at a time: hvd.h)");
}

void Communicator::begin_serving(const char* api) {
  serving_.store(api, std::memory_order_relaxed);
  serving_deadline_.store(-++serving_scopes_, std::memory_order_release);  // a scope of its own
}

void Communicator::serve_for(const Communicator& parent) {
  const Clock::rep scope = parent.serving_deadline_.load(std::memory_order_acquire);
  if (scope == kNotServing) return;
  serving_.store(parent.serving_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  // The parent's stamp, or a scope of this one's, stamped at the watchdog's first look at it,
  // which comes after the parent's call began.
  serving_deadline_.store(scope > 0 ? scope : -++serving_scopes_, std::memory_order_release);
}

void Communicator::end_serving() {
  serving_deadline_.store(kNotServing, std::memory_order_release);
}

Communicator::Clock::time_point Communicator::deadline_from_now() const {
  const Clock::time_point deadline = Clock::now() + timeout_ + kMargin;
  const Clock::rep serving = serving_deadline_.load(std::memory_order_acquire);
  if (serving <= 0) return deadline;  // none, or not stamped yet
  return std::min(deadline, Clock::time_point(Clock::duration(serving)));
}

namespace {

hvd_status invoke(const Plugin& plugin, hvd_backend_comm* backend, hvd_collective entry,
                  const hvd_collective_args* args) {
  return guarded(plugin.name, hvd_collective_name(entry), [&] {
    const hvd_backend_v1* table = plugin.table;
    switch (entry) {
      case HVD_COLLECTIVE_ALLREDUCE:
        return table->allreduce(backend, args);
      case HVD_COLLECTIVE_ALLGATHER:
        return table->allgather(backend, args);
      case HVD_COLLECTIVE_BROADCAST:
        return table->broadcast(backend, args);
      case HVD_COLLECTIVE_REDUCE_SCATTER:
        return table->reduce_scatter(backend, args);
      case HVD_COLLECTIVE_ALLTOALL:
        return plugin.alltoall(backend, args);
      case HVD_COLLECTIVE_BARRIER:
        return table->barrier(backend);
      default:  // a join never reaches a backend
        return HVD_ERR_INTERNAL;
    }
  });
}

uint64_t sum(const uint64_t* counts, int n) {
  uint64_t total = 0;
  for (int r = 0; r < n; ++r) total += counts[r];
  return total;
}

}  // namespace

Status Communicator::timed_out(const std::string& what) const {
  std::lock_guard<std::mutex> lock(call_mutex_);
  return timed_out_locked(what);
}

Status Communicator::timed_out_locked(const std::string& what) const {
  const std::string consequence =
      what == "finalize" ? "its communicator is left unreleased" : "the communicator was aborted";
  const std::string serving =
      serving_deadline_.load(std::memory_order_acquire) != kNotServing
          ? std::string(" (serving ") + serving_.load(std::memory_order_relaxed) + ")"
          : "";
  return error(HVD_ERR_TIMEOUT, what + " on backend '" + plugin_.name + "'" + serving +
                                    " did not return within HVD_TIMEOUT (" +
                                    seconds_text(timeout_) + ") + " + seconds_text(kMargin) + ": " +
                                    consequence);
}

void Communicator::check(Clock::time_point now) {
  std::unique_lock<std::mutex> lock(call_mutex_);
  // Stamp what started since the last look, with the time read now, after the lock: a stamp is
  // never older than what it stamps. `now`, the sweep's, may be older: a comparison with it is
  // only ever late.
  Clock::rep serving = serving_deadline_.load(std::memory_order_acquire);
  if (serving < 0 && serving != kNotServing) {
    const Clock::rep stamp = (Clock::now() + timeout_ + kMargin).time_since_epoch().count();
    // Fails when that scope ended, and another may have begun, since the load: the next look
    // stamps it.
    serving = serving_deadline_.compare_exchange_strong(serving, stamp, std::memory_order_acq_rel)
                  ? stamp
                  : kNotServing;
  }
  if (!in_call_ || overran_) return;
  if (call_deadline_ == kUnstamped) call_deadline_ = Clock::now() + timeout_ + kMargin;
  const bool served_call_ended = serving > 0 && now >= Clock::time_point(Clock::duration(serving));
  if (now < call_deadline_ && !served_call_ended) return;
  overran_ = true;
  if (!call_abortable_) {
    const std::string what = call_what_;
    lock.unlock();
    log(HVD_LOG_ERROR, what + " on backend '" + plugin_.name + "' has run past HVD_TIMEOUT (" +
                           seconds_text(timeout_) + ") + " + seconds_text(kMargin) +
                           ": the plugin ignores its timeout, and hvd cannot interrupt it");
    return;
  }
  // Broken in the same step that marks the call overrun: the call, when it returns, finds the
  // communicator broken whatever the plugin returned.
  const Status why = timed_out_locked(call_what_);
  break_locked(why);
  lock.unlock();
  abort_backend();
  if (local_) local_->abort(why);
  if (cross_) cross_->abort(why);
}

Status Communicator::broken_by(const char* what, hvd_status code, const std::string& message) {
  abort(failed(what, code, message));
  return health();  // this error, or one that broke it first (an abort that made the call fail)
}

hvd_collective_args Communicator::stamped(const hvd_collective_args& args) const {
  hvd_collective_args a = args;
  a.struct_size = sizeof a;
  // The application call's deadline where one is being served (its stamp less the watchdog's
  // margin), else HVD_TIMEOUT from now: the plugin returns before the watchdog would end it.
  sdk::Deadline::Clock::time_point deadline = sdk::Deadline::coarse_now() + timeout_;
  const Clock::rep serving = serving_deadline_.load(std::memory_order_acquire);
  if (serving > 0) {
    deadline = std::min(deadline, Clock::time_point(Clock::duration(serving)) - kMargin);
  }
  // A stamp the args carry already (one application call of several backend calls) stands.
  if (args.deadline_ns > 0) {
    deadline = std::min(
        deadline, sdk::Deadline::Clock::time_point(std::chrono::nanoseconds(args.deadline_ns)));
  }
  a.deadline_ns = sdk::Deadline::to_ns(deadline);
  return a;
}

Status Communicator::call(hvd_collective entry, const char* what,
                          const hvd_collective_args* unstamped) {
  if (broken_.load(std::memory_order_acquire)) return health();
  hvd_collective_args stamp;
  const hvd_collective_args* args = nullptr;
  if (unstamped != nullptr) {
    stamp = stamped(*unstamped);
    args = &stamp;
  }
  if (plugin_.abort == nullptr) return call_on_runner(entry, what, args, deadline_from_now());
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (broken_.load(std::memory_order_relaxed)) return broken_status_;
    if (closing_) return finalized_already(what);
    if (in_call_) return another_call(what);
    in_call_ = true;
    call_abortable_ = true;
    call_what_ = what;
    call_deadline_ = kUnstamped;
    overran_ = false;
  }
  begin_backend_call();
  const hvd_status code = invoke(plugin_, backend_, entry, args);
  bool overran = false;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    in_call_ = false;
    overran = overran_;
  }
  if (overran) return health();
  if (code == HVD_SUCCESS) return Status::success();
  return broken_by(what, code, backend_call_message(code));
}

Status Communicator::call_on_runner(hvd_collective entry, const char* what,
                                    const hvd_collective_args* args, Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (broken_.load(std::memory_order_relaxed)) return broken_status_;
    if (closing_) return finalized_already(what);
    if (in_call_) return another_call(what);
    in_call_ = true;  // never checked by the watchdog: call_abortable_ is false
    call_abortable_ = false;
    overran_ = true;
  }
  struct EndCall {
    Communicator* self;
    ~EndCall() {
      std::lock_guard<std::mutex> lock(self->call_mutex_);
      self->in_call_ = false;
    }
  } end_call{this};
  try {
    return run_on_runner(entry, what, args, deadline);
  } catch (const std::exception& e) {  // copies or the runner's thread could not be had
    return error(HVD_ERR_SYSTEM, std::string(what) + " on backend '" + plugin_.name +
                                     "': no memory or thread to run it (" + e.what() + ")");
  }
}

Status Communicator::run_on_runner(hvd_collective entry, const char* what,
                                   const hvd_collective_args* args, Clock::time_point deadline) {
  // The job owns everything it passes the plugin: the args, the counts they point to, and, for
  // host memory, copies of the buffers. A call walked away from may still write its result (its
  // data may have arrived): into its own copy then, never into memory its caller has freed.
  // (CUDA memory cannot be copied here: a plugin without abort that takes it keeps the
  // caller's buffers.)
  struct Call {
    hvd_collective_args args{};
    std::vector<uint64_t> counts, send_counts;
    std::vector<char> send, recv;
  };
  auto owned = std::make_shared<Call>();
  uint64_t recv_bytes = 0;
  if (args != nullptr) {
    owned->args = *args;
    if (args->recv_counts != nullptr) {
      owned->counts.assign(args->recv_counts, args->recv_counts + world_.size);
      owned->args.recv_counts = owned->counts.data();
    }
    if (entry == HVD_COLLECTIVE_ALLTOALL) {
      owned->send_counts.assign(args->send_counts, args->send_counts + world_.size);
      owned->args.send_counts = owned->send_counts.data();
    }
    if (args->memory_type == HVD_MEMORY_HOST) {
      const size_t element = hvd_dtype_size(args->dtype);
      const uint64_t n = static_cast<uint64_t>(world_.size);
      uint64_t mine = 0;  // where this rank's input lies in the output when in place (elements)
      uint64_t total = args->count;
      uint64_t sent = args->count;
      if (entry == HVD_COLLECTIVE_ALLGATHER) {
        mine = static_cast<uint64_t>(world_.rank) * args->count;
        total = n * args->count;
        if (args->recv_counts != nullptr) {
          mine = sum(args->recv_counts, world_.rank);
          total = sum(args->recv_counts, world_.size);
        }
      } else if (entry == HVD_COLLECTIVE_REDUCE_SCATTER) {
        sent = n * args->count;
      } else if (entry == HVD_COLLECTIVE_ALLTOALL) {
        total = sum(args->recv_counts, world_.size);
      }
      recv_bytes = total * element;
      const uint64_t send_bytes = sent * element;
      const char* user_recv = static_cast<const char*>(args->recvbuf);
      const bool in_place =
          entry != HVD_COLLECTIVE_ALLTOALL && args->sendbuf == user_recv + mine * element;
      const bool sends = entry != HVD_COLLECTIVE_BROADCAST || args->root == world_.rank;
      owned->recv.resize(
          std::max<uint64_t>({recv_bytes, in_place ? mine * element + send_bytes : 0, 1}));
      owned->args.recvbuf = owned->recv.data();
      if (in_place) {
        if (sends && send_bytes > 0) {
          std::memcpy(owned->recv.data() + mine * element, args->sendbuf, send_bytes);
        }
        owned->args.sendbuf = owned->recv.data() + mine * element;
      } else if (args->sendbuf != nullptr && sends) {
        owned->send.assign(static_cast<const char*>(args->sendbuf),
                           static_cast<const char*>(args->sendbuf) + send_bytes);
        owned->args.sendbuf = owned->send.data();
      } else {
        owned->args.sendbuf = nullptr;  // a rank that sends nothing: no caller memory either
      }
    }
  }
  hvd_backend_comm* backend = backend_;
  const std::optional<Status> outcome = runner_.run(
      [plugin = plugin_, backend, owned, entry, has_args = args != nullptr] {
        begin_backend_call();
        return outcome_of(invoke(plugin, backend, entry, has_args ? &owned->args : nullptr));
      },
      deadline);
  if (!outcome) {
    // Overran, or the communicator was aborted meanwhile: this plugin cannot be interrupted, so
    // its call is left to finish on its own, and the communicator is never finalized under it.
    abort(timed_out(what));
    return health();
  }
  if (!outcome->ok()) return broken_by(what, outcome->code(), outcome->message());
  if (recv_bytes > 0) std::memcpy(args->recvbuf, owned->recv.data(), recv_bytes);
  return Status::success();
}

}  // namespace hvd::core
