// host_executor.cpp — the scheduler's host executor: what runs the responses every rank agreed
// on, in the order they agreed: allreduces fused through the fusion buffer (scaled, staged where
// the memory asks), the other collectives one by one, CUDA tensors handed to the device executor.
#include "scheduler/scheduler.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "common/status_text.hpp"
#include "hvd/reduce.h"

namespace hvd::core {
namespace {

using Clock = Timeline::Clock;

// out[i] = in[i] * factor (a plain copy for factor 1). out may be in.
void scale(void* out, const void* in, uint64_t count, hvd_dtype dtype, double factor) {
  const size_t bytes = count * hvd_dtype_size(dtype);
  if (factor == 1) {
    if (out != in && bytes > 0) std::memmove(out, in, bytes);
    return;
  }
  switch (dtype) {
    case HVD_FLOAT32: {
      const float f = static_cast<float>(factor);
      for (uint64_t i = 0; i < count; ++i)
        static_cast<float*>(out)[i] = static_cast<const float*>(in)[i] * f;
      break;
    }
    case HVD_FLOAT64:
      for (uint64_t i = 0; i < count; ++i)
        static_cast<double*>(out)[i] = static_cast<const double*>(in)[i] * factor;
      break;
    case HVD_FLOAT16:
    case HVD_BFLOAT16: {
      const bool half = dtype == HVD_FLOAT16;
      const float f = static_cast<float>(factor);
      for (uint64_t i = 0; i < count; ++i) {
        const uint16_t x = static_cast<const uint16_t*>(in)[i];
        const float v = (half ? hvd_float16_to_float(x) : hvd_bfloat16_to_float(x)) * f;
        static_cast<uint16_t*>(out)[i] = half ? hvd_float_to_float16(v) : hvd_float_to_bfloat16(v);
      }
      break;
    }
    default:  // prepare() admits factors other than 1 for floating types only
      break;
  }
}

hvd_collective_args args_for(const Submission& s, const void* send, void* recv, uint64_t count) {
  hvd_collective_args a = host_args(send, recv, count, s.spec.dtype);
  a.op = s.spec.op;
  a.root = s.spec.root;
  a.memory_type = s.spec.memory;
  a.device = s.spec.device;
  a.stream = s.stream;
  a.flags = HVD_CALL_RANKS_AGREE;  // negotiated: every rank runs this response
  return a;
}

// Allreduces that may share a fusion buffer: one reduction of one dtype, scaled alike, in one
// kind of memory. Only what every rank agreed on: the device is each rank's own (ranks would
// otherwise batch differently and run different backend calls), and a staged batch copies each
// tensor on its own device.
bool fuses_with(const TensorSpec& a, const TensorSpec& b) {
  return a.dtype == b.dtype && a.op == b.op && a.memory == b.memory && a.prescale == b.prescale &&
         a.postscale == b.postscale;
}

}  // namespace

void Scheduler::execute(std::vector<Verdict> ready) {
  // Grouped tensors wait until their whole group is ready (the same on every rank).
  std::vector<Verdict> runnable;
  runnable.reserve(ready.size());
  const auto now = Clock::now();
  for (Verdict& v : ready) {
    Entry& e = *v.entry;
    e.negotiated = now;
    e.first_dims = std::move(v.first_dims);
    if (timeline_) timeline_->span(e.what.name, "NEGOTIATE", e.submitted, e.negotiated);
    if (v.group == 0) {
      runnable.push_back(std::move(v));
      continue;
    }
    std::vector<Verdict>& members = held_[v.group];
    members.push_back(std::move(v));
    if (members.size() == members.front().group_size) {
      const uint64_t group = members.front().group;
      for (Verdict& m : members) runnable.push_back(std::move(m));
      held_.erase(group);
    }
  }

  // Allreduces of one dtype/op/memory kind/scale go into one buffer, up to the threshold; the rest
  // run alone. A step's tensors are mostly of one kind: the open batches are few.
  struct Open {
    const TensorSpec* kind;
    std::vector<Entry*> batch;
    uint64_t bytes = 0;
  };
  std::vector<Open> open;
  for (Verdict& v : runnable) {
    Entry& e = *v.entry;
    if (!v.error.empty()) {
      finish(&e, error(v.error_code, v.error));
      continue;
    }
    if (e.what.spec.type == HVD_COLLECTIVE_JOIN) {
      e.completion->set_last_joined(static_cast<int>(e.first_dims.at(0)));
      finish(&e, Status::success());
      continue;
    }
    if (e.what.task) {
      const std::function<Status()> task = std::move(e.what.task);  // not kept with spare entries
      e.what.task = nullptr;
      finish(&e, task());
      continue;
    }
    const TensorSpec& s = e.what.spec;
    const bool direct = s.memory == HVD_MEMORY_CUDA && !data_.stages(s.memory) && !on_device(s);
    const bool fusable = s.type == HVD_COLLECTIVE_ALLREDUCE && !direct &&
                         options_.fusion_threshold > 0 && e.bytes() <= options_.fusion_threshold;
    if (!fusable) {
      if (s.type == HVD_COLLECTIVE_ALLREDUCE && s.memory == HVD_MEMORY_CUDA && !direct) {
        // Staged: through the fusion buffer even alone, as that is its host memory. On the
        // device: the device executor scales it.
        std::vector<Entry*> alone{&e};
        run_fused(alone);
      } else {
        run_alone(e);
      }
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(),
                           [&](const Open& o) { return fuses_with(*o.kind, s); });
    if (it == open.end()) {
      it = open.insert(open.end(), Open{&s, {}, 0});
    } else if (it->bytes + e.bytes() > options_.fusion_threshold) {
      run_fused(it->batch);  // full: it runs now and starts over
      it->bytes = 0;
    }
    it->batch.push_back(&e);
    it->bytes += e.bytes();
  }
  for (Open& o : open) run_fused(o.batch);
}

template <typename Pointer>
Pointer Scheduler::end_to_end(const std::vector<Entry*>& batch, Pointer Submission::*buffer) {
  const char* start = nullptr;
  const char* next = nullptr;
  for (const Entry* e : batch) {
    const uint64_t bytes = e->bytes();
    if (bytes == 0) continue;  // zero-size tensors may point anywhere
    const char* at = static_cast<const char*>(e->what.*buffer);
    if (next == nullptr) {
      start = at;
    } else if (at != next) {
      return nullptr;
    }
    next = at + bytes;
  }
  return static_cast<Pointer>(const_cast<char*>(start));
}

Status Scheduler::stage(const std::vector<Entry*>& batch, bool in) {
  DeviceMemory& device = *options_.device_memory;
  const auto deadline = Clock::now() + options_.timeout;
  // The batch's streams, each waited for once on its device (a rank may use several devices).
  std::vector<std::pair<int32_t, void*>> streams;
  const auto failed = [](const Status& s) {
    return error(s.code(), "staging CUDA tensors in host memory: " + s.message());
  };
  uint64_t offset = 0;
  for (const Entry* e : batch) {
    const Submission& w = e->what;
    char* host = fusion_buffer_.data() + offset;  // reserved by run_fused
    offset += e->bytes();
    const int32_t ordinal = w.spec.device;
    const Status s = in ? device.copy(host, w.send, e->bytes(), ordinal, w.stream)
                        : device.copy(w.recv, host, e->bytes(), ordinal, w.stream);
    if (!s.ok()) return failed(s);
    const std::pair<int32_t, void*> on(ordinal, w.stream);
    if (std::find(streams.begin(), streams.end(), on) == streams.end()) streams.push_back(on);
  }
  for (const auto& [ordinal, stream] : streams) {
    const Status s = device.synchronize(ordinal, stream, deadline);
    if (!s.ok()) return failed(s);
  }
  return Status::success();
}

void Scheduler::run_fused(std::vector<Entry*>& batch) {
  if (batch.empty()) return;
  const TensorSpec& s = batch.front()->what.spec;
  if (on_device(s)) {
    run_on_device(batch);
    return;
  }
  const bool staged_batch = data_.stages(s.memory);
  if (batch.size() == 1 && !staged_batch) {
    run_alone(*batch.front());
    batch.clear();
    return;
  }
  const size_t element = hvd_dtype_size(s.dtype);
  uint64_t total = 0;
  for (Entry* e : batch) total += e->bytes();

  // Tensors already end to end (a framework's flat gradient buffer, say) are reduced where they
  // lie, and each side that is not needs the fusion buffer. Every rank decides for itself: the
  // elements are in the same order either way. Inputs and outputs that overlap only in part
  // would be read after being written, so they take the buffer.
  // CUDA tensors on a backend that takes host memory only always go through the (host) buffer.
  const void* send =
      s.prescale == 1 && !staged_batch ? end_to_end(batch, &Submission::send) : nullptr;
  void* recv = s.postscale == 1 && !staged_batch ? end_to_end(batch, &Submission::recv) : nullptr;
  if (send != nullptr && recv != nullptr && send != recv) {
    const auto* a = static_cast<const char*>(send);
    const auto* b = static_cast<const char*>(recv);
    if (a < b + total && b < a + total) send = nullptr;
  }
  char* buffer = nullptr;
  if (send == nullptr || recv == nullptr) {
    buffer =
        fusion_buffer_.reserve(total, staged_batch ? options_.device_memory : nullptr, s.device);
    // Fatal, as a failed allocation always was (the loop fails the scheduler): this rank alone
    // skipping the batch would pair its next allreduce with its peers' this one.
    if (buffer == nullptr) throw std::bad_alloc();
  }

  Status status;
  const auto copy_in = Clock::now();
  const bool copied_in = send == nullptr;
  const uint64_t count = total / element;
  if (copied_in && status.ok()) {
    if (staged_batch) {
      status = stage(batch, /*in=*/true);
      if (status.ok()) scale(buffer, buffer, count, s.dtype, s.prescale);
    } else {
      uint64_t offset = 0;
      for (Entry* e : batch) {
        scale(buffer + offset, e->what.send, e->elements, s.dtype, s.prescale);
        offset += e->bytes();
      }
    }
    send = buffer;
  }
  const bool copy_back = recv == nullptr;
  if (copy_back) recv = buffer;
  const auto reduce = Clock::now();
  if (status.ok()) {
    hvd_collective_args a = args_for(batch.front()->what, send, recv, count);
    if (staged_batch) {  // the backend sees host memory
      a.memory_type = HVD_MEMORY_HOST;
      a.device = -1;
      a.stream = nullptr;
    }
    status = data_.allreduce(a);
    ++backend_calls_;
  }
  const auto copy_out = Clock::now();
  if (status.ok() && copy_back) {
    if (staged_batch) {
      scale(buffer, buffer, count, s.dtype, s.postscale);
      status = stage(batch, /*in=*/false);
    } else {
      uint64_t offset = 0;
      for (Entry* e : batch) {
        scale(e->what.recv, buffer + offset, e->elements, s.dtype, s.postscale);
        offset += e->bytes();
      }
    }
  }
  const auto end = Clock::now();
  if (timeline_) {
    for (Entry* e : batch) {
      timeline_->span(e->what.name, "QUEUE", e->negotiated, copy_in);
      if (copied_in) timeline_->span(e->what.name, "MEMCPY_IN_FUSION_BUFFER", copy_in, reduce);
      timeline_->span(e->what.name, "ALLREDUCE", reduce, copy_out);
      if (copy_back) timeline_->span(e->what.name, "MEMCPY_OUT_FUSION_BUFFER", copy_out, end);
    }
  }
  finish(batch, status);
  batch.clear();
}

void Scheduler::run_on_device(std::vector<Entry*>& batch) {
  const TensorSpec& s = batch.front()->what.spec;
  std::vector<DeviceExecutor::Tensor> tensors;
  tensors.reserve(batch.size());
  for (const Entry* e : batch) {
    tensors.push_back({e->what.send, e->what.recv, e->elements, e->ready});
  }
  const auto start = Clock::now();
  const Submission& first = batch.front()->what;
  auto reduce = [&](const void* send, void* recv, uint64_t count, void* stream) {
    hvd_collective_args a = args_for(first, send, recv, count);
    a.stream = stream;
    ++backend_calls_;
    return data_.allreduce(a);
  };
  const Result<DeviceExecutor::Done> done =
      device_executor_->allreduce(tensors, s.dtype, s.prescale, s.postscale, s.device, reduce);
  if (!done.ok()) fail_device(done.status());
  if (timeline_) {
    const auto end = Clock::now();
    for (const Entry* e : batch) {
      timeline_->span(e->what.name, "QUEUE", e->negotiated, start);
      timeline_->span(e->what.name, "ALLREDUCE", start, end);  // queued on the device
    }
  }
  finish(batch, done.status(), on_device_done(done));
  batch.clear();
}

void Scheduler::fail_device(const Status& status) {
  // This rank may have queued only part of the batch's work: its next backend call would pair
  // with its peers' earlier one. Broken, as a backend error breaks the communicator.
  failure_token_->set(status);
  data_.abort(status);
}

void Scheduler::run_alone(Entry& e) {
  if (on_device(e.what.spec)) {
    // Queued on hvd's stream after the tensor's ready event: the backend gets that stream.
    const auto start = Clock::now();
    const Result<DeviceExecutor::Done> done =
        device_executor_->run(e.ready, e.what.spec.device, [&](void* stream) {
          e.what.stream = stream;
          return run_collective(e);
        });
    ++backend_calls_;
    if (!done.ok()) fail_device(done.status());
    if (timeline_) {
      timeline_->span(e.what.name, "QUEUE", e.negotiated, start);
      timeline_->span(e.what.name, op_type_name(e.what.spec.type), start, Clock::now());
    }
    finish(&e, done.status(), on_device_done(done));
    return;
  }
  const auto start = Clock::now();
  const Status status = run_collective(e);
  ++backend_calls_;
  if (timeline_) {
    timeline_->span(e.what.name, "QUEUE", e.negotiated, start);
    timeline_->span(e.what.name, op_type_name(e.what.spec.type), start, Clock::now());
  }
  // CUDA memory given to the backend as it is (the direct path): queued on its own stream.
  DeviceWork direct;
  direct.direct = e.what.spec.memory == HVD_MEMORY_CUDA && !data_.stages(e.what.spec.memory);
  finish(&e, status, direct);
}

Status Scheduler::run_collective(Entry& e) {
  const Submission& w = e.what;
  const uint64_t count = e.elements;
  Status status;
  switch (w.spec.type) {
    case HVD_COLLECTIVE_ALLREDUCE: {
      const void* send = w.send;
      if (w.spec.prescale != 1) {
        scale(w.recv, w.send, count, w.spec.dtype, w.spec.prescale);
        send = w.recv;
      }
      status = data_.allreduce(args_for(w, send, w.recv, count));
      if (status.ok()) scale(w.recv, w.recv, count, w.spec.dtype, w.spec.postscale);
      break;
    }
    case HVD_COLLECTIVE_ALLGATHER:
      status = run_allgather(e);
      break;
    case HVD_COLLECTIVE_BROADCAST:
      status = data_.broadcast(args_for(w, w.send, w.recv, count));
      break;
    case HVD_COLLECTIVE_REDUCE_SCATTER:
      status = run_reduce_scatter(e);
      break;
    case HVD_COLLECTIVE_ALLTOALL:
      status = run_alltoall(e);
      break;
    case HVD_COLLECTIVE_JOIN:  // completed by execute(), never run
      break;
    default:  // a barrier is never a submission's
      status = error(HVD_ERR_INTERNAL, std::string(op_type_name(w.spec.type)) + " '" + w.name +
                                           "' is not a collective the scheduler runs");
      break;
  }
  return status;
}

// The submission's recv buffer, or (recvbuf NULL) one of `bytes` hvd allocates into *allocated.
// A rank that cannot allocate fails alone: the other ranks go on into the collective and time
// out (naming this one, if their backend can), as with any rank that fails outside it.
Result<void*> Scheduler::output_of(const Submission& w, uint64_t bytes,
                                   std::unique_ptr<char[]>* allocated) {
  if (w.recv != nullptr || bytes == 0) return w.recv;
  allocated->reset(new (std::nothrow) char[bytes]);
  if (!*allocated) {
    return error(HVD_ERR_INTERNAL, std::string(op_type_name(w.spec.type)) + " '" + w.name +
                                       "': could not allocate " + std::to_string(bytes) +
                                       " bytes for the output");
  }
  return static_cast<void*>(allocated->get());
}

Status Scheduler::run_allgather(Entry& e) {
  const Submission& w = e.what;
  const size_t element = hvd_dtype_size(w.spec.dtype);
  uint64_t row = 1;  // elements per unit of the first dimension (the same on every rank)
  for (size_t i = 1; i < w.spec.shape.size(); ++i) row *= static_cast<uint64_t>(w.spec.shape[i]);
  std::vector<uint64_t> counts;  // by rank
  counts.reserve(e.first_dims.size());
  uint64_t total = 0;
  int64_t first_dim = 0;
  for (int64_t rows : e.first_dims) {
    counts.push_back(static_cast<uint64_t>(rows) * row);  // the negotiator checked the sums
    total += counts.back();
    first_dim += rows;
  }
  std::unique_ptr<char[]> allocated;
  HVD_ASSIGN_OR_RETURN(void* const recv, output_of(w, total * element, &allocated));
  hvd_collective_args a = args_for(w, w.send, recv, e.elements);
  if (std::any_of(counts.begin(), counts.end(), [&](uint64_t n) { return n != counts[0]; })) {
    a.recv_counts = counts.data();  // allgatherv (the communicator's, on any backend)
  }
  const Status status = data_.allgather(a);
  if (status.ok() && w.recv == nullptr) e.completion->set_output(std::move(allocated), first_dim);
  return status;
}

Status Scheduler::run_reduce_scatter(Entry& e) {
  const Submission& w = e.what;
  const TensorSpec& spec = w.spec;
  const size_t element = hvd_dtype_size(spec.dtype);
  const uint64_t n = static_cast<uint64_t>(data_.size());
  const uint64_t rank = static_cast<uint64_t>(data_.rank());
  const uint64_t rows = static_cast<uint64_t>(spec.shape[0]);
  const uint64_t row = rows == 0 ? 0 : e.elements / rows;  // elements per row
  // Horovod's split: rows = q * n + m, and the first m ranks get one row more.
  const uint64_t q = rows / n, m = rows % n;
  const uint64_t mine = (q + (rank < m ? 1 : 0)) * row;
  // Host memory is scaled here; CUDA memory on the device executor's stream, by its kernel.
  const bool device = on_device(spec);
  const auto copy_scaled = [&](const std::vector<CopySpan>& spans, double factor) {
    if (device) {
      if (factor == 1 && spans.size() == 1 && spans[0].dst == spans[0].src)
        return Status::success();
      return options_.device_memory->copy_scaled(spans.data(), spans.size(), spec.dtype, factor,
                                                 spec.device, w.stream);
    }
    for (const CopySpan& c : spans) scale(c.dst, c.src, c.count, spec.dtype, factor);
    return Status::success();
  };
  if (m == 0 && spec.prescale == 1) {
    HVD_RETURN_IF_ERROR(data_.reduce_scatter(args_for(w, w.send, w.recv, q * row)));
    return copy_scaled({{w.recv, w.recv, mine}}, spec.postscale);
  }
  // Uneven or prescaled (staged CUDA memory: prepare() refuses these): every rank's block padded
  // to q + 1 rows in a buffer of hvd's, scaled on the way in, and this rank's rows copied out.
  const uint64_t block = (m == 0 ? q : q + 1) * row;
  const size_t in_bytes = n * block * element;
  char* in = nullptr;
  if (device) {
    HVD_ASSIGN_OR_RETURN(in, device_executor_->scratch(spec.device, in_bytes + block * element));
  } else {
    scratch_.assign(in_bytes + block * element, 0);
    in = scratch_.data();
  }
  char* out = in + in_bytes;
  std::vector<CopySpan> blocks;
  const char* from = static_cast<const char*>(w.send);
  for (uint64_t r = 0; r < n; ++r) {
    const uint64_t count = (q + (r < m ? 1 : 0)) * row;
    blocks.push_back({in + r * block * element, from, count});
    from += count * element;
  }
  HVD_RETURN_IF_ERROR(copy_scaled(blocks, spec.prescale));
  HVD_RETURN_IF_ERROR(data_.reduce_scatter(args_for(w, in, out, block)));
  return copy_scaled({{w.recv, out, mine}}, spec.postscale);
}

Status Scheduler::run_alltoall(Entry& e) {
  const Submission& w = e.what;
  const size_t element = hvd_dtype_size(w.spec.dtype);
  const size_t n = static_cast<size_t>(data_.size());
  const size_t rank = static_cast<size_t>(data_.rank());
  uint64_t row = 1;  // elements per row (the same on every rank)
  for (size_t i = 1; i < w.spec.shape.size(); ++i) row *= static_cast<uint64_t>(w.spec.shape[i]);
  // The negotiated splits of every rank, in elements; the negotiator checked every sum.
  std::vector<uint64_t> matrix(n * n);
  for (size_t i = 0; i < n * n; ++i) matrix[i] = static_cast<uint64_t>(e.first_dims[i]) * row;
  std::vector<uint64_t> recv_counts(n);
  std::vector<int64_t> received(n);
  uint64_t total = 0;
  int64_t first_dim = 0;
  for (size_t r = 0; r < n; ++r) {
    recv_counts[r] = matrix[r * n + rank];
    received[r] = e.first_dims[r * n + rank];
    total += recv_counts[r];
    first_dim += received[r];
  }
  std::unique_ptr<char[]> allocated;
  HVD_ASSIGN_OR_RETURN(void* const recv, output_of(w, total * element, &allocated));
  hvd_collective_args a = args_for(w, w.send, recv, e.elements);
  a.send_counts = matrix.data() + rank * n;
  a.recv_counts = recv_counts.data();
  const Status status = data_.alltoall(a, matrix.data());
  if (status.ok()) {
    if (w.recv == nullptr) e.completion->set_output(std::move(allocated), first_dim);
    e.completion->set_received_splits(std::move(received));
  }
  return status;
}

void Scheduler::finish(Entry* e, const Status& status, const DeviceWork& on_device) {
  finish(std::vector<Entry*>{e}, status, on_device);
}

void Scheduler::finish(const std::vector<Entry*>& entries, const Status& status,
                       const DeviceWork& on_device) {
  std::vector<std::shared_ptr<Completion>> completions;
  completions.reserve(entries.size());
  for (Entry* e : entries) {
    completions.push_back(std::move(e->completion));
    if (e->sent) sent_.erase(e->what.name);  // still there if it fails unanswered (fail_all)
    // Its device work (if any) is queued after its ready event: the event may serve again.
    if (device_executor_)
      device_executor_->release(std::exchange(e->ready, {}), e->what.spec.device);
  }
  {
    // The names are free before anyone learns of the completions: a caller that waits and then
    // submits the same name again must not find it in flight. One lock for the whole batch.
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry* e : entries) {
      if (e->stand_in) {
        e->stand_in.reset();  // a stand-in's name was never in flight
      } else {
        auto name = in_flight_.extract(e->what.name);
        if (spare_names_.size() < kSpareEntries) spare_names_.push_back(std::move(name));
      }
      if (spare_.size() < kSpareEntries) {
        spare_.splice(spare_.begin(), pending_, e->self);
      } else {
        pending_.erase(e->self);
      }
    }
  }
  tensors_ += completions.size();
  Completion::complete_all(completions, status, on_device);
}

}  // namespace hvd::core
