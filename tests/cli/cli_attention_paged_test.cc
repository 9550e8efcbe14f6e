// `softdot attention` on a paged K/V cache (--block-table, --seq-lens): the
// output against the float64 reference on each sequence's keys gathered in
// order, bit for bit against the command on those contiguous keys, and bad
// tables and shapes as one error line naming the file, the shape or the
// sequence and entry, with no output file left behind.
#include <bit>

#include "cli_attention_util.h"

namespace softdot_test {
namespace {

using namespace cli_attention;

std::string i32_npy(const std::vector<std::size_t>& shape,
                    const std::vector<std::int32_t>& values) {
  return make_npy("<i4", npy_shape(shape), raw_bytes(values));
}

// The bits of n floats from `first` on (bitwise comparisons).
std::vector<std::uint32_t> bits_of(const std::vector<float>& v,
                                   std::size_t first, std::size_t n) {
  std::vector<std::uint32_t> b;
  for (std::size_t i = first; i < first + n && i < v.size(); ++i)
    b.push_back(std::bit_cast<std::uint32_t>(v[i]));
  return b;
}

// Two sequences of 5 and 11 keys (GQA: 4 query heads, 2 KV heads), in pages
// of 4 tokens taken out of order among 6 pages; the table pads with -1.
struct PagedCase {
  static constexpr std::size_t B = 2, H = 4, Hkv = 2, n_q = 3, d = 8, dv = 3;
  static constexpr std::size_t ps = 4, P = 6, bps = 4;
  std::vector<std::int32_t> lens = {5, 11};
  std::vector<std::int32_t> table = {4, 1, -1, -1, 0, 5, 2, -1};
  Array q = make_array({B, H, n_q, d}, 31);
  Array seq_k[2], seq_v[2];  // [1, Hkv, n, d]
  Array kp, vp;              // [P, Hkv, ps, d]

  PagedCase() {
    kp.shape = {P, Hkv, ps, d};
    vp.shape = {P, Hkv, ps, dv};
    kp.values.assign(P * Hkv * ps * d, 0.0f);
    vp.values.assign(P * Hkv * ps * dv, 0.0f);
    for (std::size_t b = 0; b < B; ++b) {
      const auto n = static_cast<std::size_t>(lens[b]);
      seq_k[b] = make_array({1, Hkv, n, d}, 40 + static_cast<std::uint32_t>(b));
      seq_v[b] =
          make_array({1, Hkv, n, dv}, 50 + static_cast<std::uint32_t>(b));
      for (std::size_t t = 0; t < n; ++t) {
        const auto page = static_cast<std::size_t>(table[b * bps + t / ps]);
        for (std::size_t h = 0; h < Hkv; ++h) {
          for (std::size_t c = 0; c < d; ++c)
            kp.values[((page * Hkv + h) * ps + t % ps) * d + c] =
                seq_k[b].at(0, h, t, c);
          for (std::size_t c = 0; c < dv; ++c)
            vp.values[((page * Hkv + h) * ps + t % ps) * dv + c] =
                seq_v[b].at(0, h, t, c);
        }
      }
    }
  }
  // Query rows of sequence b as [1, H, n_q, d].
  Array q_of(std::size_t b) const {
    Array a;
    a.shape = {1, H, n_q, d};
    const std::size_t n = H * n_q * d;
    a.values.assign(
        q.values.begin() + static_cast<std::ptrdiff_t>(b * n),
        q.values.begin() + static_cast<std::ptrdiff_t>((b + 1) * n));
    return a;
  }
};

TEST(CliAttentionPaged, MatchesFloat64AndContiguousBitwise) {
  Files f;
  const PagedCase c;
  f.put("q.npy", f32_npy(c.q));
  f.put("k.npy", f32_npy(c.kp));
  f.put("v.npy", f32_npy(c.vp));
  const std::string table = f.put("table.npy", i32_npy({2, 4}, c.table));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  Options o;
  o.causal = true;
  const CommandResult r = run_softdot(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--block-table", table,
       "--seq-lens", lens, "--causal", "-o", f.out, "--lse", f.lse});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const ParsedNpy out = parse_npy(read_whole_file(f.out));
  EXPECT_EQ(out.shape, "(2, 4, 3, 3)");
  const std::vector<float> got = values_of<float>(out.data);
  const std::vector<float> got_lse = read_output(f.lse);
  const std::size_t per_b = PagedCase::H * PagedCase::n_q * PagedCase::dv;
  for (std::size_t b = 0; b < 2; ++b) {
    const Reference want = reference(c.q_of(b), c.seq_k[b], c.seq_v[b], o);
    for (std::size_t i = 0; i < per_b; ++i) {
      const double size = std::max(std::fabs(want.out[i]), want.scale_w[i]);
      EXPECT_NEAR(got[b * per_b + i], want.out[i], kTolerance * size + 1e-30)
          << "sequence " << b << " element " << i;
    }
    // The command on the sequence's keys, contiguous: the same bits.
    f.put("qb.npy", f32_npy(c.q_of(b)));
    f.put("kb.npy", f32_npy(c.seq_k[b]));
    f.put("vb.npy", f32_npy(c.seq_v[b]));
    ASSERT_EQ(run_softdot({"attention", "--q", f.dir.path("qb.npy"), "--k",
                           f.dir.path("kb.npy"), "--v", f.dir.path("vb.npy"),
                           "--causal", "-o", f.dir.path("ob.npy"), "--lse",
                           f.dir.path("lb.npy")})
                  .status,
              0);
    const std::vector<float> ob = read_output(f.dir.path("ob.npy"));
    const std::vector<float> lb = read_output(f.dir.path("lb.npy"));
    ASSERT_EQ(ob.size(), per_b);
    EXPECT_EQ(bits_of(ob, 0, per_b), bits_of(got, b * per_b, per_b))
        << "sequence " << b;
    EXPECT_EQ(bits_of(lb, 0, lb.size()),
              bits_of(got_lse, b * lb.size(), lb.size()))
        << "sequence " << b;
  }
}

TEST(CliAttentionPaged, BadTablesAndShapesAreOneErrorLine) {
  Files f;
  const PagedCase c;
  f.put("q.npy", f32_npy(c.q));
  f.put("k.npy", f32_npy(c.kp));
  f.put("v.npy", f32_npy(c.vp));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  auto run = [&](const std::string& table, const std::string& seq_lens,
                 const std::string& k = "") {
    std::vector<std::string> args = {
        "attention", "--q", f.q,  "--k", k.empty() ? f.k : k,
        "--v",       f.v,   "-o", f.out};
    if (!table.empty()) {
      args.push_back("--block-table");
      args.push_back(table);
    }
    if (!seq_lens.empty()) {
      args.push_back("--seq-lens");
      args.push_back(seq_lens);
    }
    return run_softdot(args);
  };
  auto expect_error = [&](const std::string& what, const CommandResult& r,
                          const std::vector<std::string>& needles) {
    EXPECT_EQ(r.status, 2) << what;
    EXPECT_EQ(r.err.rfind("softdot: error: ", 0), 0u) << what << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const std::string& n : needles)
      EXPECT_NE(r.err.find(n), std::string::npos)
          << what << ": \"" << r.err << "\" does not name " << n;
    EXPECT_FALSE(file_exists(f.out)) << what << ": left an output file";
  };
  std::vector<std::int32_t> bad = c.table;
  bad[5] = 6;  // sequence 1, entry 1: one past the last page
  expect_error("page out of range",
               run(f.put("bad.npy", i32_npy({2, 4}, bad)), lens),
               {"paged_attention", "sequence 1, entry 1", "= 6"});
  bad[5] = -2;
  expect_error("negative page",
               run(f.put("bad.npy", i32_npy({2, 4}, bad)), lens),
               {"sequence 1, entry 1", "= -2"});
  expect_error("length beyond the pages",
               run(f.put("t.npy", i32_npy({2, 4}, c.table)),
                   f.put("long.npy", i32_npy({2}, {5, 17}))),
               {"seq_lens[1] = 17", "sequence 1"});
  expect_error("table without lengths", run(f.dir.path("t.npy"), ""),
               {"--block-table and --seq-lens go together"});
  expect_error("float table",
               run(f.put("tf.npy", f32_npy(make_array({2, 4}, 1))), lens),
               {"--block-table", "tf.npy", "int32"});
  expect_error(
      "table of the wrong batch",
      run(f.put("t3.npy", i32_npy({3, 4}, std::vector<std::int32_t>(12, 0))),
          lens),
      {"--block-table is [3 x 4]", "batch = 2"});
  expect_error(
      "lengths of the wrong batch",
      run(f.dir.path("t.npy"), f.put("l3.npy", i32_npy({3}, {1, 1, 1}))),
      {"--seq-lens is [3]", "batch = 2"});
  expect_error("2-D pages",
               run(f.dir.path("t.npy"), lens,
                   f.put("k2.npy", f32_npy(make_array({6, 8}, 2)))),
               {"--k is [6 x 8]", "[pages x kv_heads x page_size x d]"});
  // int8 pages are for the library and Python: --kv int8 and --k-scales are
  // refused with a paged cache.
  {
    std::vector<std::string> args = {"attention",
                                     "--q",
                                     f.q,
                                     "--k",
                                     f.k,
                                     "--v",
                                     f.v,
                                     "-o",
                                     f.out,
                                     "--block-table",
                                     f.dir.path("t.npy"),
                                     "--seq-lens",
                                     lens,
                                     "--kv",
                                     "int8"};
    expect_error("--kv int8 with pages", run_softdot(args),
                 {"--kv int8", "int8 pages are not read by the command"});
  }
}

}  // namespace
}  // namespace softdot_test
