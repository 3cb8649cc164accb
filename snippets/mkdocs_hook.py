"""MkDocs hook (mkdocs.yml `hooks:`): renders the docs' code blocks with snippets/blocks.py.

- C++ blocks lose their metadata and hidden `//~` lines. Where what the reader copies
  differs from what is shown (a fragment, or a program with hidden lines), a collapsed
  "Complete program" box below the block shows `blocks.copy_text(block)`, and the block's
  copy button copies that same text (docs/javascripts/copy-program.js).
- Every C++ block carries data-kind (and data-expect for compile-fail); every output block
  data-for and data-tolerance: the reader-side test (tests/browser/site_test.mjs, then
  snippets/copies_test.py) takes the copies and the expected outputs from the built HTML.
- Output blocks get an "Output" caption (and, with `plot="lr"`, an SVG chart per line;
  with `plot="timeline"`, the window timeline: snippets/plot.py); compile-fail and
  no-compile blocks a label; a `{.text .curves title="..."}` block, whose lines are
  `FILE LABEL` (csv_monitor files under docs/), becomes one chart of those loss curves.
- Invalid blocks are logged as warnings, so `mkdocs build --strict` fails on them.
- The C++ API reference (Sphinx + Breathe HTML, built before MkDocs into
  $STEPWISE_API_HTML, default build/docs/api) becomes pages of this site (snippets/
  api_pages.py): api/<header>.html in the nav's "C++ API reference" section, in the site's
  theme, with a "Used in" list of tested blocks under each entry, and every public symbol
  in the site's search index. The count of symbols no tested block uses is printed.
"""
import json
import logging
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import api_pages  # noqa: E402
import blocks as B  # noqa: E402
import plot  # noqa: E402

from mkdocs.structure.files import File  # noqa: E402

log = logging.getLogger("mkdocs.hooks.stepwise")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _fence(block, info, lines):
    fence = "```"
    return [block.indent + fence + info] + [block.indent + l if l else "" for l in lines] + [block.indent + fence]


def _attr(value):
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _render(block):
    """The markdown lines that replace one block."""
    i = block.indent
    if block.is_output:
        info = (f'{{.text .sw-output data-for="{_attr(block.attrs.get("for", ""))}" '
                f'data-tolerance="{_attr(block.attrs.get("tolerance", ""))}" '
                f'data-atol="{_attr(block.attrs.get("atol", ""))}"}}')
        out = [f"{i}Output", f"{i}{{: .sw-output-label }}", ""] + _fence(block, info, block.lines)
        draw = plot.CHARTS.get(block.attrs.get("plot"))  # an unknown kind: the check's warning
        if draw:  # drawn from the verified output, at build time
            out += ["", i + draw(block.lines), ""]
        return out
    if "curves" in block.classes:  # loss curves from committed csv_monitor files
        return [i + plot.curves_block(block.attrs.get("title", ""), block.lines, ROOT / "docs")]
    if not (block.is_cpp and block.kind):
        return None
    extra = f' data-expect="{_attr(block.attrs["expect"])}"' if block.kind == "compile-fail" else ""
    shown = block.shown_lines()
    out = _fence(block, f'{{.cpp #snippet-{block.id} data-kind="{block.kind}"{extra}}}', shown)
    copy = B.copy_text(block).splitlines()
    if copy != shown:
        what = ("the block's code with its context and a main()" if block.kind != "program"
                else f"with {block.hidden_count()} hidden line{'s' if block.hidden_count() > 1 else ''}")
        out += ["", f'{i}??? example sw-complete "Complete program ({what}): what the copy button copies"', ""]
        out += ["    " + l if l else "" for l in _fence(block, "{.cpp .sw-complete-code}", copy)]
    if block.kind == "compile-fail":
        out = [f"{i}Does not compile: the docs test checks that the compiler says "
               f"`` {block.attrs['expect']} ``", f"{i}{{: .sw-label .sw-compile-fail }}", ""] + out
    elif block.kind == "no-compile":
        out = [f"{i}Not compiled: {block.attrs['reason']}", f"{i}{{: .sw-label .sw-no-compile }}", ""] + out
    return out


def on_page_markdown(markdown, page, config, files):
    src = "docs/" + page.file.src_path
    blocks = B.parse_text(markdown, src)
    for b, msg in B.check_page(blocks, ROOT / "snippets" / "contexts"):
        log.warning(f"{b.page}:{b.line}: {msg}")
    lines = markdown.splitlines()
    for b in reversed(blocks):
        rendered = _render(b)
        if rendered is not None:
            lines[b.line - 1: b.line + len(b.lines) + 1] = rendered
    return "\n".join(lines) + "\n"


API_NAV_TITLE = "C++ API reference"
_api = {"pages": [], "symbols": [], "stubs": None}


def _api_dir():
    return pathlib.Path(os.environ.get("STEPWISE_API_HTML", ROOT / "build" / "docs" / "api"))


def _replace_api_nav(nav, section):
    """Puts `section` where the nav names the API reference (api/index.md)."""
    for i, item in enumerate(nav):
        if isinstance(item, dict):
            (title, value), = item.items()
            if value in ("api/index.md", "api/index.html"):
                nav[i] = {title: section}
                return True
            if isinstance(value, list) and _replace_api_nav(value, section):
                return True
    return False


def on_config(config):
    api = _api_dir()
    if not (api / "index.html").is_file():
        log.warning(f"C++ API reference not built ({api}/index.html missing): run tools/docs-check "
                    "or set STEPWISE_API_HTML")
        return config
    pages, symbols = api_pages.build(api)
    _api.update(pages=pages, symbols=symbols)
    # Each API page is a stub Markdown file (its title) whose content on_page_content sets.
    stubs = api.parent / "api-pages"
    for page in pages:
        path = stubs / "api" / f"{page.name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {page.title}\n", encoding="utf-8")
    _api["stubs"] = stubs
    # Nav titles without the header's path: "Engine (stepwise/engine.h)" -> "Engine".
    section = [{("Overview" if p.name == "index" else p.title.split(" (")[0]): f"api/{p.name}.md"}
               for p in pages]
    if not _replace_api_nav(config["nav"], section):
        log.warning("mkdocs.yml's nav has no entry for api/index.md (the C++ API reference)")
    return config


def on_files(files, config):
    if _api["stubs"] is None:
        return files
    for page in _api["pages"]:
        files.append(File(f"api/{page.name}.md", str(_api["stubs"]), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_content(html, page, config, files):
    for p in _api["pages"]:
        if page.file.src_uri == f"api/{p.name}.md":
            return html + f'<div class="sw-api">{p.body}</div>'
    return html


def on_post_build(config):
    symbols = _api["symbols"]
    if not symbols:
        return
    index_path = pathlib.Path(config["site_dir"]) / "search" / "search_index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["docs"] += api_pages.search_entries(symbols)
    index_path.write_text(json.dumps(index), encoding="utf-8")
    counted = [s for s in symbols if api_pages.counted(s)]
    unused = [s for s in counted if not s.uses]
    listing = pathlib.Path(config["site_dir"]).parent / "api-unused.txt"
    listing.write_text("".join(f"{s.title}\n" for s in unused), encoding="utf-8")
    print(f"C++ API reference: {len(symbols)} entries in the search index; {len(counted) - len(unused)} "
          f"of {len(counted)} public symbols link to the tested blocks that use them, "
          f"{len(unused)} are used by none ({listing})", file=sys.stderr)
    # The count may fall, never rise: a new public symbol comes with a tested block that uses
    # it, or lives in src/. The committed ceiling is lowered as the count falls.
    ceiling_file = pathlib.Path(config["config_file_path"]).parent / "docs-api" / "unused-symbols.max"
    ceiling = int(ceiling_file.read_text().split()[0])
    if len(unused) > ceiling:
        raise RuntimeError(
            f"{len(unused)} public symbols are used by no tested block, more than the {ceiling} of "
            f"{ceiling_file.name}: show the new ones in a tested block of the guide, or move them "
            f"out of include/ (the list: {listing})")
    if len(unused) < ceiling:
        print(f"C++ API reference: {len(unused)} unused symbols, below the ceiling of {ceiling}: "
              f"lower docs-api/unused-symbols.max to {len(unused)}", file=sys.stderr)
