// hvd.torch._ops — the C++ half of hvd.torch: torch tensors handed to libhvd's fusion scheduler.
//
// Python (hvd/torch/mpi_ops.py) keeps Horovod's API; this module owns the communicators and the
// operations in flight. An operation is submitted here, gets an integer handle, and its tensors
// stay referenced until synchronize() has waited for it, so that hvd never writes into memory
// Python has freed. Every call here holds the GIL except the waits, which release it, so the
// module's state needs no lock of its own: the GIL is that lock.
//
// What torch and hvd do not share is bridged here, in one place:
//  - int16, which hvd's dtypes lack, travels as int32 (widened going in, narrowed coming out;
//    sums and products wrap alike modulo 2^16);
//  - pre- and postscale factors on integer tensors, which hvd applies to floating types only,
//    are applied here in float64 and truncated, as Horovod does;
//  - outputs whose size only the other ranks know (allgather, alltoall) are allocated by hvd and
//    copied into a tensor of the input's dtype and device once the operation succeeded.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hvd/hvd.hpp"

namespace py = pybind11;

namespace {

// A failure of a collective, or of hvd itself: Horovod's HorovodInternalError (a RuntimeError).
struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Arguments hvd refused (a duplicate name, splits that do not add up) are ValueError, as in
// Horovod; everything else, ranks that disagree among it, is HorovodInternalError.
[[noreturn]] void fail(const hvd::Status& status) {
  if (status.code() == HVD_ERR_INVALID_ARGUMENT) throw py::value_error(status.message());
  throw InternalError(status.message());
}

hvd_dtype hvd_dtype_of(at::ScalarType type) {
  switch (type) {
    case at::kByte:
      return HVD_UINT8;
    case at::kChar:
      return HVD_INT8;
    case at::kShort:  // carried as int32
    case at::kInt:
      return HVD_INT32;
    case at::kLong:
      return HVD_INT64;
    case at::kHalf:
      return HVD_FLOAT16;
    case at::kBFloat16:
      return HVD_BFLOAT16;
    case at::kFloat:
      return HVD_FLOAT32;
    case at::kDouble:
      return HVD_FLOAT64;
    default:
      throw py::value_error(std::string("hvd.torch: tensors of dtype ") + c10::toString(type) +
                            " are not supported (uint8, int8, int16, int32, int64, float16, "
                            "bfloat16, float32 and float64 are)");
  }
}

// The collectives hvd.torch makes (hvd_collective), as Python names them.
using Kind = hvd_collective;

// Horovod's name of a collective, the prefix of its unnamed tensors' names.
const char* kind_name(Kind kind) {
  return kind == HVD_COLLECTIVE_REDUCE_SCATTER ? "reducescatter" : hvd_collective_name(kind);
}

// One tensor of an operation: what hvd reads and writes, and what the caller gets back.
struct Slot {
  at::Tensor input;   // the caller's tensor, kept alive until the operation completes
  at::Tensor send;    // contiguous, in the dtype hvd carries
  at::Tensor recv;    // what hvd writes (undefined where hvd allocates: allgather, alltoall)
  at::Tensor output;  // what synchronize() returns; recv itself where no copy is needed
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall: rows to each rank (empty: even)
  hvd_placement placement{};
  hvd_reduce_op op = HVD_SUM;
  double prescale = 1;  // what hvd applies: floating-point tensors' factors
  double postscale = 1;
  double integer_postscale = 1;  // applied here once the operation succeeded
};

// A submitted operation: one tensor, or a group that completes together.
struct Operation {
  Kind kind = HVD_COLLECTIVE_ALLREDUCE;
  int set_size = 0;
  std::vector<Slot> slots;
  std::vector<hvd::Request> requests;
};

// A communicator over a process set: the world (id 0) or one added later. Ranks not in a set
// hold an empty Comm for it.
struct ProcessSet {
  std::optional<hvd::Comm> comm;  // none for the world (Runtime::world_); false off the set
  std::vector<int> ranks;         // of the world, increasing
};

class Runtime {
 public:
  void init(const std::string& backend, double timeout_seconds,
            const std::vector<std::vector<int>>& process_sets) {
    if (world_) return;
    hvd::Comm::Options options;
    options.backend = backend;
    options.timeout_seconds = timeout_seconds;
    hvd::Result<hvd::Comm> made = [&] {
      py::gil_scoped_release nogil;
      return hvd::Comm::init(options);
    }();
    if (!made.ok()) fail(made.status());
    world_ = std::make_unique<hvd::Comm>(std::move(made).value());
    learn_layout();
    std::vector<int> all(static_cast<size_t>(world_->size()));
    for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
    sets_.clear();
    sets_.emplace(0, ProcessSet{std::nullopt, all});
    next_set_id_ = 1;
    for (const std::vector<int>& ranks : process_sets) add_process_set(ranks);
  }

  // Releases every communicator, children first. Operations in flight fail; their tensors are
  // released once hvd is done with them (the communicators' finalize waits for that).
  void shutdown() {
    if (!world_) return;
    hvd::Status first;
    {
      py::gil_scoped_release nogil;
      for (auto& [id, set] : sets_) {
        if (!set.comm || !*set.comm) continue;
        hvd::Status s = set.comm->finalize();
        if (first.ok() && !s.ok()) first = std::move(s);
      }
      hvd::Status s = world_->finalize();
      if (first.ok() && !s.ok()) first = std::move(s);
    }
    sets_.clear();
    operations_.clear();
    names_.clear();
    world_.reset();
    if (!first.ok()) fail(first);
  }

  bool initialized() const { return world_ != nullptr; }
  hvd::Comm& world() {
    if (!world_) {
      throw py::value_error("hvd.torch has not been initialized; use hvd.init() first");
    }
    return *world_;
  }
  int local_rank() { return world().local_rank(); }
  int local_size() { return world().local_size(); }
  int cross_rank() { return (void)world(), cross_rank_; }
  int cross_size() { return (void)world(), cross_size_; }
  bool homogeneous() { return (void)world(), homogeneous_; }
  std::string backend() { return world().backend(); }

  // The communicator of a process set, as this rank sees it (null where it is not a member).
  hvd::Comm* comm_of(int set_id) {
    hvd::Comm& w = world();
    if (set_id == 0) return &w;
    auto it = sets_.find(set_id);
    if (it == sets_.end()) {
      throw py::value_error("hvd.torch: process set " + std::to_string(set_id) +
                            " does not exist (it was never added, or was removed)");
    }
    std::optional<hvd::Comm>& comm = it->second.comm;
    return comm && *comm ? &*comm : nullptr;
  }
  hvd::Comm& member_comm(int set_id) {
    hvd::Comm* comm = comm_of(set_id);
    if (comm == nullptr) {
      throw py::value_error("hvd.torch: rank " + std::to_string(world().rank()) +
                            " is not a member of process set " + std::to_string(set_id));
    }
    return *comm;
  }
  // This rank's rank in the set, -1 where it is not a member.
  int rank(int set_id) {
    hvd::Comm* comm = comm_of(set_id);
    return comm == nullptr ? -1 : comm->rank();
  }
  int size(int set_id) {
    (void)comm_of(set_id);
    return static_cast<int>(sets_.at(set_id).ranks.size());
  }
  std::vector<int> ranks(int set_id) {
    (void)comm_of(set_id);
    return sets_.at(set_id).ranks;
  }

  // Collective over the world: every rank passes the same ranks. The id is the same everywhere.
  int add_process_set(std::vector<int> ranks) {
    hvd::Comm& w = world();
    std::sort(ranks.begin(), ranks.end());
    for (const auto& [id, set] : sets_) {
      if (id != 0 && set.ranks == ranks) {
        throw py::value_error("hvd.torch: a process set with these ranks exists already (id " +
                              std::to_string(id) + ")");
      }
    }
    hvd::Result<hvd::Comm> made = [&] {
      py::gil_scoped_release nogil;
      return w.process_set(ranks);
    }();
    if (!made.ok()) fail(made.status());
    const int id = next_set_id_++;
    sets_.emplace(id, ProcessSet{std::move(made).value(), std::move(ranks)});
    if (hvd::Comm* set = comm_of(id)) {  // its members start its scheduler together
      const int32_t mine = set->rank();
      std::vector<int32_t> all(static_cast<size_t>(set->size()));
      scheduled(*set, "hvd.torch.process_set", &mine, all.data(), 1);
    }
    return id;
  }
  // Collective over the world, like adding it.
  void remove_process_set(int set_id) {
    if (set_id == 0) throw py::value_error("hvd.torch: the global process set cannot be removed");
    (void)comm_of(set_id);
    auto node = sets_.extract(set_id);
    hvd::Status s;
    std::optional<hvd::Comm>& comm = node.mapped().comm;
    if (comm && *comm) {
      py::gil_scoped_release nogil;
      s = comm->finalize();
    }
    if (!s.ok()) fail(s);
  }

  void barrier(int set_id) {
    hvd::Comm& comm = member_comm(set_id);
    hvd::Status s;
    {
      py::gil_scoped_release nogil;
      s = comm.barrier();
    }
    if (!s.ok()) fail(s);
  }

  // Horovod's join: this rank serves the others' allreduces with zeros until every rank has
  // joined; returns the rank that joined last.
  int join() {
    hvd::Result<hvd::Request> request = world().join_async();
    if (!request.ok()) fail(request.status());
    const hvd::Status s = wait_interruptibly(*request);
    if (!s.ok()) fail(s);
    hvd::Result<int> last = request->last_joined();
    if (!last.ok()) fail(last.status());
    // Ranks that joined at different times made different numbers of unnamed calls meanwhile
    // (refused on the ranks that made them): every rank counts afresh from here.
    names_.clear();
    return *last;
  }

  // Submits one operation over `tensors` (a group when more than one) and returns its handle.
  int64_t submit(Kind kind, const std::vector<at::Tensor>& tensors,
                 const std::vector<std::optional<at::Tensor>>& outputs, const std::string& name,
                 int op, int root, double prescale, double postscale,
                 const std::vector<int64_t>& splits, int set_id, uint64_t stream) {
    hvd::Comm& comm = member_comm(set_id);
    if (tensors.empty()) throw py::value_error("hvd.torch: no tensors to submit");
    if (!outputs.empty() && outputs.size() != tensors.size()) {
      throw py::value_error("hvd.torch: as many outputs as tensors are needed");
    }
    auto operation = std::make_unique<Operation>();
    operation->kind = kind;
    operation->set_size = comm.size();
    const std::string base = name.empty() ? auto_name(kind, set_id, tensors.size() > 1) : name;
    operation->slots.reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      Slot& slot = operation->slots.emplace_back();
      prepare(slot, kind, tensors[i], outputs.empty() ? std::nullopt : outputs[i], comm, prescale,
              postscale, stream);
      slot.name = tensors.size() > 1 ? base + "." + std::to_string(i) : base;
      if (kind == HVD_COLLECTIVE_ALLTOALL) slot.splits = splits;
      slot.op = static_cast<hvd_reduce_op>(op);
      // Horovod averages integers by scaling the sum by postscale / size: one truncation, where
      // hvd's average and then the postscale would truncate twice.
      if (slot.op == HVD_AVERAGE && slot.integer_postscale != 1) {
        slot.op = HVD_SUM;
        slot.integer_postscale /= comm.size();
      }
    }
    if (operation->slots.size() == 1) {
      operation->requests.push_back(submit_one(comm, kind, operation->slots[0], root));
    } else {
      std::vector<hvd_tensor> group;
      for (Slot& s : operation->slots) {
        hvd_tensor t{};
        t.collective = kind;
        t.name = s.name.c_str();
        t.sendbuf = s.send.data_ptr();
        t.recvbuf = s.recv.defined() ? s.recv.data_ptr() : nullptr;
        t.dtype = hvd_dtype_of(s.send.scalar_type());
        t.ndim = static_cast<int32_t>(s.shape.size());
        t.shape = s.shape.data();
        t.op = s.op;
        t.root = root;
        t.prescale = s.prescale;
        t.postscale = s.postscale;
        t.placement = s.placement.memory_type == HVD_MEMORY_CUDA ? &s.placement : nullptr;
        t.splits = s.splits.empty() ? nullptr : s.splits.data();
        group.push_back(t);
      }
      hvd::Result<std::vector<hvd::Request>> requests = comm.grouped_async(std::move(group));
      if (!requests.ok()) fail(requests.status());
      operation->requests = std::move(requests).value();
    }
    const int64_t handle = next_handle_++;
    operations_.emplace(handle, std::move(operation));
    return handle;
  }

  bool poll(int64_t handle) {
    for (const hvd::Request& r : find(handle).requests)
      if (!r.ready()) return false;
    return true;
  }

  // Waits for the operation (the GIL released, Ctrl-C honoured) and returns its outputs: a
  // list of tensors, and for an alltoall the rows each rank sent.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> wait(int64_t handle) {
    Operation& operation = find(handle);
    // Every request before the first failure is raised: the other tensors of a group run on
    // after one of them failed, and hvd writes into them until they are done.
    std::optional<hvd::Status> failed;
    for (const hvd::Request& r : operation.requests) {
      hvd::Status s = wait_interruptibly(r);
      if (!s.ok() && !failed) failed = std::move(s);
    }
    if (failed) {
      operations_.erase(handle);
      fail(*failed);
    }
    // Done: take it out of the table whatever happens below.
    std::unique_ptr<Operation> done = std::move(operations_.at(handle));
    operations_.erase(handle);
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> received;
    for (size_t i = 0; i < done->slots.size(); ++i) {
      Slot& slot = done->slots[i];
      const hvd::Request& request =
          done->requests.size() == 1 ? done->requests[0] : done->requests[i];
      if (done->kind == HVD_COLLECTIVE_ALLGATHER || done->kind == HVD_COLLECTIVE_ALLTOALL) {
        hvd::Result<hvd::Request::Output> out = request.output();
        if (!out.ok()) fail(out.status());
        std::vector<int64_t> shape = slot.shape;
        if (shape.empty()) shape.push_back(1);
        shape[0] = out->first_dim;
        at::Tensor gathered = at::from_blob(out->data, shape, slot.send.options().device(at::kCPU));
        slot.output = gathered.to(slot.input.options(), /*non_blocking=*/false, /*copy=*/true);
        if (done->kind == HVD_COLLECTIVE_ALLTOALL) {
          hvd::Result<std::vector<int64_t>> rows = request.received_splits(done->set_size);
          if (!rows.ok()) fail(rows.status());
          received.push_back(at::tensor(*rows, at::kLong).to(at::kInt));
        }
      } else {
        at::Tensor result = slot.recv;
        if (slot.integer_postscale != 1) {
          result = (result.to(at::kDouble) * slot.integer_postscale).to(result.scalar_type());
        }
        if (!result.is_same(slot.output)) slot.output.copy_(result.view(slot.output.sizes()));
      }
      outputs.push_back(slot.output);
    }
    return {std::move(outputs), std::move(received)};
  }

 private:
  // The collective's n-th unnamed call on this process set: every rank derives the same name
  // as long as it makes the same calls in the same order, as Horovod requires.
  std::string auto_name(Kind kind, int set_id, bool grouped) {
    const std::string prefix = std::string(grouped ? "grouped_" : "") + kind_name(kind);
    const uint64_t n = names_[std::to_string(set_id) + "/" + prefix]++;
    return prefix + ".noname." + std::to_string(n);
  }

  void prepare(Slot& slot, Kind kind, const at::Tensor& tensor,
               const std::optional<at::Tensor>& output, const hvd::Comm& comm, double prescale,
               double postscale, uint64_t stream) {
    const at::ScalarType type = tensor.scalar_type();
    (void)hvd_dtype_of(type);  // refuses a dtype hvd cannot carry
    slot.input = tensor;
    slot.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    at::Tensor send = tensor.contiguous();
    if (type == at::kShort) send = send.to(at::kInt);
    // Each tensor of a group by its own dtype: a group may mix integers and floats.
    const bool integer_scales = hvd_collective_reduces(kind) && !at::isFloatingType(type);
    if (integer_scales && prescale != 1) {
      send = (send.to(at::kDouble) * prescale).to(send.scalar_type());
    }
    if (integer_scales) {
      slot.integer_postscale = postscale;
    } else {
      slot.prescale = prescale;
      slot.postscale = postscale;
    }
    slot.send = send;
    if (tensor.is_cuda()) {
      slot.placement.struct_size = sizeof(hvd_placement);
      slot.placement.memory_type = HVD_MEMORY_CUDA;
      slot.placement.device = tensor.get_device();
      slot.placement.stream = reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
    } else {
      slot.placement.memory_type = HVD_MEMORY_HOST;
      slot.placement.device = -1;
    }
    switch (kind) {
      case HVD_COLLECTIVE_ALLGATHER:
      case HVD_COLLECTIVE_ALLTOALL:
        return;  // hvd allocates the output
      case HVD_COLLECTIVE_REDUCE_SCATTER: {
        if (tensor.dim() == 0) {
          throw py::value_error(
              "hvd.torch: reducescatter needs a tensor of at least one dimension");
        }
        const int64_t n = comm.size();
        const int64_t rows = tensor.size(0) / n + (comm.rank() < tensor.size(0) % n ? 1 : 0);
        std::vector<int64_t> out_shape = slot.shape;
        out_shape[0] = rows;
        slot.recv = at::empty(out_shape, send.options());
        slot.output =
            slot.recv.scalar_type() == type ? slot.recv : at::empty(out_shape, tensor.options());
        return;
      }
      case HVD_COLLECTIVE_ALLREDUCE:
      case HVD_COLLECTIVE_BROADCAST: {
        const at::Tensor out = output ? *output : at::empty_like(tensor);
        slot.output = out;
        if (out.is_same(tensor) && send.data_ptr() != tensor.data_ptr()) {
          slot.recv = send;  // in place on the working copy, copied back at the end
        } else if (out.is_contiguous() && out.scalar_type() == send.scalar_type()) {
          slot.recv = out;
        } else {
          slot.recv = at::empty(slot.shape, send.options());
        }
        return;
      }
      default:  // _ops.Kind names only the five above
        throw py::value_error(std::string("hvd.torch: ") + hvd_collective_name(kind) +
                              " is not a collective of tensors");
    }
  }

  static hvd::Request submit_one(hvd::Comm& comm, Kind kind, Slot& s, int root) {
    const hvd_dtype dtype = hvd_dtype_of(s.send.scalar_type());
    const hvd_placement* placement =
        s.placement.memory_type == HVD_MEMORY_CUDA ? &s.placement : nullptr;
    void* send = s.send.data_ptr();
    void* recv = s.recv.defined() ? s.recv.data_ptr() : nullptr;
    hvd::Result<hvd::Request> r = [&]() -> hvd::Result<hvd::Request> {
      switch (kind) {
        case HVD_COLLECTIVE_ALLREDUCE:
          return comm.allreduce_async(s.name, send, recv, dtype, s.shape, s.op, s.prescale,
                                      s.postscale, placement);
        case HVD_COLLECTIVE_ALLGATHER:
          return comm.allgather_async(s.name, send, nullptr, dtype, s.shape, placement);
        case HVD_COLLECTIVE_BROADCAST:
          return comm.broadcast_async(s.name, send, recv, dtype, s.shape, root, placement);
        case HVD_COLLECTIVE_ALLTOALL:
          return comm.alltoall_async(s.name, send, nullptr, dtype, s.shape, s.splits, placement);
        case HVD_COLLECTIVE_REDUCE_SCATTER:
          return comm.reduce_scatter_async(s.name, send, recv, dtype, s.shape, s.op, s.prescale,
                                           s.postscale, placement);
        default:
          break;
      }
      return hvd::Status(HVD_ERR_INTERNAL, "unknown collective");
    }();
    if (!r.ok()) fail(r.status());
    return std::move(r).value();
  }

  Operation& find(int64_t handle) {
    auto it = operations_.find(handle);
    if (it == operations_.end()) {
      throw py::value_error("hvd.torch: handle " + std::to_string(handle) +
                            " was not made by this process, or was synchronized already");
    }
    return *it->second;
  }

  // Waits in slices so that a signal (Ctrl-C) raises in Python within a fraction of a second.
  static hvd::Status wait_interruptibly(const hvd::Request& r) {
    constexpr double kSliceSeconds = 0.05;
    for (;;) {
      hvd::Status s;
      {
        py::gil_scoped_release nogil;
        s = r.wait(kSliceSeconds);
      }
      if (s.code() != HVD_ERR_TIMEOUT) return s;
      // The slice ran out, or the operation itself timed out (then it is done).
      if (r.ready()) return r.wait();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  // Horovod's cross communicator: the ranks of the job with this rank's local rank. Gathered
  // asynchronously, which starts the world's scheduler on every rank at once (see scheduled).
  void learn_layout() {
    hvd::Comm& w = *world_;
    const int n = w.size();
    std::vector<int32_t> mine = {w.local_rank(), w.local_size()};
    std::vector<int32_t> all(2 * static_cast<size_t>(n));
    scheduled(w, "hvd.torch.layout", mine.data(), all.data(), 2);
    cross_rank_ = 0;
    cross_size_ = 0;
    homogeneous_ = true;
    for (int r = 0; r < n; ++r) {
      if (all[2 * r] == mine[0]) {
        if (r < w.rank()) ++cross_rank_;
        ++cross_size_;
      }
      if (all[2 * r + 1] != mine[1]) homogeneous_ = false;
    }
  }

  // Gathers `count` int32 per rank through the communicator's scheduler, and so starts it. Every
  // rank's scheduler then runs from the communicator's birth: hvd sends a blocking call
  // (barrier) through the scheduler once it runs and straight to the backend before, so a
  // communicator whose ranks started theirs at different calls would pair a barrier on one rank
  // with a negotiation on another.
  static void scheduled(hvd::Comm& comm, const std::string& name, const int32_t* mine, int32_t* all,
                        int64_t count) {
    hvd::Result<hvd::Request> r = comm.allgather_async(name, mine, all, HVD_INT32, {count});
    if (!r.ok()) fail(r.status());
    const hvd::Status s = wait_interruptibly(*r);
    if (!s.ok()) fail(s);
  }

  std::unique_ptr<hvd::Comm> world_;
  std::map<int, ProcessSet> sets_;
  int next_set_id_ = 1;
  int cross_rank_ = 0;
  int cross_size_ = 1;
  bool homogeneous_ = true;
  std::unordered_map<int64_t, std::unique_ptr<Operation>> operations_;
  int64_t next_handle_ = 1;
  std::unordered_map<std::string, uint64_t> names_;
};

// Never destroyed: Python's atexit (hvd.torch registers shutdown) releases the communicators
// while libhvd and torch are still whole.
Runtime& runtime() {
  static Runtime* const instance = new Runtime();
  return *instance;
}

}  // namespace

PYBIND11_MODULE(_ops, m) {
  m.doc() = "hvd.torch's C++ half: torch tensors over libhvd (use hvd.torch, not this module)";
  py::register_exception<InternalError>(m, "HorovodInternalError", PyExc_RuntimeError);

  py::enum_<Kind>(m, "Kind")
      .value("allreduce", HVD_COLLECTIVE_ALLREDUCE)
      .value("allgather", HVD_COLLECTIVE_ALLGATHER)
      .value("broadcast", HVD_COLLECTIVE_BROADCAST)
      .value("alltoall", HVD_COLLECTIVE_ALLTOALL)
      .value("reducescatter", HVD_COLLECTIVE_REDUCE_SCATTER);
  m.attr("SUM") = static_cast<int>(HVD_SUM);
  m.attr("AVERAGE") = static_cast<int>(HVD_AVERAGE);
  m.attr("MIN") = static_cast<int>(HVD_MIN);
  m.attr("MAX") = static_cast<int>(HVD_MAX);
  m.attr("PRODUCT") = static_cast<int>(HVD_PRODUCT);

  m.def("init",
        [](const std::string& backend, double timeout, const std::vector<std::vector<int>>& sets) {
          runtime().init(backend, timeout, sets);
        });
  m.def("shutdown", [] { runtime().shutdown(); });
  m.def("is_initialized", [] { return runtime().initialized(); });
  m.def(
      "rank", [](int set_id) { return runtime().rank(set_id); }, py::arg("set_id") = 0);
  m.def(
      "size", [](int set_id) { return runtime().size(set_id); }, py::arg("set_id") = 0);
  m.def("local_rank", [] { return runtime().local_rank(); });
  m.def("local_size", [] { return runtime().local_size(); });
  m.def("cross_rank", [] { return runtime().cross_rank(); });
  m.def("cross_size", [] { return runtime().cross_size(); });
  m.def("is_homogeneous", [] { return runtime().homogeneous(); });
  m.def("backend", [] { return runtime().backend(); });
  m.def("set_ranks", [](int set_id) { return runtime().ranks(set_id); });
  m.def("add_process_set",
        [](std::vector<int> ranks) { return runtime().add_process_set(std::move(ranks)); });
  m.def("remove_process_set", [](int set_id) { runtime().remove_process_set(set_id); });
  m.def("barrier", [](int set_id) { runtime().barrier(set_id); });
  m.def("join", [] { return runtime().join(); });
  m.def("submit", [](Kind kind, const std::vector<at::Tensor>& tensors,
                     const std::vector<std::optional<at::Tensor>>& outputs, const std::string& name,
                     int op, int root, double prescale, double postscale,
                     const std::vector<int64_t>& splits, int set_id, uint64_t stream) {
    return runtime().submit(kind, tensors, outputs, name, op, root, prescale, postscale, splits,
                            set_id, stream);
  });
  m.def("poll", [](int64_t handle) { return runtime().poll(handle); });
  m.def("wait", [](int64_t handle) { return runtime().wait(handle); });
}
