"""The docs' copies, tested from the reader's side (CTest docs:copies).

    copies_test.py --copies build/artifacts/copies.json --prefix build/install-prefix --work DIR

copies.json is what the browser test copied with each C++ block's copy button on the built
site (tests/browser/site_test.mjs), with the page's output block and tolerance as the HTML
has them. The copies become one consumer project, one target each, whose CMakeLists.txt
has only find_package(stepwise) against the install prefix (`cmake --install`): no include
path of this repository. Every program and fragment copy must build and, run in an
empty folder, as a reader runs it, print what the page shows; every
compile-fail copy must fail to compile with its diagnostic.

NOTE: [first-include PCH] A precompiled header is used only for a copy's first include,
and only when that is <stepwise/stepwise.h> or <torch/torch.h> (or, with Clang, for the
include lines it opens with: NOTE: [leading-includes PCH]): so each copy still gets
only what it includes, and a copy that lacks an include still fails (checked here on every
run, with a copy that uses a LibTorch module stepwise.h does not include).
- With Clang (the default where clang++ is installed: tools/bootstrap installs it), the
  copies compile with clang++ and a copy whose first line of code is `#include <H>` gets
  `-include-pch H.pch`, which is that same include, done before the file; the .pch is built
  with -fpch-instantiate-templates, so the templates LibTorch's headers instantiate are
  instantiated once, in the PCH, not again in every copy. A copy compiles in about a third
  of GCC's time with its .gch (3.6 s against 12.5 s for one, 2.0 s against 9.4 s for an
  empty main). The in-tree docs tests compile the same code with the build's compiler
  (Clang too where it is installed: NOTE: [Clang first]); GCC builds the copies on request
  (--cxx g++, docs/contributing.md).
- With GCC (--cxx g++, or no clang++), GCC's own rule does it: a `name.gch` found where
  `name` would be found is used for an #include that comes before any other token of the
  file. The .gch files sit in an -I folder that holds no headers; -Winvalid-pch says so if
  one is ever not used.

NOTE: [leading-includes PCH] With Clang, the `#include <...>` lines a copy opens with, when
at least BLOCK_PCH_MIN copies open with exactly the same lines in the same order (the
fragments of the "basic" and "engine" contexts: snippets/contexts/), are precompiled once
as a header of those lines, and each such copy gets `-include-pch` of it in place of its
first include's. That is the copy's own first lines, done before the file: it still gets
only what it includes (a second probe, which opens with the most shared block's lines but
one and uses what that one declares, must fail: it gets no block's PCH). A copy of a
fragment compiles in 1.0 s with it against 1.8 s with <stepwise/stepwise.h>'s alone (the
rest of its includes parsed every time).

NOTE: [PCH dependencies] A compile that uses a PCH writes a depfile without the headers
inside it, so ninja alone would not rebuild a copy after an installed header changed, and
the stale object would link against the new library (a crash, not a compile error). So a
.gch is rebuilt when any header it was built from is newer (its own depfile lists them),
and every copy's object depends on the .gch files (OBJECT_DEPENDS).
"""
import argparse
import collections
import concurrent.futures
import hashlib
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

import run_block

CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(stepwise_copies LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
find_package(stepwise REQUIRED)
foreach(id {runnable})
  add_executable(${{id}} ${{id}}.cpp)
  target_link_libraries(${{id}} PRIVATE stepwise::stepwise)
endforeach()
foreach(id {failing})
  add_executable(${{id}} EXCLUDE_FROM_ALL ${{id}}.cpp)
  target_link_libraries(${{id}} PRIVATE stepwise::stepwise)
endforeach()
# see NOTE: [PCH dependencies]
foreach(id {runnable} {failing})
  set_source_files_properties(${{id}}.cpp PROPERTIES OBJECT_DEPENDS "{gchs}")
endforeach()
{include_pch}"""

# What the first-include PCHs hold, and the copy that must still fail with them.
PCH_HEADERS = ["stepwise/stepwise.h", "torch/torch.h"]
MISSING_INCLUDE = {
    "id": "pch-probe-missing-include",
    "copy": "#include <stepwise/stepwise.h>\n\nint main() {\n"
            "  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 1, 3));  // <torch/nn/modules/conv.h>\n"
            "  return conv->weight.numel() == 9 ? 0 : 1;\n}\n",
    "expect": "Conv2d",
}


# How many copies must open with the same include lines for those to get a PCH of their own.
BLOCK_PCH_MIN = 10


def leading_includes(code):
    """The headers of the `#include <header>` lines the copy opens with, in order (comments
    and blank lines among them are allowed, as GCC allows them before a .gch include)."""
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    headers = []
    for line in code.splitlines():
        line = line.split("//", 1)[0].strip()
        if line:
            m = re.fullmatch(r"#\s*include\s*<([^>]+)>", line)
            if not m:
                break
            headers.append(m.group(1))
    return tuple(headers)


def shared_blocks(copies):
    """The leading include lines (two or more) that at least BLOCK_PCH_MIN copies open with,
    each with a short name. see NOTE: [leading-includes PCH]"""
    counts = collections.Counter(leading_includes(c["copy"]) for c in copies)
    blocks = [b for b, n in counts.most_common() if n >= BLOCK_PCH_MIN and len(b) > 1]
    return {b: "block-" + hashlib.sha1("\n".join(b).encode()).hexdigest()[:12] for b in blocks}


def block_probe(block):
    """A copy that opens with `block`'s lines but <torch/optim/schedulers/step_lr.h> and uses
    StepLR: it must fail to compile, so no PCH may hold more than a copy's own lines (a
    block's PCH given to a copy whose lines are a part of it would hide the missing one).
    see NOTE: [leading-includes PCH]"""
    missing = "torch/optim/schedulers/step_lr.h"
    assert missing in block, f"the probe needs {missing} in the shared block: pick another header"
    code = "".join(f"#include <{h}>\n" for h in block if h != missing) + (
        "\nint main() {\n  auto w = torch::zeros({1}, torch::requires_grad());\n"
        "  torch::optim::SGD sgd({w}, 0.1);\n"
        "  torch::optim::StepLR schedule(sgd, 1);  // <torch/optim/schedulers/step_lr.h>\n"
        "  schedule.step();\n}\n")
    name = "pch-probe-block-missing-include"
    return {"id": name, "page": "pch-probe", "target": target(name), "copy": code,
            "expect": "StepLR"}


def pch_path(pch_dir, header, clang):
    return pch_dir / (header + (".pch" if clang else ".gch"))


def block_header(pch_dir, name):
    return pch_dir / "blocks" / f"{name}.h"


def copy_pch(c, pch_dir, clang, blocks):
    """The PCH a copy is compiled with (Clang: its leading block's, else its first include's),
    or None. see NOTE: [first-include PCH], NOTE: [leading-includes PCH]"""
    lead = leading_includes(c["copy"])
    if clang and lead in blocks:
        return pch_path(pch_dir, f"blocks/{blocks[lead]}.h", clang)
    if lead and lead[0] in PCH_HEADERS:
        return pch_path(pch_dir, lead[0], clang)
    return None


def include_pch_lines(copies, pch_dir, clang, blocks):
    """Clang only: `-include-pch` for each copy that has a PCH."""
    if not clang:
        return ""
    lines = []
    for c in copies:
        pch = copy_pch(c, pch_dir, clang, blocks)
        if pch:
            lines.append(f'set_property(SOURCE {c["target"]}.cpp APPEND PROPERTY COMPILE_OPTIONS '
                         f'-include-pch "{pch}")')
    return "\n".join(lines) + "\n"


def write_if_changed(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def target(block_id):
    return "copy_" + block_id.replace("-", "_")


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def linker_flags():
    """GNU gold where binutils has it: it links a copy in 0.12 s where ld.bfd takes 0.84 s,
    and it resolves archives in command-line order as ld.bfd does, so a link that needs
    another library order fails here as it would for the reader (lld would not)."""
    return "-fuse-ld=gold" if shutil.which("ld.gold") else ""


def failed_targets(ninja_output):
    """{target: what its compiler printed} for each target whose build ninja reports as
    FAILED (the lines after "FAILED: CMakeFiles/<target>.dir/..." up to ninja's next line)."""
    errors, current = {}, None
    for line in ninja_output.splitlines():
        m = re.match(r"FAILED: CMakeFiles/(\w+)\.dir/", line)
        if m:
            current = m.group(1)
            errors[current] = ""
        elif re.match(r"\[\d+/\d+\] |ninja: ", line):
            current = None
        elif current:
            errors[current] += line + "\n"
    return errors


def newest_input(depfile, header):
    """The newest mtime of the headers a .gch was built from (its depfile lists them; the
    header alone when there is none). see NOTE: [PCH dependencies]"""
    paths = [header]
    if depfile.exists():
        text = depfile.read_text().replace("\\\n", " ")
        paths += [pathlib.Path(p) for p in text.split(":", 1)[-1].split()]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def build_pchs(build, pch_dir, clang, blocks):
    """Compiles each of PCH_HEADERS to pch_dir/<header>.gch (GCC) or .pch (Clang), and with
    Clang each shared block's header (pch_dir/blocks/<name>.h) beside it, with the consumer
    project's own compile command (compile_commands.json), so the compiler accepts them.
    see NOTE: [first-include PCH], NOTE: [leading-includes PCH]"""
    entries = json.loads((build / "compile_commands.json").read_text())
    args = shlex.split(entries[0]["command"])
    base, skip = [], 0
    for i, a in enumerate(args):  # the command without its source, output and dependency file
        if skip:
            skip -= 1
        elif a in ("-o", "-c", "-MT", "-MF", "-include-pch"):
            skip = 1
        elif a != "-MD":
            base.append(a)
    dirs = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-I", "-isystem")]
    dirs += [a[2:] for a in args if a.startswith("-I") and len(a) > 2]
    procs, failures, sources = [], [], []
    for header in PCH_HEADERS:
        found = [pathlib.Path(d) / header for d in dirs
                 if (pathlib.Path(d) / header).exists() and pathlib.Path(d) != pch_dir]
        if not found:
            failures.append(f"PCH: {header} is in no include folder of the copies' compile command")
            continue
        sources.append((header, found))
    for block, name in blocks.items() if clang else ():
        path = block_header(pch_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_if_changed(path, "".join(f"#include <{h}>\n" for h in block))
        sources.append((f"blocks/{name}.h", [path]))
    for header, found in sources:
        gch = pch_path(pch_dir, header, clang)
        gch.parent.mkdir(parents=True, exist_ok=True)
        depfile = gch.with_name(gch.name + ".d")
        command = base + (["-fpch-instantiate-templates"] if clang else []) + [
            "-x", "c++-header", str(found[0]), "-o", str(gch), "-MD", "-MF", str(depfile)]
        stamp = gch.with_name(gch.name + ".cmd")
        if gch.exists() and stamp.exists() and stamp.read_text() == shlex.join(command) \
                and gch.stat().st_mtime > newest_input(depfile, found[0]):
            continue  # up to date (a rerun): no header it was built from changed
        procs.append((header, gch, stamp, command, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for header, gch, stamp, command, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"PCH: {header} does not compile as a header:\n{out[-3000:]}")
        else:
            stamp.write_text(shlex.join(command))
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--work", required=True)
    # the copies' own code is small: what is tested is that each compiles alone and prints
    # the page's numbers. -O1 compiles LibTorch-heavy code fastest with GCC, -O0 with Clang.
    ap.add_argument("--flags", default=None)
    # Clang where it is installed (its PCH holds the instantiations: see NOTE: [first-include PCH]).
    ap.add_argument("--cxx", default="clang++" if shutil.which("clang++") else "g++")
    ap.add_argument("--jobs", type=int, default=2)
    # Where the copies run: by default an empty folder (WORK/run, made afresh), as a reader
    # runs a copy anywhere, so a copy that needs a file of this repository fails here.
    ap.add_argument("--cwd", default=None)
    args = ap.parse_args()
    clang = "clang" in pathlib.Path(args.cxx).name
    if args.flags is None:
        args.flags = "-O0" if clang else "-O1"
    copies = json.loads(pathlib.Path(args.copies).read_text())
    start, failures, counts, phases = time.time(), [], collections.Counter(), []
    work = pathlib.Path(args.work).resolve()
    if args.cwd is None:
        args.cwd = work / "run"
        shutil.rmtree(args.cwd, ignore_errors=True)
        args.cwd.mkdir(parents=True)
    src, build, pch_dir = work / "project", work / "project" / "build", work / "pch"
    src.mkdir(parents=True, exist_ok=True)
    pch_dir.mkdir(parents=True, exist_ok=True)
    for c in copies:  # one target per copy: "<page>_<id>"
        c["target"] = target(f"{c['page']}-{c['id']}")
    runnable = [c for c in copies if c["kind"] in ("program", "fragment")]
    failing = [c for c in copies if c["kind"] == "compile-fail"]
    counts["not compiled (.no-compile)"] += sum(c["kind"] == "no-compile" for c in copies)
    blocks = shared_blocks(runnable + failing) if clang else {}
    probes = [dict(MISSING_INCLUDE, page="pch-probe", target=target(MISSING_INCLUDE["id"]))]
    if blocks:  # the most shared block but one header, and what that header declares
        probes.append(block_probe(next(iter(blocks))))
    for c in runnable + failing + probes:  # unchanged files keep their time: a rerun rebuilds what changed
        write_if_changed(src / f"{c['target']}.cpp", c["copy"])
    pchs = [pch_path(pch_dir, h, clang) for h in PCH_HEADERS]
    pchs += [pch_path(pch_dir, f"blocks/{name}.h", clang) for name in blocks.values()]
    write_if_changed(src / "CMakeLists.txt", CMAKELISTS.format(
        runnable=" ".join(c["target"] for c in runnable),
        failing=" ".join(c["target"] for c in failing + probes),
        gchs=";".join(str(p) for p in pchs),
        include_pch=include_pch_lines(runnable + failing + probes, pch_dir, clang, blocks)))
    flags = f"{args.flags} -Winvalid-pch" + ("" if clang else f" -I{pch_dir}")
    # A build folder configured for another compiler is made afresh (CMake would stop).
    stamp = work / "compiler"
    if not stamp.exists() or stamp.read_text() != args.cxx:
        shutil.rmtree(build, ignore_errors=True)
    stamp.write_text(args.cxx)
    configure = run(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=",
                     f"-DCMAKE_CXX_COMPILER={args.cxx}",
                     f"-DCMAKE_CXX_FLAGS={flags}", f"-DCMAKE_EXE_LINKER_FLAGS={linker_flags()}",
                     f"-DCMAKE_PREFIX_PATH={pathlib.Path(args.prefix).resolve()}"])
    if configure.returncode != 0:
        print(f"FAIL the consumer project does not configure:\n{configure.stdout}")
        return 1
    phases.append(f"configure {time.time() - start:.0f} s")
    failures += build_pchs(build, pch_dir, clang, blocks)  # they compile side by side
    for block, name in blocks.items():
        users = sum(leading_includes(c["copy"]) == block for c in runnable + failing)
        print(f"ok   {users} copies open with the same {len(block)} includes: {name}.pch", flush=True)
    phases.append(f"PCHs {time.time() - start:.0f} s")
    # One build of every target, the ones that must fail included (-k 0 goes on past them).
    built = run(["cmake", "--build", build, "-j", str(args.jobs), "--target", "all"]
                + [c["target"] for c in failing + probes] + ["--", "-k", "0"])
    if "not used because" in built.stdout:
        failures.append("PCH: a .gch was found but not used (-Winvalid-pch):\n" + built.stdout[-3000:])
    errors = failed_targets(built.stdout)
    phases.append(f"build {time.time() - start:.0f} s")
    # The probes: a copy that opens with <stepwise/stepwise.h> (or with the largest shared
    # block) and uses a LibTorch module it does not include must fail, PCH or not.
    for probe in probes:
        if probe["target"] not in errors or probe["expect"] not in errors[probe["target"]]:
            failures.append(f"PCH: a copy that lacks an include compiled ({probe['id']}: the "
                            "PCH hides it):\n" + errors.get(probe["target"], "it compiled")[-3000:])
        else:
            print(f"ok   a copy that lacks an include still fails to compile with its PCH "
                  f"({probe['id']})", flush=True)
    for c in failing:
        name = f"{c['page']}.html#{c['id']}"
        if c["target"] not in errors or c["expect"] not in errors[c["target"]]:
            failures.append(f"{name}: expected a compile error containing {c['expect']!r}:\n"
                            + errors.get(c["target"], "it compiled")[-3000:])
        else:
            counts["compile-fail copies failing as the page says"] += 1
            print(f"ok   {name}: fails to compile with {c['expect']!r}", flush=True)
    built_ok = []
    for c in runnable:
        if (build / c["target"]).exists():
            built_ok.append(c)
        else:
            failures.append(f"{c['page']}.html#{c['id']}: the copy does not compile on its own:\n"
                            + errors.get(c["target"], built.stdout[-6000:])[-6000:])
    # Each run is mostly loading LibTorch: the copies run side by side, reported in order.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda c: subprocess.run(
            [build / c["target"]], cwd=args.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, timeout=300), built_ok))
    for c, proc in zip(built_ok, results):
        name = f"{c['page']}.html#{c['id']}"
        expected = c["output"] or ""
        if proc.returncode != 0:
            failures.append(f"{name}: the copy exited with status {proc.returncode}:\n{proc.stderr[-3000:]}")
        elif not run_block.same_output(expected, proc.stdout, c["tolerance"], c.get("atol", "")):
            failures.append(f"{name}: the copy printed\n{proc.stdout}\nbut the page shows\n{expected}")
        else:
            counts[f"{c['kind']} copies built and run"] += 1
            print(f"ok   {name}: built alone, printed what the page shows", flush=True)
    phases.append(f"run {time.time() - start:.0f} s")
    for f in failures:
        print("FAIL " + f)
    pages = len({c["page"] for c in copies})
    print(f"\n{len(copies)} copies from the HTML over {pages} pages, built with {args.cxx} {args.flags}, "
          f"in {time.time() - start:.0f} s "
          f"({', '.join(phases)}): " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if len(copies) < 30:
        print("FAIL fewer than 30 copies: did the browser test run?")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
