// A hand-written C++ table (no SDK helper) whose allreduce throws: the C ABI forbids it, and the
// host must turn it into an error naming the backend and the entry, not end the process.
#include <cstring>
#include <stdexcept>

#include "hvd/backend.h"

namespace {

hvd_backend_comm* const kComm = reinterpret_cast<hvd_backend_comm*>(1);

hvd_status init(const hvd_backend_init_args* args, hvd_backend_comm** comm) {
  if (args->size != 1) return HVD_ERR_UNSUPPORTED;
  *comm = kComm;
  return HVD_SUCCESS;
}
hvd_status finalize(hvd_backend_comm*) { return HVD_SUCCESS; }
hvd_status allreduce(hvd_backend_comm*, const hvd_collective_args*) {
  throw std::runtime_error("boom");
}
hvd_status copy(hvd_backend_comm*, const hvd_collective_args* a) {
  if (a->count > 0 && a->sendbuf != a->recvbuf) {
    std::memcpy(a->recvbuf, a->sendbuf, a->count * hvd_dtype_size(a->dtype));
  }
  return HVD_SUCCESS;
}
hvd_status barrier(hvd_backend_comm*) { return HVD_SUCCESS; }

hvd_backend_v1 make_table() {
  hvd_backend_v1 t{};
  t.struct_size = sizeof t;
  t.abi_major = HVD_BACKEND_ABI_MAJOR;
  t.abi_minor = HVD_BACKEND_ABI_MINOR;
  t.name = "throwing";
  t.version = "1.0.0";
  t.description = "test backend: a hand-written C++ table whose allreduce throws";
  t.capabilities = HVD_CAP_HOST_MEMORY;
  t.init = init;
  t.finalize = finalize;
  t.allreduce = allreduce;
  t.allgather = copy;
  t.broadcast = copy;
  t.barrier = barrier;
  t.dtypes = HVD_DTYPES_1_0;
  t.reduce_ops = HVD_REDUCE_OPS_1_0;
  return t;
}
const hvd_backend_v1 kTable = make_table();

}  // namespace

extern "C" HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) { return &kTable; }
