#include "endpoint.hpp"

#include <dirent.h>
#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sched.h>
#include <signal.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

namespace hvd::ofi {
namespace {

// Tags: bit 63 marks a notice (its low bits are the sender's rank); otherwise bits 32..55 are
// the call's sequence number, bits 0..31 the message's index within the call, bit 62 marks a
// message that travels apart (above the inject size, where Shapes are checked) and bit 61 a
// Shape.
constexpr uint64_t kNoticeBit = uint64_t{1} << 63;
constexpr uint64_t kApartBit = uint64_t{1} << 62;
constexpr uint64_t kShapeBit = uint64_t{1} << 61;
constexpr uint64_t kSequenceMask = (uint64_t{1} << 24) - 1;

// An endpoint name as the out-of-band allgather carries it, with what the ranks must agree on:
// the same size on every rank. A rank that could not open its endpoint sends its error instead
// (`failure`, its text in `name`), so that the others fail at once naming it.
constexpr size_t kNameBytes = 192;
struct NameRecord {
  uint32_t length = 0;
  char provider[44] = {};
  uint32_t rxm_eager_limit = 0;  // the eager limit this rank's ofi_rxm works out (0: not rxm)
  int32_t pid = 0;
  uint64_t pid_namespace = 0;  // the inode of /proc/self/ns/pid (0: unknown)
  int32_t failure = 0;         // an hvd_status: this rank's endpoint did not open
  uint32_t reserved = 0;
  uint64_t shared[Endpoint::kMaxShared] = {};  // the values of the settings every rank shares
  unsigned char name[kNameBytes] = {};
};
static_assert(sizeof(NameRecord) == 72 + 8 * Endpoint::kMaxShared + kNameBytes);

// The eager limit ofi_rxm (libfabric 1.17) works out for an endpoint, which it requires to be the
// same at both ends of a connection (rxm_ep_init_proto, rxm_verify_connreq): over tcp,
// FI_OFI_RXM_EAGER_LIMIT read as libfabric reads a size (strtol, any base), but at least its
// buffer size, which it reports as the inject size; elsewhere the buffer size.
uint32_t rxm_eager_limit(const fi_info& info) {
  const size_t buffer = info.tx_attr->inject_size;
  size_t eager = buffer;
  const char* text = std::getenv("FI_OFI_RXM_EAGER_LIMIT");
  if (std::strncmp(info.fabric_attr->prov_name, "tcp;", 4) == 0 && text != nullptr) {
    eager = std::max(static_cast<size_t>(std::strtol(text, nullptr, 0)), buffer);
  }
  return static_cast<uint32_t>(eager);  // as rxm sends it
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

Status fabric_error(const char* what, ssize_t code) {
  return Status(HVD_ERR_SYSTEM,
                std::string("ofi: ") + what + " failed: " + fi_strerror(static_cast<int>(-code)));
}

template <typename Fid>
void close_fid(Fid*& object) {
  if (object != nullptr) fi_close(&object->fid);
  object = nullptr;
}

// libfabric 1.17's shm names each endpoint's shared-memory region /dev/shm/<pid>:<n>:<m> and
// creates it exclusively. A process that died without closing its endpoint (a rank killed, an
// endpoint left open) leaves its region behind (16 MiB), and a later process given the same pid
// fails to open one (fi_enable: "Device or resource busy"). So before this process's first shm
// endpoint, the regions of pids that no process has any more are removed, and those named for
// this process's pid that it does not map (a dead predecessor's); a peer that still maps one keeps
// its mapping.
void remove_dead_shm_regions() {
  static std::once_flag once;
  std::call_once(once, [] {
    DIR* dir = ::opendir("/dev/shm");
    if (dir == nullptr) return;
    const long self = static_cast<long>(::getpid());
    std::string maps;  // what this process maps, /dev/shm regions among them
    if (std::FILE* file = std::fopen("/proc/self/maps", "r")) {
      char chunk[4096];
      for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, file)) > 0;)
        maps.append(chunk, got);
      std::fclose(file);
    }
    while (const dirent* entry = ::readdir(dir)) {
      long pid = 0;
      int n = 0, m = 0, length = 0;
      if (std::sscanf(entry->d_name, "%ld:%d:%d%n", &pid, &n, &m, &length) != 3 ||
          entry->d_name[length] != '\0' || pid <= 0) {
        continue;
      }
      const std::string path = std::string("/dev/shm/") + entry->d_name;
      const bool dead = ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
      const bool predecessors = pid == self && maps.find(path + "\n") == std::string::npos;
      if (dead || predecessors) (void)::unlink(path.c_str());
    }
    ::closedir(dir);
  });
}

}  // namespace

Result<std::unique_ptr<Endpoint>> Endpoint::open(const sdk::InitContext& ctx,
                                                 const std::string& provider, size_t message_bytes,
                                                 const std::vector<Shared>& shared,
                                                 const Status& failed_before) {
  std::unique_ptr<Endpoint> ep(new Endpoint());
  ep->rank_ = ctx.rank;
  ep->size_ = ctx.size;
  ep->members_ = ctx.members;
  ep->timeout_ = ctx.timeout;
  ep->call_budget_ = ep->timeout_ - ep->blame_grace();
  ep->provider_ = provider;
  const size_t n = static_cast<size_t>(ctx.size);
  ep->heard_.assign(n, Notice{});
  ep->unsent_.assign(n, false);
  ep->liveness_checked_.assign(n, false);
  ep->shape_sent_.assign(n, 0);
  ep->shape_posted_.assign(n, 0);
  ep->shape_matched_.assign(n, 0);
  ep->shapes_heard_.assign(n, ShapeMessage{});
  ep->shape_ops_.assign(n, Op{});
  Status opened = failed_before;
  if (opened.ok()) opened = ep->open_objects(ctx, provider, message_bytes);
  HVD_RETURN_IF_ERROR(ep->connect(ctx, shared, opened));
  HVD_RETURN_IF_ERROR(ep->post_notice_receive());
  return ep;
}

Endpoint::~Endpoint() {
  // A broken endpoint left open (break_endpoint) stays open for the life of the process, its
  // objects kept reachable (not a leak: they are still the provider's).
  if (broken_ && leave_open_when_broken_) {
    static std::mutex mutex;
    static auto* kept = new std::vector<std::array<void*, 6>>();
    const std::lock_guard<std::mutex> lock(mutex);
    kept->push_back({ep_, av_, cq_, domain_, fabric_, info_});
    return;
  }
  // The endpoint first: closing it cancels what it had posted.
  close_fid(ep_);
  close_fid(av_);
  close_fid(cq_);
  close_fid(domain_);
  close_fid(fabric_);
  if (info_ != nullptr) fi_freeinfo(info_);
}

Status Endpoint::open_objects(const sdk::InitContext& ctx, const std::string& provider,
                              size_t message_bytes) {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) return Status(HVD_ERR_SYSTEM, "ofi: fi_allocinfo failed");
  // Reliable datagrams with tagged messages matched by source. No memory registration: hvd asks
  // only for providers that move unregistered buffers (shm, tcp;ofi_rxm; rxm over verbs registers
  // and caches internally).
  hints->caps = FI_TAGGED | FI_DIRECTED_RECV;
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = 0;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (provider == "shm") remove_dead_shm_regions();
  // Across hosts, listen on the address the peers reach this host at; on one host shm needs none.
  const bool bind_address = provider != "shm" && !ctx.local_address.empty();
  // libfabric's providers start here, libinfinipath's catching the process's signals again.
  const sdk::SignalDispositions signals;
  auto get_info = [&](fi_info** out) {
    return fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
                      bind_address ? ctx.local_address.c_str() : nullptr, nullptr,
                      bind_address ? FI_SOURCE : 0, hints, out);
  };
  const int found = get_info(&info_);
  std::vector<std::string> offered;  // where none is `provider`: those that meet the same hints
  if (found != 0) {
    std::free(hints->fabric_attr->prov_name);
    hints->fabric_attr->prov_name = nullptr;
    fi_info* all = nullptr;
    if (get_info(&all) == 0) {
      for (const fi_info* info = all; info != nullptr; info = info->next) {
        const std::string name = info->fabric_attr->prov_name;
        if (std::find(offered.begin(), offered.end(), name) == offered.end()) {
          offered.push_back(name);
        }
      }
      fi_freeinfo(all);
    }
  }
  (void)signals.restore_changed();
  fi_freeinfo(hints);
  if (found != 0) {
    std::string names;
    for (const std::string& name : offered) names += (names.empty() ? "" : ", ") + name;
    return Status(
        HVD_ERR_UNSUPPORTED,
        "ofi: libfabric has no provider '" + provider + "' with reliable tagged messages" +
            (bind_address ? " on " + ctx.local_address : std::string()) + " (" +
            fi_strerror(-found) +
            "); HVD_OFI_PROVIDER takes one of those it has: " + (names.empty() ? "none" : names));
  }
  const bool rxm = std::string(info_->fabric_attr->prov_name).find("ofi_rxm") != std::string::npos;
  std::string limits;
  if (rxm) {
    // Over tcp, ofi_rxm hands a tagged send up to its eager limit straight to tcp, which lands it
    // in the posted receive; a larger one waits for a rendezvous of three legs, each needing a
    // rank of a busy host to progress it. So the collectives' messages go eagerly. rxm reads the
    // limit from the environment as it opens an endpoint (libfabric 1.17 to 1.19, over tcp); a
    // limit the user set stays. It sends the limit as 32 bits: at most 1 GiB here. Over verbs it
    // reads none.
    const size_t eager = std::min<size_t>(message_bytes, size_t{1} << 30);
    ::setenv("FI_OFI_RXM_EAGER_LIMIT", std::to_string(eager).c_str(), 0);
    rxm_eager_limit_ = rxm_eager_limit(*info_);
    limits = ", eager limit " + std::to_string(rxm_eager_limit_) + " B";
  }
  int code = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
  if (code != 0) return fabric_error("fi_fabric", code);
  code = fi_domain(fabric_, info_, &domain_, nullptr);
  if (code != 0) return fabric_error("fi_domain", code);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = info_->rx_attr->size + info_->tx_attr->size;
  // The caller polls (wait_until). Past its spin, a wait over ofi_rxm sleeps in the kernel on the
  // queue's descriptor, leaving the core to the ranks that share it and to the kernel's TCP work.
  // Only there: shm's peers write its memory, which wakes no descriptor, and net's stays readable
  // with nothing to read, so a wait on it would spin through poll.
  cq_attr.wait_obj = rxm ? FI_WAIT_FD : FI_WAIT_NONE;
  code = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
  if (code != 0 && cq_attr.wait_obj != FI_WAIT_NONE) {
    cq_attr.wait_obj = FI_WAIT_NONE;  // a provider without one: yield, as on shm
    code = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
  }
  if (code != 0) return fabric_error("fi_cq_open", code);
  if (cq_attr.wait_obj == FI_WAIT_FD && fi_control(&cq_->fid, FI_GETWAIT, &wait_fd_) != 0) {
    wait_fd_ = -1;
  }
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = static_cast<size_t>(size_);
  code = fi_av_open(domain_, &av_attr, &av_, nullptr);
  if (code != 0) return fabric_error("fi_av_open", code);
  code = fi_endpoint(domain_, info_, &ep_, nullptr);
  if (code != 0) return fabric_error("fi_endpoint", code);
  code = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (code != 0) return fabric_error("binding the completion queue", code);
  code = fi_ep_bind(ep_, &av_->fid, 0);
  if (code != 0) return fabric_error("binding the address vector", code);
  code = fi_enable(ep_);
  if (code != 0) return fabric_error("fi_enable", code);
  // Only where data moves when this rank progresses it: then a transfer left posted stays still.
  // FI_OFI_RXM_DATA_AUTO_PROGRESS (a libfabric boolean) starts a thread of rxm's own that moves
  // it whatever the domain says: such an endpoint is closed.
  const char* auto_progress = std::getenv("FI_OFI_RXM_DATA_AUTO_PROGRESS");
  const bool rxm_moves_data_itself =
      auto_progress != nullptr &&
      (std::strcmp(auto_progress, "1") == 0 || strcasecmp(auto_progress, "true") == 0 ||
       strcasecmp(auto_progress, "yes") == 0 || strcasecmp(auto_progress, "on") == 0);
  leave_open_when_broken_ =
      rxm && info_->domain_attr->data_progress == FI_PROGRESS_MANUAL && !rxm_moves_data_itself;
  inject_size_ = info_->tx_attr->inject_size;
  // shm's larger messages go by cross-memory attach, whose copy (libfabric 1.17's smr_cma_loop)
  // loops forever on a message longer than the receive it meets: Shapes keep that from happening.
  shape_checks_ = std::strcmp(info_->fabric_attr->prov_name, "shm") == 0;
  description_ = std::string(info_->fabric_attr->prov_name) + " on " + info_->domain_attr->name +
                 ", fabric " + info_->fabric_attr->name + limits;
  return Status::success();
}

Status Endpoint::connect(const sdk::InitContext& ctx, const std::vector<Shared>& shared,
                         const Status& opened) {
  NameRecord mine;
  if (opened.ok()) {
    size_t length = sizeof(mine.name);
    const int code = fi_getname(&ep_->fid, mine.name, &length);
    if (code != 0) return fabric_error("fi_getname", code);
    mine.length = static_cast<uint32_t>(length);
    std::strncpy(mine.provider, info_->fabric_attr->prov_name, sizeof(mine.provider) - 1);
  } else {
    mine.failure = opened.code();
    std::strncpy(reinterpret_cast<char*>(mine.name), opened.message().c_str(),
                 sizeof(mine.name) - 1);
  }
  mine.rxm_eager_limit = rxm_eager_limit_;
  mine.pid = static_cast<int32_t>(::getpid());
  mine.pid_namespace = pid_namespace();
  for (size_t i = 0; i < shared.size() && i < kMaxShared; ++i) mine.shared[i] = shared[i].value;
  std::vector<NameRecord> all(static_cast<size_t>(size_));
  HVD_RETURN_IF_ERROR(ctx.host.oob_allgather(&mine, sizeof(mine), all.data(), ctx.timeout)
                          .with_context("ofi: exchanging endpoint names"));
  if (!opened.ok()) return opened;
  // "rank 0 shm, rank 1 tcp;ofi_rxm": what each rank says, for an error the same on every rank.
  auto each_rank = [&](auto&& says) {
    std::string list;
    for (int r = 0; r < size_; ++r) {
      list += (r > 0 ? ", " : "") + name_of(r) + " " + says(all[static_cast<size_t>(r)]);
    }
    return list;
  };
  for (int r = 0; r < size_; ++r) {
    const NameRecord& theirs = all[static_cast<size_t>(r)];
    if (theirs.failure == 0) continue;
    return Status(
        static_cast<hvd_status>(theirs.failure),
        "ofi: " + name_of(r) + " could not open its endpoint: " +
            std::string(reinterpret_cast<const char*>(theirs.name),
                        strnlen(reinterpret_cast<const char*>(theirs.name), sizeof(theirs.name))));
  }
  // Every rank must speak the same provider: say which rank uses which, the same on every rank.
  for (const NameRecord& theirs : all) {
    if (std::strncmp(theirs.provider, mine.provider, sizeof(mine.provider)) != 0 ||
        theirs.length > sizeof(theirs.name)) {
      return Status(HVD_ERR_MISMATCH, "ofi: the ranks use different libfabric providers (" +
                                          each_rank([](const NameRecord& record) {
                                            return std::string(
                                                record.provider,
                                                strnlen(record.provider, sizeof(record.provider)));
                                          }) +
                                          "); set the same HVD_OFI_PROVIDER on every rank");
    }
  }
  // The algorithms' crossovers and segments must be the same on every rank: ranks that chose
  // different algorithms, or cut their messages otherwise, would meet messages they do not expect.
  for (size_t i = 0; i < shared.size() && i < kMaxShared; ++i) {
    for (const NameRecord& theirs : all) {
      if (theirs.shared[i] == mine.shared[i]) continue;
      return Status(HVD_ERR_MISMATCH, std::string("ofi: the ranks' ") + shared[i].name +
                                          " differ (" + each_rank([i](const NameRecord& record) {
                                            return std::to_string(record.shared[i]);
                                          }) +
                                          "); set the same on every rank, or leave it unset");
    }
  }
  // ofi_rxm refuses a connection between endpoints whose eager limits differ, and the sends
  // would wait for it until the timeout: say so now, the same on every rank.
  for (const NameRecord& theirs : all) {
    if (theirs.rxm_eager_limit == mine.rxm_eager_limit) continue;
    return Status(HVD_ERR_MISMATCH,
                  "ofi: the ranks' ofi_rxm eager limits differ (" +
                      each_rank([](const NameRecord& record) {
                        return std::to_string(record.rxm_eager_limit) + " B";
                      }) +
                      "), and rxm connects only endpoints whose limits agree; set the same "
                      "FI_OFI_RXM_EAGER_LIMIT and FI_OFI_RXM_BUFFER_SIZE, and the same "
                      "HVD_OFI_SEGMENT_BYTES, on every rank");
  }
  // On shm every rank is a process of this host: where all share this process's pid namespace,
  // a peer's pid tells whether it still lives.
  bool pids_mean_here = provider_ == "shm" && mine.pid_namespace != 0;
  for (const NameRecord& theirs : all) {
    pids_mean_here = pids_mean_here && theirs.pid_namespace == mine.pid_namespace;
  }
  if (pids_mean_here) {
    for (const NameRecord& theirs : all) peer_pids_.push_back(static_cast<pid_t>(theirs.pid));
    // /proc may be another pid namespace's (a new namespace without its own /proc mounted).
    char self[32] = {};
    const ssize_t got = ::readlink("/proc/self", self, sizeof self - 1);
    proc_is_ours_ = got > 0 && std::atol(self) == static_cast<long>(::getpid());
  }
  addresses_.assign(static_cast<size_t>(size_), FI_ADDR_UNSPEC);
  for (int r = 0; r < size_; ++r) {
    const int inserted = fi_av_insert(av_, all[static_cast<size_t>(r)].name, 1,
                                      &addresses_[static_cast<size_t>(r)], 0, nullptr);
    if (inserted != 1) {
      return Status(HVD_ERR_SYSTEM, "ofi: fi_av_insert of " + name_of(r) + "'s address failed");
    }
  }
  return Status::success();
}

Status Endpoint::post_notice_receive() {
  notice_op_ = Op{};
  notice_op_.peer = -1;
  notice_op_.bytes = sizeof(notice_);
  const uint64_t ignore = ~kNoticeBit;  // from any rank
  ssize_t posted = -FI_EAGAIN;
  for (int attempt = 0; attempt < 1000 && posted == -FI_EAGAIN; ++attempt) {
    posted = fi_trecv(ep_, &notice_, sizeof(notice_), nullptr, FI_ADDR_UNSPEC, kNoticeBit, ignore,
                      &notice_op_.context);
    if (posted == -FI_EAGAIN) (void)fi_cq_read(cq_, nullptr, 0);
  }
  return posted == 0 ? Status::success() : fabric_error("posting the notice receive", posted);
}

bool Endpoint::take_notice(size_t bytes, uint64_t tag) {
  const NoticeMessage message = notice_;
  (void)post_notice_receive();  // best effort: the endpoint is failing
  auto is_peer = [this](int rank) { return rank >= 0 && rank < size_ && rank != rank_; };
  auto known = [](Finding found) {
    return found == Finding::kSilent || found == Finding::kUnreachable || found == Finding::kGone;
  };
  const Notice& sender = message.sender;
  if (bytes != sizeof(message) || !is_peer(sender.rank) ||
      (tag & ~kNoticeBit) != static_cast<uint64_t>(sender.rank) || !known(sender.found) ||
      !known(message.relayed.found)) {
    return false;
  }
  heard_[static_cast<size_t>(sender.rank)] = sender;
  if (!notice_arrived_) first_heard_ = sender;
  notice_arrived_ = true;
  // Every rank sends one notice: a relayed one is the same as the rank's own, heard or not yet.
  const Notice& relayed = message.relayed;
  if (is_peer(relayed.rank) && relayed.rank != sender.rank &&
      heard_[static_cast<size_t>(relayed.rank)].rank < 0) {
    heard_[static_cast<size_t>(relayed.rank)] = relayed;
  }
  return true;
}

std::string Endpoint::name_of(int peer) const {
  const std::string name = "rank " + std::to_string(peer);
  if (peer < 0 || peer >= static_cast<int>(members_.size()) ||
      members_[static_cast<size_t>(peer)] == peer) {
    return name;
  }
  return name + " (job rank " + std::to_string(members_[static_cast<size_t>(peer)]) + ")";
}

uint64_t Endpoint::tag(uint32_t index, size_t bytes) const {
  return (uint64_t{sequence_ & kSequenceMask} << 32) | index |
         (travels_apart(bytes) ? kApartBit : 0);
}

Status Endpoint::check_usable() const {
  if (aborted()) {
    return Status(HVD_ERR_STATE, "ofi: the communicator was aborted; it takes no more calls");
  }
  if (broken_) {
    return Status(broken_status_.code() == HVD_SUCCESS ? HVD_ERR_REMOTE : broken_status_.code(),
                  "ofi: the communicator failed earlier (" + broken_status_.message() +
                      "); it takes no more calls");
  }
  return Status::success();
}

Status Endpoint::end(Status failure) {
  if (failure.ok() && pending_ != 0) {
    failure = Status(HVD_ERR_INTERNAL,
                     std::string("ofi ") + call_ + ": the call ended with a message in flight");
  }
  if (failure.ok()) {
    ops_.clear();
  } else if (!broken_) {
    broken_status_ = failure;
    break_endpoint(failure.code());
  }
  release();
  return failure;
}

Status Endpoint::refuse(uint32_t before, const char* what) {
  if ((before & kInCall) != 0) {  // abort() owns the endpoint this moment, breaking it
    return Status(HVD_ERR_STATE, "ofi: the communicator was aborted; it takes no more calls");
  }
  Status refused;
  try {
    if (aborted() && !broken_) {
      broken_status_ = Status(HVD_ERR_STATE, "the communicator was aborted");
      break_endpoint(HVD_ERR_STATE);
    } else if (notice_arrived_ && !broken_) {  // the last call's data came before a notice
      call_ = what;
      refused = notice_failure(first_heard_.rank);
      broken_status_ = refused;
      break_endpoint(refused.code());
    }
    if (refused.ok()) refused = check_usable();
  } catch (const std::exception& e) {  // no memory for a message: the endpoint is released still
    refused = Status(HVD_ERR_SYSTEM, std::string("ofi ") + what + ": " + e.what());
  }
  release();
  return refused;
}

void Endpoint::release() {
  const uint32_t before = state_.fetch_and(~kInCall, std::memory_order_acq_rel);
  // An abort that came during the call left the peers to it.
  if ((before & kAborted) != 0) break_if_aborted_and_free();
}

void Endpoint::break_if_aborted_and_free() {
  uint32_t expected = kAborted;
  if (!state_.compare_exchange_strong(expected, kAborted | kInCall, std::memory_order_acq_rel)) {
    return;  // a call owns the endpoint: it breaks it as it ends
  }
  if (!broken_) {
    broken_status_ = Status(HVD_ERR_STATE, "the communicator was aborted");
    quick_notices_ = true;  // abort() waits on no peer: what cannot go at once does not go
    break_endpoint(HVD_ERR_STATE);
  }
  state_.fetch_and(~kInCall, std::memory_order_release);
}

void Endpoint::abort() {
  state_.fetch_or(kAborted, std::memory_order_acq_rel);
  break_if_aborted_and_free();
}

void Endpoint::send_notices(hvd_status code) {
  if (notices_sent_ || ep_ == nullptr) return;
  notices_sent_ = true;
  // Best effort, to every peer: an inject needs no completion.
  sent_.sender = Notice{rank_, static_cast<int32_t>(code), waits_for_, found_};
  if (waits_for_ >= 0 && waits_for_ < size_)
    sent_.relayed = heard_[static_cast<size_t>(waits_for_)];
  if (inject_size_ < sizeof(sent_)) return;
  notice_everyone();
  // A peer this rank never sent to takes a notice only once both have progressed their
  // connection (shm, ofi_rxm): up to 100 ms for that. Over ofi_rxm the notices then leave as this
  // thread progresses the endpoint, behind whatever the call had queued for the same peers (ring
  // segments of a MiB): 10 ms of progress lets them go. shm delivers them as it takes them.
  const auto start = std::chrono::steady_clock::now();
  const auto flushed = start + std::chrono::milliseconds(rxm_eager_limit_ != 0 ? 10 : 0);
  const auto given_up = quick_notices_ ? flushed : start + std::chrono::milliseconds(100);
  for (;;) {
    resend_notices();
    const auto now = std::chrono::steady_clock::now();
    const bool all_taken = std::find(unsent_.begin(), unsent_.end(), true) == unsent_.end();
    if ((all_taken && now >= flushed) || now >= given_up) return;
    (void)drain();
  }
}

int Endpoint::gone_in_flight(int checked) {
  std::fill(liveness_checked_.begin(), liveness_checked_.end(), false);
  if (checked >= 0 && checked < size_) liveness_checked_[static_cast<size_t>(checked)] = true;
  size_t in_flight = 0;
  for (const Op& op : ops_) {
    if (in_flight == pending_) break;  // the rest are done
    if (op.done) continue;
    ++in_flight;
    if (op.peer < 0 || op.peer >= size_ || liveness_checked_[static_cast<size_t>(op.peer)]) {
      continue;
    }
    liveness_checked_[static_cast<size_t>(op.peer)] = true;
    if (gone(op.peer)) return op.peer;
  }
  return -1;
}

bool Endpoint::gone(int peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= peer_pids_.size() || peer == rank_) return false;
  const pid_t pid = peer_pids_[static_cast<size_t>(peer)];
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  if (!proc_is_ours_) return false;
  // Killed and not yet reaped by its parent: exiting (PF_EXITING in the flags), a zombie ('Z') or
  // dead ('X') in /proc/PID/stat.
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) return false;
  char text[512] = {};
  const size_t got = std::fread(text, 1, sizeof text - 1, file);
  std::fclose(file);
  const char* paren = std::strrchr(text, ')');  // the command name may hold spaces and parens
  char state = 0;
  unsigned flags = 0;
  constexpr unsigned kExiting = 0x4;  // PF_EXITING, include/linux/sched.h
  if (got == 0 || paren == nullptr ||
      std::sscanf(paren + 1, " %c %*d %*d %*d %*d %*d %u", &state, &flags) != 2) {
    return false;
  }
  if (state != 'Z' && state != 'X' && (flags & kExiting) == 0) return false;
  // A main thread that ended alone (pthread_exit) looks the same: its process lives on while it
  // has other threads.
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
  std::ifstream status(path);
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8) <= 1;
  }
  return true;
}

void Endpoint::resend_notices() {
  for (int r = 0; r < size_; ++r) {
    if (!unsent_[static_cast<size_t>(r)]) continue;
    // A rank that died inside libfabric may hold its region's lock for good: sending to it would
    // spin on that lock forever.
    if (gone(r)) {
      unsent_[static_cast<size_t>(r)] = false;
      continue;
    }
    // A peer not yet connected (over ofi_rxm, or shm's first message to it) takes EAGAIN until
    // both ends have progressed the connection.
    const ssize_t sent = fi_tinject(ep_, &sent_, sizeof(sent_), addresses_[static_cast<size_t>(r)],
                                    kNoticeBit | static_cast<uint64_t>(rank_));
    if (sent != -FI_EAGAIN) unsent_[static_cast<size_t>(r)] = false;
  }
}

void Endpoint::break_endpoint(hvd_status code) {
  broken_ = true;
  send_notices(code);
  // No wait follows (begin() refuses a broken endpoint): nap() must not run after close_fid(ep_).
  deferred_.clear();  // never posted
  deferred_ready_ = 0;
  if (!leave_open_when_broken_) {
    close_fid(ep_);  // cancels every posted operation: nothing touches the caller's buffers after
    ops_.clear();
    pending_ = 0;
    return;
  }
  // ofi_rxm with manual data progress: cancel what is posted and never call into the endpoint
  // again (every later call fails before it would), so no transfer moves on; the Ops stay, as
  // their contexts may still be the provider's.
  for (Op& op : ops_) {
    if (!op.done) (void)fi_cancel(&ep_->fid, &op.context);
  }
  for (int i = 0; i < 100; ++i) (void)fi_cq_read(cq_, nullptr, 0);
}

uint64_t Endpoint::shape_tag() const {
  return kShapeBit | (uint64_t{sequence_ & kSequenceMask} << 32);
}

std::string Endpoint::transfer(bool is_send, int peer) const {
  return std::string("ofi ") + call_ + ": " + (is_send ? "sending to " : "receiving from ") +
         name_of(peer);
}

Status Endpoint::post_failure(bool is_send, int peer, ssize_t code) const {
  return Status(HVD_ERR_SYSTEM,
                transfer(is_send, peer) + " failed: " + fi_strerror(static_cast<int>(-code)));
}

Result<Op*> Endpoint::try_send(int peer, uint32_t index, const void* buffer, size_t bytes) {
  const size_t p = static_cast<size_t>(peer);
  if (travels_apart(bytes) && shape_matched_[p] != sequence_) {  // the peer's Shape first
    if (shape_posted_[p] != sequence_) {
      Op& shape_op = shape_ops_[p];
      shape_op = Op{};
      shape_op.is_shape = true;
      shape_op.peer = peer;
      shape_op.bytes = sizeof(ShapeMessage);
      const ssize_t posted = fi_trecv(ep_, &shapes_heard_[p], sizeof(ShapeMessage), nullptr,
                                      addresses_[p], shape_tag(), 0, &shape_op.context);
      if (posted == -FI_EAGAIN) return static_cast<Op*>(nullptr);
      if (posted != 0) {
        return post_failure(false, peer, posted);
      }
      shape_posted_[p] = sequence_;
    }
    Op* op = &ops_.emplace_back();
    op->is_send = true;
    op->peer = peer;
    op->bytes = bytes;
    deferred_.push_back(Deferred{op, index, buffer});
    ++pending_;
    return op;
  }
  ops_.emplace_back();
  Op* op = &ops_.back();
  op->is_send = true;
  op->peer = peer;
  op->bytes = bytes;
  // A message the provider takes inline is sent and done on return: no completion to wait for.
  const bool inject = bytes <= inject_size_;
  const ssize_t posted = inject ? fi_tinject(ep_, buffer, bytes, addresses_[p], tag(index, bytes))
                                : fi_tsend(ep_, buffer, bytes, nullptr, addresses_[p],
                                           tag(index, bytes), &op->context);
  if (posted == 0) {
    op->done = inject;
    if (!inject) ++pending_;
    return op;
  }
  ops_.pop_back();
  if (posted == -FI_EAGAIN) return static_cast<Op*>(nullptr);
  return post_failure(true, peer, posted);
}

Result<Op*> Endpoint::try_recv(int peer, uint32_t index, void* buffer, size_t bytes) {
  const size_t p = static_cast<size_t>(peer);
  if (travels_apart(bytes) && shape_sent_[p] != sequence_) {  // this call's first such from peer
    const ShapeMessage message{shape(), bytes, index, 0};
    const ssize_t sent = fi_tinject(ep_, &message, sizeof(message), addresses_[p], shape_tag());
    if (sent == -FI_EAGAIN) return static_cast<Op*>(nullptr);
    if (sent != 0) {
      return post_failure(true, peer, sent);
    }
    shape_sent_[p] = sequence_;
  }
  ops_.emplace_back();
  Op* op = &ops_.back();
  op->peer = peer;
  op->bytes = bytes;
  const ssize_t posted =
      fi_trecv(ep_, buffer, bytes, nullptr, addresses_[p], tag(index, bytes), 0, &op->context);
  if (posted == 0) {
    ++pending_;
    return op;
  }
  ops_.pop_back();
  if (posted == -FI_EAGAIN) return static_cast<Op*>(nullptr);
  return post_failure(false, peer, posted);
}

Result<Op*> Endpoint::post(bool is_send, int peer, uint32_t index, void* buffer, size_t bytes) {
  {  // The provider's queue is seldom full: a first try without the waiting loop's set-up.
    Result<Op*> posted =
        is_send ? try_send(peer, index, buffer, bytes) : try_recv(peer, index, buffer, bytes);
    if (!posted.ok() || *posted != nullptr) return posted;
  }
  Op* op = nullptr;
  Status failure;
  HVD_RETURN_IF_ERROR(wait_until(
      [&] {
        Result<Op*> posted =
            is_send ? try_send(peer, index, buffer, bytes) : try_recv(peer, index, buffer, bytes);
        if (!posted.ok()) failure = posted.status();
        op = posted.ok() ? *posted : nullptr;
        return op != nullptr || !failure.ok();
      },
      [peer] { return peer; }));
  if (!failure.ok()) return failure;
  return op;
}

Status Endpoint::exchange(int peer, uint32_t index, const void* send, void* recv, size_t bytes) {
  const fi_addr_t address = addresses_[static_cast<size_t>(peer)];
  Op* in = &ops_.emplace_back();
  in->peer = peer;
  in->bytes = bytes;
  if (bytes <= inject_size_ &&
      fi_trecv(ep_, recv, bytes, nullptr, address, tag(index, bytes), 0, &in->context) == 0) {
    ++pending_;
    if (fi_tinject(ep_, send, bytes, address, tag(index, bytes)) == 0) return wait(in);
    // The receive is posted: the send waits for room, or fails with the reason.
    HVD_RETURN_IF_ERROR(this->send(peer, index, send, bytes).status());
    return wait_all();
  }
  ops_.pop_back();
  HVD_ASSIGN_OR_RETURN(Op * received, this->recv(peer, index, recv, bytes));
  HVD_ASSIGN_OR_RETURN(Op * sent, this->send(peer, index, send, bytes));
  HVD_RETURN_IF_ERROR(wait(received));
  return wait(sent);
}

Result<bool> Endpoint::progress() {
  if (deferred_ready_ != 0) HVD_RETURN_IF_ERROR(post_deferred());
  fi_cq_tagged_entry entries[16];
  const ssize_t n = fi_cq_read(cq_, entries, 16);
  if (n > 0) {
    bool notice = false;
    for (ssize_t i = 0; i < n; ++i) {
      Op* op = static_cast<Op*>(entries[i].op_context);
      if (op == nullptr) continue;  // not one of this endpoint's posts (fi_tinject asks for none)
      if (op == &notice_op_) {      // after the rest: the data that came before it may end the call
        notice = take_notice(entries[i].len, entries[i].tag) || notice;
        continue;
      }
      if (op->is_shape) {
        if (entries[i].len != sizeof(ShapeMessage)) {
          return Status(HVD_ERR_MISMATCH, std::string("ofi ") + call_ + ": " + name_of(op->peer) +
                                              " sent a call description of " +
                                              std::to_string(entries[i].len) + " bytes");
        }
        HVD_RETURN_IF_ERROR(take_shape(op->peer));
        continue;
      }
      if (!op->is_send && entries[i].len != op->bytes) {
        return Status(HVD_ERR_MISMATCH,
                      std::string("ofi ") + call_ + ": " + name_of(op->peer) + " sent " +
                          std::to_string(entries[i].len) + " bytes where " +
                          std::to_string(op->bytes) +
                          " were expected (the ranks disagree on the call, its count or dtype)");
      }
      complete(op);
    }
    if (deferred_ready_ != 0) HVD_RETURN_IF_ERROR(post_deferred());
    if (!notice) return true;
    stopped_by_notice_ = true;
    return Status(HVD_ERR_REMOTE, "ofi: a peer's notice");
  }
  if (n == -FI_EAGAIN) return false;
  if (n != -FI_EAVAIL) return fabric_error("fi_cq_read", n);
  fi_cq_err_entry error{};
  const ssize_t read = fi_cq_readerr(cq_, &error, 0);
  if (read != 1) return fabric_error("fi_cq_readerr", read);
  const Op* op = static_cast<const Op*>(error.op_context);
  const int err = std::abs(error.err);  // shm reports its errors negated
  // The provider's own words, where they add to the error's.
  std::string detail = fi_strerror(err);
  const std::string provider_says =
      fi_cq_strerror(cq_, error.prov_errno, error.err_data, nullptr, 0);
  if (provider_says != detail) detail += " (" + provider_says + ")";
  if (op == &notice_op_) {
    (void)post_notice_receive();
    return Status(HVD_ERR_REMOTE, std::string("ofi ") + call_ + ": a peer's notice: " + detail);
  }
  if (op == nullptr) {
    // A failed fi_tinject may still report its error, with no context to say to whom.
    return Status(HVD_ERR_REMOTE,
                  std::string("ofi ") + call_ + ": a message sent inline failed: " + detail);
  }
  const std::string what = transfer(op->is_send, op->peer);
  if (err == FI_ETRUNC) {
    return Status(HVD_ERR_MISMATCH, what + ": it sent more than the " + std::to_string(op->bytes) +
                                        " bytes expected (the ranks disagree on the call, its "
                                        "count or dtype)");
  }
  unreachable_ = op->peer;  // no notice to it: a dying shm peer may hold its region's lock
  return blame(HVD_ERR_REMOTE, what + " failed: " + detail, op->peer, Finding::kUnreachable);
}

Status Endpoint::take_shape(int peer) {
  const size_t p = static_cast<size_t>(peer);
  shape_ops_[p].done = true;
  const ShapeMessage& heard = shapes_heard_[p];
  const std::string what = std::string("ofi ") + call_ + ": " + name_of(peer) + " ";
  if (heard.shape != shape()) {
    return Status(HVD_ERR_MISMATCH, what + "called " + heard.shape.describe() +
                                        " where this rank called " + shape().describe());
  }
  for (const auto& [op, index, buffer] : deferred_) {
    if (op->peer == peer && index == heard.index && op->bytes != heard.bytes) {
      return Status(HVD_ERR_MISMATCH, what + "expects " + std::to_string(heard.bytes) +
                                          " bytes where this rank sends " +
                                          std::to_string(op->bytes) +
                                          " (the ranks disagree on the " + call_ + "'s counts)");
    }
  }
  shape_matched_[p] = sequence_;
  for (const Deferred& send : deferred_) deferred_ready_ += send.op->peer == peer ? 1 : 0;
  return Status::success();
}

Status Endpoint::post_deferred() {
  size_t kept = 0;
  Status failure;
  for (const Deferred& send : deferred_) {
    Op* op = send.op;
    const size_t p = static_cast<size_t>(op->peer);
    if (failure.ok() && shape_matched_[p] == sequence_) {
      const ssize_t posted = fi_tsend(ep_, send.buffer, op->bytes, nullptr, addresses_[p],
                                      tag(send.index, op->bytes), &op->context);
      if (posted == 0) {
        --deferred_ready_;
        continue;
      }
      if (posted != -FI_EAGAIN) {
        failure = post_failure(true, op->peer, posted);
      }
    }
    deferred_[kept++] = send;
  }
  deferred_.resize(kept);
  return failure;
}

const Shape& Endpoint::shape() {
  if (shape_known_) return shape_;
  shape_ = Shape::of(call_collective_, call_args_, size_);
  shape_known_ = true;
  return shape_;
}

void Endpoint::complete(Op* op) {
  if (op == nullptr || op->done) return;  // a failed fi_tinject's error has no Op
  op->done = true;
  --pending_;
}

Status Endpoint::wait_all() {
  auto first_pending = [this]() -> const Op* {
    for (const Op& op : ops_) {
      if (!op.done) return &op;
    }
    return nullptr;
  };
  return wait_until([this] { return pending_ == 0; },
                    [&] {
                      const Op* op = first_pending();
                      return op != nullptr ? op->peer : -1;
                    });
}

// A peer gave up: this rank gives up too, telling the others whom it waits for, and names the
// rank at the end of the chain of waits.
Status Endpoint::notice_failure(int waiting_for) {
  const Notice notice = first_heard_;
  const std::string what = std::string("ofi ") + call_ + ": " + name_of(notice.rank) +
                           " gave up on the communicator (" +
                           hvd_status_name(static_cast<hvd_status>(notice.code)) + ")";
  return blame(HVD_ERR_REMOTE, what, waiting_for, Finding::kSilent, true);
}

Status Endpoint::peer_died(int peer) {
  return blame(HVD_ERR_REMOTE, std::string("ofi ") + call_, peer, Finding::kGone);
}

Status Endpoint::timeout_failure(int peer) {
  const double seconds = std::chrono::duration<double>(timeout_).count();
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", seconds);
  return blame(HVD_ERR_TIMEOUT,
               std::string("ofi ") + call_ + ": nothing arrived from or left for " + name_of(peer) +
                   " within the call's " + text + " s (HVD_TIMEOUT)",
               peer, Finding::kSilent);
}

// The rank this one waits for may itself wait for a rank that stopped or died: every rank that
// gives up tells the others whom it waits for, and listens a moment for theirs (blame_grace,
// within the call's timeout), so that the error follows the chain to the rank at its end. It
// stops listening as soon as the chain ends at a rank that failed on its own, or closes on itself.
Status Endpoint::blame(hvd_status code, const std::string& what, int waiting_for, Finding found,
                       bool by_notice) {
  waits_for_ = waiting_for;
  found_ = found;
  // What has come already first: a rank that exited after giving up left its notice behind, and
  // this rank's notice relays the one of the rank it waits for.
  drain();
  send_notices(code);
  // The chain starts at the rank this one waits for; a notice's error has not named it yet.
  int start = notice_arrived_ ? first_heard_.rank : -1;
  std::string chain;
  if (waiting_for >= 0 && waiting_for != rank_) {
    start = waiting_for;
    if (by_notice && waiting_for != first_heard_.rank) {
      chain = "; this rank waits for " + name_of(waiting_for);
    }
  }
  auto resolve = [&](bool final) -> std::optional<std::string> {
    std::optional<std::string> origin = origin_heard();
    return origin
               ? origin
               : chain_from(start, start == waiting_for ? found : Finding::kSilent, final, chain);
  };
  const auto until = std::chrono::steady_clock::now() + blame_grace();
  std::optional<std::string> blamed = resolve(false);
  while (!blamed && std::chrono::steady_clock::now() < until && !aborted()) {
    resend_notices();
    if (!drain()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    relay_late_notice();
    blamed = resolve(false);
  }
  relay_late_notice();
  if (!blamed) blamed = resolve(true);
  return Status(code, what + *blamed);
}

void Endpoint::notice_everyone() {
  for (int r = 0; r < size_; ++r) unsent_[static_cast<size_t>(r)] = r != rank_ && r != unreachable_;
}

void Endpoint::relay_late_notice() {
  if (!notices_sent_ || sent_.relayed.rank >= 0 || waits_for_ < 0 || waits_for_ >= size_) return;
  const Notice& heard = heard_[static_cast<size_t>(waits_for_)];
  if (heard.rank < 0 || inject_size_ < sizeof(sent_)) return;
  sent_.relayed = heard;
  notice_everyone();
  resend_notices();  // a peer with no room now gets it only as the grace loop goes on
}

bool Endpoint::drain() {
  bool any = false;
  for (int round = 0; round < 64; ++round) {  // bounded: peers may keep sending
    fi_cq_tagged_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (fi_cq_readerr(cq_, &error, 0) == 1 && error.op_context == &notice_op_) {
        (void)post_notice_receive();
      }
      any = true;
      continue;
    }
    if (n <= 0) break;
    any = true;
    for (ssize_t i = 0; i < n; ++i) {
      Op* op = static_cast<Op*>(entries[i].op_context);
      if (op == &notice_op_) {
        (void)take_notice(entries[i].len, entries[i].tag);
      } else if (op->is_shape) {
        op->done = true;  // the call is failing: its deferred sends stay unposted
      } else {
        complete(op);
      }
    }
  }
  return any;
}

// A rank that failed on its own (aborted, a message of the wrong size) is where the failure
// began, whoever waits for whom: the first such notice heard names it.
std::optional<std::string> Endpoint::origin_heard() const {
  auto on_its_own = [this](const Notice& notice) {
    return notice.rank >= 0 && (notice.waits_for < 0 || notice.waits_for >= size_) &&
           (notice.code == HVD_ERR_STATE || notice.code == HVD_ERR_MISMATCH);
  };
  const Notice* origin = notice_arrived_ && on_its_own(first_heard_) ? &first_heard_ : nullptr;
  for (const Notice& notice : heard_) {
    if (origin == nullptr && on_its_own(notice)) origin = &notice;
  }
  if (origin == nullptr) return std::nullopt;
  if (origin->code == HVD_ERR_STATE) return ": " + name_of(origin->rank) + " was aborted";
  return ": " + name_of(origin->rank) + " failed (" +
         hvd_status_name(static_cast<hvd_status>(origin->code)) + ")";
}

std::string Endpoint::verdict(int peer, Finding found) const {
  if (found == Finding::kGone || gone(peer)) {
    const bool pid_known = peer >= 0 && static_cast<size_t>(peer) < peer_pids_.size();
    return "is gone (its process " +
           (pid_known ? std::to_string(peer_pids_[static_cast<size_t>(peer)]) + " " : "") +
           "exited or was killed)";
  }
  return found == Finding::kUnreachable ? "failed or is unreachable"
                                        : "stopped, died, or is in another call";
}

const Endpoint::Notice* Endpoint::first_hand_report(int about) const {
  const Notice* first = nullptr;
  for (const Notice& notice : heard_) {
    if (notice.rank < 0 || notice.found == Finding::kSilent || notice.waits_for < 0 ||
        notice.waits_for >= size_ || notice.waits_for == rank_ ||
        heard_[static_cast<size_t>(notice.waits_for)].rank >= 0) {
      continue;
    }
    if (notice.waits_for == about) return &notice;
    if (first == nullptr) first = &notice;
  }
  return first;
}

std::optional<std::string> Endpoint::chain_from(int start, Finding found, bool final,
                                                std::string chain) const {
  std::vector<bool> seen(static_cast<size_t>(size_), false);
  seen[static_cast<size_t>(rank_)] = true;
  for (int at = start; at >= 0 && at < size_;) {
    if (seen[static_cast<size_t>(at)]) {
      return chain +
             ": the ranks wait for one another (they are in different calls, or disagree on "
             "this one)";
    }
    seen[static_cast<size_t>(at)] = true;
    const Notice& notice = heard_[static_cast<size_t>(at)];
    if (notice.rank < 0 && gone(at)) return chain + ": " + name_of(at) + " " + verdict(at, found);
    if (notice.rank < 0) {  // nothing heard from it
      if (!final) return std::nullopt;
      // It may only be late. Another rank may have found it failed first hand; or else found
      // another rank failed, which is then the better guess at where the failure began.
      const Notice* report = found == Finding::kSilent ? first_hand_report(at) : nullptr;
      if (report != nullptr && report->waits_for == at) {
        found = report->found;
        report = nullptr;
      }
      chain += ": " + name_of(at) + " " + verdict(at, found);
      if (report == nullptr) return chain;
      return chain + "; " + name_of(report->rank) + " waits for " + name_of(report->waits_for) +
             ": " + name_of(report->waits_for) + " " + verdict(report->waits_for, report->found);
    }
    if (notice.waits_for < 0 || notice.waits_for >= size_) {  // it failed, waiting for no one
      return chain + ": " + name_of(at) + " failed (" +
             hvd_status_name(static_cast<hvd_status>(notice.code)) + ")";
    }
    chain += "; " + name_of(at) + " waits for " +
             (notice.waits_for == rank_ ? std::string("this rank") : name_of(notice.waits_for));
    at = notice.waits_for;
    found = notice.found;
  }
  return chain;  // no rank to follow: the error says all there is
}

// After the spin: sleep on the completion queue's descriptor where it has one, a millisecond at
// most, so that the deadline and an abort are seen. Where the provider's try finds completions
// pending, yield once: the next progress() reads them. Where there is no descriptor, or the try
// fails otherwise, yield, then sleep: a long wait (a peer still computing) must not take a core
// from the ranks that share it. Never after close_fid(ep_): ofi_rxm's endpoint stays in the
// queue's wait set (break_endpoint).
void Endpoint::nap(std::chrono::steady_clock::duration idle) const {
  if (wait_fd_ >= 0) {
    fid* queue = &cq_->fid;
    const int tried = fi_trywait(fabric_, &queue, 1);
    if (tried == FI_SUCCESS) {
      pollfd ready{wait_fd_, POLLIN | POLLOUT, 0};
      (void)poll(&ready, 1, 1);
      return;
    }
    if (tried == -FI_EAGAIN) {
      sched_yield();
      return;
    }
  }
  if (idle < std::chrono::milliseconds(2)) {
    sched_yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace hvd::ofi
