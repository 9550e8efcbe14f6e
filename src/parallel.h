// softdot: the serial-or-OpenMP loop of the checked entry points, written
// once. Results never depend on it: each index is computed as it would be
// serially (docs/design.md, "threads").
#ifndef SOFTDOT_SRC_PARALLEL_H_
#define SOFTDOT_SRC_PARALLEL_H_

#include <cstddef>

namespace softdot::detail {

// How OpenMP hands out the indices: kStatic, equal contiguous ranges
// (schedule(static): for equal pieces of work); kDynamic, one index at a
// time to whichever thread is free (schedule(dynamic, 1): for pieces of
// unequal cost, such as causal attention's blocks of rows).
enum class Schedule { kStatic, kDynamic };

// f(i) for every i < n: on the calling thread when !parallel, else in an
// OpenMP parallel loop with the given schedule. The serial case opens no
// region at all: a region, even with if(false), forks and joins the team,
// which takes longer than a small call's whole work (bench/: BM_dots/4,
// BM_softmax_rows/4/16, BM_attention_one_key measure serial calls). f must
// not throw out of a parallel loop.
template <Schedule kSchedule = Schedule::kStatic, class F>
void for_each_index(std::size_t n, bool parallel, F&& f) {
  if (!parallel) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  if constexpr (kSchedule == Schedule::kStatic) {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) f(i);
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (std::size_t i = 0; i < n; ++i) f(i);
  }
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_PARALLEL_H_
