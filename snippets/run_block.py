"""Runs one extracted docs block as a CTest test (see snippets/CMakeLists.txt).

    run_block.py run [--capture] --actual F --expected F --tolerance R --atol A -- EXE ARGS...
    run_block.py compile-fail --build-dir DIR --target T --expect TEXT
    run_block.py before-after --page docs/x.md --before ID --after ID --before-exe E --after-exe E
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import blocks as B

BEFORE = re.compile(r"//\s*before:")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)")


def same_output(expected, actual, tolerance, atol=""):
    """Exact text, or with a tolerance: the same text between numbers, and each number within
    `tolerance` relative to the expected one (|a - e| <= tol * |e|), or within `atol`
    absolutely (for values near zero; default 0)."""
    if not tolerance and not atol:
        return expected == actual
    rtol, abs_tol = float(tolerance or 0), float(atol or 0)
    if NUMBER.split(expected) != NUMBER.split(actual):
        return False
    exp, act = NUMBER.findall(expected), NUMBER.findall(actual)
    return len(exp) == len(act) and all(
        e == a or abs(float(e) - float(a)) <= max(rtol * abs(float(e)), abs_tol) for e, a in zip(exp, act))


def run(args):
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        capture = pathlib.Path(tmp) / "out.txt"
        env["STEPWISE_SNIPPET_OUTPUT"] = str(capture)
        proc = subprocess.run(args.command, stdout=subprocess.PIPE, env=env, text=True)
        stdout = proc.stdout
        ran = capture.exists()
        actual = capture.read_text() if args.capture and capture.exists() else ("" if args.capture else stdout)
    if args.capture and stdout:
        sys.stdout.write(stdout)  # doctest's own report
    actual_file = pathlib.Path(args.actual)
    actual_file.unlink(missing_ok=True)
    if args.capture and not ran:
        print("the fragment's test case did not run (wrong --test-case filter?)")
        return 1
    if proc.returncode != 0:
        print(f"block exited with status {proc.returncode}; its output:\n{actual}")
        return 1
    actual_file.write_text(actual)  # what tools/docs-update-output copies into the page
    if not args.expected:
        if actual:
            print("the block prints but has no output block after it; add\n"
                  '```{.text .output for="ID"}\n```\nand fill it with tools/docs-update-output. It printed:\n' + actual)
            return 1
        return 0
    expected = pathlib.Path(args.expected).read_text()
    if same_output(expected, actual, args.tolerance, args.atol):
        return 0
    import difflib
    print("output differs from the page's output block (tools/docs-update-output rewrites it):")
    sys.stdout.writelines(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "expected", "actual"))
    return 1


def compile_fail(args):
    """Builds the block's own target (excluded from `all`, as Eigen's ei_add_failtest does)
    and requires the build to fail with the expected text in the compiler's output."""
    proc = subprocess.run(["cmake", "--build", args.build_dir, "--target", args.target],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode == 0:
        print("the block compiled, but it is marked .compile-fail: it must not compile")
        return 1
    if args.expect not in proc.stdout:
        print(f"the block failed to compile, but without the expected text {args.expect!r}:\n{proc.stdout}")
        return 1
    print(f"fails to compile as documented ({args.expect!r})")
    return 0


def kept_or_replaced(before, after):
    """The lines of `before` that `after` neither keeps (the same line, stripped) nor
    names in a `// before:` comment. Blank lines, comments and lone braces are not lines
    of behaviour and are not asked for."""
    after_lines = [l.strip() for l in after.compiled_lines()]
    replaced = {BEFORE.split(l, 1)[1].strip() for l in after_lines if BEFORE.search(l)}
    kept = set(after_lines)
    missing = []
    for offset, line in enumerate(before.compiled_lines()):
        text = line.strip()
        if not text or text.startswith("//") or text.strip("{};") == "":
            continue
        if text not in kept and text not in replaced:
            missing.append((before.first_code_line + offset, text))
    return missing


def before_after(args):
    """Both directions: every `// before: LINE` of the After program is a line of the
    Before program, and every line of the Before program is kept in the After program or
    named there in a `// before:` comment; then both must print the same."""
    root = pathlib.Path(__file__).resolve().parent.parent
    blocks = {b.id: b for b in B.parse_file(root / args.page, root) if b.is_cpp}
    before, after = blocks[args.before], blocks[args.after]
    before_lines = {l.strip() for l in before.compiled_lines()}
    errors, found = [], 0
    for offset, line in enumerate(after.compiled_lines()):
        if BEFORE.search(line):
            found += 1
            old = BEFORE.split(line, 1)[1].strip()
            if old not in before_lines:
                errors.append(f"{args.page}:{after.first_code_line + offset}: '// before: {old}' "
                              f"is not a line of #{args.before}")
    if not found:
        errors.append(f"#{args.after} has no '// before: LINE' comments")
    for line_no, text in kept_or_replaced(before, after):
        errors.append(f"{args.page}:{line_no}: '{text}' of #{args.before} is neither kept in "
                      f"#{args.after} nor named there in a '// before:' comment")
    outs = [subprocess.run([exe], stdout=subprocess.PIPE, text=True, check=True).stdout
            for exe in (args.before_exe, args.after_exe)]
    if outs[0] != outs[1]:
        errors.append(f"#{args.before} and #{args.after} print different results:\n--- {args.before}\n"
                      f"{outs[0]}--- {args.after}\n{outs[1]}")
    print("\n".join(errors) if errors else
          f"{found} replaced lines checked, every line of #{args.before} accounted for; "
          "both programs print the same")
    return 1 if errors else 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("--capture", action="store_true")
    r.add_argument("--actual", required=True)
    r.add_argument("--expected", default="")
    r.add_argument("--tolerance", default="")
    r.add_argument("--atol", default="")
    r.add_argument("command", nargs="+")
    c = sub.add_parser("compile-fail")
    c.add_argument("--build-dir", required=True)
    c.add_argument("--target", required=True)
    c.add_argument("--expect", required=True)
    b = sub.add_parser("before-after")
    for name in ("--page", "--before", "--after", "--before-exe", "--after-exe"):
        b.add_argument(name, required=True)
    args = p.parse_args()
    return {"run": run, "compile-fail": compile_fail, "before-after": before_after}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
