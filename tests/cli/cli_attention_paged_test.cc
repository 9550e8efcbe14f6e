// `softdot attention` on a paged K/V cache (--block-table, --seq-lens): the
// output against the float64 reference on each sequence's keys gathered in
// order, bit for bit against the command on those contiguous keys, and bad
// tables and shapes as one error line naming the file, the shape or the
// sequence and entry, with no output file left behind. The cases write HND
// pages ([pages, kv_heads, page_size, d], --kv-layout HND); the same cache in
// NHD files (the default layout) gives the same bits.
#include <bit>
#include <cstring>

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
  const CommandResult r =
      run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                   "--block-table", table, "--seq-lens", lens, "--kv-layout",
                   "HND", "--causal", "-o", f.out, "--lse", f.lse});
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
      args.push_back("--kv-layout");
      args.push_back("HND");
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
               {"--block-table: " + f.dir.path("bad.npy"),
                "sequence 1, entry 1", "= 6", "--k [6 x 2 x 4 x 8] (0 to 5)"});
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
}

std::string i8_npy(const std::vector<std::size_t>& shape,
                   const std::vector<std::int8_t>& values) {
  std::string data(values.size(), '\0');
  std::memcpy(data.data(), values.data(), values.size());
  return make_npy("|i1", npy_shape(shape), data);
}

// int8 pages: read with their scales, or quantised from float pages by --kv
// int8 (one scale per page row, which is one per (token, KV head), as for
// contiguous keys); each sequence bit for bit the command on its keys
// gathered in order, in the same format.
TEST(CliAttentionPaged, Int8PagesMatchContiguousBitwise) {
  Files f;
  const PagedCase c;
  using C = PagedCase;
  // int8 values and scales for every page row; a row of page 2 has scale 0.
  std::vector<std::int8_t> kq(C::P * C::Hkv * C::ps * C::d),
      vq(C::P * C::Hkv * C::ps * C::dv);
  std::vector<float> ks(C::P * C::Hkv * C::ps), vs(ks.size());
  for (std::size_t i = 0; i < kq.size(); ++i)
    kq[i] =
        static_cast<std::int8_t>(static_cast<int>((i * 37 + 11) % 255) - 127);
  for (std::size_t i = 0; i < vq.size(); ++i)
    vq[i] =
        static_cast<std::int8_t>(static_cast<int>((i * 53 + 7) % 255) - 127);
  for (std::size_t i = 0; i < ks.size(); ++i) {
    ks[i] = 0.01f * static_cast<float>(1 + i % 7);
    vs[i] = 0.02f * static_cast<float>(1 + i % 5);
  }
  ks[(2 * C::Hkv + 1) * C::ps + 1] = 0.0f;
  const std::string table = f.put("table.npy", i32_npy({2, 4}, c.table));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  f.put("q.npy", f32_npy(c.q));
  f.put("k.npy", i8_npy({C::P, C::Hkv, C::ps, C::d}, kq));
  f.put("v.npy", i8_npy({C::P, C::Hkv, C::ps, C::dv}, vq));
  const std::string kf = f.put("kf.npy", f32_npy(c.kp));
  const std::string vf = f.put("vf.npy", f32_npy(c.vp));
  const std::string kss =
      f.put("ks.npy", f32_npy(Array{{C::P, C::Hkv, C::ps, 1}, ks}));
  const std::string vss =
      f.put("vs.npy", f32_npy(Array{{C::P, C::Hkv, C::ps, 1}, vs}));
  const CommandResult r =
      run_softdot({"attention", "--q",        f.q,  "--k",
                   f.k,         "--v",        f.v,  "--k-scales",
                   kss,         "--v-scales", vss,  "--block-table",
                   table,       "--seq-lens", lens, "--kv-layout",
                   "HND",       "--causal",   "-o", f.out,
                   "--lse",     f.lse});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::vector<float> got = read_output(f.out);
  const std::vector<float> got_lse = read_output(f.lse);
  const std::string out2 = f.dir.path("out2.npy");
  const CommandResult rq =
      run_softdot({"attention", "--q", f.q, "--k", kf, "--v", vf, "--kv",
                   "int8", "--block-table", table, "--seq-lens", lens,
                   "--kv-layout", "HND", "--causal", "-o", out2});
  ASSERT_EQ(rq.status, 0) << rq.err;
  const std::vector<float> got_q = read_output(out2);
  const std::size_t per_b = C::H * C::n_q * C::dv;
  ASSERT_EQ(got.size(), 2 * per_b);
  ASSERT_EQ(got_q.size(), 2 * per_b);
  for (std::size_t b = 0; b < 2; ++b) {
    // Sequence b's keys in position order: values, scales and floats.
    const auto n = static_cast<std::size_t>(c.lens[b]);
    std::vector<std::int8_t> kb, vb;
    std::vector<float> ksb, vsb;
    for (std::size_t h = 0; h < C::Hkv; ++h) {
      for (std::size_t t = 0; t < n; ++t) {
        const auto page =
            static_cast<std::size_t>(c.table[b * C::bps + t / C::ps]);
        const std::size_t row = (page * C::Hkv + h) * C::ps + t % C::ps;
        kb.insert(kb.end(),
                  kq.begin() + static_cast<std::ptrdiff_t>(row * C::d),
                  kq.begin() + static_cast<std::ptrdiff_t>((row + 1) * C::d));
        vb.insert(vb.end(),
                  vq.begin() + static_cast<std::ptrdiff_t>(row * C::dv),
                  vq.begin() + static_cast<std::ptrdiff_t>((row + 1) * C::dv));
        ksb.push_back(ks[row]);
        vsb.push_back(vs[row]);
      }
    }
    f.put("qb.npy", f32_npy(c.q_of(b)));
    f.put("kb.npy", i8_npy({1, C::Hkv, n, C::d}, kb));
    f.put("vb.npy", i8_npy({1, C::Hkv, n, C::dv}, vb));
    f.put("ksb.npy", f32_npy(Array{{1, C::Hkv, n, 1}, ksb}));
    f.put("vsb.npy", f32_npy(Array{{1, C::Hkv, n, 1}, vsb}));
    ASSERT_EQ(run_softdot({"attention", "--q", f.dir.path("qb.npy"), "--k",
                           f.dir.path("kb.npy"), "--v", f.dir.path("vb.npy"),
                           "--k-scales", f.dir.path("ksb.npy"), "--v-scales",
                           f.dir.path("vsb.npy"), "--causal", "-o",
                           f.dir.path("ob.npy"), "--lse", f.dir.path("lb.npy")})
                  .status,
              0);
    const std::vector<float> ob = read_output(f.dir.path("ob.npy"));
    const std::vector<float> lb = read_output(f.dir.path("lb.npy"));
    ASSERT_EQ(ob.size(), per_b);
    EXPECT_EQ(bits_of(ob, 0, per_b), bits_of(got, b * per_b, per_b))
        << "int8 pages, sequence " << b;
    EXPECT_EQ(bits_of(lb, 0, lb.size()),
              bits_of(got_lse, b * lb.size(), lb.size()))
        << "int8 pages, sequence " << b;
    // --kv int8 on float pages: the contiguous command with --kv int8.
    f.put("kfb.npy", f32_npy(c.seq_k[b]));
    f.put("vfb.npy", f32_npy(c.seq_v[b]));
    ASSERT_EQ(
        run_softdot({"attention", "--q", f.dir.path("qb.npy"), "--k",
                     f.dir.path("kfb.npy"), "--v", f.dir.path("vfb.npy"),
                     "--kv", "int8", "--causal", "-o", f.dir.path("oq.npy")})
            .status,
        0);
    const std::vector<float> oq = read_output(f.dir.path("oq.npy"));
    ASSERT_EQ(oq.size(), per_b);
    EXPECT_EQ(bits_of(oq, 0, per_b), bits_of(got_q, b * per_b, per_b))
        << "--kv int8 pages, sequence " << b;
  }
  // The errors of int8 keys hold for pages too: missing scales, and scales
  // shaped for contiguous keys; one line, no output file.
  const std::string none = f.dir.path("none.npy");
  auto expect_error = [&](const std::string& what, const CommandResult& e,
                          const std::vector<std::string>& needles) {
    EXPECT_EQ(e.status, 2) << what;
    EXPECT_EQ(e.err.rfind("softdot: error: ", 0), 0u) << what << ": " << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
    for (const std::string& n : needles)
      EXPECT_NE(e.err.find(n), std::string::npos)
          << what << ": \"" << e.err << "\" does not name " << n;
    EXPECT_FALSE(file_exists(none)) << what << ": left an output file";
  };
  expect_error("int8 pages without scales",
               run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--block-table", table, "--seq-lens", lens,
                            "--kv-layout", "HND", "-o", none}),
               {"is int8 and needs its scales", "--k-scales",
                "[pages x kv_heads x page_size x 1]"});
  const std::string flat =
      f.put("flat.npy", f32_npy(Array{{C::P * C::Hkv * C::ps, 1}, ks}));
  expect_error("2-D scales for pages",
               run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--k-scales", flat, "--v-scales", vss,
                            "--block-table", table, "--seq-lens", lens,
                            "--kv-layout", "HND", "-o", none}),
               {"--k-scales is [48 x 1]", "[6 x 2 x 4 x 1]"});
}

// [pages, A, B, last] -> [pages, B, A, last]: HND pages to NHD and back.
template <class T>
std::vector<T> swap_page_axes(const std::vector<T>& v, std::size_t pages,
                              std::size_t a, std::size_t b, std::size_t last) {
  std::vector<T> out(v.size());
  for (std::size_t p = 0; p < pages; ++p)
    for (std::size_t i = 0; i < a; ++i)
      for (std::size_t j = 0; j < b; ++j)
        for (std::size_t c = 0; c < last; ++c)
          out[((p * b + j) * a + i) * last + c] =
              v[((p * a + i) * b + j) * last + c];
  return out;
}

std::vector<std::uint32_t> all_bits(const std::vector<float>& v) {
  return bits_of(v, 0, v.size());
}

// The same cache as NHD files ([pages, page_size, kv_heads, d], the
// default, and named with --kv-layout NHD) and as HND files (--kv-layout
// HND): the same output and lse bit for bit, for float pages, int8 pages
// with their scales (in the pages' layout) and --kv int8.
TEST(CliAttentionPaged, NhdAndHndFilesGiveTheSameBits) {
  Files f;
  const PagedCase c;
  using C = PagedCase;
  const std::string table = f.put("table.npy", i32_npy({2, 4}, c.table));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  f.put("q.npy", f32_npy(c.q));
  const std::string k_hnd = f.put("k_hnd.npy", f32_npy(c.kp));
  const std::string v_hnd = f.put("v_hnd.npy", f32_npy(c.vp));
  const std::string k_nhd = f.put(
      "k_nhd.npy",
      f32_npy(Array{{C::P, C::ps, C::Hkv, C::d},
                    swap_page_axes(c.kp.values, C::P, C::Hkv, C::ps, C::d)}));
  const std::string v_nhd = f.put(
      "v_nhd.npy",
      f32_npy(Array{{C::P, C::ps, C::Hkv, C::dv},
                    swap_page_axes(c.vp.values, C::P, C::Hkv, C::ps, C::dv)}));
  // Runs the command on the pages with `extra` options; the output and lse.
  auto run = [&](const std::string& k, const std::string& v,
                 const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "attention", "--q",           f.q,     "--k",        k,    "--v",
        v,           "--block-table", table,   "--seq-lens", lens, "--causal",
        "-o",        f.out,           "--lse", f.lse};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_softdot(args);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    std::vector<std::uint32_t> bits = all_bits(read_output(f.out));
    const std::vector<std::uint32_t> lse = all_bits(read_output(f.lse));
    EXPECT_EQ(bits.size(), C::B * C::H * C::n_q * C::dv);
    EXPECT_EQ(lse.size(), C::B * C::H * C::n_q);
    bits.insert(bits.end(), lse.begin(), lse.end());
    return bits;
  };
  const std::vector<std::uint32_t> hnd =
      run(k_hnd, v_hnd, {"--kv-layout", "HND"});
  EXPECT_EQ(run(k_nhd, v_nhd, {}), hnd) << "NHD files, the default";
  EXPECT_EQ(run(k_nhd, v_nhd, {"--kv-layout", "NHD"}), hnd)
      << "NHD files, --kv-layout NHD";
  const std::vector<std::uint32_t> q_hnd =
      run(k_hnd, v_hnd, {"--kv-layout", "HND", "--kv", "int8"});
  EXPECT_EQ(run(k_nhd, v_nhd, {"--kv", "int8"}), q_hnd) << "--kv int8";
  // float16 pages (the values are exact in float16).
  const std::string kh_hnd = f.put("kh_hnd.npy", f16_npy(c.kp));
  const std::string vh_hnd = f.put("vh_hnd.npy", f16_npy(c.vp));
  const std::string kh_nhd = f.put(
      "kh_nhd.npy",
      f16_npy(Array{{C::P, C::ps, C::Hkv, C::d},
                    swap_page_axes(c.kp.values, C::P, C::Hkv, C::ps, C::d)}));
  const std::string vh_nhd = f.put(
      "vh_nhd.npy",
      f16_npy(Array{{C::P, C::ps, C::Hkv, C::dv},
                    swap_page_axes(c.vp.values, C::P, C::Hkv, C::ps, C::dv)}));
  EXPECT_EQ(run(kh_nhd, vh_nhd, {}),
            run(kh_hnd, vh_hnd, {"--kv-layout", "HND"}))
      << "float16 pages";

  // int8 pages and their scales, HND and swapped to NHD.
  std::vector<std::int8_t> kq(C::P * C::Hkv * C::ps * C::d),
      vq(C::P * C::Hkv * C::ps * C::dv);
  std::vector<float> ks(C::P * C::Hkv * C::ps), vs(ks.size());
  for (std::size_t i = 0; i < kq.size(); ++i)
    kq[i] =
        static_cast<std::int8_t>(static_cast<int>((i * 29 + 3) % 255) - 127);
  for (std::size_t i = 0; i < vq.size(); ++i)
    vq[i] =
        static_cast<std::int8_t>(static_cast<int>((i * 41 + 5) % 255) - 127);
  for (std::size_t i = 0; i < ks.size(); ++i) {
    ks[i] = 0.01f * static_cast<float>(1 + i % 7);
    vs[i] = 0.02f * static_cast<float>(1 + i % 3);
  }
  f.put("kq_hnd.npy", i8_npy({C::P, C::Hkv, C::ps, C::d}, kq));
  f.put("vq_hnd.npy", i8_npy({C::P, C::Hkv, C::ps, C::dv}, vq));
  f.put("ks_hnd.npy", f32_npy(Array{{C::P, C::Hkv, C::ps, 1}, ks}));
  f.put("vs_hnd.npy", f32_npy(Array{{C::P, C::Hkv, C::ps, 1}, vs}));
  f.put("kq_nhd.npy", i8_npy({C::P, C::ps, C::Hkv, C::d},
                             swap_page_axes(kq, C::P, C::Hkv, C::ps, C::d)));
  f.put("vq_nhd.npy", i8_npy({C::P, C::ps, C::Hkv, C::dv},
                             swap_page_axes(vq, C::P, C::Hkv, C::ps, C::dv)));
  f.put("ks_nhd.npy",
        f32_npy(Array{{C::P, C::ps, C::Hkv, 1},
                      swap_page_axes(ks, C::P, C::Hkv, C::ps, 1)}));
  f.put("vs_nhd.npy",
        f32_npy(Array{{C::P, C::ps, C::Hkv, 1},
                      swap_page_axes(vs, C::P, C::Hkv, C::ps, 1)}));
  const auto int8_run = [&](const std::string& layout,
                            const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--k-scales", f.dir.path("ks_" + layout + ".npy"), "--v-scales",
        f.dir.path("vs_" + layout + ".npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(f.dir.path("kq_" + layout + ".npy"),
               f.dir.path("vq_" + layout + ".npy"), args);
  };
  const std::vector<std::uint32_t> i8_hnd =
      int8_run("hnd", {"--kv-layout", "HND"});
  EXPECT_EQ(int8_run("nhd", {}), i8_hnd) << "int8 pages, NHD";
  // HND scales with NHD pages: the scales must follow the pages' layout.
  const CommandResult r = run_softdot(
      {"attention", "--q", f.q, "--k", f.dir.path("kq_nhd.npy"), "--v",
       f.dir.path("vq_nhd.npy"), "--k-scales", f.dir.path("ks_hnd.npy"),
       "--v-scales", f.dir.path("vs_nhd.npy"), "--block-table", table,
       "--seq-lens", lens, "-o", f.dir.path("none.npy")});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "softdot: error: --k-scales is [6 x 2 x 4 x 1] but --k is "
            "[6 x 4 x 2 x 8]; --k-scales must be [6 x 4 x 2 x 1], one "
            "scale per row of --k\n");
  EXPECT_FALSE(file_exists(f.dir.path("none.npy")));
}

// Without --kv-layout the pages are NHD: the messages about their shapes
// say so, show the files' own shapes and name the option.
TEST(CliAttentionPaged, DefaultLayoutIsNhdAndErrorsShowTheFilesShapes) {
  Files f;
  const PagedCase c;
  using C = PagedCase;
  const std::string table = f.put("table.npy", i32_npy({2, 4}, c.table));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  f.put("q.npy", f32_npy(c.q));
  // NHD pages [6, 4, 2, d].
  f.put("k.npy",
        f32_npy(Array{{C::P, C::ps, C::Hkv, C::d},
                      swap_page_axes(c.kp.values, C::P, C::Hkv, C::ps, C::d)}));
  f.put("v.npy", f32_npy(Array{
                     {C::P, C::ps, C::Hkv, C::dv},
                     swap_page_axes(c.vp.values, C::P, C::Hkv, C::ps, C::dv)}));
  const std::string none = f.dir.path("none.npy");
  auto run = [&](const std::string& k, const std::string& v,
                 const std::string& block_table,
                 const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "attention",     "--q",       f.q,          "--k", k,    "--v", v,
        "--block-table", block_table, "--seq-lens", lens,  "-o", none};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = run_softdot(args);
    EXPECT_EQ(r.status, 2);
    EXPECT_FALSE(file_exists(none));
    return r.err;
  };
  const std::string k2 = f.put("k2.npy", f32_npy(make_array({6, 8}, 2)));
  EXPECT_EQ(run(k2, f.v, table, {}),
            "softdot: error: --k is [6 x 8]: with --block-table it holds "
            "pages, a 4-D array; --kv-layout NHD (the default) reads pages as "
            "[pages x page_size x kv_heads x d], HND as [pages x kv_heads x "
            "page_size x d]\n");
  EXPECT_EQ(run(k2, f.v, table, {"--kv-layout", "HND"}),
            "softdot: error: --k is [6 x 8]: with --block-table it holds "
            "pages, a 4-D array; --kv-layout HND reads pages as [pages x "
            "kv_heads x page_size x d]\n");
  // 3 KV heads (axis 2 in NHD) do not divide q's 4 heads.
  const std::string k3 =
      f.put("k3.npy", f32_npy(make_array({C::P, C::ps, 3, C::d}, 3)));
  EXPECT_EQ(run(k3, f.v, table, {}),
            "softdot: error: --q has heads = 4, not a multiple of --k's "
            "kv_heads = 3 (q is [2 x 4 x 3 x 8], k is [6 x 4 x 3 x 8]); "
            "--kv-layout NHD (the default) reads pages as [pages x page_size "
            "x kv_heads x d], HND as [pages x kv_heads x page_size x d]\n");
  const std::string v3 =
      f.put("v3.npy", f32_npy(make_array({C::P, C::Hkv, C::ps, C::dv}, 4)));
  EXPECT_EQ(run(f.k, v3, table, {}),
            "softdot: error: --v is [6 x 2 x 4 x 3] but --k is [6 x 4 x 2 x "
            "8]: they need the same pages, kv_heads and page_size; "
            "--kv-layout NHD (the default) reads pages as [pages x page_size "
            "x kv_heads x d], HND as [pages x kv_heads x page_size x d]\n");
  // A table entry past the pages: the pages as the file holds them.
  std::vector<std::int32_t> bad = c.table;
  bad[5] = 6;
  const std::string bad_table = f.put("bad.npy", i32_npy({2, 4}, bad));
  EXPECT_EQ(run(f.k, f.v, bad_table, {}),
            "softdot: error: --block-table: " + bad_table +
                ": block_table[1, 1] = 6 (sequence 1, entry 1) is not a page "
                "of --k [6 x 4 x 2 x 8] (0 to 5)\n");
  const std::string long_lens = f.put("long.npy", i32_npy({2}, {5, 17}));
  std::vector<std::string> args = {
      "attention",     "--q", f.q,          "--k",     f.k,  "--v", f.v,
      "--block-table", table, "--seq-lens", long_lens, "-o", none};
  const CommandResult r = run_softdot(args);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "softdot: error: --seq-lens: " + long_lens +
                       ": seq_lens[1] = 17 (sequence 1) is more keys than "
                       "its 4 pages of page_size 4 hold (--block-table is "
                       "[2 x 4], --k is [6 x 4 x 2 x 8])\n");
  // int8 pages without scales: the scales' shape in the default layout.
  std::vector<std::int8_t> zeros(C::P * C::ps * C::Hkv * C::d, 1);
  const std::string kq =
      f.put("kq.npy", i8_npy({C::P, C::ps, C::Hkv, C::d}, zeros));
  const std::string vq =
      f.put("vq.npy",
            i8_npy({C::P, C::ps, C::Hkv, C::dv},
                   std::vector<std::int8_t>(C::P * C::ps * C::Hkv * C::dv)));
  EXPECT_EQ(run(kq, vq, table, {}),
            "softdot: error: --k " + kq +
                " is int8 and needs its scales: --k-scales FILE.npy, float32 "
                "[pages x page_size x kv_heads x 1] (--kv-layout NHD, the "
                "default)\n");
}

// --kv-layout takes NHD or HND, and only with --block-table: status 2 and one
// line naming the option, before any input is read.
TEST(CliAttentionPaged, BadKvLayoutIsAClearError) {
  Files f;
  const PagedCase c;
  const std::string table = f.put("table.npy", i32_npy({2, 4}, c.table));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  f.put("q.npy", f32_npy(c.q));
  f.put("k.npy", f32_npy(c.kp));
  f.put("v.npy", f32_npy(c.vp));
  for (const char* bad : {"nhd", "NDH", "HND ", "vllm"}) {
    const CommandResult r = run_softdot(
        {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--block-table",
         table, "--seq-lens", lens, "--kv-layout", bad, "-o", f.out});
    EXPECT_EQ(r.status, 2) << bad;
    EXPECT_EQ(r.err, "softdot: error: --kv-layout \"" + std::string(bad) +
                         "\": must be NHD (pages [pages x page_size x "
                         "kv_heads x d], the default) or HND (pages [pages x "
                         "kv_heads x page_size x d])\n");
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(file_exists(f.out)) << bad;
  }
  const CommandResult r =
      run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                   "--kv-layout", "HND", "-o", f.out});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "softdot: error: --kv-layout is an option of --block-table: it "
            "orders the axes of paged k and v\n");
  EXPECT_FALSE(file_exists(f.out));
}

}  // namespace
}  // namespace softdot_test

namespace softdot_test {
namespace {

using namespace cli_attention;

// The packed rows [T, H, d] of a uniform batch [B, H, n_q, d].
Array packed_rows(const Array& q) {
  const std::size_t B = q.shape[0], H = q.shape[1], n = q.shape[2],
                    d = q.shape[3];
  Array a;
  a.shape = {B * n, H, d};
  a.values.resize(q.values.size());
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < d; ++c)
          a.values[((b * n + i) * H + h) * d + c] = q.at(b, h, i, c);
  return a;
}

// --query-start-loc: the ragged form of the uniform batch gives its bits
// (out [T, H, d_v], lse [H, T]), with --batch-invariant and --alibi-slopes
// too; a draft tree that is a chain (--draft-parents) is plain causal; a
// bad combination is one error line.
TEST(CliAttentionPaged, RaggedBatchMatchesTheUniformBatch) {
  Files f;
  const PagedCase c;
  f.put("q.npy", f32_npy(c.q));
  f.put("k.npy", f32_npy(c.kp));
  f.put("v.npy", f32_npy(c.vp));
  const std::string qp = f.put("qp.npy", f32_npy(packed_rows(c.q)));
  const std::string table = f.put("table.npy", i32_npy({2, 4}, c.table));
  const std::string lens = f.put("lens.npy", i32_npy({2}, c.lens));
  const std::string qsl = f.put("qsl.npy", i32_npy({3}, {0, 3, 6}));
  const std::string chain =
      f.put("chain.npy", i32_npy({6}, {-1, 0, 1, -1, 0, 1}));
  Array slopes;
  slopes.shape = {4};
  slopes.values = {0.5f, 0.25f, -0.125f, 1.0f};
  const std::string alibi = f.put("alibi.npy", f32_npy(slopes));
  const std::vector<std::string> base = {
      "attention", "--k",        f.k,  "--v",         f.v,   "--block-table",
      table,       "--seq-lens", lens, "--kv-layout", "HND", "--causal"};
  const std::size_t T = 6, H = PagedCase::H, dv = PagedCase::dv;
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{
           {}, {"--batch-invariant", "--alibi-slopes", alibi}}) {
    std::vector<std::string> uni = base, rag = base;
    uni.insert(uni.end(), {"--q", f.q, "-o", f.out, "--lse", f.lse});
    rag.insert(rag.end(),
               {"--q", qp, "--query-start-loc", qsl, "-o", f.dir.path("or.npy"),
                "--lse", f.dir.path("lr.npy")});
    uni.insert(uni.end(), extra.begin(), extra.end());
    rag.insert(rag.end(), extra.begin(), extra.end());
    const CommandResult ru = run_softdot(uni);
    ASSERT_EQ(ru.status, 0) << ru.err;
    const CommandResult rr = run_softdot(rag);
    ASSERT_EQ(rr.status, 0) << rr.err;
    const ParsedNpy o_r = parse_npy(read_whole_file(f.dir.path("or.npy")));
    EXPECT_EQ(o_r.shape, "(6, 4, 3)");
    const std::vector<float> got = values_of<float>(o_r.data);
    const std::vector<float> want = read_output(f.out);
    const std::vector<float> lr = read_output(f.dir.path("lr.npy"));
    const std::vector<float> lu = read_output(f.lse);
    ASSERT_EQ(got.size(), T * H * dv);
    ASSERT_EQ(lr.size(), H * T);
    bool same = true;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < 3; ++i) {
          const std::size_t t = b * 3 + i;
          same =
              same && std::bit_cast<std::uint32_t>(lr[h * T + t]) ==
                          std::bit_cast<std::uint32_t>(lu[(b * H + h) * 3 + i]);
          for (std::size_t x = 0; x < dv; ++x)
            same = same &&
                   std::bit_cast<std::uint32_t>(got[(t * H + h) * dv + x]) ==
                       std::bit_cast<std::uint32_t>(
                           want[((b * H + h) * 3 + i) * dv + x]);
        }
    EXPECT_TRUE(same) << "ragged differs from uniform with " << extra.size()
                      << " extra arguments";
  }
  // A chain of draft tokens: plain causal attention.
  std::vector<std::string> tree = base;
  tree.insert(tree.end(),
              {"--q", qp, "--query-start-loc", qsl, "--draft-parents", chain,
               "-o", f.dir.path("ot.npy")});
  ASSERT_EQ(run_softdot(tree).status, 0);
  std::vector<std::string> plain = base;
  plain.insert(plain.end(), {"--q", qp, "--query-start-loc", qsl, "-o",
                             f.dir.path("op.npy")});
  ASSERT_EQ(run_softdot(plain).status, 0);
  EXPECT_EQ(read_whole_file(f.dir.path("ot.npy")),
            read_whole_file(f.dir.path("op.npy")));
  // Errors: one line, nothing written.
  const CommandResult e1 =
      run_softdot({"attention", "--q", qp, "--k", f.k, "--v", f.v,
                   "--query-start-loc", qsl, "-o", f.dir.path("e.npy")});
  EXPECT_NE(e1.status, 0);
  EXPECT_NE(e1.err.find("--query-start-loc is an option of --block-table"),
            std::string::npos)
      << e1.err;
  std::vector<std::string> four = base;
  four.insert(four.end(), {"--q", f.q, "--query-start-loc", qsl, "-o",
                           f.dir.path("e.npy")});
  const CommandResult e2 = run_softdot(four);
  EXPECT_NE(e2.status, 0);
  EXPECT_NE(e2.err.find("[T x heads x d]"), std::string::npos) << e2.err;
  const std::string bad = f.put("bad.npy", i32_npy({6}, {-1, 1, 1, -1, 0, 1}));
  std::vector<std::string> badtree = base;
  badtree.insert(badtree.end(),
                 {"--q", qp, "--query-start-loc", qsl, "--draft-parents", bad,
                  "-o", f.dir.path("e.npy")});
  const CommandResult e3 = run_softdot(badtree);
  EXPECT_NE(e3.status, 0);
  EXPECT_NE(e3.err.find("draft_parents[1] = 1"), std::string::npos) << e3.err;
  EXPECT_FALSE(file_exists(f.dir.path("e.npy")));
}

}  // namespace
}  // namespace softdot_test
