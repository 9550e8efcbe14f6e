#!/usr/bin/env python3
"""Runs the examples of a Markdown file (docs/cli.md) and compares each
command's output with the lines the document shows under it.

Usage: check_doc_examples.py [--emulator COMMAND] SOFTDOT_BINARY DOC.md

--emulator (a cross build's CMAKE_CROSSCOMPILING_EMULATOR, e.g.
qemu-aarch64; its words split on spaces, empty for none) starts the binary
through that program.

An example is a fenced block (```) whose lines start with "$ ": each "$ "
line (with the lines that continue an open quote) is a command, run by bash
with `softdot` meaning SOFTDOT_BINARY, standard output and standard error
together; the lines up to the next "$ " line or the end of the block are
its expected output. Blocks without "$ " lines (usage summaries, quoted
messages) are not run.

The blocks run in order, each in a copy of one working directory; a file a
block makes is kept for the later blocks unless an earlier block made it
(so an example that writes its own q.npy does not change the files the
later examples were written with). A "$ cat FILE" whose FILE no block made
creates FILE from the output the document shows (docs/cli.md shows
scores.csv that way); FIXTURES below are the files the error examples read
without showing them.

The usage summary (the first block that starts "softdot [--help]") must name
every command of `softdot --help` and, on its lines for a command, every
option of `softdot COMMAND --help` (but --help; a short form such as -t
counts for its long one).

Compared exactly, except: trailing spaces of a line, and the SIMD target
("SIMD target: AVX3"), which depends on the machine. A block that needs a
Python module that is not installed (numpy, softdot) is skipped and named.
Exit status 0 when every example run matched, 1 otherwise (each mismatch
printed with the document's line number), 2 for bad arguments.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

FIXTURES = {
    # docs/cli.md "## Errors": bad.csv:3:7 is "x", ragged.csv's line 2 has
    # 2 values and line 1 has 3.
    "bad.csv": "1,2,3\n4,5,6\n1, 2, x\n",
    "ragged.csv": "1,2,3\n4,5\n",
}

SIMD = re.compile(r"SIMD target: [A-Za-z0-9_]+")


def normalise(text):
    lines = [SIMD.sub("SIMD target: *", line).rstrip() for line in text.split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines)


def complete(command):
    """True when `command` has no open quote (shlex reads it whole)."""
    try:
        shlex.split(command)
        return True
    except ValueError:
        return False


def blocks(path):
    """Yields (first line number, [(line number, command, expected)])."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        body = lines[start:end]
        i = end + 1
        if not any(line.startswith("$ ") for line in body):
            continue
        examples = []
        j = 0
        while j < len(body):
            if not body[j].startswith("$ "):
                j += 1
                continue
            number = start + j + 1
            command = body[j][2:]
            j += 1
            while not complete(command) and j < len(body):
                command += "\n" + body[j]
                j += 1
            expected = []
            while j < len(body) and not body[j].startswith("$ "):
                expected.append(body[j])
                j += 1
            examples.append((number, command, "\n".join(expected)))
        yield start, examples


def python_modules(command):
    """The modules a python3 -c command imports (first line)."""
    match = re.search(r"python3 -c \"import ([^\n\"]*)", command)
    if not match:
        return []
    return [m.strip().split(" as ")[0] for m in match.group(1).split(",")]


def importable(module):
    return (
        subprocess.run([sys.executable, "-c", "import " + module], capture_output=True).returncode
        == 0
    )


def usage_problems(command_line, doc):
    """The commands and options `--help` lists that the usage summary lacks."""
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"```\n(softdot \[--help\].*?)```", text, re.S)
    if not match:
        return [f"{doc}: no usage summary (a block starting 'softdot [--help]')"]
    summary = match.group(1).split("\n")

    def helped(*args):
        return subprocess.run(
            [*command_line, *args, "--help"], capture_output=True, text=True
        ).stdout

    top = helped()
    commands = re.findall(r"^  ([a-z][a-z-]*) {2,}", top.split("Subcommands:")[1], re.M)
    problems = []
    for command in commands:
        # The command's lines: those naming it, and the indented lines after them.
        lines, inside = [], False
        for line in summary:
            if re.search(r"\bsoftdot " + re.escape(command) + r"\b", line):
                inside = True
            elif not line.startswith(" "):
                inside = False
            if inside:
                lines.append(line)
        if not lines:
            problems.append(f"{doc}: the usage summary has no line for 'softdot {command}'")
            continue
        options = re.findall(r"^  (?:(-\w),)?(--[a-z][a-z0-9-]*)", helped(command), re.M)
        shown = "\n".join(lines)
        for short, option in options:
            # Either spelling will do: "-t T" names --temperature.
            names = [option] + ([short] if short else [])
            if option != "--help" and not any(
                re.search(r"(?<![\w-])" + re.escape(n) + r"(?![\w-])", shown) for n in names
            ):
                problems.append(f"{doc}: the usage summary of 'softdot {command}' lacks {option}")
    return problems


def main():
    args = sys.argv[1:]
    emulator = []
    if len(args) == 4 and args[0] == "--emulator":
        emulator, args = args[1].split(), args[2:]
    if len(args) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    binary, doc = os.path.abspath(args[0]), args[1]
    command_line = [*emulator, binary]
    bindir = tempfile.mkdtemp(prefix="softdot_doc_bin.")
    shared = tempfile.mkdtemp(prefix="softdot_doc.")
    if emulator:
        # `softdot` in the examples: a script that starts the binary through
        # the emulator.
        wrapper = os.path.join(bindir, "softdot")
        with open(wrapper, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\nexec " + shlex.join(command_line) + ' "$@"\n')
        os.chmod(wrapper, 0o755)
    else:
        os.symlink(binary, os.path.join(bindir, "softdot"))
    for name, content in FIXTURES.items():
        with open(os.path.join(shared, name), "w", encoding="utf-8") as f:
            f.write(content)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env["LC_ALL"] = "C.UTF-8"
    checked = failed = 0
    skipped = []
    try:
        for start, examples in blocks(doc):
            missing = [
                m
                for _, command, _ in examples
                for m in python_modules(command)
                if not importable(m)
            ]
            if missing:
                skipped.append(f"{doc}:{start}: needs Python module(s) {', '.join(missing)}")
                continue
            work = tempfile.mkdtemp(prefix="softdot_doc_block.")
            try:
                for name in os.listdir(shared):
                    shutil.copy(os.path.join(shared, name), work)
                for number, command, expected in examples:
                    cat = re.fullmatch(r"cat (\S+)", command)
                    if cat and not os.path.exists(os.path.join(work, cat.group(1))):
                        with open(os.path.join(work, cat.group(1)), "w", encoding="utf-8") as f:
                            f.write(expected + "\n")
                    run = subprocess.run(
                        ["bash", "-c", command],
                        cwd=work,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        timeout=120,
                    )
                    got = run.stdout.decode("utf-8", "replace")
                    checked += 1
                    if normalise(got) != normalise(expected):
                        failed += 1
                        print(f"{doc}:{number}: $ {command}")
                        print("  the document shows:")
                        print(
                            "".join("    " + line + "\n" for line in expected.split("\n")), end=""
                        )
                        print("  the command printed:")
                        print(
                            "".join("    " + line + "\n" for line in got.rstrip("\n").split("\n")),
                            end="",
                        )
                for name in os.listdir(work):
                    kept = os.path.join(shared, name)
                    if not os.path.exists(kept):
                        shutil.copy(os.path.join(work, name), kept)
            finally:
                shutil.rmtree(work)
    finally:
        shutil.rmtree(shared)
        shutil.rmtree(bindir)
    usage = usage_problems(command_line, doc)
    for problem in usage:
        print(problem)
        failed += 1
    for s in skipped:
        print("skipped: " + s)
    print(f"{checked} examples run, {failed} differ from {doc}, {len(skipped)} block(s) skipped")
    return 1 if failed or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
