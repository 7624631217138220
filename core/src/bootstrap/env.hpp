// env.hpp — the environment, and who this process is in the job (the knobs: settings.hpp).
#ifndef HVD_CORE_BOOTSTRAP_ENV_HPP
#define HVD_CORE_BOOTSTRAP_ENV_HPP

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hvd/sdk/result.hpp"

namespace hvd::core {

// Looks a variable up; empty values count as unset. Injected so tests need no real environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// The non-empty pieces of `text` between `separator`s ("a::b" -> {"a", "b"}).
std::vector<std::string> split(const std::string& text, char separator);

// Where this process sits in the job, and which launcher said so.
struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string source = "default (single process)";
  bool from_launcher = false;  // Open MPI, PMI or Slurm said so (not hvdrun or the user)
};

// HVD_RANK/HVD_SIZE/HVD_LOCAL_RANK/HVD_LOCAL_SIZE (set by hvdrun), else Open MPI's
// OMPI_COMM_WORLD_*, else PMI_RANK/PMI_SIZE, else Slurm's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID;
// none of them: a single process. Malformed or inconsistent values are errors, not guesses.
Result<World> discover_world(const EnvLookup& env);

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_ENV_HPP
