"""The one parser of the docs' code blocks: the MkDocs hook and the extractor both use it.

A C++ block is a fence with attr_list metadata (never a bare key=value header: it breaks
superfences 9.5), and exactly one kind:

    ```{.cpp .program #id}                          whole program with main()
    ```{.cpp .fragment #id context="engine"}        body of a doctest TEST_CASE in snippets/contexts/engine.h
    ```{.cpp .compile-fail #id expect="text"}       must fail to compile, the output containing "text"
    ```{.cpp .no-compile #id reason="why"}          not compiled (counted; the goal is zero)
    ```{.text .output for="id" tolerance="1e-6"}    the expected stdout of block `id` (numbers within
                                                    1e-6 relative; atol="1e-9" adds an absolute bound)

Lines starting with HIDDEN (after indentation) are compiled but hidden on the page; they
may only hold what does not change what the shown code does (includes, declarations of
fixture objects, output plumbing: docs/contributing.md).

What the reader copies is `copy_text(block)`: a program's whole source (hidden lines
included), or for a fragment a complete program made from its context (see `standalone`).
Public headers carry a usage example in the same syntax (`header_blocks`), compiled as
fragments of the page "headers".
"""
import pathlib
import re
import sys
from dataclasses import dataclass, field

import plot  # the output blocks' plot kinds (plot.CHARTS)

HIDDEN = "//~"
CPP_LANGS = {"cpp", "c++", "cxx"}
KINDS = ("program", "fragment", "compile-fail", "no-compile")
REQUIRED = {"fragment": "context", "compile-fail": "expect", "no-compile": "reason"}
OUTPUT_KEYS = {"for", "tolerance", "atol", "plot"}
KNOWN_KEYS = {"context", "expect", "reason", "for", "tolerance", "before", "title"}
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
CONTEXT_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
FENCE_RE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*?)\s*$")
ATTR_RE = re.compile(r"""\.(?P<cls>[\w-]+)|\#(?P<id>[\w-]+)|(?P<key>[\w-]+)=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s}]+))""")
INCLUDE_RE = re.compile(r"""^\s*-{1,}8<-{1,}\s+["']?(?P<path>[^"'\s]+)["']?\s*$""")


@dataclass
class Block:
    page: str            # "docs/getting-started.md"
    line: int            # 1-based line of the opening fence
    indent: str
    lang: str            # first class: "cpp", "text", ...
    classes: list
    id: str
    attrs: dict
    lines: list = field(default_factory=list)  # content, fence indentation removed

    @property
    def first_code_line(self):
        return self.line + 1

    @property
    def is_cpp(self):
        return self.lang in CPP_LANGS

    @property
    def kind(self):
        kinds = [c for c in self.classes if c in KINDS]
        return kinds[0] if len(kinds) == 1 else None

    @property
    def is_output(self):
        return "output" in self.classes

    def compiled_lines(self):
        """What the compiler sees: hidden lines with the marker removed, line for line."""
        return [unhide(l) for l in self.lines]

    def shown_lines(self):
        """What the reader sees by default."""
        return [l for l in self.lines if not is_hidden(l)]

    def hidden_count(self):
        return sum(1 for l in self.lines if is_hidden(l))


def is_hidden(line):
    return line.lstrip().startswith(HIDDEN)


def unhide(line):
    if not is_hidden(line):
        return line
    head = line[: len(line) - len(line.lstrip())]
    rest = line.lstrip()[len(HIDDEN):]
    return head + (rest[1:] if rest.startswith(" ") else rest)


def parse_info(info):
    """Fence info string -> (lang, classes, id, attrs) or None when it is not a code fence."""
    if info.startswith("{") and info.endswith("}"):
        classes, ident, attrs = [], "", {}
        for m in ATTR_RE.finditer(info[1:-1]):
            if m.group("cls"):
                classes.append(m.group("cls"))
            elif m.group("id"):
                ident = m.group("id")
            else:
                attrs[m.group("key")] = next(v for v in (m.group("dq"), m.group("sq"), m.group("bare")) if v is not None)
        return (classes[0] if classes else ""), classes, ident, attrs
    lang = info.split()[0] if info else ""
    return lang, [lang] if lang else [], "", {"_bare_info": info} if "=" in info else {}


def parse_text(text, page):
    """All fenced blocks of one markdown text, in order."""
    blocks, open_block, fence = [], None, None
    for number, raw in enumerate(text.splitlines(), start=1):
        m = FENCE_RE.match(raw)
        if open_block is None:
            if m:
                lang, classes, ident, attrs = parse_info(m.group("info"))
                open_block = Block(page, number, m.group("indent"), lang.lower(), classes, ident, attrs)
                fence = m.group("fence")
            continue
        if m and not m.group("info") and m.group("fence").startswith(fence) and m.group("fence")[0] == fence[0]:
            blocks.append(open_block)
            open_block = None
            continue
        line = raw[len(open_block.indent):] if raw.startswith(open_block.indent) else raw.lstrip()
        open_block.lines.append(line)
    if open_block is not None:
        open_block.attrs["_unclosed"] = "1"
        blocks.append(open_block)
    return blocks


def parse_file(path, root):
    path = pathlib.Path(path)
    return parse_text(path.read_text(encoding="utf-8"), path.resolve().relative_to(root.resolve()).as_posix())


def page_name(page):
    """"docs/guide/x.md" -> "guide-x": the name used in test names and labels."""
    return page[len("docs/"):-len(".md")].replace("/", "-") if page.startswith("docs/") else page[:-3]


def doc_pages(docs_dir):
    return sorted(pathlib.Path(docs_dir).rglob("*.md"))


def check_page(blocks, contexts_dir):
    """Errors of one page's blocks as (block, message)."""
    errors, ids = [], {}
    for b in blocks:
        where = b
        if "_unclosed" in b.attrs:
            errors.append((where, "unclosed fence"))
        if "_bare_info" in b.attrs:
            errors.append((where, "bare key=value in a fence header breaks superfences 9.5: use {.lang key=\"value\"}"))
        if b.is_output:
            if not b.attrs.get("for"):
                errors.append((where, "output block without for=\"BLOCK-ID\""))
            unknown = set(b.attrs) - OUTPUT_KEYS
            if unknown:
                errors.append((where, "unknown output attribute(s) " + ", ".join(sorted(unknown))))
            if b.attrs.get("plot", "lr") not in plot.CHARTS:
                errors.append((where, f"plot={b.attrs['plot']!r}: the plot kinds are "
                                      + " and ".join(f'"{k}"' for k in plot.CHARTS)))
            continue
        if not b.is_cpp:
            continue
        kinds = [c for c in b.classes if c in KINDS]
        if len(kinds) != 1:
            errors.append((where, "C++ block needs exactly one kind of " + ", ".join("." + k for k in KINDS)
                           + " (untested code is not allowed; see docs/contributing.md)"))
            continue
        if not b.id or not ID_RE.match(b.id):
            errors.append((where, "C++ block needs an id like #my-block (lowercase, digits, dashes)"))
        elif b.id in ids:
            errors.append((where, f"duplicate block id #{b.id} (first at line {ids[b.id]})"))
        else:
            ids[b.id] = b.line
        need = REQUIRED.get(b.kind)
        if need and not b.attrs.get(need):
            errors.append((where, f".{b.kind} needs {need}=\"...\""))
        unknown = set(b.attrs) - KNOWN_KEYS
        if unknown:
            errors.append((where, "unknown attribute(s) " + ", ".join(sorted(unknown))))
        ctx = b.attrs.get("context")
        if ctx is not None:
            if not CONTEXT_RE.match(ctx):
                errors.append((where, f"context name {ctx!r} must be a C++ identifier"))
            elif not (pathlib.Path(contexts_dir) / f"{ctx}.h").is_file():
                errors.append((where, f"context {ctx!r}: no file snippets/contexts/{ctx}.h"))
        includes = [l.strip() for l in b.compiled_lines() if CPP_INCLUDE_RE.match(l)]
        if "#include <torch/torch.h>" in includes[1:]:
            errors.append((where, "#include <torch/torch.h> after another include: write it first "
                           "(a reader's GCC uses a precompiled header only for the first include; "
                           "docs/contributing.md, \"What the reader copies\")"))
        for call, count in order_dependent_calls(b.compiled_lines()):
            errors.append((where, f"{call}(...) draws from the random generator in {count} of its "
                           "arguments: C++ leaves their order to the compiler (GCC last to first, "
                           "Clang first to last), so the block prints other numbers under each; "
                           "make them first, in statements (docs/troubleshooting.md, \"Same seed, "
                           "other numbers with another compiler\")"))
    by_id = {b.id: b for b in blocks if b.is_cpp and b.id}
    seen_out = set()
    for b in blocks:
        target = b.attrs.get("for") if b.is_output else None
        if target is not None:
            if target not in by_id or by_id[target].kind in ("compile-fail", "no-compile"):
                errors.append((b, f"output for=\"{target}\": no runnable C++ block with that id on this page"))
            elif target in seen_out:
                errors.append((b, f"second output block for #{target}"))
            seen_out.add(target)
        if b.is_cpp and b.attrs.get("before"):
            other = by_id.get(b.attrs["before"])
            if other is None or other.kind != "program" or b.kind != "program":
                errors.append((b, "before=\"ID\" pairs two .program blocks of the same page"))
    return errors


ROOT = pathlib.Path(__file__).resolve().parent.parent
CONTEXTS = ROOT / "snippets" / "contexts"
CHECKS = ROOT / "snippets" / "standalone_checks.h"
CPP_INCLUDE_RE = re.compile(r"\s*#\s*include\b")
CHECK_RE = re.compile(r"\b(?:CHECK|CHECK_FALSE|CHECK_MESSAGE|CHECK_NOTHROW|CHECK_THROWS_AS|REQUIRE)\s*\(|\bdoctest::")


# NOTE: [evaluation order] The arguments of one call are unsequenced in C++: GCC evaluates
# them last to first, Clang first to last. A block whose call draws from LibTorch's random
# generator in two of its arguments prints other numbers under each compiler, so
# docs:check-blocks refuses it. What counts as a draw: the random factories and
# functional dropouts, the in-place random fills and the random initialisers, and the
# constructors of the layers and samplers that draw (reset_parameters(), randperm). A
# check of the usual forms, not a proof: the operands of a binary operator
# (`randn(...) + randn(...)`), a user's own module that draws, and a call through a
# pointer are not seen.
RNG_CALL_RE = re.compile(
    r"\b(?:torch::)?(?:randn|rand|randint|randperm|randn_like|rand_like|randint_like|normal|"
    r"bernoulli|multinomial|poisson|dropout|dropout2d|dropout3d|alpha_dropout|"
    r"feature_alpha_dropout|rrelu)\s*\("
    r"|\.(?:uniform_|normal_|bernoulli_|random_|exponential_|geometric_|cauchy_|log_normal_)\s*\("
    r"|\binit::(?:uniform_|normal_|xavier_uniform_|xavier_normal_|kaiming_uniform_|"
    r"kaiming_normal_|trunc_normal_|orthogonal_|sparse_)\s*\("
    r"|\b(?:torch::nn::)?(?:Linear|Bilinear|Conv[123]d|ConvTranspose[123]d|Embedding|"
    r"EmbeddingBag|(?:LSTM|GRU|RNN)(?:Cell)?|MultiheadAttention|"
    r"Transformer(?:Encoder|Decoder)?(?:Layer)?|RandomSampler)\s*(?:<[^<>()]*>)?\s*\(")
_CALL_RE = re.compile(r"([A-Za-z_][\w:]*)\s*(?:<[^<>();{}]*>)?\s*\(")
# What cannot hold code: comments, raw and plain strings, character literals (a ' after a
# digit is a digit separator, 1'000).
_SKIP_RE = re.compile(
    r'/\*.*?\*/|//[^\n]*|R"([^()\\\s"]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"'
    r"|(?<![0-9])'(?:\\.|[^'\\\n])+'", re.S)


def order_dependent_calls(lines):
    """(callee, n) for each call in `lines` whose arguments draw from the random generator in
    n >= 2 of them: their order is the compiler's (arguments are unsequenced, unlike the
    elements of a braced list or a declaration's declarators)."""
    code = _SKIP_RE.sub(lambda m: " " * len(m.group(0)), "\n".join(lines))
    found = []
    for m in _CALL_RE.finditer(code):
        if m.group(1) in ("if", "for", "while", "switch", "return", "sizeof"):
            continue
        depth, start, args = 0, m.end(), []
        for i in range(m.end(), len(code)):
            c = code[i]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    args.append(code[start:i])
                    break
                depth -= 1
            elif c == "," and depth == 0:
                args.append(code[start:i])
                start = i + 1
        drawing = sum(1 for a in args if RNG_CALL_RE.search(a))
        if drawing >= 2:
            found.append((m.group(1), drawing))
    return found


def _without_header_comment(path):
    """A file's lines after its leading comment (and `#pragma once`), blank lines trimmed."""
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith("//") or not lines[i].strip()):
        i += 1
    lines = [l for l in lines[i:] if l.strip() != "#pragma once"]
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def _indent(lines, by):
    return [by + l if l.strip() else "" for l in lines]


def standalone(block, contexts_dir=CONTEXTS):
    """The complete program of a fragment (or of a compile-fail block with a context): the
    context file (snippets/contexts/NAME.h) pasted whole, doctest's checks replaced by
    snippets/standalone_checks.h where the block uses them, and the block's code (hidden
    lines included) as the body of `run()` of a struct derived from the context, which is
    how the docs test runs it (doctest's TEST_CASE_FIXTURE), called from main()."""
    ctx = block.attrs["context"]
    code = block.compiled_lines()
    out = [f"// The complete program of block #{block.id} ({block.page}): the code shown there",
           f'// runs in run() below, with the members of the "{ctx}" context it uses.']
    out += _without_header_comment(pathlib.Path(contexts_dir) / f"{ctx}.h")
    if any(CHECK_RE.search(l) for l in code):
        out += ["", "// doctest's checks without doctest: a failed one prints the expression and exits 1."]
        out += _without_header_comment(CHECKS)
    out += ["", f"struct Block : {ctx}_context {{", "  void run() {"] + _indent(code, "    ")
    out += ["  }", "};", "", "int main() {", "  Block().run();", "  return 0;", "}"]
    return "\n".join(out) + "\n"


def copy_text(block, contexts_dir=CONTEXTS):
    """What the copy button of a C++ block copies (and its "complete program" box shows)."""
    if block.kind in ("fragment", "compile-fail") and block.attrs.get("context"):
        return standalone(block, contexts_dir)
    if block.kind == "no-compile":
        return "\n".join(block.shown_lines()) + "\n"
    return "\n".join(block.compiled_lines()) + "\n"


USAGE_RE = re.compile(r"^// Usage (?P<info>\{.*\})(?P<note>.*):\s*$")
HEADERS_PAGE = "headers"  # the page name of the headers' usage examples: docs:headers:<id>


def header_block_id(header):
    """"include/stepwise/cuda/kernels.h" -> "cuda-kernels", "fused_adamw.h" -> "fused-adamw"."""
    rel = pathlib.PurePosixPath(header).as_posix().split("include/stepwise/", 1)[-1]
    return rel[:-2].replace("/", "-").replace("_", "-")


def header_blocks(path, root=ROOT):
    """The usage example atop a public header, as a Block (id: `header_block_id`) of the page
    "headers" (all headers' examples compile in one TU, tests docs:headers:<id>):

        // Usage {.cpp .fragment context="engine"} (optional words):
        //
        //   code, indented three spaces after "//"
        //
    The example ends at the first "//" line that is not followed by more indented code."""
    path = pathlib.Path(path)
    rel = path.resolve().relative_to(pathlib.Path(root).resolve()).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        m = USAGE_RE.match(line)
        if not m:
            continue
        lang, classes, _, attrs = parse_info(m.group("info"))
        block = Block(rel, number, "", lang.lower(), classes, header_block_id(rel), attrs)
        body = lines[number:]
        if body and body[0].strip() == "//":
            body = body[1:]
            block.line += 1
        for i, l in enumerate(body):
            if l.startswith("//   "):
                block.lines.append(l[5:])
            elif l.strip() == "//" and i + 1 < len(body) and body[i + 1].startswith("//   "):
                block.lines.append("")
            else:
                break
        return [block]
    return []


def public_headers(root=ROOT):
    return sorted((pathlib.Path(root) / "include" / "stepwise").rglob("*.h"))


def output_of(blocks, ident):
    return next((b for b in blocks if b.is_output and b.attrs.get("for") == ident), None)


def check_includes(path, docs_dir, root):
    """`--8<-- "file"` lines whose file exists neither beside the docs nor at the repo root."""
    errors = []
    for number, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        m = INCLUDE_RE.match(line)
        if m and not any((base / m.group("path")).is_file() for base in (pathlib.Path(docs_dir), root)):
            errors.append((number, f"included file {m.group('path')!r} does not exist"))
    return errors


README_TESTED_RE = re.compile(r"^<!-- tested: (?P<page>docs/[\w/.-]+\.md)#(?P<id>[a-z0-9-]+) -->$")


def check_readme(readme, root):
    """Each C++ block of the README follows `<!-- tested: docs/PAGE.md#ID -->` and equals the
    shown code of that tested block (GitHub renders the README: no attr_list there)."""
    errors, lines = [], pathlib.Path(readme).read_text(encoding="utf-8").splitlines()
    for b in parse_text("\n".join(lines), "README.md"):
        if not b.is_cpp:
            continue
        m = README_TESTED_RE.match(lines[b.line - 3].strip() if b.line >= 3 else "") or \
            README_TESTED_RE.match(lines[b.line - 2].strip() if b.line >= 2 else "")
        if not m:
            errors.append((b.line, "C++ block without a `<!-- tested: docs/PAGE.md#ID -->` line before it"))
            continue
        page = root / m.group("page")
        target = next((t for t in parse_file(page, root) if t.id == m.group("id")), None) if page.is_file() else None
        if target is None or target.kind not in ("program", "fragment"):
            errors.append((b.line, f"{m.group('page')}#{m.group('id')}: no tested block with that id"))
        elif target.shown_lines() != b.lines:
            errors.append((b.line, f"differs from the code shown at {m.group('page')}#{m.group('id')}: "
                                   "copy it from there"))
    return errors


def main(argv):
    """`blocks.py [DOCS_DIR]`: report every error and the counts of blocks by kind (the
    docs pages, the usage example atop every public header, the README's blocks).
    `blocks.py --json PAGE.md`: the page's blocks as JSON (for the browser test)."""
    root = ROOT
    if len(argv) == 3 and argv[1] == "--json":
        import json
        print(json.dumps([dict(id=b.id, kind=b.kind, lang=b.lang, line=b.line, shown="\n".join(b.shown_lines()),
                               copy=copy_text(b) if b.is_cpp and b.kind else None, attrs=b.attrs)
                          for b in parse_file(argv[2], root)]))
        return 0
    docs_dir = pathlib.Path(argv[1]) if len(argv) > 1 else root / "docs"
    counts, problems, reasons = {k: 0 for k in KINDS}, [], []
    pages = [(path, parse_file(path, root)) for path in doc_pages(docs_dir)]
    for header in public_headers(root):
        blocks = header_blocks(header, root)
        if not blocks:
            problems.append(f"{header.relative_to(root)}:1: error: no usage example in the tested syntax "
                            '`// Usage {.cpp .fragment context="..."}:` (snippets/blocks.py)')
        pages.append((header, blocks))
    for path, blocks in pages:
        for b, msg in check_page(blocks, CONTEXTS):
            problems.append(f"{b.page}:{b.line}: error: {msg}")
        if path.suffix == ".md":
            for number, msg in check_includes(path, docs_dir, root):
                problems.append(f"{path.relative_to(root)}:{number}: error: {msg}")
        for b in blocks:
            if b.is_cpp and b.kind:
                counts[b.kind] += 1
                if b.kind == "no-compile":
                    reasons.append(f"{b.page}:{b.line}: #{b.id} not compiled: {b.attrs.get('reason', '')}")
    for number, msg in check_readme(root / "README.md", root):
        problems.append(f"README.md:{number}: error: {msg}")
    print("\n".join(problems + reasons))
    print("blocks: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
