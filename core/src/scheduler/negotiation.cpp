#include "scheduler/negotiation.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace hvd::core {
namespace {

// Little byte writer/reader for the gathered requests (same machine kind on every rank).
class Writer {
 public:
  template <typename T>
  void put(const T& value) {
    const char* p = reinterpret_cast<const char*>(&value);
    out_.insert(out_.end(), p, p + sizeof value);
  }
  void put_string(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<char> take() { return std::move(out_); }

 private:
  std::vector<char> out_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  bool get(T* value) {
    if (static_cast<size_t>(end_ - p_) < sizeof *value) return false;
    std::memcpy(value, p_, sizeof *value);
    p_ += sizeof *value;
    return true;
  }
  bool get_string(std::string* s) {
    uint32_t n = 0;
    if (!get(&n) || static_cast<size_t>(end_ - p_) < n) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }

 private:
  const char* p_;
  const char* end_;
};

std::string shape_text(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// "alone", or which group: groups are named by a hash of their members' names.
std::string group_text(const TensorSpec& spec) {
  if (spec.group == 0) return "alone";
  char id[24];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(spec.group));
  return "in a group of " + std::to_string(spec.group_size) + " tensors (" + id + ")";
}

std::string memory_text(hvd_memory_type memory) {
  return memory == HVD_MEMORY_CUDA ? "CUDA memory" : "host memory";
}

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

const char* op_type_name(hvd_collective type) {
  switch (type) {
    case HVD_COLLECTIVE_ALLREDUCE:
      return "ALLREDUCE";
    case HVD_COLLECTIVE_ALLGATHER:
      return "ALLGATHER";
    case HVD_COLLECTIVE_BROADCAST:
      return "BROADCAST";
    case HVD_COLLECTIVE_REDUCE_SCATTER:
      return "REDUCESCATTER";
    case HVD_COLLECTIVE_ALLTOALL:
      return "ALLTOALL";
    case HVD_COLLECTIVE_BARRIER:
      return "BARRIER";
    case HVD_COLLECTIVE_JOIN:
      return "JOIN";
    default:
      return "?";
  }
}

uint64_t TensorSpec::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

bool TensorSpec::operator==(const TensorSpec& o) const {
  return type == o.type && dtype == o.dtype && shape == o.shape && op == o.op && root == o.root &&
         memory == o.memory && device == o.device && device_executor == o.device_executor &&
         prescale == o.prescale && postscale == o.postscale && group == o.group &&
         group_size == o.group_size && output_capacity == o.output_capacity && splits == o.splits;
}

std::vector<char> serialize(const std::vector<Request>& requests) {
  Writer w;
  w.put(static_cast<uint32_t>(requests.size()));
  for (const Request& r : requests) {
    const TensorSpec& s = r.spec;
    w.put_string(r.name);
    w.put(static_cast<uint8_t>(s.type));
    w.put(static_cast<int32_t>(s.dtype));
    w.put(static_cast<uint32_t>(s.shape.size()));
    for (int64_t d : s.shape) w.put(d);
    w.put(static_cast<int32_t>(s.op));
    w.put(s.root);
    w.put(static_cast<int32_t>(s.memory));
    w.put(static_cast<uint8_t>(s.device_executor ? 1 : 0));
    w.put(s.device);
    w.put(s.prescale);
    w.put(s.postscale);
    w.put(s.group);
    w.put(s.group_size);
    w.put(s.output_capacity);
    w.put(static_cast<uint32_t>(s.splits.size()));
    for (int64_t d : s.splits) w.put(d);
    w.put_string(r.error);
    w.put(static_cast<int32_t>(r.error_code));
  }
  return w.take();
}

Result<std::vector<Request>> deserialize(const char* data, size_t size) {
  Reader r(data, size);
  uint32_t count = 0;
  auto corrupt = [] { return error(HVD_ERR_INTERNAL, "a rank's tensor requests are corrupt"); };
  if (!r.get(&count)) return corrupt();
  // The count comes from a peer: one the bytes cannot hold is refused before it sizes anything.
  // Every request takes at least its fixed fields (serialize(): name length, type, dtype, ndim,
  // op, root, memory, device executor, device, prescale, postscale, group, group size, output
  // capacity, splits).
  constexpr size_t kMinRequestBytes = 4 + 1 + 4 + 4 + 4 + 4 + 4 + 1 + 4 + 8 + 8 + 8 + 4 + 8 + 4;
  if (count > (size - sizeof count) / kMinRequestBytes) return corrupt();
  std::vector<Request> out(count);
  for (Request& req : out) {
    TensorSpec& s = req.spec;
    uint8_t type = 0;
    int32_t dtype = 0, op = 0, memory = 0;
    uint8_t device_executor = 0;
    uint32_t ndim = 0;
    if (!r.get_string(&req.name) || !r.get(&type) || !r.get(&dtype) || !r.get(&ndim) || ndim > 64) {
      return corrupt();
    }
    s.shape.resize(ndim);
    for (int64_t& d : s.shape) {
      if (!r.get(&d)) return corrupt();
    }
    if (!r.get(&op) || !r.get(&s.root) || !r.get(&memory) || !r.get(&device_executor) ||
        device_executor > 1 || !r.get(&s.device) || !r.get(&s.prescale) || !r.get(&s.postscale) ||
        !r.get(&s.group) || !r.get(&s.group_size) || !r.get(&s.output_capacity) ||
        type >= HVD_COLLECTIVE_COUNT || type == HVD_COLLECTIVE_BARRIER) {
      return corrupt();
    }
    uint32_t nsplits = 0;
    if (!r.get(&nsplits) || nsplits > 1u << 20) return corrupt();
    s.splits.resize(nsplits);
    for (int64_t& d : s.splits) {
      if (!r.get(&d)) return corrupt();
    }
    int32_t error_code = 0;
    if (!r.get_string(&req.error) || !r.get(&error_code)) return corrupt();
    req.error_code = static_cast<hvd_status>(error_code);
    s.type = static_cast<hvd_collective>(type);
    s.dtype = static_cast<hvd_dtype>(dtype);
    s.op = static_cast<hvd_reduce_op>(op);
    s.memory = static_cast<hvd_memory_type>(memory);
    s.device_executor = device_executor != 0;
  }
  return out;
}

Negotiator::Negotiator(int rank, int size, size_t cache_capacity)
    : rank_(rank), size_(size), capacity_(cache_capacity), joined_(static_cast<size_t>(size), 0) {}

std::optional<uint32_t> Negotiator::cached_bit(const std::string& name,
                                               const TensorSpec& spec) const {
  const auto it = slot_of_.find(name);
  if (it == slot_of_.end() || slots_[it->second]->spec != spec) return std::nullopt;
  return it->second;
}

std::string Negotiator::mismatch(const std::string& name, const TensorSpec& a,
                                 const TensorSpec& b) {
  const std::string op = op_type_name(a.type);
  const std::string tensor = " for tensor '" + name + "': ";
  if (a.type != b.type) {
    return std::string("Mismatched collective operations") + tensor + "One rank did an " + op +
           ", but another rank did an " + op_type_name(b.type) + ".";
  }
  if (a.dtype != b.dtype) {
    return "Mismatched " + op + " data types" + tensor + "One rank sent a tensor of type " +
           hvd_dtype_name(a.dtype) + ", but another rank sent a tensor of type " +
           hvd_dtype_name(b.dtype) + ".";
  }
  // Allgather concatenates along the first dimension, in which the ranks may differ; alltoall
  // exchanges rows of it.
  const bool rows_differ = a.type == HVD_COLLECTIVE_ALLGATHER || a.type == HVD_COLLECTIVE_ALLTOALL;
  const bool shapes_differ =
      rows_differ ? a.shape.size() != b.shape.size() ||
                        !std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                                    b.shape.begin() + (b.shape.empty() ? 0 : 1))
                  : a.shape != b.shape;
  if (shapes_differ) {
    return "Mismatched " + op + " tensor shapes" + tensor + "One rank sent a tensor of shape " +
           shape_text(a.shape) + ", but another rank sent a tensor of shape " +
           shape_text(b.shape) + (rows_differ ? " (only the first dimension may differ)." : ".");
  }
  if ((a.type == HVD_COLLECTIVE_ALLREDUCE || a.type == HVD_COLLECTIVE_REDUCE_SCATTER) &&
      a.op != b.op) {
    return "Mismatched " + op + " reduce ops" + tensor + "One rank sent op " +
           hvd_reduce_op_name(a.op) + ", but another rank sent op " + hvd_reduce_op_name(b.op) +
           ".";
  }
  if (a.type == HVD_COLLECTIVE_BROADCAST && a.root != b.root) {
    return "Mismatched " + op + " root ranks" + tensor + "One rank specified root rank " +
           std::to_string(a.root) + ", but another rank specified root rank " +
           std::to_string(b.root) + ".";
  }
  // The kind of memory, not the device: each rank may use its own GPU (device = local rank).
  if (a.memory != b.memory) {
    return "Mismatched " + op + " memory kinds" + tensor + "One rank sent a tensor in " +
           memory_text(a.memory) + ", but another rank sent a tensor in " + memory_text(b.memory) +
           ".";
  }
  if (a.device_executor != b.device_executor) {
    return "Mismatched " + op + " CUDA paths" + tensor +
           "One rank runs it on hvd's device executor, but another rank cannot drive its device "
           "and hands it to the backend as it is (that rank's log says why).";
  }
  if (a.prescale != b.prescale) {
    return "Mismatched " + op + " prescale factors" + tensor + "One rank sent factor " +
           number_text(a.prescale) + ", but another rank sent factor " + number_text(b.prescale) +
           ".";
  }
  if (a.postscale != b.postscale) {
    return "Mismatched " + op + " postscale factors" + tensor + "One rank sent factor " +
           number_text(a.postscale) + ", but another rank sent factor " + number_text(b.postscale) +
           ".";
  }
  if (a.group != b.group || a.group_size != b.group_size) {
    return "Mismatched " + op + " groups" + tensor + "One rank submitted it " + group_text(a) +
           ", but another rank " + group_text(b) + ".";
  }
  return "";
}

std::optional<Response> Negotiator::add(int rank, const Request& request, Clock::time_point now) {
  auto [it, fresh] = table_.try_emplace(request.name);
  Partial& partial = it->second;
  if (fresh) {
    partial.by_rank.resize(static_cast<size_t>(size_));
    partial.first_seen = now;
  }
  auto& slot = partial.by_rank[static_cast<size_t>(rank)];
  if (slot) {
    // The enqueue check rejects a duplicate name in flight, so this is a rank out of step.
    Response failed{request.name, request.spec,
                    "Duplicate tensor name '" + request.name + "': rank " + std::to_string(rank) +
                        " submitted it again before it completed."};
    table_.erase(it);
    return failed;
  }
  slot = request.spec;
  if (!request.error.empty() && partial.error.empty()) {
    partial.error = "Tensor '" + request.name + "' failed on rank " + std::to_string(rank) + ": " +
                    request.error;
    partial.error_code = request.error_code;
  }
  ++partial.count;
  if (!complete(partial)) return std::nullopt;
  Response response = respond(request.name, partial);
  table_.erase(it);
  return response;
}

bool Negotiator::complete(const Partial& partial) const {
  if (partial.count == size_) return true;
  for (int r = 0; r < size_; ++r) {
    if (!partial.by_rank[static_cast<size_t>(r)] && !joined(r)) return false;
  }
  return true;
}

std::string Negotiator::stand_in_refusal(const std::string& name, const TensorSpec& spec) const {
  if (spec.type == HVD_COLLECTIVE_JOIN) return {};
  std::string ranks;
  for (int r = 0; r < size_; ++r) {
    if (joined(r)) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (ranks.empty() || (spec.type == HVD_COLLECTIVE_ALLREDUCE && spec.memory == HVD_MEMORY_HOST))
    return {};
  return std::string(op_type_name(spec.type)) + " '" + name + "' cannot run while rank(s) " +
         ranks +
         " have joined (hvd_join_async): joined ranks take part in host-memory allreduces only";
}

Response Negotiator::respond(const std::string& name, Partial& partial) const {
  // This rank's spec, or where it has joined, the first rank's that submitted the tensor.
  int first = 0;
  while (!partial.by_rank[static_cast<size_t>(first)]) ++first;
  const bool mine = partial.by_rank[static_cast<size_t>(rank_)].has_value();
  Response response{name, *partial.by_rank[static_cast<size_t>(mine ? rank_ : first)], "", {}};
  response.stand_in = !mine;
  if (!partial.error.empty()) {
    response.error = std::move(partial.error);
    response.error_code = partial.error_code;
    return response;
  }
  const TensorSpec& reference = *partial.by_rank[static_cast<size_t>(first)];
  for (int r = first + 1; r < size_ && response.error.empty(); ++r) {
    if (partial.by_rank[static_cast<size_t>(r)]) {
      response.error = mismatch(name, reference, *partial.by_rank[static_cast<size_t>(r)]);
    }
  }
  if (response.error.empty() && partial.count < size_) {
    response.error = stand_in_refusal(name, reference);
    if (!response.error.empty()) response.error_code = HVD_ERR_UNSUPPORTED;
  }
  if (response.error.empty() && response.spec.type == HVD_COLLECTIVE_ALLGATHER) {
    response.error = first_dims_of(name, partial.by_rank, &response.first_dims);
  }
  if (response.error.empty() && response.spec.type == HVD_COLLECTIVE_ALLTOALL) {
    response.error = splits_of(name, partial.by_rank, &response.first_dims);
    if (!response.error.empty()) response.error_code = HVD_ERR_INVALID_ARGUMENT;
  }
  return response;
}

void Negotiator::complete_joined(std::vector<Response>* out) {
  for (auto it = table_.begin(); it != table_.end();) {
    if (!complete(it->second)) {
      ++it;
      continue;
    }
    Response response = respond(it->first, it->second);
    if (response.error.empty()) cache_insert(response);
    out->push_back(std::move(response));
    it = table_.erase(it);
  }
}

std::string Negotiator::first_dims_of(const std::string& name,
                                      const std::vector<std::optional<TensorSpec>>& by_rank,
                                      FirstDims* first_dims) {
  const Shape& shape = by_rank[0]->shape;  // beyond the first dimension, every rank's
  uint64_t row = 1;                        // elements per unit of the first dimension
  for (size_t i = 1; i < shape.size(); ++i) row *= static_cast<uint64_t>(shape[i]);
  uint64_t rows = 0;
  bool overflow = false;
  first_dims->clear();
  for (const auto& spec : by_rank) {
    first_dims->push_back(spec->shape.empty() ? 1 : spec->shape[0]);  // a scalar is one row
    overflow |= __builtin_add_overflow(rows, static_cast<uint64_t>(first_dims->back()), &rows);
  }
  uint64_t total = 0;
  overflow |= __builtin_mul_overflow(rows, row, &total) || total > (UINT64_MAX >> 8);
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const uint64_t holds = by_rank[r]->output_capacity;
    if (!overflow && (holds == TensorSpec::kAllocated || holds >= total)) continue;
    std::string dims;
    for (size_t q = 0; q < first_dims->size(); ++q) {
      dims += (q ? ", " : "") + std::to_string((*first_dims)[q]);
    }
    std::string why = "Mismatched ALLGATHER first dimensions for tensor '" + name +
                      "': the ranks sent " + dims + " (in rank order), ";
    if (overflow) return why + "too many elements in all.";
    return why + std::to_string(total) + " elements in all, but rank " + std::to_string(r) +
           "'s output buffer holds " + std::to_string(holds) +
           " (an allgather's recvbuf is sized for equal shapes; pass recvbuf NULL and hvd "
           "allocates the output once the sizes are known).";
  }
  return "";
}

std::string Negotiator::splits_of(const std::string& name,
                                  const std::vector<std::optional<TensorSpec>>& by_rank,
                                  FirstDims* matrix) {
  const size_t n = by_rank.size();
  const Shape& shape = by_rank[0]->shape;
  uint64_t row = 1;  // elements per row (the same on every rank)
  for (size_t i = 1; i < shape.size(); ++i) row *= static_cast<uint64_t>(shape[i]);
  matrix->clear();
  matrix->reserve(n * n);
  for (const auto& spec : by_rank) {
    // Each rank checked its own splits (n of them, summing to its first dimension).
    if (spec->splits.size() != n) {
      return "Mismatched ALLTOALL splits for tensor '" + name + "': a rank sent " +
             std::to_string(spec->splits.size()) + " splits to " + std::to_string(n) + " ranks.";
    }
    matrix->insert(matrix->end(), spec->splits.begin(), spec->splits.end());
  }
  for (size_t r = 0; r < n; ++r) {
    uint64_t rows = 0;
    bool overflow = false;
    for (size_t s = 0; s < n; ++s) {
      overflow |= __builtin_add_overflow(rows, static_cast<uint64_t>((*matrix)[s * n + r]), &rows);
    }
    uint64_t total = 0;
    overflow |= __builtin_mul_overflow(rows, row, &total) || total > (UINT64_MAX >> 8);
    const uint64_t holds = by_rank[r]->output_capacity;
    if (!overflow && (holds == TensorSpec::kAllocated || holds >= total)) continue;
    std::string why = "ALLTOALL for tensor '" + name + "': rank " + std::to_string(r) + " ";
    if (overflow) return why + "would receive too many elements.";
    return why + "receives " + std::to_string(total) + " elements, but its output buffer holds " +
           std::to_string(holds) + " (pass recvbuf NULL and hvd allocates the output).";
  }
  return "";
}

void Negotiator::cache_insert(const Response& response) {
  if (capacity_ == 0) return;
  const std::string& name = response.name;
  cache_erase(name);
  if (cache_order_.size() >= capacity_) cache_erase(slots_[cache_order_.front()]->name);
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    order_pos_.emplace_back();
    entry_pos_.emplace_back();
  }
  slots_[slot] = CacheEntry{name, response.spec, response.first_dims};
  slot_of_[name] = slot;
  order_pos_[slot] = cache_order_.insert(cache_order_.end(), slot);
  entry_pos_[slot] = entry_order_.insert(entry_order_.end(), slot);
}

void Negotiator::cache_erase(const std::string& name) {
  const auto it = slot_of_.find(name);
  if (it == slot_of_.end()) return;
  const uint32_t slot = it->second;
  cache_order_.erase(order_pos_[slot]);
  entry_order_.erase(entry_pos_[slot]);
  slots_[slot].reset();
  free_slots_.push_back(slot);
  slot_of_.erase(it);
}

Negotiator::Ready Negotiator::cycle(const std::vector<uint8_t>& bits_ready,
                                    const std::vector<std::vector<Request>>& requests,
                                    Clock::time_point now) {
  Ready ready;
  for (uint32_t bit : entry_order_) {
    if (bit >= bits_ready.size() || !bits_ready[bit]) continue;
    ready.cached.push_back(bit);
    cache_order_.splice(cache_order_.end(), cache_order_, order_pos_[bit]);  // recently used
  }
  for (size_t rank = 0; rank < requests.size(); ++rank) {
    for (const Request& request : requests[rank]) {
      if (request.spec.type == HVD_COLLECTIVE_JOIN) {
        // From now on the rank counts as present for every tensor (with zeros), until every
        // rank has joined; what waited only for it is ready now.
        joined_[rank] = 1;
        last_joined_ = static_cast<int>(rank);
        std::optional<Response> all = add(static_cast<int>(rank), request, now);
        if (all) {
          all->first_dims = {last_joined_};
          std::fill(joined_.begin(), joined_.end(), 0);
          last_joined_ = -1;
          ready.negotiated.push_back(std::move(*all));
        } else {
          complete_joined(&ready.negotiated);
        }
        continue;
      }
      // A cached name sent in full: some rank's spec changed (or it waited too long on the
      // bit). Every rank forgets the entry and sends its own request, so the message table sees
      // all of them.
      cache_erase(request.name);
      std::optional<Response> done = add(static_cast<int>(rank), request, now);
      if (!done) continue;
      if (done->error.empty()) cache_insert(*done);
      ready.negotiated.push_back(std::move(*done));
    }
  }
  return ready;
}

std::vector<Negotiator::Stall> Negotiator::stalled(Clock::time_point now,
                                                   std::chrono::duration<double> after) const {
  std::vector<Stall> out;
  for (const auto& [name, partial] : table_) {
    const auto waited = now - partial.first_seen;
    if (waited < after) continue;
    Stall s{name, waited, {}};
    for (int r = 0; r < size_; ++r) {
      if (!partial.by_rank[static_cast<size_t>(r)]) s.missing.push_back(r);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hvd::core
