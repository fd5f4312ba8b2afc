#pragma once
// Private: the frames the chief's store and its clients exchange (tcp_store.hpp describes the
// format), shared by the server (tcp_store.cpp) and the client (tcp_store_client.cpp).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mirrored::detail::cluster::wire {

enum Op : uint8_t { kHello = 1, kSet, kSetIfAbsent, kGet, kWait, kBye, kGone, kStale, kDeparted };
// kMismatch: the workers were configured differently (InvalidArgumentError on the client).
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2, kMismatch = 3 };

constexpr uint32_t kMaxFrame = 16u << 20;  // requests are small: addresses, ids, notices
constexpr std::size_t kMaxClients = 4096;

struct Writer {
  std::string buf = std::string(4, '\0');  // room for the length
  Writer& u8(uint8_t v) {
    buf.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& i64(int64_t v) {
    buf.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Writer& str(const std::string& s) {
    const auto n = static_cast<uint32_t>(s.size());
    buf.append(reinterpret_cast<const char*>(&n), sizeof(n));
    buf.append(s);
    return *this;
  }
  std::string frame() {
    const auto n = static_cast<uint32_t>(buf.size() - 4);
    std::memcpy(buf.data(), &n, 4);
    return std::move(buf);
  }
};

// Reads fields of one frame; any overrun is a malformed frame.
struct Reader {
  std::string_view s;
  std::size_t pos = 0;
  void need(std::size_t n) const {
    if (s.size() - pos < n) throw std::runtime_error("truncated frame");
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(s[pos++]);
  }
  int64_t i64() {
    need(8);
    int64_t v;
    std::memcpy(&v, s.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string str() {
    need(4);
    uint32_t n;
    std::memcpy(&n, s.data() + pos, 4);
    pos += 4;
    need(n);
    std::string out(s.substr(pos, n));
    pos += n;
    return out;
  }
};

}  // namespace mirrored::detail::cluster::wire
