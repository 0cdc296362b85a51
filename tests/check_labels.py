#!/usr/bin/env python3
"""Checks the labels of a build's tests (the CTest test `test_labels`).

    check_labels.py BUILD_DIR --ctest CTEST --require L,L,... --coming L,... --kinds L,...

Lists every test of BUILD_DIR with its labels (ctest --show-only=json-v1, run
from a scratch directory so that the logs of a ctest run in progress there are
left alone), prints how many tests each label finds, and fails when:
  - a required label finds no test (`ctest -L tcp` must never be empty);
  - a test has no label, or a label that is neither required, coming, nor a
    kind (unit, behaviour, ...): a misspelt label finds nothing;
  - a test whose name mentions shm, tcp or ucx lacks that label (the rule of
    cmake/HixlTestLabels.cmake, so a suite registered without it shows here).
Labels still to come (gpu, vllm, ...) are listed with their count, 0 allowed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

TRANSPORTS = ("shm", "tcp", "ucx")


def list_tests(build_dir, ctest):
    with tempfile.TemporaryDirectory(prefix="hixl-labels-") as scratch:
        with open(os.path.join(scratch, "CTestTestfile.cmake"), "w") as f:
            f.write('subdirs("%s")\n' % os.path.abspath(build_dir))
        out = subprocess.run([ctest, "--show-only=json-v1"], cwd=scratch, check=True,
                             capture_output=True, text=True, timeout=300).stdout
    tests = {}
    for t in json.loads(out)["tests"]:
        labels = []
        for p in t.get("properties", []):
            if p["name"] == "LABELS":
                labels = p["value"]
        tests[t["name"]] = set(labels)
    return tests


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--ctest", default="ctest")
    ap.add_argument("--require", default="")
    ap.add_argument("--coming", default="")
    ap.add_argument("--kinds", default="")
    a = ap.parse_args()
    split = lambda s: [x for x in s.split(",") if x]
    required, coming, kinds = split(a.require), split(a.coming), split(a.kinds)

    tests = list_tests(a.build_dir, a.ctest)
    problems = []
    if not tests:
        problems.append("the build has no tests")
    counts = {}
    for name, labels in tests.items():
        for label in labels:
            counts[label] = counts.get(label, 0) + 1
        if not labels:
            problems.append("no label: %s" % name)
        unknown = labels - set(required) - set(coming) - set(kinds)
        if unknown:
            problems.append("unknown label(s) %s: %s" % (",".join(sorted(unknown)), name))
        lower = name.lower()
        for t in TRANSPORTS:
            if t in lower and t not in labels:
                problems.append("name says %s, label missing: %s" % (t, name))

    print("%-12s %6s" % ("label", "tests"))
    for label in required + coming + sorted(set(counts) - set(required) - set(coming)):
        note = " (reserved for a suite to come)" if label in coming else ""
        print("%-12s %6d%s" % (label, counts.get(label, 0), note))
        if label in required and counts.get(label, 0) == 0:
            problems.append("label %s finds no test" % label)
    print("%-12s %6d" % ("(all)", len(tests)))

    for p in problems[:50]:
        print("FAIL: " + p)
    if len(problems) > 50:
        print("FAIL: ... %d more" % (len(problems) - 50))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
