#include "bootstrap/settings.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "hvd/sdk/env.hpp"

namespace hvd::core {
namespace {

constexpr double kNoMax = 0;

// Choices as the error lists them: "a, b or c".
std::string listed(const std::string& choices) {
  const std::vector<std::string> each = split(choices, '|');
  std::string text;
  for (size_t i = 0; i < each.size(); ++i) {
    if (i > 0) text += i + 1 == each.size() ? " or " : ", ";
    text += each[i];
  }
  return text;
}

std::string whole(double value) { return std::to_string(static_cast<int64_t>(value)); }

// `text` as a whole finite number, nullopt where it is not one.
std::optional<double> finite_number(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

const std::vector<KnobSpec>& knob_table() {
  using T = KnobType;
  static const std::vector<KnobSpec> table = {
      {"BACKEND", true, T::kText, "gloo", 0, kNoMax, nullptr,
       "backend name, or a path to a plugin .so", nullptr},
      {"PLUGIN_PATH", false, T::kText, nullptr, 0, kNoMax, nullptr,
       "extra plugin directories, :-separated, searched before the install location", nullptr},
      {"TIMEOUT", true, T::kSeconds, "30", 0, 1e7, nullptr,
       "seconds that bound every wait (rendezvous, peers, each backend call, each blocking call)",
       nullptr},
      {"CHECK_ARGS", true, T::kFlag, "0", 0, kNoMax, nullptr,
       "1: blocking collectives compare their arguments across the ranks first", nullptr},
      {"CONTROLLER", true, T::kText, "gloo", 0, kNoMax, nullptr,
       "backend that carries hvd's own messages where the chosen one cannot (NCCL)", nullptr},
      {"HOSTNAME", true, T::kText, nullptr, 0, kNoMax, nullptr,
       "this rank's host, as hvd groups ranks (local rank and size)", nullptr},
      {"RENDEZVOUS_ADDR", true, T::kText, nullptr, 0, kNoMax, nullptr,
       "host:port of the rendezvous store (set by hvdrun)", nullptr},
      {"SECRET", true, T::kText, nullptr, 0, kNoMax, nullptr,
       "shared secret every rendezvous connection presents (set by hvdrun)", nullptr},
      {"RENDEZVOUS_SERVER", true, T::kChoice, "rank0", 0, kNoMax, "rank0|external",
       "external: the launcher hosts the store; rank0: rank 0 does", nullptr},
      {"RENDEZVOUS_IFACE", true, T::kText, nullptr, 0, kNoMax, nullptr,
       "interface whose address rank 0 or hvdrun advertises for the rendezvous", nullptr},
      {"BOOTSTRAP_BACKEND", true, T::kText, "mpi", 0, kNoMax, nullptr,
       "self-bootstrapping backend that makes a rendezvous under mpirun or srun", nullptr},
      {"HIERARCHICAL_ALLREDUCE", true, T::kFlag, "0", 0, kNoMax, nullptr,
       "1: allreduces of 64 KiB or more run within each host, then across hosts", nullptr},
      // Below 64 KiB a chunk's latency is all there is.
      {"HIERARCHICAL_CHUNK_BYTES", true, T::kBytes, "2097152", 65536, kNoMax, nullptr,
       "bytes per chunk of the hierarchical allreduce's pipeline; 0: no pipeline", nullptr},
      {"LOG_LEVEL", true, T::kChoice, "warning", 0, kNoMax, "error|warning|info|debug|trace|fatal",
       "what hvd logs to stderr (Horovod's trace is debug, fatal is error)", nullptr},
      {"CYCLE_TIME", true, T::kNumber, "1", 0, 1e6, nullptr,
       "milliseconds between the scheduler's negotiation cycles", nullptr},
      {"FUSION_THRESHOLD", true, T::kNumber, "134217728", 0, 1099511627776.0, nullptr,
       "bytes of one fusion buffer; 0 turns fusion off", nullptr},
      {"CACHE_CAPACITY", true, T::kNumber, "1024", 0, 1e9, nullptr,
       "tensors the response cache remembers; 0 turns it off", nullptr},
      {"TIMELINE", true, T::kText, nullptr, 0, kNoMax, nullptr,
       "file for a Chrome trace of every tensor (rank 0 writes it); DYNAMIC: none", nullptr},
      {"TIMELINE_MARK_CYCLES", true, T::kFlag, "0", 0, kNoMax, nullptr,
       "1: mark each negotiation cycle in the timeline", nullptr},
      {"STALL_CHECK_TIME_SECONDS", true, T::kNumber, "60", 0, 1e7, nullptr,
       "warn when ranks wait this long for others to submit a tensor; 0 off", nullptr},
      {"STALL_CHECK_DISABLE", true, T::kFlag, "0", 0, kNoMax, nullptr, "1: no stall warnings",
       nullptr},
      {"STALL_SHUTDOWN_TIME_SECONDS", true, T::kNumber, "0", 0, 1e7, nullptr,
       "stop the scheduler on every rank after a stall this long; 0 never", nullptr},
      {"DEVICE_EXECUTOR", true, T::kFlag, "1", 0, kNoMax, nullptr,
       "0: CUDA tensors go to a backend that takes CUDA memory as they are, unfused", nullptr},
      // Read elsewhere.
      {"RANK", true, T::kElsewhere, nullptr, 0, kNoMax, nullptr, "this process's rank in the job",
       "the launcher discovery (bootstrap/env.cpp)"},
      {"SIZE", true, T::kElsewhere, nullptr, 0, kNoMax, nullptr, "the job's number of ranks",
       "the launcher discovery (bootstrap/env.cpp)"},
      {"LOCAL_RANK", true, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "this process's rank on its host", "the launcher discovery (bootstrap/env.cpp)"},
      {"LOCAL_SIZE", true, T::kElsewhere, nullptr, 0, kNoMax, nullptr, "the ranks on this host",
       "the launcher discovery (bootstrap/env.cpp)"},
      {"GLOO_IFACE", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "network interface Gloo binds to", "the gloo plugin"},
      {"GLOO_HOSTNAME", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr, "address Gloo binds to",
       "the gloo plugin"},
      {"MPI_ALGORITHMS", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "mpi: hvd (hvd's algorithms over point-to-point) or library (MPI's own collectives)",
       "the mpi plugin"},
      {"OFI_PROVIDER", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "libfabric provider of the ofi backend", "the ofi plugin"},
      {"OFI_RING_ALLREDUCE_BYTES", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "ofi: allreduces of at least this many bytes take the ring", "the ofi plugin"},
      {"OFI_SEGMENT_BYTES", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "ofi: bytes of one ring segment", "the ofi plugin"},
      {"OFI_SEGMENTS_IN_FLIGHT", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "ofi: ring segments in flight per peer", "the ofi plugin"},
      {"OFI_SCATTER_BROADCAST_BYTES", false, T::kElsewhere, nullptr, 0, kNoMax, nullptr,
       "ofi: broadcasts of at least this many bytes scatter, then allgather", "the ofi plugin"},
  };
  return table;
}

const KnobSpec& spec(Knob knob) { return knob_table()[static_cast<size_t>(knob)]; }

Settings::Settings() {
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobSpec& s = knob_table()[i];
    values_[i] = s.fallback != nullptr ? s.fallback : "";
    variables_[i] = std::string("HVD_") + s.name;
    numbers_[i] = s.fallback != nullptr ? std::strtod(s.fallback, nullptr) : 0;
  }
}

Result<Settings> Settings::read(const EnvLookup& env) {
  std::vector<Problem> problems;
  Settings settings = read_leniently(env, &problems);
  if (!problems.empty()) return problems.front().why;
  return settings;
}

Settings Settings::read_leniently(const EnvLookup& env, std::vector<Problem>* problems) {
  Settings settings;
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobSpec& s = knob_table()[i];
    const std::string hvd = std::string("HVD_") + s.name;
    std::optional<std::string> value = env(hvd);
    std::string variable = hvd;
    if (!value && s.horovod) {
      variable = std::string("HOROVOD_") + s.name;
      value = env(variable);
      if (!value) variable = hvd;
    }
    const Status taken = settings.take(static_cast<Knob>(i), variable, value);
    if (!taken.ok() && problems != nullptr) problems->push_back({static_cast<Knob>(i), taken});
  }
  return settings;
}

Result<Settings> Settings::with(Knob knob, const std::string& value) const {
  Settings copy = *this;
  HVD_RETURN_IF_ERROR(copy.take(knob, std::string("HVD_") + spec(knob).name, value));
  return copy;
}

Status Settings::take(Knob knob, const std::string& variable,
                      const std::optional<std::string>& value) {
  const size_t i = index(knob);
  const KnobSpec& s = spec(knob);
  if (!value) return Status::success();
  const std::string& text = *value;
  const auto refused = [&](const std::string& what) {
    return error(HVD_ERR_INVALID_ARGUMENT, variable + "='" + text + "' is not " + what);
  };
  double number = 0;
  switch (s.type) {
    case KnobType::kText:
    case KnobType::kElsewhere:
      break;
    case KnobType::kChoice: {  // in any case, as Horovod reads its log level
      bool known = false;
      for (const std::string& choice : split(s.choices, '|'))
        known = known || choice == lower(text);
      if (!known) return refused("one of " + listed(s.choices) + " (in any case)");
      break;
    }
    case KnobType::kFlag:
      if (text != "0" && text != "1") return refused("0 or 1");
      break;
    case KnobType::kNumber: {
      const std::optional<double> parsed = finite_number(text);
      if (!parsed || *parsed < s.min || *parsed > s.max) {
        return refused("a number from " + whole(s.min) + " to " + whole(s.max));
      }
      number = *parsed;
      break;
    }
    case KnobType::kSeconds: {
      const std::optional<double> parsed = finite_number(text);
      if (!parsed || !(*parsed > 0) || *parsed > s.max) {
        return refused("a number of seconds above 0 and at most " + whole(s.max) + " (" +
                       whole(s.max / 86400) + " days)");
      }
      number = *parsed;
      break;
    }
    case KnobType::kBytes: {
      const std::optional<uint64_t> bytes = sdk::parse_whole(text);
      if (!bytes || (*bytes != 0 && static_cast<double>(*bytes) < s.min)) {
        return refused("0 or a byte count of at least " + whole(s.min));
      }
      number = static_cast<double>(*bytes);
      break;
    }
  }
  values_[i] = s.type == KnobType::kChoice ? lower(text) : text;
  variables_[i] = variable;
  numbers_[i] = number;
  set_[i] = true;
  return Status::success();
}

std::optional<std::string> Settings::optional(Knob knob) const {
  if (!is_set(knob)) return std::nullopt;
  return text(knob);
}

std::chrono::milliseconds Settings::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(number(Knob::kTimeout) * 1000)));
}

}  // namespace hvd::core
