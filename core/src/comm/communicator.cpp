#include "comm/communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "bootstrap/host.hpp"
#include "comm/agreement.hpp"
#include "comm/host_services.hpp"
#include "common/log.hpp"

namespace hvd::core {
namespace {

// Each hvd_init of a process takes the next epoch; every rank inits the same number of times,
// so keys of one init never collide with keys of an earlier one on the same store.
std::atomic<int> g_epoch{0};

// Derived alike on every rank: the world communicator of the epoch-th hvd_init (FNV-1a).
uint64_t world_comm_id(int epoch) {
  uint64_t hash = 1469598103934665603ull;
  for (const char c : "hvd world " + std::to_string(epoch)) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return hash;
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
                                                     const EnvLookup& env) {
  const std::string helper = knob(env, "BOOTSTRAP_BACKEND").value_or("mpi");
  HVD_ASSIGN_OR_RETURN(Plugin plugin, resolve_backend(helper, plugin_search_path(env)));
  if ((plugin.capabilities & HVD_CAP_SELF_BOOTSTRAP) == 0) {
    return error(HVD_ERR_UNSUPPORTED, "bootstrap backend '" + helper +
                                          "' cannot find its peers by itself (no self_bootstrap)");
  }
  CommOptions options;
  options.backend = plugin.path.string();
  options.timeout = timeout;
  options.purpose = "the bootstrap of " + for_backend;
  HVD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> bootstrap, Communicator::create(options, env));

  HVD_ASSIGN_OR_RETURN(SharedRendezvous made,
                       share_rendezvous(bootstrap->world(), env, [&](void* record, size_t size) {
                         return bootstrap->broadcast(bootstrap->control_args(record, record, size));
                       }));
  log(HVD_LOG_INFO, "rendezvous made through '" + helper + "' at " + made.address.to_string());
  return made;
}

// ---- Communicator -------------------------------------------------------------------------

Result<std::unique_ptr<Communicator>> Communicator::create(const CommOptions& options,
                                                           const EnvLookup& env) {
  std::unique_ptr<Communicator> comm(new Communicator);
  comm->device_memory_ = options.device_memory ? options.device_memory : &cuda_memory();
  HVD_ASSIGN_OR_RETURN(comm->world_, discover_world(env));
  const World& world = comm->world_;
  set_log_rank(world.rank);
  if (options.timeout) {
    comm->timeout_ = *options.timeout;
  } else {
    HVD_ASSIGN_OR_RETURN(comm->timeout_, timeout_from_env(env));
  }

  const int epoch = g_epoch++;
  const std::string prefix = "hvd/" + std::to_string(epoch) + "/";
  const std::string spec =
      options.backend ? *options.backend : knob(env, "BACKEND").value_or("gloo");
  Result<Plugin> loaded = resolve_backend(spec, plugin_search_path(env));
  std::string choice = describe_backend_choice(loaded);
  if (loaded.ok() && !options.purpose.empty()) choice += " as " + options.purpose;
  const std::string record = format_init_record(host_identity(env), world, choice);

  // Rendezvous: the job's TCP store, at HVD_RENDEZVOUS_ADDR or made through the launcher; an
  // in-process one for a lone process; none at all for a self-bootstrapping backend (MPI under
  // mpirun), which then checks the agreement itself.
  std::optional<HostPort> where;
  std::string secret;
  bool agree_after_init = false;
  if (const auto address = knob(env, "RENDEZVOUS_ADDR")) {
    HVD_ASSIGN_OR_RETURN(where, parse_host_port(*address));
    const auto given = knob(env, "SECRET");
    if (!given) {
      return error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_RENDEZVOUS_ADDR is set but HVD_SECRET is not: every rank needs the "
                   "job's shared secret (hvdrun sets both)");
    }
    secret = *given;
    if (world.rank == 0 && knob(env, "RENDEZVOUS_SERVER").value_or("rank0") != "external") {
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
          rendezvous_through_launcher(loaded->name, comm->timeout_, env);
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
  comm->comm_id_ = world_comm_id(epoch);
  comm->local_address_ = local_address;
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
  log(HVD_LOG_INFO, "rank " + std::to_string(world.rank) + "/" + std::to_string(world.size) + " (" +
                        world.source + ") on backend " + comm->plugin_.name + " from " +
                        comm->plugin_.path.string());
  return comm;
}

Status Communicator::init_backend() {
  const World& world = world_;
  services_ = std::make_unique<HostServices>(store_.get(), services_prefix_, world);
  hvd_backend_init_args args{};
  args.struct_size = sizeof args;
  args.rank = world.rank;
  args.size = world.size;
  args.local_rank = world.local_rank;
  args.local_size = world.local_size;
  args.timeout_ms = timeout_.count();
  args.local_address = local_address_.c_str();
  args.host = services_->table();
  std::vector<int32_t> members(static_cast<size_t>(world.size));
  for (int32_t r = 0; r < world.size; ++r) members[static_cast<size_t>(r)] = r;
  args.members = members.data();
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
        "init of backend '" + plugin_.name + "': rank " + std::to_string(args.rank) + " of " +
            std::to_string(args.size) + ", local rank " + std::to_string(args.local_rank) + " of " +
            std::to_string(args.local_size) + ", communicator " + std::to_string(args.comm_id));
  }
  hvd_backend_comm* backend = nullptr;
  HVD_RETURN_IF_ERROR(call_backend("init", [&] { return plugin_.table->init(&args, &backend); }));
  backend_ = backend;
  return Status::success();
}

Status Communicator::finalize_backend() {
  hvd_backend_comm* backend = std::exchange(backend_, nullptr);
  if (backend == nullptr) return Status::success();
  return call_backend("finalize", [&] { return plugin_.table->finalize(backend); });
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

Communicator::~Communicator() {
  const Status s = finalize_backend();
  if (!s.ok()) log(HVD_LOG_WARNING, s.message());
}

template <typename Fn>
Status Communicator::call_backend(const char* what, Fn&& fn) {
  begin_backend_call();
  const hvd_status code = fn();
  if (code == HVD_SUCCESS) return Status::success();
  const std::string message = backend_call_message(code);
  const bool known = code > HVD_SUCCESS && code <= HVD_ERR_IN_PROGRESS;
  return error(known ? code : HVD_ERR_INTERNAL,
               std::string(what) + " on backend '" + plugin_.name + "' failed: " + message);
}

Status Communicator::validate(const char* what, const hvd_collective_args& a, bool uses_op,
                              bool uses_root) const {
  auto invalid = [&](const std::string& why) {
    return error(HVD_ERR_INVALID_ARGUMENT, std::string(what) + ": " + why);
  };
  const size_t element = hvd_dtype_size(a.dtype);
  if (element == 0) return invalid("dtype " + std::to_string(a.dtype) + " is not an hvd_dtype");
  if (uses_op && (a.op < 0 || a.op >= HVD_REDUCE_OP_COUNT)) {
    return invalid("reduce op " + std::to_string(a.op) + " is not an hvd_reduce_op");
  }
  if (uses_root && (a.root < 0 || a.root >= world_.size)) {
    return invalid("root " + std::to_string(a.root) + " is not a rank of this job of " +
                   std::to_string(world_.size));
  }
  // A multiplication, not a division: this check runs on every call (see bench/micro).
  uint64_t total_bytes = 0;
  if (__builtin_mul_overflow(a.count, element * static_cast<uint64_t>(world_.size), &total_bytes)) {
    return invalid("count " + std::to_string(a.count) + " overflows the buffer size");
  }
  if (a.recv_counts != nullptr) {
    if ((plugin_.capabilities & HVD_CAP_ALLGATHERV) == 0 && a.memory_type != HVD_MEMORY_HOST &&
        !stages(a.memory_type)) {
      return error(HVD_ERR_UNSUPPORTED,
                   std::string(what) + ": backend '" + plugin_.name +
                       "' has no allgatherv for device memory (capabilities: " +
                       capabilities_to_string(plugin_.capabilities) + ")");
    }
    uint64_t total = 0;
    for (int r = 0; r < world_.size; ++r) {
      const uint64_t n = a.recv_counts[r];
      if (n > UINT64_MAX / element - total) return invalid("recv_counts overflow the buffer size");
      total += n;
    }
    if (total > 0 && a.recvbuf == nullptr) return invalid("recvbuf is NULL");
    if (a.recv_counts[world_.rank] != a.count) {
      return invalid("recv_counts[" + std::to_string(world_.rank) + "] is " +
                     std::to_string(a.recv_counts[world_.rank]) + " but this rank sends " +
                     std::to_string(a.count));
    }
  }
  const bool needs_send = !uses_root || a.root == world_.rank;
  if (a.count > 0 && (a.recvbuf == nullptr || (needs_send && a.sendbuf == nullptr))) {
    return invalid("buffer is NULL for " + std::to_string(a.count) + " elements");
  }
  const bool cuda = a.memory_type == HVD_MEMORY_CUDA;
  if (a.memory_type != HVD_MEMORY_HOST && !cuda) {
    return invalid("memory type " + std::to_string(a.memory_type) + " is not an hvd_memory_type");
  }
  // CUDA memory goes to a backend that takes it, or is staged through host memory.
  const uint64_t takes = cuda ? HVD_CAP_CUDA_MEMORY | HVD_CAP_HOST_MEMORY : HVD_CAP_HOST_MEMORY;
  if ((plugin_.capabilities & takes) == 0) {
    return error(HVD_ERR_UNSUPPORTED, std::string(what) + ": backend '" + plugin_.name +
                                          "' does not take " + (cuda ? "CUDA" : "host") +
                                          " memory (capabilities: " +
                                          capabilities_to_string(plugin_.capabilities) + ")");
  }
  // Only what the plugin declared reaches it (a 1.0 plugin declared every 1.0 dtype and op).
  const bool op_taken = !uses_op || plugin_.takes(a.op);
  if (!plugin_.takes(a.dtype) || !op_taken) {
    return error(
        HVD_ERR_UNSUPPORTED,
        std::string(what) + ": backend '" + plugin_.name + "' does not take " +
            hvd_dtype_name(a.dtype) + (uses_op ? std::string(" ") + hvd_reduce_op_name(a.op) : "") +
            " (its dtypes: " + dtypes_to_string(plugin_.dtypes) +
            (uses_op ? "; its reduce ops: " + reduce_ops_to_string(plugin_.reduce_ops) : "") + ")");
  }
  return Status::success();
}

template <typename Run>
Status Communicator::staged(const char* what, const hvd_collective_args& a, uint64_t in_offset,
                            uint64_t in_bytes, uint64_t out_bytes, Run&& run) {
  const auto failed = [&](const Status& s) {
    const std::string why = ": staging CUDA memory through host memory for backend '";
    return error(s.code(), what + why + plugin_.name + "': " + s.message());
  };
  if (staging_.size() < std::max(in_offset + in_bytes, out_bytes)) {
    staging_.resize(std::max(in_offset + in_bytes, out_bytes));
  }
  char* stage = staging_.data();
  // The copies are ordered after the caller's work on its stream, and waited for: the input must
  // be in host memory before the backend reads it, and the staging buffer serves the next call.
  // A rank whose copy fails leaves its peers in the collective, to time out as with any rank that
  // fails outside it.
  if (in_bytes > 0) {
    const Status s =
        device_memory_->copy_and_wait(stage + in_offset, a.sendbuf, in_bytes, a.device, a.stream);
    if (!s.ok()) return failed(s);
  }
  hvd_collective_args host = a;
  host.memory_type = HVD_MEMORY_HOST;
  host.device = -1;
  host.stream = nullptr;
  host.sendbuf = stage + in_offset;
  host.recvbuf = stage;
  HVD_RETURN_IF_ERROR(run(host));
  if (out_bytes == 0) return Status::success();
  const Status s = device_memory_->copy_and_wait(a.recvbuf, stage, out_bytes, a.device, a.stream);
  return s.ok() ? s : failed(s);
}

Status Communicator::allreduce(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate("allreduce", args, /*uses_op=*/true, /*uses_root=*/false));
  if (stages(args.memory_type)) {
    const uint64_t bytes = args.count * hvd_dtype_size(args.dtype);
    return staged("allreduce", args, 0, bytes, bytes,
                  [&](const hvd_collective_args& host) { return allreduce(host); });
  }
  return call_backend("allreduce", [&] { return plugin_.table->allreduce(backend_, &args); });
}

Status Communicator::allgather(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate("allgather", args, /*uses_op=*/false, /*uses_root=*/false));
  if (stages(args.memory_type)) {
    const size_t element = hvd_dtype_size(args.dtype);
    uint64_t before = static_cast<uint64_t>(world_.rank) * args.count;  // this rank's offset
    uint64_t total = static_cast<uint64_t>(world_.size) * args.count;
    if (args.recv_counts != nullptr) {
      before = 0;
      total = 0;
      for (int r = 0; r < world_.size; ++r) {
        if (r < world_.rank) before += args.recv_counts[r];
        total += args.recv_counts[r];
      }
    }
    return staged("allgather", args, before * element, args.count * element, total * element,
                  [&](const hvd_collective_args& host) { return allgather(host); });
  }
  if (args.recv_counts == nullptr || (plugin_.capabilities & HVD_CAP_ALLGATHERV) != 0) {
    const hvd_collective_args a = without_reduction(args);
    return call_backend("allgather", [&] { return plugin_.table->allgather(backend_, &a); });
  }
  // A backend without allgatherv (host memory, checked above): each rank's part is broadcast
  // from it, in place in recvbuf.
  const size_t element = hvd_dtype_size(args.dtype);
  char* part = static_cast<char*>(args.recvbuf);
  for (int r = 0; r < world_.size; ++r) {
    const uint64_t count = args.recv_counts[r];
    if (count == 0) continue;
    if (r == world_.rank && part != args.sendbuf) std::memmove(part, args.sendbuf, count * element);
    hvd_collective_args piece = without_reduction(args);
    piece.sendbuf = part;
    piece.recvbuf = part;
    piece.count = count;
    piece.root = r;
    piece.recv_counts = nullptr;
    HVD_RETURN_IF_ERROR(
        call_backend("allgatherv", [&] { return plugin_.table->broadcast(backend_, &piece); }));
    part += count * element;
  }
  return Status::success();
}

Status Communicator::broadcast(const hvd_collective_args& args) {
  HVD_RETURN_IF_ERROR(validate("broadcast", args, /*uses_op=*/false, /*uses_root=*/true));
  if (stages(args.memory_type)) {
    const uint64_t bytes = args.count * hvd_dtype_size(args.dtype);
    return staged("broadcast", args, 0, args.root == world_.rank ? bytes : 0, bytes,
                  [&](const hvd_collective_args& host) { return broadcast(host); });
  }
  const hvd_collective_args a = without_reduction(args);
  return call_backend("broadcast", [&] { return plugin_.table->broadcast(backend_, &a); });
}

hvd_collective_args Communicator::without_reduction(const hvd_collective_args& args) const {
  // The op of a call that reduces nothing is whatever the caller left there; the plugin gets one
  // it declared instead (it never sees a value it did not declare).
  hvd_collective_args a = args;
  a.op = plugin_.any_reduce_op();
  return a;
}

hvd_collective_args Communicator::control_args(const void* send, void* recv, size_t bytes) const {
  const hvd_dtype dtype = plugin_.byte_dtype();  // whose size divides any multiple of 8
  return host_args(send, recv, bytes / hvd_dtype_size(dtype), dtype);
}

Status Communicator::barrier() {
  return call_backend("barrier", [&] { return plugin_.table->barrier(backend_); });
}

}  // namespace hvd::core
