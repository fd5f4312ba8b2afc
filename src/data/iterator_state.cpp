// The binary form of an iterator's position: a bounds-checked reader and writer, and the walk over
// a dataset graph that describes it and collects its counters (see iterator_state.hpp).
#include "mirrored/data/detail/iterator_state.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"

namespace mirrored::data::detail {
namespace {

namespace core = ::mirrored::detail;

// The first bytes of every state: which format the rest is in.
constexpr std::string_view kMagic = "mirrored.iterator_state";
// 2: a distributed iterator's state also records the steps taken in its pass (its global
// position, what a restore on another placement checks the workers agree on); 1 is still read.
constexpr uint64_t kVersion = kStateVersionWithSteps;
constexpr uint64_t kOldestVersion = 1;
// Dimensions are stored as int64; more than this many is corrupt state, not a tensor.
constexpr uint64_t kMaxRank = 64;

void describe_into(const NodeBase& node, std::string& out) {
  const std::vector<const NodeBase*> in = node.inputs();
  if (in.size() == 1) {
    describe_into(*in[0], out);
    out += '.';
    out += node.describe();
    return;
  }
  out += node.describe();
  if (in.empty()) return;
  out += '(';
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (i) out += ", ";
    describe_into(*in[i], out);
  }
  out += ')';
}

void counters_into(const NodeBase& node, std::vector<uint64_t>& out) {
  for (const NodeBase* in : node.inputs()) counters_into(*in, out);
  const std::vector<uint64_t> mine = node.counters();
  out.insert(out.end(), mine.begin(), mine.end());
}

void set_counters_from(const NodeBase& node, const std::vector<uint64_t>& values, std::size_t& at) {
  for (const NodeBase* in : node.inputs()) set_counters_from(*in, values, at);
  const std::size_t n = node.counters().size();
  if (n == 0) return;
  node.set_counters(std::vector<uint64_t>(values.begin() + static_cast<std::ptrdiff_t>(at),
                                          values.begin() + static_cast<std::ptrdiff_t>(at + n)));
  at += n;
}

}  // namespace

StateWriter::~StateWriter() {
  for (auto it = resume_.rbegin(); it != resume_.rend(); ++it) (*it)();
}

void StateWriter::u8(uint8_t v) {
  if (!pause_only_) bytes_.push_back(static_cast<char>(v));
}

void StateWriter::u64(uint64_t v) {
  if (pause_only_) return;
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void StateWriter::str(std::string_view s) {
  u64(s.size());
  if (!pause_only_) bytes_.append(s);
}

void StateWriter::tensor(const UntypedTensor& t) {
  if (pause_only_) return;
  u8(static_cast<uint8_t>(t.dtype));
  str(t.device().to_string());
  u64(t.shape.size());
  for (int64_t d : t.shape) i64(d);
  const std::size_t n = t.bytes();
  const std::size_t at = bytes_.size();
  bytes_.resize(at + n);
  if (n) core::copy_between(bytes_.data() + at, cpu0, t.data(), t.device(), n);
}

void StateWriter::hold(std::function<void()> resume) { resume_.push_back(std::move(resume)); }

const unsigned char* StateReader::take(std::size_t n, const char* what) {
  if (bytes_.size() - pos_ < n)
    corrupt(core::str_cat("truncated: ", what, " needs ", n, " bytes, ", bytes_.size() - pos_, " are left"));
  const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data()) + pos_;
  pos_ += n;
  return p;
}

uint8_t StateReader::u8() { return *take(1, "a byte"); }

bool StateReader::boolean() {
  const uint8_t v = u8();
  check(v <= 1, "a flag is neither 0 nor 1");
  return v == 1;
}

uint64_t StateReader::u64() {
  const unsigned char* p = take(8, "a number");
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string StateReader::str() {
  const uint64_t n = count(-1, 1, "string length");
  const unsigned char* p = take(static_cast<std::size_t>(n), "a string");
  return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
}

uint64_t StateReader::count(int64_t max, std::size_t min_bytes, const char* what) {
  const uint64_t n = u64();
  if (max >= 0 && n > static_cast<uint64_t>(max)) corrupt(core::str_cat(what, " ", n, " exceeds its limit ", max));
  if (min_bytes > 0 && n > (bytes_.size() - pos_) / min_bytes)
    corrupt(core::str_cat(what, " ", n, " exceeds what the ", bytes_.size() - pos_, " bytes left can hold"));
  return n;
}

UntypedTensor StateReader::tensor(DType dtype) {
  const uint8_t d = u8();
  if (d != static_cast<uint8_t>(dtype))
    corrupt(core::str_cat("a tensor has dtype code ", int{d}, " where ", dtype_name(dtype), " was expected"));
  Device device;
  try {
    device = Device::parse(str());
  } catch (const InvalidArgumentError& e) {
    corrupt(std::string("a tensor's device: ") + e.what());
  }
  const uint64_t rank = count(static_cast<int64_t>(kMaxRank), 8, "tensor rank");
  Shape shape;
  for (uint64_t i = 0; i < rank; ++i) {
    const int64_t dim = i64();
    check(dim >= 0, "a tensor has a negative dimension");
    shape.push_back(dim);
  }
  int64_t numel = 0;
  try {
    numel = core::shape_numel(shape, dtype_size(dtype));
  } catch (const InvalidArgumentError& e) {
    corrupt(std::string("a tensor's shape: ") + e.what());
  }
  const std::size_t n = static_cast<std::size_t>(numel) * dtype_size(dtype);
  const unsigned char* p = take(n, "a tensor's data");
  UntypedTensor host = core::make_untyped(dtype, shape, cpu0);
  if (n) std::memcpy(host.data(), p, n);
  return device == cpu0 || to_host_ ? host : on_device(host, device);
}

void StateReader::expect_end() const {
  if (pos_ != bytes_.size()) corrupt(core::str_cat(bytes_.size() - pos_, " bytes left over after the state"));
}

void StateReader::corrupt(const std::string& why) const {
  throw InvalidArgumentError(core::str_cat(op_, ": corrupt iterator state: ", why));
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(type.name());
}

void throw_no_state(const char* op, const std::type_info& what) {
  throw UnimplementedError(core::str_cat(op, ": ", type_name(what),
                                         " does not support iterator state (a custom dataset node needs describe, "
                                         "restore and its cursor's save)"));
}

void write_state_header(StateWriter& w, StateKind kind) {
  w.str(kMagic);
  w.u64(kVersion);
  w.u8(static_cast<uint8_t>(kind));
}

uint64_t read_state_header(StateReader& r, StateKind kind) {
  // Not `str()`: a wrong length field in foreign bytes should read as "not an iterator state".
  const uint64_t n = r.u64();
  r.check(n == kMagic.size(), "it does not start with an iterator state's magic");
  std::string magic;
  for (std::size_t i = 0; i < kMagic.size(); ++i) magic.push_back(static_cast<char>(r.u8()));
  r.check(magic == kMagic, "it does not start with an iterator state's magic");
  const uint64_t version = r.u64();
  if (version < kOldestVersion || version > kVersion)
    r.corrupt(core::str_cat("format version ", version, ", this library reads ", kOldestVersion, " to ", kVersion));
  const uint8_t k = r.u8();
  if (k != static_cast<uint8_t>(kind)) {
    const auto name = [](uint8_t v) {
      return v == 1 ? "a Dataset iterator" : v == 2 ? "a DistributedIterator" : "an unknown iterator";
    };
    r.corrupt(core::str_cat("it is the state of ", name(k), ", not of ", name(static_cast<uint8_t>(kind))));
  }
  return version;
}

void check_same_pipeline(const StateReader& r, const std::string& saved, const std::string& current) {
  MIRRORED_ENFORCE(saved == current, InvalidArgumentError, r.op(), ": the state was saved from the pipeline ", saved,
                   ", restoring into ", current);
}

std::string describe_graph(const NodeBase& node) {
  std::string out;
  describe_into(node, out);
  return out;
}

std::vector<uint64_t> graph_counters(const NodeBase& node) {
  std::vector<uint64_t> out;
  counters_into(node, out);
  return out;
}

void set_graph_counters(const NodeBase& node, const std::vector<uint64_t>& values, const StateReader& r) {
  const std::size_t expected = graph_counters(node).size();
  if (values.size() != expected)
    r.corrupt(core::str_cat(values.size(), " pass counters where the pipeline has ", expected));
  std::size_t at = 0;
  set_counters_from(node, values, at);
}

}  // namespace mirrored::data::detail
