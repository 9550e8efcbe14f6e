// Test helpers (see npy_test_io.h).
#include "npy_test_io.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace softdot_test {

std::string make_npy(const std::string& descr, const std::string& shape,
                     const std::string& data, int major, bool fortran_order) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " +
                     (fortran_order ? "True" : "False") +
                     ", 'shape': " + shape + ", }";
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  std::size_t total = 8 + length_bytes + dict.size() + 1;
  while (total % 64 != 0) {
    dict += ' ';
    ++total;
  }
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const std::uint32_t len = static_cast<std::uint32_t>(dict.size());
  for (std::size_t i = 0; i < length_bytes; ++i)
    out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + dict + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string s(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(s.data(), values.data(), s.size());
  return s;  // little-endian hosts only (the tests run on x86-64 / arm64)
}
template std::string raw_bytes<float>(const std::vector<float>&);
template std::string raw_bytes<std::uint16_t>(
    const std::vector<std::uint16_t>&);
template std::string raw_bytes<double>(const std::vector<double>&);
template std::string raw_bytes<std::int32_t>(const std::vector<std::int32_t>&);
template std::string raw_bytes<std::int64_t>(const std::vector<std::int64_t>&);

namespace {
std::string quoted_value_after(const std::string& dict,
                               const std::string& key) {
  const std::size_t k = dict.find("'" + key + "':");
  if (k == std::string::npos) throw std::runtime_error("no " + key);
  const std::size_t open = dict.find('\'', k + key.size() + 3);
  const std::size_t close = dict.find('\'', open + 1);
  return dict.substr(open + 1, close - open - 1);
}
}  // namespace

ParsedNpy parse_npy(const std::string& bytes) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw std::runtime_error("not an npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  std::size_t len = 0;
  for (std::size_t i = 0; i < length_bytes; ++i)
    len |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i]))
           << (8 * i);
  const std::string dict = bytes.substr(8 + length_bytes, len);
  if ((8 + length_bytes + len) % 64 != 0)
    throw std::runtime_error("header not padded to 64 bytes");
  if (dict.find("'fortran_order': False") == std::string::npos)
    throw std::runtime_error("not C order");
  ParsedNpy parsed;
  parsed.descr = quoted_value_after(dict, "descr");
  const std::size_t s = dict.find("'shape': ");
  if (s == std::string::npos) throw std::runtime_error("no shape");
  parsed.shape = dict.substr(s + 9, dict.find(')', s) - (s + 9) + 1);
  parsed.data = bytes.substr(8 + length_bytes + len);
  return parsed;
}

template <class T>
std::vector<T> values_of(const std::string& data) {
  if (data.size() % sizeof(T) != 0) throw std::runtime_error("ragged data");
  std::vector<T> v(data.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), data.data(), data.size());
  return v;
}
template std::vector<float> values_of<float>(const std::string&);
template std::vector<std::uint16_t> values_of<std::uint16_t>(
    const std::string&);
template std::vector<double> values_of<double>(const std::string&);

}  // namespace softdot_test
