// The Gloo backend: hvd's collectives on Facebook's Gloo over TCP.
//
// Bootstrap goes through the host's rendezvous store (gloo_algorithms::KvStore).
// The collectives are Gloo's buffer-based algorithms with hvd's reduction kernels, small ones
// over a mesh whose callers read their own sockets (gloo_algorithms.hpp says why for both).
// Configuration: HVD_GLOO_IFACE (a network interface) or HVD_GLOO_HOSTNAME (an address to bind);
// by default the address this host uses to reach the rendezvous server.
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>

#include "gloo_algorithms.hpp"
#include "hvd/reduce.h"
#include "hvd/sdk/backend.hpp"

namespace {

using hvd::Status;

// Run a Gloo call, turning its exceptions into statuses: I/O errors mean a peer or the network
// failed (or a wait timed out); enforce failures are misuse. Gloo names the failed peer by its
// socket address; a crashed rank is named by hvdrun, which sees it exit.
template <typename Fn>
Status run_gloo(const char* what, Fn&& fn) {
  try {
    fn();
    return Status::success();
  } catch (const gloo::IoException& e) {
    const std::string message = e.what();
    const bool timed_out = message.find("imed out") != std::string::npos ||
                           message.find("imeout") != std::string::npos;
    return Status(timed_out ? HVD_ERR_TIMEOUT : HVD_ERR_REMOTE,
                  std::string("gloo ") + what + ": " + message +
                      (timed_out ? " (a peer rank did not respond in time)"
                                 : " (a peer rank failed or became unreachable)"));
  } catch (const gloo::EnforceNotMet& e) {
    return Status(HVD_ERR_INTERNAL, std::string("gloo ") + what + ": " + e.what());
  }
}

// Gloo sizes buffers by sizeof(T): each dtype travels as the unsigned type of its width.
template <size_t Bytes>
struct Unsigned;
template <>
struct Unsigned<1> {
  using type = uint8_t;
};
template <>
struct Unsigned<2> {
  using type = uint16_t;
};
template <>
struct Unsigned<4> {
  using type = uint32_t;
};
template <>
struct Unsigned<8> {
  using type = uint64_t;
};
template <size_t Bytes>
using Element = typename Unsigned<Bytes>::type;

// Calls fn(element) with a value of the element type of `element_size` bytes; nothing for a size
// that is no dtype's (the collectives refuse a dtype they do not know first).
template <typename Fn>
void with_element_type(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1:
      fn(Element<1>{});
      break;
    case 2:
      fn(Element<2>{});
      break;
    case 4:
      fn(Element<4>{});
      break;
    case 8:
      fn(Element<8>{});
      break;
    default:
      break;
  }
}

// Gloo's legacy algorithms take a plain function per element type, so each dtype/op pair gets
// one instance of hvd's kernel.
template <hvd_dtype D, hvd_reduce_op Op, typename T>
void reduce_into(T* x, const T* y, size_t n) {
  hvd_reduce(x, x, y, n, D, Op);
}

template <hvd_dtype D, typename T>
const gloo::ReductionFunction<T>* reduction_of(hvd_reduce_op op) {
  using Function = gloo::ReductionFunction<T>;
  static const Function sum(gloo::SUM, &reduce_into<D, HVD_SUM, T>);
  static const Function product(gloo::PRODUCT, &reduce_into<D, HVD_PRODUCT, T>);
  static const Function min(gloo::MIN, &reduce_into<D, HVD_MIN, T>);
  static const Function max(gloo::MAX, &reduce_into<D, HVD_MAX, T>);
  switch (op) {
    case HVD_PRODUCT:
      return &product;
    case HVD_MIN:
      return &min;
    case HVD_MAX:
      return &max;
    default:  // HVD_AVERAGE sums; the caller divides
      return &sum;
  }
}

// Calls fn(element, reduction): a value of the dtype's element type and its reduction for op;
// nothing for a dtype this plugin does not know (the collectives refuse one first).
template <typename Fn>
void with_reduction(hvd_dtype dtype, hvd_reduce_op op, Fn&& fn) {
  switch (dtype) {
    case HVD_UINT8:
      fn(Element<1>{}, reduction_of<HVD_UINT8, Element<1>>(op));
      break;
    case HVD_INT8:
      fn(Element<1>{}, reduction_of<HVD_INT8, Element<1>>(op));
      break;
    case HVD_INT32:
      fn(Element<4>{}, reduction_of<HVD_INT32, Element<4>>(op));
      break;
    case HVD_INT64:
      fn(Element<8>{}, reduction_of<HVD_INT64, Element<8>>(op));
      break;
    case HVD_FLOAT16:
      fn(Element<2>{}, reduction_of<HVD_FLOAT16, Element<2>>(op));
      break;
    case HVD_BFLOAT16:
      fn(Element<2>{}, reduction_of<HVD_BFLOAT16, Element<2>>(op));
      break;
    case HVD_FLOAT32:
      fn(Element<4>{}, reduction_of<HVD_FLOAT32, Element<4>>(op));
      break;
    case HVD_FLOAT64:
      fn(Element<8>{}, reduction_of<HVD_FLOAT64, Element<8>>(op));
      break;
    default:
      break;
  }
}

// The host passes only the dtypes this plugin declares (all of ABI 1.0's); one from a later ABI
// would have no element type here, and must never be read at another width.
Status check_dtype(hvd_dtype dtype) {
  if (hvd_dtype_size(dtype) != 0) return Status::success();
  return Status(HVD_ERR_UNSUPPORTED,
                "gloo: dtype " + std::to_string(dtype) + " is not one it knows");
}

class GlooBackend {
 public:
  static hvd::Result<std::unique_ptr<GlooBackend>> create(const hvd::sdk::InitContext& ctx) {
    auto self = std::unique_ptr<GlooBackend>(new GlooBackend(ctx));
    if (ctx.size == 1) return self;  // nothing to connect: every collective is local

    gloo::transport::tcp::attr attr;
    attr.iface = hvd::sdk::env_or("HVD_GLOO_IFACE", "");
    if (attr.iface.empty()) {
      attr.hostname = hvd::sdk::env_or("HVD_GLOO_HOSTNAME",
                                       ctx.local_address.empty() ? "127.0.0.1" : ctx.local_address);
    }
    const hvd::sdk::Host host = ctx.host;
    const hvd::gloo_algorithms::KvStore kv{
        [&](const std::string& key, const std::vector<char>& value) {
          return host.kv_set(key, value.data(), value.size());
        },
        [&](const std::string& key, std::chrono::milliseconds timeout) {
          return host.kv_get(key, timeout);
        }};
    const std::string where =
        attr.iface.empty() ? "address " + attr.hostname : "interface " + attr.iface;
    Status s = run_gloo("connect", [&] {
      self->meshes_ = hvd::gloo_algorithms::Meshes::connect(
          kv, gloo::transport::tcp::CreateDevice(attr), ctx.rank, ctx.size, ctx.timeout);
    });
    if (!s.ok()) {
      return s.with_context("connecting rank " + std::to_string(ctx.rank) + " on " + where);
    }
    HVD_RETURN_IF_ERROR(wait_until_all_connected(ctx));
    return self;
  }

  ~GlooBackend() {
    // Leave together: a rank that closes its sockets while a peer still drains the last
    // collective would turn that peer's success into a connection error. After a failure the
    // connections are closed already.
    if (meshes_ && !failed_) {
      (void)run_gloo("barrier at finalize", [&] { hvd::gloo_algorithms::barrier(meshes_); });
    }
  }

  Status allreduce(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    if (a.count == 0) return Status::success();
    const size_t element = hvd_dtype_size(a.dtype);
    if (a.sendbuf != a.recvbuf) std::memcpy(a.recvbuf, a.sendbuf, a.count * element);
    if (meshes_) {
      Status s = guarded("allreduce", [&] {
        with_reduction(a.dtype, a.op, [&](auto t, const auto* reduction) {
          using T = decltype(t);
          hvd::gloo_algorithms::allreduce(meshes_, static_cast<T*>(a.recvbuf), a.count, reduction);
        });
      });
      if (!s.ok()) return s;
    }
    if (a.op == HVD_AVERAGE) hvd_divide(a.recvbuf, a.count, a.dtype, size_);
    return Status::success();
  }

  Status allgather(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    const size_t element = hvd_dtype_size(a.dtype);
    if (a.recv_counts != nullptr) return allgatherv(a, element);
    if (a.count == 0) return Status::success();
    char* mine = static_cast<char*>(a.recvbuf) + static_cast<size_t>(rank_) * a.count * element;
    if (!meshes_) {
      if (a.sendbuf != mine) std::memcpy(mine, a.sendbuf, a.count * element);
      return Status::success();
    }
    return guarded("allgather", [&] {
      with_element_type(element, [&](auto t) {
        using T = decltype(t);
        hvd::gloo_algorithms::allgather(meshes_, static_cast<const T*>(a.sendbuf),
                                        static_cast<T*>(a.recvbuf), a.count);
      });
    });
  }

  Status broadcast(const hvd_collective_args& a) {
    HVD_RETURN_IF_ERROR(check_dtype(a.dtype));
    if (a.count == 0) return Status::success();
    const size_t element = hvd_dtype_size(a.dtype);
    if (rank_ == a.root && a.sendbuf != a.recvbuf) {
      std::memcpy(a.recvbuf, a.sendbuf, a.count * element);
    }
    if (!meshes_) return Status::success();
    return guarded("broadcast", [&] {
      with_element_type(element, [&](auto t) {
        hvd::gloo_algorithms::broadcast(meshes_, static_cast<decltype(t)*>(a.recvbuf), a.count,
                                        a.root);
      });
    });
  }

  Status barrier() {
    if (!meshes_) return Status::success();
    return guarded("barrier", [&] { hvd::gloo_algorithms::barrier(meshes_); });
  }

 private:
  explicit GlooBackend(const hvd::sdk::InitContext& ctx) : rank_(ctx.rank), size_(ctx.size) {}

  // run_gloo; a failure also closes every connection. A collective that failed half way leaves
  // peers waiting for messages this rank will never send (a peer of a dead rank gives up, and
  // the dead rank's other peers would wait on it for the whole timeout); closed sockets tell
  // them at once, naming this rank's address.
  template <typename Fn>
  Status guarded(const char* what, Fn&& fn) {
    Status s = run_gloo(what, std::forward<Fn>(fn));
    if (!s.ok() && !failed_) {
      failed_ = true;
      (void)run_gloo("closing connections", [&] { meshes_.close_connections(); });
    }
    return s;
  }

  // Every rank has finished connectFullMesh once this returns. Without it a rank could leave
  // init (and exit) while a peer still reads its handshake, failing that peer's init.
  static Status wait_until_all_connected(const hvd::sdk::InitContext& ctx) {
    const char mine = 1;
    std::vector<char> all(static_cast<size_t>(ctx.size));
    return ctx.host.oob_allgather(&mine, 1, all.data(), ctx.timeout);
  }

  Status allgatherv(const hvd_collective_args& a, size_t element) {
    std::vector<size_t> counts(a.recv_counts, a.recv_counts + size_);
    if (std::accumulate(counts.begin(), counts.end(), size_t{0}) == 0) return Status::success();
    size_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[static_cast<size_t>(r)];
    char* mine = static_cast<char*>(a.recvbuf) + offset * element;
    if (a.count > 0 && a.sendbuf != mine) std::memcpy(mine, a.sendbuf, a.count * element);
    if (!meshes_) return Status::success();
    return guarded("allgatherv", [&] {
      with_element_type(element, [&](auto t) {
        hvd::gloo_algorithms::allgatherv(meshes_, static_cast<decltype(t)*>(a.recvbuf), counts);
      });
    });
  }

  int rank_;
  int size_;
  hvd::gloo_algorithms::Meshes meshes_;  // empty when size == 1
  bool failed_ = false;                  // a collective failed: the connections are closed
};

}  // namespace

HVD_BACKEND_PLUGIN(
    GlooBackend, "gloo", HVD_PLUGIN_VERSION " (gloo " HVD_GLOO_VERSION ")",
    "Gloo collectives over TCP (HVD_GLOO_IFACE / HVD_GLOO_HOSTNAME choose the network)",
    HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV)
