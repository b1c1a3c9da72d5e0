#!/usr/bin/env python3
"""Checks that no doctest case name holds a ';'.

tests/CMakeLists.txt registers each doctest case as its own ctest test (doctest_discover_tests),
and CMake splits a name at ';' (its list separator): such a case becomes several tests that each
name no case, and every one of them fails. Exit status 1 names each offending case.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# TEST_CASE( or TEST_CASE_TEMPLATE( followed by one or more adjacent string literals.
CASE = re.compile(r'\bTEST_CASE(?:_TEMPLATE)?\s*\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def main():
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.cpp")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in CASE.finditer(text):
            name = "".join(LITERAL.findall(m.group(1)))
            if ";" in name:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(ROOT)}:{line}: test case name holds ';': {name}")
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print("check-test-names: ctest splits names at ';'; use ',' instead", file=sys.stderr)
        return 1
    print("check-test-names: no doctest case name holds ';'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
