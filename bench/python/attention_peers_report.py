"""Tables and chart of attention_peers.py's results: the Markdown tables it
prints, and an SVG of decode K+V GB/s against n_kv, one line per
implementation, one panel per (thread count, K/V dtype), the read roofline
dashed. Standard library only (written with report_writer.py, as
scripts/peers_report.py's), so both can be made again from the --json file
without running the benchmark:

    python bench/python/attention_peers_report.py peers.json [--svg peers.svg]
"""

from __future__ import annotations

import json
import math
import sys

from report_writer import esc, md_bullets, md_table, svg_close, svg_open, svg_series, write_svg

COLORS = {
    "softdot": "#d62728",
    "torch SDPA": "#1f77b4",
    "torch matmul": "#8c564b",
    "ONNX Runtime": "#2ca02c",
    "OpenVINO": "#9467bd",
    "torch SDPA (dequantised f32)": "#17becf",
}  # int8 cases: a reference


def pick_config(runs):
    """The (B, Hq, Hkv, L) drawn: B = 1, n_q = 1, 32 on 8 heads where present."""
    configs = [
        (r["case"]["B"], r["case"]["Hq"], r["case"]["Hkv"], r["case"]["L"])
        for run in runs
        for r in run["results"]
        if r["case"]["kind"] == "decode"
    ]
    if not configs:
        return None
    return max(set(configs), key=lambda c: (c[0] == 1, c[3] == 1, c[1] == 32, -configs.index(c)))


def decode_chart(header, runs):
    """An SVG string, or None without decode results."""
    cfg = pick_config(runs)
    if cfg is None:
        return None
    dtypes = []
    for run in runs:
        for r in run["results"]:
            c = r["case"]
            if c["kind"] == "decode" and c["dtype"] not in dtypes:
                dtypes.append(c["dtype"])
    pw, ph, gap, left, top = 360, 260, 70, 70, 90
    legend_w = 170
    width = max(900, left + len(dtypes) * (pw + gap) + legend_w)
    height = top + len(runs) * (ph + gap) + 20
    subtitle = (
        f"batch {cfg[0]}, {cfg[1]} query heads on {cfg[2]} KV heads, n_q = {cfg[3]}, "
        f"d = 128; {header['cpu']}, softdot target {header['target']}"
    )
    title = "Attention decode: K+V GB/s against n_kv (higher is better)"
    s = svg_open(width, height, 12)
    s += [
        (
            f'<text x="{width / 2:.0f}" y="24" text-anchor="middle" font-size="15" '
            f'font-weight="bold">{esc(title)}</text>'
        ),
        f'<text x="{width / 2:.0f}" y="44" text-anchor="middle">{esc(subtitle)}</text>',
    ]
    impls = []
    for row, run in enumerate(runs):
        roof = max(run["roofline"].values(), default=0) / 1e9
        for col, dt in enumerate(dtypes):
            pts = {}
            for r in run["results"]:
                c = r["case"]
                if (
                    c["kind"] == "decode"
                    and c["dtype"] == dt
                    and "kv_gbs" in r
                    and (c["B"], c["Hq"], c["Hkv"], c["L"]) == cfg
                ):
                    pts.setdefault(r["impl"], []).append((c["S"], r["kv_gbs"]))
            x0, y0 = left + col * (pw + gap), top + row * (ph + gap)
            xs = sorted({x for p in pts.values() for x, _ in p}) or [4096]
            lo, hi = math.log2(xs[0]) - 0.5, math.log2(xs[-1]) + 0.5
            ymax = max([roof] + [y for p in pts.values() for _, y in p]) * 1.1 or 1.0
            step = 10 ** math.floor(math.log10(ymax / 2))
            step *= 5 if ymax / step > 25 else 2 if ymax / step > 10 else 1

            def px(x, x0=x0, lo=lo, hi=hi):
                return x0 + (math.log2(x) - lo) / (hi - lo) * pw

            def py(y, y0=y0, ymax=ymax):
                return y0 + ph - y / ymax * ph

            title = f"{dt} K/V, {run['threads']} thread(s)"
            s.append(
                f'<text x="{x0 + pw / 2:.0f}" y="{y0 - 8}" text-anchor="middle" '
                f'font-weight="bold">{esc(title)}</text>'
            )
            v = 0.0
            while v <= ymax:
                s.append(
                    f'<line x1="{x0}" y1="{py(v):.1f}" x2="{x0 + pw}" y2="{py(v):.1f}" '
                    f'stroke="#e6e6e6"/><text x="{x0 - 6}" y="{py(v) + 4:.1f}" '
                    f'text-anchor="end">{v:g}</text>'
                )
                v += step
            for x in xs:
                s.append(
                    f'<text x="{px(x):.1f}" y="{y0 + ph + 16}" text-anchor="middle">{x}</text>'
                )
            s.append(
                f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="black"/>'
            )
            if roof:
                s.append(
                    f'<line x1="{x0}" y1="{py(roof):.1f}" x2="{x0 + pw}" y2="{py(roof):.1f}" '
                    f'stroke="black" stroke-dasharray="6,4"/>'
                )
            for impl, p in pts.items():
                if impl not in impls:
                    impls.append(impl)
                p.sort()
                color = COLORS.get(impl, "#000000")
                w = 3 if impl == "softdot" else 2
                s += svg_series([(px(x), py(y)) for x, y in p], color, w)
        s.append(
            f'<text transform="translate(18,{top + row * (ph + gap) + ph / 2:.0f}) '
            f'rotate(-90)" text-anchor="middle">GB/s of K + V</text>'
        )
    s.append(
        f'<text x="{left + len(dtypes) * (pw + gap) / 2:.0f}" y="{height - 12}" '
        f'text-anchor="middle">n_kv (keys per sequence, log scale)</text>'
    )
    lx, ly = width - legend_w + 5, top + 10
    impls.sort(key=lambda i: list(COLORS).index(i) if i in COLORS else len(COLORS))
    legend = [(i, COLORS.get(i, "#000000"), "") for i in impls]
    legend.append(("read roofline", "black", ' stroke-dasharray="6,4"'))
    for j, (name, color, dash) in enumerate(legend):
        y = ly + 20 * j
        s.append(
            f'<line x1="{lx}" y1="{y}" x2="{lx + 26}" y2="{y}" stroke="{color}" '
            f'stroke-width="2"{dash}/><text x="{lx + 32}" y="{y + 4}">{esc(name)}</text>'
        )
    return svg_close(s)


# ---- report --------------------------------------------------------------------
def fmt(x, digits=3):
    return "—" if x is None else f"{x:.{digits}g}"


def report(header, runs, target) -> str:
    h = header
    L = [
        (
            f"CPU: {h['cpu']}; last-level cache {h['l3_bytes'] / 2**20:.0f} MiB (lscpu); "
            f"K/V arena {h['arena_bytes'] / 2**20:.0f} MiB per dtype"
        ),
        (
            f"softdot {h['softdot']}, SIMD target {h['target']}"
            f"{' (forced)' if target else ''}; torch {h['torch']} (CPU capability "
            f"{h['torch_cpu_capability']}); onnxruntime {h['onnxruntime']} (onnx {h['onnx']}); "
            f"openvino {h['openvino']}; numpy {h['numpy']}"
        ),
        (
            "Peers' ISA limited by: "
            + ", ".join(f"{k}={v}" for k, v in h["isa_limits"].items())
            + " (ONNX Runtime not limited)"
            if h.get("isa_limits")
            else None
        ),
        (
            "Threads: OMP_NUM_THREADS (softdot), torch.set_num_threads, ORT intra_op_num_threads "
            "(inter_op 1), OpenVINO INFERENCE_NUM_THREADS (NUM_STREAMS 1, LATENCY), all equal."
        ),
        "",
    ]
    L = [line for line in L if line is not None]
    for run in runs:
        th = run["threads"]
        roof = run["roofline"]
        notes, skipped = {}, {}
        for kind in ("decode", "prefill"):
            rs = [r for r in run["results"] if r["case"]["kind"] == kind]
            if not rs:
                continue
            if kind == "decode":
                L.append(
                    f"### Decode, {th} thread(s): K+V GB/s; read roofline "
                    + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in roof.items())
                    + ' ("of roofline" divides by the better one)'
                )
                rate_cols = ["K+V GB/s", "of roofline"]
            else:
                L.append(
                    f"### Prefill, {th} thread(s): GFLOP/s at 4·L·S·d (causal: half); "
                    f"MKL sgemm (torch.mm 1024³) {fmt(run['sgemm_gflops'], 4)} GFLOP/s"
                )
                rate_cols = ["GFLOP/s", "of sgemm"]
            acc = any("err_uw" in r for r in rs)
            cols = (
                ["case", "implementation", "ms"]
                + rate_cols
                + ["vs best peer", "max abs diff"]
                + (["err/(u W)"] if acc else [])
            )
            rows = []
            labels = list(dict.fromkeys(r["case"]["label"] for r in rs))
            for lab in labels:
                row = [r for r in rs if r["case"]["label"] == lab]
                peers = [
                    r["seconds"]
                    for r in row
                    if not r["impl"].startswith("softdot") and "seconds" in r
                ]
                best = min(peers, default=None)
                for r in row:
                    if "seconds" not in r:
                        skipped.setdefault((r["impl"], r["skipped"]), []).append(lab)
                        continue
                    if r.get("note"):
                        notes.setdefault((r["impl"], r["note"]), []).append(lab)
                    rate = (
                        (r["kv_gbs"], r.get("of_roofline"))
                        if kind == "decode"
                        else (r["gflops"], r.get("of_sgemm"))
                    )
                    vs = f"{best / r['seconds']:.2f}" if best else "—"
                    diff = "ref." if r["impl"] == "softdot" else f"{r['max_abs_diff']:.1e}"
                    frac = "—" if rate[1] is None else f"{rate[1]:.2f}"
                    cells = [
                        lab,
                        r["impl"],
                        f"{r['seconds'] * 1e3:.3f}",
                        f"{rate[0]:.1f}",
                        frac,
                        vs,
                        diff,
                    ]
                    if acc:
                        cells.append(f"{r['err_uw']:.3f}" if "err_uw" in r else "—")
                    rows.append(cells)
            L += ["", md_table(cols, rows, text_columns=2), ""]
        L.append(
            "\"vs best peer\": the best peer's time / this one's (softdot's speed-up; "
            '1.00 for the best peer). "max abs diff": against softdot\'s output, same '
            "inputs."
        )
        L.append("")
        items = [f"{impl}: {note} ({len(labs)} case(s))" for (impl, note), labs in notes.items()]
        items += [
            f"{impl} not run: {why} ({len(labs)} case(s), e.g. {labs[0]})"
            for (impl, why), labs in skipped.items()
        ]
        if items:
            L.append(md_bullets(items))
        L.append("")
    return "\n".join(L)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="attention_peers.py --json output")
    ap.add_argument("--svg", help="also draw the decode chart to this file")
    args = ap.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    print(report(data["header"], data["runs"], data.get("target")))
    if args.svg:
        svg = decode_chart(data["header"], data["runs"])
        if svg is None:
            sys.exit("no decode results: no chart")
        write_svg(args.svg, svg)
        print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
