// softdot Python bindings: sampling. The Python layer (python/softdot/
// _sample.py) has made the logits a 2-d array with a contiguous last axis
// (float32, or 16-bit bits as uint16 with `format`), the seeds uint64, the
// bitmask int32 and allocated the outputs; this checks dtypes and shapes
// once more, releases the GIL and calls softdot::sample /
// speculative_accept.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "python_errors.h"
#include "softdot/sample.h"

namespace softdot::python {
namespace {

template <class T, class A>
std::span<T> flat(const char* name, const A& a, std::size_t n) {
  if (a.dtype() != nb::dtype<std::remove_const_t<T>>())
    fail(std::string(name) + " has the wrong dtype");
  std::size_t size = 1;
  for (std::size_t d = 0; d < a.ndim(); ++d) size *= a.shape(d);
  if (size != n)
    fail(std::string(name) + " has " + std::to_string(size) +
         " entries; expected " + std::to_string(n));
  if (a.ndim() > 1 || (a.ndim() == 1 && n > 1 && a.stride(0) != 1))
    fail(std::string(name) + " is not contiguous");
  return std::span<T>(static_cast<T*>(a.data()), n);
}

void sample_py(const In& logits, int format, const In& seeds, const Out& tokens,
               const std::optional<Out>& logprobs,
               const std::optional<In>& bitmask, double temperature,
               std::int64_t top_k, double top_p, double min_p) {
  as_python("sample", [&] {
    const std::size_t rows = logits.shape(0);
    const std::size_t cols = logits.ndim() == 2 ? logits.shape(1) : 0;
    const auto s = flat<const std::uint64_t>("seed", seeds, rows);
    const auto t = flat<std::int64_t>("tokens", tokens, rows);
    std::span<float> lp;
    if (logprobs) lp = flat<float>("logprobs", *logprobs, rows);
    std::span<const std::int32_t> mask;
    if (bitmask) {
      const std::size_t words = (cols + 31) / 32;
      std::size_t size = 1;
      for (std::size_t d = 0; d < bitmask->ndim(); ++d)
        size *= bitmask->shape(d);
      mask = flat<const std::int32_t>("bitmask", *bitmask,
                                      size == words ? words : rows * words);
    }
    const SampleOptions o{temperature, top_k, top_p, min_p};
    if (format == 0) {
      const auto x =
          view2<const float>("logits", logits, kAnyExtent, kAnyExtent, true);
      nb::gil_scoped_release release;
      sample(x, s, t, lp, o, mask);
    } else if (format == 1) {
      const auto x =
          view2<const BFloat16>("logits", logits, kAnyExtent, kAnyExtent, true);
      nb::gil_scoped_release release;
      sample(x, s, t, lp, o, mask);
    } else {
      const auto x =
          view2<const Float16>("logits", logits, kAnyExtent, kAnyExtent, true);
      nb::gil_scoped_release release;
      sample(x, s, t, lp, o, mask);
    }
  });
}

void speculative_py(const In& draft_tokens,
                    const std::optional<In>& draft_probs,
                    const In& target_logits, const In& seeds,
                    const Out& accepted, const Out& tokens, double temperature,
                    std::int64_t top_k, double top_p, double min_p) {
  as_python("speculative_accept", [&] {
    if (draft_tokens.ndim() != 2 ||
        draft_tokens.dtype() != nb::dtype<std::int64_t>())
      fail("draft_tokens must be 2-d int64");
    const std::size_t rows = draft_tokens.shape(0), k = draft_tokens.shape(1);
    const auto dt = view2<const std::int64_t>("draft_tokens", draft_tokens,
                                              kAnyExtent, kAnyExtent, true);
    MatrixView<const float> dp;
    if (draft_probs)
      dp = view2<const float>("draft_probs", *draft_probs, kAnyExtent,
                              kAnyExtent, true);
    const auto tl = view2<const float>("target_logits", target_logits,
                                       kAnyExtent, kAnyExtent, true);
    const auto s = flat<const std::uint64_t>("seed", seeds, rows);
    const auto a = flat<std::int64_t>("accepted", accepted, rows);
    const auto out = flat<std::int64_t>("tokens", tokens, rows * (k + 1));
    const SampleOptions o{temperature, top_k, top_p, min_p};
    nb::gil_scoped_release release;
    speculative_accept(dt, dp, tl, s, a,
                       MatrixView<std::int64_t>(out.data(), rows, k + 1), o);
  });
}

}  // namespace

void bind_sample(nb::module_& m) {
  using namespace nb::literals;
  m.def("sample_rows", &sample_py, "logits"_a, "format"_a, "seeds"_a,
        "tokens"_a, "logprobs"_a.none(), "bitmask"_a.none(), "temperature"_a,
        "top_k"_a, "top_p"_a, "min_p"_a,
        "softdot::sample on 2-d rows (format 0 float32, 1 bfloat16 bits, 2 "
        "float16 bits).");
  m.def("speculative_accept_rows", &speculative_py, "draft_tokens"_a,
        "draft_probs"_a.none(), "target_logits"_a, "seeds"_a, "accepted"_a,
        "tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "min_p"_a,
        "softdot::speculative_accept on 2-d arrays.");
}

}  // namespace softdot::python
