// Test helpers: a small .npy writer and reader written independently of the
// command's own (cli/io_npy.cc), so that a bug there cannot hide itself.
#ifndef SOFTDOT_TESTS_CLI_NPY_TEST_IO_H_
#define SOFTDOT_TESTS_CLI_NPY_TEST_IO_H_

#include <cstddef>
#include <string>
#include <vector>

namespace softdot_test {

// A .npy file's bytes: version major.0, the given descr, fortran_order and
// shape text (e.g. "(2, 3)"), then `data` verbatim.
std::string make_npy(const std::string& descr, const std::string& shape,
                     const std::string& data, int major = 1,
                     bool fortran_order = false);

template <class T>
std::string raw_bytes(const std::vector<T>& values);

struct ParsedNpy {
  std::string descr;
  std::string shape;  // as written, e.g. "(2, 3)"
  std::string data;   // the bytes after the header
};

// Splits a .npy file into header fields and data (test-grade parsing: finds
// the 'descr' and 'shape' values by search). Throws on malformed input.
ParsedNpy parse_npy(const std::string& bytes);

template <class T>
std::vector<T> values_of(const std::string& data);

}  // namespace softdot_test

#endif  // SOFTDOT_TESTS_CLI_NPY_TEST_IO_H_
