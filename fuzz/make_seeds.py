#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/).

Run from anywhere: python3 fuzz/make_seeds.py. Standard library only. The
seeds are small valid and invalid inputs of each format; libFuzzer grows the
corpus from them. Files another run added (crash reproducers kept as
regression inputs) are left alone; the seeds are rewritten.
"""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(descr, shape, data, major=1, fortran=False):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shape_text)
    length_size = 2 if major == 1 else 4
    total = 6 + 2 + length_size + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    length = struct.pack("<H" if major == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + length + header.encode("latin-1") + data


def write(target, name, data):
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    f4 = struct.pack("<6f", 1, -2, 3.5, float("inf"), float("nan"), -0.0)
    seeds = {
        "f4_2x3": npy("<f4", (2, 3), f4),
        "f8_1x1": npy("<f8", (1, 1), struct.pack("<d", 1e-310)),
        "f4_v2": npy("<f4", (3, 2), f4, major=2),
        "f4_v3": npy("=f4", (1, 6), f4, major=3),
        "f2_vec": npy("<f2", (3,), struct.pack("<3e", 1, -65504, 6e-8)),
        "i1_4d": npy("|i1", (1, 2, 1, 2), bytes([1, 255, 127, 128])),
        "b1": npy("|b1", (2, 2), bytes([0, 1, 1, 0])),
        "i4": npy("<i4", (2,), struct.pack("<2i", -1, 7)),
        "i8": npy("<i8", (1,), struct.pack("<q", -(2 ** 40))),
        "scalar": npy("<f4", (), struct.pack("<f", 2.0)),
        "empty": npy("<f4", (0, 3), b""),
        "fortran": npy("<f4", (2, 3), f4, fortran=True),
        "big_endian": npy(">f4", (2, 3), f4),
        "truncated": npy("<f4", (2, 3), f4)[:-5],
        "petabyte": npy("<f4", (10 ** 9, 250000), f4),
        "wraps": npy("<f8", (2 ** 32, 2 ** 32), f4),
        "bad_magic": b"\x93NUMPZ\x01\x00" + npy("<f4", (1, 1), b"\0" * 4)[8:],
    }
    for name, data in seeds.items():
        write("fuzz_npy", name, data)

    csv = {
        "matrix": "1,2,3\n4,5,6\n",
        "spaces_crlf": "1 2\r\n3 4\r\n",
        "specials": "nan,inf,-inf,-0\n",
        "extremes": "1e-320,1.7976931348623157e308,4.9e-324\n",
        "empty_field": "1,,2\n",
        "leading_comma": ",1\n",
        "ragged": "1,2\n3\n",
        "blank_lines": "\n\n1\n\n",
        "words": "abc,1\n",
        "out_of_range": "1e999\n",
        "tabs": "1\t2 ,3\n",
    }
    for name, text in csv.items():
        write("fuzz_csv", name, text)

    parse = {
        "decimal": "1.5", "neg_inf": "-inf", "nan": "NaN", "huge": "1e999",
        "hex": "0x10", "list": "1,5, 7", "spaced": "  3", "underflow": "1e-400",
        "point": "+.5e-3", "long": "12345678901234567890.000000000000000001",
        "small_int": "40", "too_big_int": "41", "lines": "1 2\n3,,4\n-5e-1",
        "halfway": "9007199254740993", "subnormal": "2.4703282292062328e-324",
    }
    for name, text in parse.items():
        write("fuzz_parse", name, text)

    rng = random.Random(20261204)
    for i in range(24):
        n = rng.choice([16, 48, 128, 400, 1500])
        write("fuzz_attention", "random_%02d" % i, bytes(rng.randrange(256) for _ in range(n)))

    rng = random.Random(20261205)
    for i in range(12):
        n = rng.choice([64, 256, 600, 1500, 3000])
        write("fuzz_paged", "random_%02d" % i, bytes(rng.randrange(256) for _ in range(n)))

    # The request, the backward and the 16-bit rows: random bytes too (each
    # target reads its case from a FuzzedDataProvider).
    for target, seed in (("fuzz_request", 20261206), ("fuzz_backward", 20261207),
                         ("fuzz_rows16", 20261208)):
        rng = random.Random(seed)
        for i in range(12):
            n = rng.choice([16, 64, 256, 600, 1500])
            write(target, "random_%02d" % i, bytes(rng.randrange(256) for _ in range(n)))


if __name__ == "__main__":
    main()
