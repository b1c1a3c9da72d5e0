#!/usr/bin/env python3
"""Every repository path cited in a comment or a document names a file or folder that exists.

Comments and docs point readers at files ("Tests: tests/test_training.cpp", "see
remat/plan/planners/dp.cpp"); a file that moves or never existed leaves the pointer stale. This
script reads every tracked C++/CUDA, Python, shell, CMake and Markdown file, takes the text of its
comments (all of a Markdown file), finds the paths that start at one of the repository's top-level
folders and end in a file name or a folder, and fails naming each one that is not there, with where
it is cited. CI runs it beside the format check (.ci/run).

    python3 scripts/check-paths.py          # exit 1 and a line per stale path, else exit 0
"""
import os
import re
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folders a cited path starts at.
ROOTS = sorted(d for d in os.listdir(TOP) if os.path.isdir(os.path.join(TOP, d))
               and not d.startswith(("build", ".git", "out")))
PATH = re.compile(r"(?<![\w./$-])((?:%s)/[\w./+-]*\w)" % "|".join(re.escape(r) for r in ROOTS))
FILE_END = re.compile(r"\.(h|cpp|cu|cuh|py|md|sh|cmake|txt|json|csv|c|supp|safetensors|bin)$")
C_LIKE = (".h", ".cpp", ".cu", ".cuh", ".c")
HASH_LIKE = (".py", ".sh", ".cmake", ".txt")


def comments(path, text):
    """The comment text of each line of a file, as (line number, text)."""
    if path.endswith(".md"):
        yield from enumerate(text.splitlines(), 1)
        return
    in_block = False
    for n, line in enumerate(text.splitlines(), 1):
        if path.endswith(C_LIKE):
            if in_block:
                end = line.find("*/")
                yield n, line if end < 0 else line[:end]
                in_block = end < 0
                continue
            i, j = line.find("//"), line.find("/*")
            if i >= 0 and (j < 0 or i < j):
                yield n, line[i:]
            elif j >= 0:
                end = line.find("*/", j)
                yield n, line[j:] if end < 0 else line[j:end]
                in_block = end < 0
        elif path.endswith(HASH_LIKE) or os.path.basename(path) in ("Makefile", "run"):
            i = line.find("#")
            if i >= 0:
                yield n, line[i:]


def main():
    files = subprocess.run(["git", "ls-files"], cwd=TOP, capture_output=True, text=True,
                           check=True).stdout.split()
    stale = []
    for f in files:
        if f.startswith(("tests/data/", "docs/data/")) or not (
                f.endswith(C_LIKE + HASH_LIKE + (".md",)) or f in ("Makefile", ".ci/run")):
            continue
        with open(os.path.join(TOP, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for n, comment in comments(f, text):
            for m in PATH.finditer(comment):
                p = m.group(1).rstrip(".")
                full = os.path.join(TOP, p)
                if not FILE_END.search(p) and not os.path.isdir(full):
                    continue  # a path pattern or a name, not a file ("remat/plan/planners/<name>")
                if not os.path.exists(full):
                    stale.append(f"{f}:{n}: {p} does not exist")
    for s in stale:
        print(s)
    if stale:
        print(f"check-paths: {len(stale)} cited path(s) do not exist", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
