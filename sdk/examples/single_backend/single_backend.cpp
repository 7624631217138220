// single: the smallest backend written with the SDK's C++ helper — a one-process job.
//
// A template for plugin authors: a class with create() and one method per collective, and one
// HVD_BACKEND_PLUGIN line. It is built out of tree against an installed hvd by
// tests/install (see CMakeLists.txt beside this file).
#include <cstring>
#include <memory>

#include "hvd/sdk/backend.hpp"

class SingleBackend {
 public:
  static hvd::Result<std::unique_ptr<SingleBackend>> create(const hvd::sdk::InitContext& ctx) {
    if (ctx.size != 1) {
      return hvd::Status(HVD_ERR_UNSUPPORTED,
                         "the 'single' backend runs one-process jobs only; "
                         "this job has " +
                             std::to_string(ctx.size) + " ranks");
    }
    ctx.host.log(HVD_LOG_INFO, "single backend ready");
    return std::make_unique<SingleBackend>();
  }

  // With one rank every collective is a copy (reductions over one rank are the identity).
  hvd::Status allreduce(const hvd_collective_args& a) { return copy(a); }
  hvd::Status allgather(const hvd_collective_args& a) { return copy(a); }
  hvd::Status broadcast(const hvd_collective_args& a) { return copy(a); }
  hvd::Status barrier() { return hvd::Status::success(); }

 private:
  static hvd::Status copy(const hvd_collective_args& a) {
    if (a.count > 0 && a.sendbuf != a.recvbuf) {
      std::memcpy(a.recvbuf, a.sendbuf, a.count * hvd_dtype_size(a.dtype));
    }
    return hvd::Status::success();
  }
};

HVD_BACKEND_PLUGIN(SingleBackend, "single", "1.0.0", "one-process example backend (SDK template)",
                   HVD_CAP_HOST_MEMORY)
