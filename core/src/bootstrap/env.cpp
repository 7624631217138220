#include "bootstrap/env.hpp"

#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "hvd/sdk/env.hpp"

namespace hvd::core {
namespace {

Result<int> parse_int(const std::string& name, const std::string& text) {
  const std::optional<uint64_t> value = sdk::parse_whole(text, 1 << 30);
  if (!value) {
    return error(HVD_ERR_INVALID_ARGUMENT, name + "='" + text + "' is not a non-negative integer");
  }
  return static_cast<int>(*value);
}

// Slurm's SLURM_TASKS_PER_NODE, e.g. "2(x3),1": the task count of node `node`, nullopt where it
// lists no such node.
Result<std::optional<int>> slurm_tasks_on_node(const std::string& spec, int node) {
  uint64_t seen = 0;
  for (const std::string& group : split(spec, ',')) {
    const std::string_view text(group);
    const size_t x = text.find("(x");
    const std::optional<uint64_t> tasks = sdk::parse_whole(text.substr(0, x), 1 << 30);
    std::optional<uint64_t> repeat = 1;
    if (x != std::string_view::npos) {
      repeat = text.back() == ')'
                   ? sdk::parse_whole(text.substr(x + 2, text.size() - x - 3), 1 << 30)
                   : std::nullopt;
    }
    if (!tasks || !repeat) {
      return error(HVD_ERR_INVALID_ARGUMENT,
                   "SLURM_TASKS_PER_NODE='" + spec + "' is not a list of task counts like 2(x3),1");
    }
    if (static_cast<uint64_t>(node) < seen + *repeat)
      return std::optional<int>(static_cast<int>(*tasks));
    seen += *repeat;
  }
  return std::optional<int>();
}

struct Source {
  const char* label;
  bool launcher;  // a process launcher (not hvdrun or the user) set these
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

}  // namespace

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(separator, pos);
    if (end == std::string::npos) end = text.size();
    if (end > pos) pieces.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return pieces;
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

Result<World> discover_world(const EnvLookup& env) {
  const Source sources[] = {
      {"HVD_* variables", false, "HVD_RANK", "HVD_SIZE", "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE"},
      {"HOROVOD_* variables", false, "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
       "HOROVOD_LOCAL_SIZE"},
      {"Open MPI", true, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI", true, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"Slurm", true, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
  };
  for (const Source& source : sources) {
    const auto rank_text = env(source.rank);
    const auto size_text = env(source.size);
    if (!rank_text && !size_text) continue;
    if (!rank_text || !size_text) {
      return error(HVD_ERR_INVALID_ARGUMENT,
                   std::string(rank_text ? source.rank : source.size) + " is set but " +
                       (rank_text ? source.size : source.rank) + " is not: set both");
    }
    World world;
    world.source = source.label;
    world.from_launcher = source.launcher;
    HVD_ASSIGN_OR_RETURN(world.rank, parse_int(source.rank, *rank_text));
    HVD_ASSIGN_OR_RETURN(world.size, parse_int(source.size, *size_text));
    if (world.size < 1 || world.rank >= world.size) {
      return error(HVD_ERR_INVALID_ARGUMENT, std::string(source.rank) + "=" + *rank_text +
                                                 " is not a rank of " + source.size + "=" +
                                                 *size_text);
    }
    // Without local information, assume all ranks share this host.
    world.local_rank = world.rank;
    world.local_size = world.size;
    if (auto text = env(source.local_rank)) {
      HVD_ASSIGN_OR_RETURN(world.local_rank, parse_int(source.local_rank, *text));
    }
    if (source.local_size != nullptr) {
      if (auto text = env(source.local_size)) {
        HVD_ASSIGN_OR_RETURN(world.local_size, parse_int(source.local_size, *text));
      }
    } else if (auto spec = env("SLURM_TASKS_PER_NODE")) {
      int node = 0;
      if (auto text = env("SLURM_NODEID")) {
        HVD_ASSIGN_OR_RETURN(node, parse_int("SLURM_NODEID", *text));
      }
      HVD_ASSIGN_OR_RETURN(const std::optional<int> tasks, slurm_tasks_on_node(*spec, node));
      if (tasks) world.local_size = *tasks;
    }
    if (world.local_size < 1 || world.local_rank >= world.local_size ||
        world.local_size > world.size) {
      return error(HVD_ERR_INVALID_ARGUMENT,
                   std::string("inconsistent ") + source.label + ": local rank " +
                       std::to_string(world.local_rank) + " of local size " +
                       std::to_string(world.local_size) + " in a job of " +
                       std::to_string(world.size));
    }
    return world;
  }
  return World{};
}

}  // namespace hvd::core
