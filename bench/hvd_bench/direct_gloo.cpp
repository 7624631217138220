// The Gloo baseline: the algorithms the plugin runs (plugins/gloo/gloo_algorithms.hpp) with
// Gloo's own reduction functions, on meshes of its own, connected the way the plugin connects:
// through a rendezvous store.
#include <algorithm>
#include <cstring>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "bootstrap/env.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/settings.hpp"
#include "bootstrap/store.hpp"
#include "direct.hpp"
#include "gloo_algorithms.hpp"

namespace hvd::bench {
namespace {

template <typename Fn>
Status run_gloo(const std::string& what, Fn&& fn) {
  try {
    fn();
    return Status::success();
  } catch (const std::exception& e) {
    return error(HVD_ERR_REMOTE, what + ": " + e.what());
  }
}

// Gloo's element type for an hvd dtype (bfloat16 has none).
template <typename Fn>
bool with_gloo_type(hvd_dtype dtype, Fn&& fn) {
  switch (dtype) {
    case HVD_UINT8:
      fn(uint8_t{});
      return true;
    case HVD_INT8:
      fn(int8_t{});
      return true;
    case HVD_INT32:
      fn(int32_t{});
      return true;
    case HVD_INT64:
      fn(int64_t{});
      return true;
    case HVD_FLOAT16:
      fn(gloo::float16{});
      return true;
    case HVD_FLOAT32:
      fn(float{});
      return true;
    case HVD_FLOAT64:
      fn(double{});
      return true;
    default:
      return false;
  }
}

template <typename T>
const gloo::ReductionFunction<T>* gloo_reduction(hvd_reduce_op op) {
  switch (op) {
    case HVD_PRODUCT:
      return gloo::ReductionFunction<T>::product;
    case HVD_MIN:
      return gloo::ReductionFunction<T>::min;
    case HVD_MAX:
      return gloo::ReductionFunction<T>::max;
    default:
      return gloo::ReductionFunction<T>::sum;
  }
}

class DirectGloo final : public DirectLibrary {
 public:
  DirectGloo(gloo_algorithms::Meshes meshes, int rank) : meshes_(std::move(meshes)), rank_(rank) {}

  std::string call_name(hvd_collective c) const override {
    return std::string("gloo_algorithms::") + hvd_collective_name(c);
  }

  std::string unsupported(const CollectiveCall& c) const override {
    if (c.placement.memory_type != HVD_MEMORY_HOST) return "host memory only";
    if (c.dtype == HVD_BFLOAT16) return "Gloo has no bfloat16 type";
    if (hvd_collective_reduces(c.collective) && c.op == HVD_AVERAGE)
      return "Gloo has no average op";
    if (c.collective == HVD_COLLECTIVE_ALLTOALL && c.send == c.recv) return "never in place";
    return "";
  }

  Status run(const CollectiveCall& c) override {
    if (c.count == 0) return Status::success();
    if (!meshes_) return local(c);  // one rank: Gloo has nobody to talk to
    return run_gloo(call_name(c.collective), [&] {
      with_gloo_type(c.dtype, [&](auto element) {
        using T = decltype(element);
        T* recv = static_cast<T*>(c.recv);
        T* send = const_cast<T*>(static_cast<const T*>(c.send));
        switch (c.collective) {
          case HVD_COLLECTIVE_ALLREDUCE:
            if (send != recv) std::copy(send, send + c.count, recv);
            gloo_algorithms::allreduce(meshes_, recv, c.count, gloo_reduction<T>(c.op),
                                       gloo_algorithms::order_sensitive(c.dtype, c.op));
            break;
          case HVD_COLLECTIVE_ALLGATHER:
            gloo_algorithms::allgather(meshes_, send, recv, c.count);
            break;
          case HVD_COLLECTIVE_BROADCAST:
            if (rank_ == c.root && send != recv) std::copy(send, send + c.count, recv);
            gloo_algorithms::broadcast(meshes_, recv, c.count, c.root);
            break;
          case HVD_COLLECTIVE_REDUCE_SCATTER:
            gloo_algorithms::reduce_scatter(meshes_, send, recv, c.count, gloo_reduction<T>(c.op),
                                            &scratch_);
            break;
          case HVD_COLLECTIVE_ALLTOALL: {
            // Every rank sends every rank count elements: the whole exchange moves size^2 x
            // count, which routes it to a mesh as the plugin's agreement does.
            const size_t size = static_cast<size_t>(meshes_.sync->size);
            counts_.assign(size, c.count);
            gloo_algorithms::alltoall(meshes_, send, counts_, recv, counts_,
                                      size * size * c.count * sizeof(T));
            break;
          }
          default:  // barrier and join are not benchmarked
            break;
        }
      });
    });
  }

 private:
  Status local(const CollectiveCall& c) {
    if (c.send != c.recv) std::memcpy(c.recv, c.send, c.count * hvd_dtype_size(c.dtype));
    return Status::success();
  }

  gloo_algorithms::Meshes meshes_;  // empty at one rank
  std::vector<char> scratch_;       // reduce_scatter's, kept between calls as the plugin does
  int rank_;
  std::vector<size_t> counts_;  // alltoall's, sent and received alike
};

}  // namespace

Result<std::unique_ptr<DirectLibrary>> open_direct_gloo(Comm& comm) {
  gloo_algorithms::Meshes meshes;
  if (comm.size() > 1) {
    // A store of the baseline's own, served by rank 0 and announced over hvd.
    HVD_ASSIGN_OR_RETURN(const core::Settings settings, core::Settings::read(core::process_env()));
    core::World world;
    world.rank = comm.rank();
    world.size = comm.size();
    world.local_rank = comm.local_rank();
    world.local_size = comm.local_size();
    HVD_ASSIGN_OR_RETURN(core::SharedRendezvous rendezvous,
                         core::share_rendezvous(world, settings, [&](void* record, size_t size) {
                           return comm.broadcast(record, record, size, HVD_UINT8, 0);
                         }));
    const std::chrono::milliseconds timeout = settings.timeout();
    HVD_ASSIGN_OR_RETURN(
        auto client, core::TcpStoreClient::connect(rendezvous.address, rendezvous.secret, timeout));
    // Gloo binds where the plugin's rule says: HVD_GLOO_IFACE, HVD_GLOO_HOSTNAME, else the
    // address on the route to the rendezvous.
    gloo::transport::tcp::attr attr;
    const core::EnvLookup env = core::process_env();
    if (auto iface = env("HVD_GLOO_IFACE")) {
      attr.iface = *iface;
    } else {
      attr.hostname = env("HVD_GLOO_HOSTNAME").value_or(client->local_address());
    }
    HVD_RETURN_IF_ERROR(run_gloo("connecting Gloo for the baseline", [&] {
      const gloo_algorithms::KvStore kv{
          [&](const std::string& key, const std::vector<char>& value) {
            return client->set(key, value);
          },
          [&](const std::string& key, std::chrono::milliseconds wait) {
            return client->get(key, wait);
          }};
      meshes = gloo_algorithms::Meshes::connect(kv, gloo::transport::tcp::CreateDevice(attr),
                                                comm.rank(), comm.size(), timeout);
    }));
    // Every rank has connected before any uses the mesh, and the store may go (see the plugin's
    // init).
    HVD_RETURN_IF_ERROR(comm.barrier());
  }
  return std::unique_ptr<DirectLibrary>(new DirectGloo(std::move(meshes), comm.rank()));
}

}  // namespace hvd::bench
