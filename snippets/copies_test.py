"""The docs' copies, tested from the reader's side (CTest docs:copies).

    copies_test.py --copies build/artifacts/copies.json --prefix build/install-prefix --work DIR

copies.json is what the browser test copied with each C++ block's copy button on the built
site (tests/browser/site_test.mjs), with the page's output block and tolerance as the HTML
has them. Each page's copies become one consumer project whose CMakeLists.txt has only
find_package(stepwise) against the install prefix (`cmake --install`): no precompiled
header, no include path of this repository. Every program and fragment copy must build
and, run from the repository's root as the in-tree docs tests are, print what the page
shows; every compile-fail copy must fail to compile with its diagnostic.
"""
import argparse
import collections
import concurrent.futures
import json
import pathlib
import subprocess
import sys
import time

import run_block

CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(stepwise_copies_{name} LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(stepwise REQUIRED)
foreach(id {runnable})
  add_executable(${{id}} ${{id}}.cpp)
  target_link_libraries(${{id}} PRIVATE stepwise::stepwise)
endforeach()
foreach(id {failing})
  add_executable(${{id}} EXCLUDE_FROM_ALL ${{id}}.cpp)
  target_link_libraries(${{id}} PRIVATE stepwise::stepwise)
endforeach()
"""


def write_if_changed(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def target(block_id):
    return "copy_" + block_id.replace("-", "_")


def test_page(page, blocks, work, prefix, flags, cwd):
    """Builds, runs and checks one page's copies; returns (failures, counts, log lines)."""
    failures, counts, log = [], collections.Counter(), []
    runnable = [b for b in blocks if b["kind"] in ("program", "fragment")]
    failing = [b for b in blocks if b["kind"] == "compile-fail"]
    counts["not compiled (.no-compile)"] += sum(b["kind"] == "no-compile" for b in blocks)
    if not runnable and not failing:
        return failures, counts, log
    src, build = work / page, work / page / "build"
    src.mkdir(parents=True, exist_ok=True)
    for b in runnable + failing:  # unchanged files keep their time: a rerun rebuilds what changed
        write_if_changed(src / f"{target(b['id'])}.cpp", b["copy"])
    write_if_changed(src / "CMakeLists.txt", CMAKELISTS.format(
        name=page.replace("-", "_"), runnable=" ".join(target(b["id"]) for b in runnable),
        failing=" ".join(target(b["id"]) for b in failing)))
    configure = subprocess.run(
        ["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=", f"-DCMAKE_CXX_FLAGS={flags}",
         f"-DCMAKE_PREFIX_PATH={prefix}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if configure.returncode != 0:
        return [f"{page}: the consumer project does not configure:\n{configure.stdout}"], counts, log
    built = subprocess.run(["cmake", "--build", build, "-j", "1", "--", "-k", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for b in runnable:
        name = f"{page}.html#{b['id']}"
        exe = build / target(b["id"])
        if not exe.exists():
            failures.append(f"{name}: the copy does not compile on its own:\n" + built.stdout[-6000:])
            continue
        proc = subprocess.run([exe], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=300)
        expected = b["output"] or ""
        if proc.returncode != 0:
            failures.append(f"{name}: the copy exited with status {proc.returncode}:\n{proc.stderr[-3000:]}")
        elif not run_block.same_output(expected, proc.stdout, b["tolerance"], b.get("atol", "")):
            failures.append(f"{name}: the copy printed\n{proc.stdout}\nbut the page shows\n{expected}")
        else:
            counts[f"{b['kind']} copies built and run"] += 1
            log.append(f"ok   {name}: built alone, printed what the page shows")
    for b in failing:
        name = f"{page}.html#{b['id']}"
        proc = subprocess.run(["cmake", "--build", build, "--target", target(b["id"])],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode == 0 or b["expect"] not in proc.stdout:
            failures.append(f"{name}: expected a compile error containing {b['expect']!r}:\n{proc.stdout[-3000:]}")
        else:
            counts["compile-fail copies failing as the page says"] += 1
            log.append(f"ok   {name}: fails to compile with {b['expect']!r}")
    return failures, counts, log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--work", required=True)
    # The copies' own code is small: what is tested is that each compiles alone and prints
    # the page's numbers, and -O1 compiles LibTorch-heavy code fastest here.
    ap.add_argument("--flags", default="-O1")
    ap.add_argument("--jobs", type=int, default=2)
    # Where the copies run, as the in-tree docs tests do: the repository's root (one block
    # reads its own page, docs/config.md).
    ap.add_argument("--cwd", default=str(pathlib.Path(__file__).resolve().parent.parent))
    args = ap.parse_args()
    copies = json.loads(pathlib.Path(args.copies).read_text())
    pages = collections.defaultdict(list)
    for c in copies:
        pages[c["page"]].append(c)
    failures, counts, start = [], collections.Counter(), time.time()
    prefix = str(pathlib.Path(args.prefix).resolve())
    # One consumer project per page; pages build side by side (the biggest first), one
    # compile each, so a page's configure overlaps another's compiles.
    order = sorted(pages, key=lambda p: -len(pages[p]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        jobs = [pool.submit(test_page, p, pages[p], pathlib.Path(args.work), prefix, args.flags,
                            args.cwd) for p in order]
        for job in concurrent.futures.as_completed(jobs):
            f, c, log = job.result()
            failures += f
            counts.update(c)
            print("\n".join(log), flush=True)
    for f in failures:
        print("FAIL " + f)
    print(f"\n{len(copies)} copies from the HTML over {len(pages)} pages in {time.time() - start:.0f} s: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if len(copies) < 30:
        print("FAIL fewer than 30 copies: did the browser test run?")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
