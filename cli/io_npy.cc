// softdot command: .npy reader and writer (see io_npy.h). Format reference:
// numpy/lib/format.py: magic "\x93NUMPY", major and minor version bytes, a
// little-endian header length (2 bytes in 1.0, 4 in 2.0/3.0), then an ASCII
// (3.0: UTF-8) Python dict literal ending in "\n", then the raw data.
#include "io_npy.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "error.h"
#include "parse.h"

namespace softdot::cli {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

// The three keys of an .npy header.
struct Header {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::uint64_t>> shape;
};

// A strict reader of the dict literal numpy writes, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name)
      : text_(text), name_(name) {}

  Header parse() {
    Header header;
    expect('{');
    while (true) {
      skip_spaces();
      if (peek() == '}') break;
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        if (header.descr) fail("key 'descr' appears twice");
        header.descr = string_literal();
      } else if (key == "fortran_order") {
        if (header.fortran_order) fail("key 'fortran_order' appears twice");
        header.fortran_order = boolean_literal();
      } else if (key == "shape") {
        if (header.shape) fail("key 'shape' appears twice");
        header.shape = tuple_literal();
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_spaces();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    expect('}');
    skip_spaces();
    if (pos_ != text_.size()) fail("junk after the dict");
    if (!header.descr) fail("no 'descr'");
    if (!header.fortran_order) fail("no 'fortran_order'");
    if (!header.shape) fail("no 'shape'");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CliError(std::string(name_) + ": bad .npy header: " + what);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_spaces() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t'))
      ++pos_;
  }
  void expect(char c) {
    skip_spaces();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_spaces();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    const std::size_t end = text_.find(q, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }
  bool boolean_literal() {
    skip_spaces();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::vector<std::uint64_t> tuple_literal() {
    std::vector<std::uint64_t> dims;
    expect('(');
    while (true) {
      skip_spaces();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("expected a dimension");
      std::uint64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        const std::uint64_t digit = static_cast<std::uint64_t>(peek() - '0');
        if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
          fail("dimension too large");
        value = value * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 longs
      dims.push_back(value);
      skip_spaces();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        fail("expected ',' or ')' in the shape");
      }
    }
    ++pos_;
    return dims;
  }

  std::string_view text_;
  std::string_view name_;
  std::size_t pos_ = 0;
};

std::string shape_text(const std::vector<std::uint64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  if (dims.size() == 1) s += ",";
  return s + ")";
}

// "int32" for 'i4' and so on, for messages.
std::string dtype_name(std::string_view descr) {
  if (descr.size() < 3) return "unknown";
  const char kind = descr[1];
  const auto size = parse_small_int(descr.substr(2), 64);
  if (!size) return "unknown";
  const std::string bits = std::to_string(*size * 8);
  switch (kind) {
    case 'i':
      return "int" + bits;
    case 'u':
      return "uint" + bits;
    case 'f':
      return "float" + bits;
    case 'c':
      return "complex" + bits;
    case 'b':
      return "bool";
    default:
      return "unknown";
  }
}

std::uint32_t read_le(std::string_view bytes, std::size_t offset,
                      std::size_t size) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < size; ++i)
    v |= static_cast<std::uint32_t>(
             static_cast<unsigned char>(bytes[offset + i]))
         << (8 * i);
  return v;
}

// The parts of a .npy file before its data: magic, version, header.
struct Layout {
  Header header;
  std::size_t data_offset = 0;
};

Layout read_layout(std::string_view bytes, std::string_view name) {
  const std::string prefix = std::string(name) + ": ";
  if (bytes.size() < 8 || bytes.substr(0, 6) != kMagic) {
    throw CliError(prefix + "not a .npy file (no \\x93NUMPY magic)" +
                   (bytes.size() < 8 ? ", or truncated" : ""));
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (!((major == 1 || major == 2 || major == 3) && minor == 0)) {
    throw CliError(prefix + "unsupported .npy format version " +
                   std::to_string(major) + "." + std::to_string(minor) +
                   " (need 1.0, 2.0 or 3.0)");
  }
  const std::size_t length_size = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + length_size) {
    throw CliError(prefix + "truncated .npy header");
  }
  const std::size_t header_len = read_le(bytes, 8, length_size);
  const std::size_t data_offset = 8 + length_size + header_len;
  if (bytes.size() < data_offset) {
    throw CliError(prefix + "truncated .npy header (" +
                   std::to_string(header_len) + " bytes announced, " +
                   std::to_string(bytes.size() - 8 - length_size) +
                   " present)");
  }
  std::string_view dict = bytes.substr(8 + length_size, header_len);
  if (dict.empty() || dict.back() != '\n') {
    throw CliError(prefix + "bad .npy header: does not end in a newline");
  }
  return {HeaderParser(dict, name).parse(), data_offset};
}

void check_c_order(const Header& header, const std::string& prefix) {
  if (*header.fortran_order) {
    throw CliError(prefix +
                   "Fortran-order arrays are not supported; need C order "
                   "(fortran_order False)");
  }
}

// The data of `shape` items of `item_size` bytes after the header: exactly
// that many bytes, no fewer, no more.
std::string_view checked_data(std::string_view bytes, std::size_t data_offset,
                              const std::vector<std::uint64_t>& shape,
                              std::size_t item_size,
                              const std::string& prefix) {
  const std::uint64_t kMax = std::numeric_limits<std::size_t>::max();
  std::uint64_t count = 1;
  bool zero = false;
  for (std::uint64_t d : shape) zero = zero || d == 0;
  for (std::uint64_t d : shape) {
    if (zero) break;
    if (count > kMax / d || count * d > kMax / item_size) {
      throw CliError(prefix + "shape " + shape_text(shape) + " is too large");
    }
    count *= d;
  }
  if (zero) count = 0;
  const std::size_t data_size = static_cast<std::size_t>(count) * item_size;
  const std::size_t present = bytes.size() - data_offset;
  if (present < data_size) {
    throw CliError(prefix + "truncated: shape " + shape_text(shape) +
                   " needs " + std::to_string(data_size) +
                   " bytes of data, the file has " + std::to_string(present));
  }
  if (present > data_size) {
    throw CliError(prefix + std::to_string(present - data_size) +
                   " unexpected bytes after the data of shape " +
                   shape_text(shape));
  }
  return bytes.substr(data_offset, data_size);
}

template <class T>
Matrix<T> read_values(std::string_view data, std::size_t rows,
                      std::size_t cols) {
  Matrix<T> m;
  m.rows = rows;
  m.cols = cols;
  m.values.resize(rows * cols);
  std::memcpy(m.values.data(), data.data(), data.size());
  if constexpr (std::endian::native == std::endian::big) {
    for (T& v : m.values) {
      auto* p = reinterpret_cast<unsigned char*>(&v);
      std::reverse(p, p + sizeof(T));
    }
  }
  return m;
}

template <class T>
std::string encode(std::span<const T> values,
                   std::span<const std::size_t> shape,
                   std::string_view descr = sizeof(T) == 4 ? "<f4" : "<f8") {
  const std::vector<std::uint64_t> dims(shape.begin(), shape.end());
  std::string dict = std::string("{'descr': '") + std::string(descr) +
                     "', 'fortran_order': False, 'shape': " + shape_text(dims) +
                     ", }";
  // magic (6) + version (2) + length (2) + dict + spaces + "\n", a multiple
  // of 64 so that the data is aligned, as numpy pads (its ARRAY_ALIGN).
  std::size_t total = 10 + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  const std::size_t header_len = total - 10;
  dict.append(header_len - dict.size() - 1, ' ');
  dict += '\n';
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header_len & 0xff);
  out += static_cast<char>((header_len >> 8) & 0xff);
  out += dict;
  const std::size_t data_start = out.size();
  out.resize(data_start + values.size() * sizeof(T));
  if (!values.empty())
    std::memcpy(out.data() + data_start, values.data(),
                values.size() * sizeof(T));
  if constexpr (std::endian::native == std::endian::big) {
    for (std::size_t i = data_start; i < out.size(); i += sizeof(T))
      std::reverse(out.begin() + static_cast<std::ptrdiff_t>(i),
                   out.begin() + static_cast<std::ptrdiff_t>(i + sizeof(T)));
  }
  return out;
}

template <class T>
std::string encode(const Matrix<T>& m) {
  const std::size_t shape[2] = {m.rows, m.cols};
  return encode(std::span<const T>(m.values),
                std::span<const std::size_t>(shape));
}

}  // namespace

bool looks_like_npy(std::string_view bytes) {
  return !bytes.empty() && bytes[0] == kMagic[0];
}

namespace {

// A .npy matrix's shape: 2-D with at least one row and one column, else a
// CliError naming the file (prefix) and the shape.
void check_matrix_shape(const std::vector<std::uint64_t>& shape,
                        const std::string& prefix) {
  if (shape.size() != 2) {
    throw CliError(prefix + "shape " + shape_text(shape) + " has " +
                   std::to_string(shape.size()) +
                   (shape.size() == 1 ? " dimension" : " dimensions") +
                   "; need a 2-D array (rows, cols)");
  }
  if (shape[0] == 0)
    throw CliError(prefix + "shape " + shape_text(shape) + " has no rows");
  if (shape[1] == 0)
    throw CliError(prefix + "shape " + shape_text(shape) +
                   ": the rows are empty");
}

}  // namespace

AnyMatrix read_npy(std::string_view bytes, std::string_view name) {
  const std::string prefix = std::string(name) + ": ";
  const Layout layout = read_layout(bytes, name);
  const Header& header = layout.header;

  const std::string& descr = *header.descr;
  const bool little = descr.size() == 3 && (descr[0] == '<' || descr[0] == '=');
  std::size_t item_size = 0;
  if (little && descr.substr(1) == "f4") item_size = 4;
  if (little && descr.substr(1) == "f8") item_size = 8;
  if (item_size == 0) {
    if (descr.size() == 3 && descr[0] == '>' && descr[1] == 'f')
      throw CliError(prefix + "big-endian dtype '" + descr +
                     "' is not supported; need little-endian '<f4' or '<f8'");
    throw CliError(prefix + "dtype '" + descr + "' (" + dtype_name(descr) +
                   ") is not supported; need float32 '<f4' or float64 '<f8'");
  }
  check_c_order(header, prefix);
  const auto& shape = *header.shape;
  check_matrix_shape(shape, prefix);
  const std::string_view data =
      checked_data(bytes, layout.data_offset, shape, item_size, prefix);
  const std::size_t rows = shape[0], cols = shape[1];
  if (item_size == 4) return read_values<float>(data, rows, cols);
  return read_values<double>(data, rows, cols);
}

std::optional<Matrix16> read_npy16(std::string_view bytes,
                                   std::string_view name) {
  const std::string prefix = std::string(name) + ": ";
  const Layout layout = read_layout(bytes, name);
  const Header& header = layout.header;
  const std::string& descr = *header.descr;
  // float16: '<f2' ('=f2'); bfloat16: ml_dtypes' np.save writes a bfloat16
  // array as 2-byte void, '<V2' or '|V2' (numpy has no bfloat16 code).
  const bool f16 = descr == "<f2" || descr == "=f2";
  const bool bf16 = descr == "<V2" || descr == "|V2" || descr == "=V2";
  if (!f16 && !bf16) return std::nullopt;
  check_c_order(header, prefix);
  const auto& shape = *header.shape;
  check_matrix_shape(shape, prefix);
  const std::string_view data =
      checked_data(bytes, layout.data_offset, shape, 2, prefix);
  Matrix16 m;
  m.bf16 = bf16;
  m.descr = descr;
  m.rows = shape[0];
  m.cols = shape[1];
  m.bits.resize(m.rows * m.cols);
  for (std::size_t i = 0; i < m.bits.size(); ++i) {
    m.bits[i] = static_cast<std::uint16_t>(
        static_cast<unsigned char>(data[2 * i]) |
        (static_cast<unsigned>(static_cast<unsigned char>(data[2 * i + 1]))
         << 8));
  }
  return m;
}

std::string encode_npy16(const Matrix16& m) {
  const std::size_t shape[2] = {m.rows, m.cols};
  return encode(std::span<const std::uint16_t>(m.bits),
                std::span<const std::size_t>(shape), m.descr);
}

std::string encode_npy16(std::span<const std::uint16_t> bits,
                         std::span<const std::size_t> shape,
                         std::string_view descr) {
  return encode(bits, shape, descr);
}

std::string_view npy_dtype_name(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kBool:
      return "bool '|b1'";
    case NpyDtype::kFloat16:
      return "float16 '<f2'";
    case NpyDtype::kFloat32:
      return "float32 '<f4'";
    case NpyDtype::kFloat64:
      return "float64 '<f8'";
    case NpyDtype::kInt8:
      return "int8 '|i1'";
    case NpyDtype::kInt32:
      return "int32 '<i4'";
    case NpyDtype::kInt64:
      return "int64 '<i8'";
  }
  return "unknown";
}

std::size_t NpyArray::size() const {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

NpyArray read_npy_array(std::string_view bytes, std::string_view name,
                        std::span<const NpyDtype> allowed) {
  const std::string prefix = std::string(name) + ": ";
  const Layout layout = read_layout(bytes, name);
  const Header& header = layout.header;
  const std::string& descr = *header.descr;

  std::optional<NpyDtype> dtype;
  if (descr.size() == 3) {
    const char order = descr[0];
    const std::string_view code = std::string_view(descr).substr(1);
    // One-byte types have no byte order: numpy writes '|b1' and '|i1'.
    const bool any_order =
        order == '|' || order == '<' || order == '=' || order == '>';
    if (code == "b1" && any_order) dtype = NpyDtype::kBool;
    if (code == "i1" && any_order) dtype = NpyDtype::kInt8;
    if (order == '<' || order == '=') {
      if (code == "f2") dtype = NpyDtype::kFloat16;
      if (code == "f4") dtype = NpyDtype::kFloat32;
      if (code == "f8") dtype = NpyDtype::kFloat64;
      if (code == "i4") dtype = NpyDtype::kInt32;
      if (code == "i8") dtype = NpyDtype::kInt64;
    }
  }
  const bool ok = dtype && std::find(allowed.begin(), allowed.end(), *dtype) !=
                               allowed.end();
  if (!ok) {
    std::string need;
    for (std::size_t i = 0; i < allowed.size(); ++i) {
      if (i != 0) need += i + 1 == allowed.size() ? " or " : ", ";
      need += npy_dtype_name(allowed[i]);
    }
    if (!dtype && descr.size() == 3 && descr[0] == '>' && descr[1] == 'f')
      throw CliError(prefix + "big-endian dtype '" + descr +
                     "' is not supported; need " + need);
    throw CliError(prefix + "dtype '" + descr + "' (" + dtype_name(descr) +
                   ") is not supported; need " + need);
  }
  check_c_order(header, prefix);
  std::size_t item_size = 1;
  if (*dtype == NpyDtype::kFloat16) item_size = 2;
  if (*dtype == NpyDtype::kFloat32 || *dtype == NpyDtype::kInt32) item_size = 4;
  if (*dtype == NpyDtype::kFloat64 || *dtype == NpyDtype::kInt64) item_size = 8;
  const std::string_view data =
      checked_data(bytes, layout.data_offset, *header.shape, item_size, prefix);
  NpyArray array;
  array.dtype = *dtype;
  array.shape.assign(header.shape->begin(), header.shape->end());
  array.data.assign(data);
  return array;
}

std::string encode_npy(std::span<const float> values,
                       std::span<const std::size_t> shape) {
  return encode(values, shape);
}

std::string encode_npy(std::span<const double> values,
                       std::span<const std::size_t> shape) {
  return encode(values, shape);
}

std::string encode_npy(const Matrix<float>& matrix) { return encode(matrix); }
std::string encode_npy(const Matrix<double>& matrix) { return encode(matrix); }

// Little-endian bytes to values (the .npy data is little-endian).
namespace {

std::uint32_t le_bits(const std::string& data, std::size_t offset,
                      std::size_t size) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < size; ++i)
    v |=
        static_cast<std::uint32_t>(static_cast<unsigned char>(data[offset + i]))
        << (8 * i);
  return v;
}

std::uint64_t le_bits64(const std::string& data, std::size_t offset) {
  return static_cast<std::uint64_t>(le_bits(data, offset, 4)) |
         (static_cast<std::uint64_t>(le_bits(data, offset + 4, 4)) << 32);
}

}  // namespace

std::vector<float> floats_of(const NpyArray& a) {
  std::vector<float> v(std::max<std::size_t>(a.size(), 1), 0.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a.dtype == NpyDtype::kFloat16) {
      Float16 h;
      h.bits = static_cast<std::uint16_t>(le_bits(a.data, 2 * i, 2));
      v[i] = to_float(h);
    } else {
      v[i] = std::bit_cast<float>(le_bits(a.data, 4 * i, 4));
    }
  }
  return v;
}

std::vector<Float16> halves_of(const NpyArray& a) {
  std::vector<Float16> v(std::max<std::size_t>(a.size(), 1));
  for (std::size_t i = 0; i < a.size(); ++i)
    v[i].bits = static_cast<std::uint16_t>(le_bits(a.data, 2 * i, 2));
  return v;
}

std::vector<std::int8_t> int8s_of(const NpyArray& a) {
  std::vector<std::int8_t> v(std::max<std::size_t>(a.size(), 1), 0);
  for (std::size_t i = 0; i < a.size(); ++i)
    v[i] = static_cast<std::int8_t>(static_cast<unsigned char>(a.data[i]));
  return v;
}

std::vector<std::int32_t> int32s_of(const NpyArray& a) {
  std::vector<std::int32_t> v(std::max<std::size_t>(a.size(), 1), 0);
  for (std::size_t i = 0; i < a.size(); ++i)
    v[i] = static_cast<std::int32_t>(le_bits(a.data, 4 * i, 4));
  return v;
}

std::vector<std::int64_t> int64s_of(const NpyArray& a) {
  std::vector<std::int64_t> v(std::max<std::size_t>(a.size(), 1), 0);
  for (std::size_t i = 0; i < a.size(); ++i) {
    v[i] = a.dtype == NpyDtype::kInt32
               ? static_cast<std::int32_t>(le_bits(a.data, 4 * i, 4))
               : static_cast<std::int64_t>(le_bits64(a.data, 8 * i));
  }
  return v;
}

// A contiguous bool array (std::vector<bool> has none).
std::unique_ptr<bool[]> bools_of(const NpyArray& a) {
  const std::size_t n = std::max<std::size_t>(a.size(), 1);
  auto flags = std::make_unique<bool[]>(n);
  for (std::size_t i = 0; i < a.size(); ++i) flags[i] = a.data[i] != 0;
  return flags;
}

}  // namespace softdot::cli
