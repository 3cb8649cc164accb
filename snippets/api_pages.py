"""The C++ API reference as pages of the MkDocs site (used by snippets/mkdocs_hook.py).

Doxygen's XML, rendered by Sphinx + Breathe (docs-api/, `tools/docs-check api`), stays the
source of the reference. This module takes the body of each Sphinx page and makes it a page
of the site: the site's theme, navigation and search.

- Pages: api/<page>.html as Sphinx named them (so `api/engine.html#_CPPv4...` anchors stay),
  in the order of docs-api/index.rst's toctree; the Sphinx chrome (sidebar, its own search,
  its h1) is dropped, and links to Sphinx-only pages (genindex, search) are unwrapped.
- Symbols: every entry (`<dt>` of a Breathe `dl.cpp` / `dl.c`) with its qualified name,
  kind, anchor and text. Each one becomes an entry of the site's search index.
- "Used in": under each entry, links to the tested blocks of docs/ (programs and fragments,
  found by snippets/blocks.py, the parser the snippet tests use) whose code uses it, so a
  link can only point at a block the tests compile and run.

    /usr/bin/python3 snippets/api_pages.py API_HTML_DIR   # prints the symbols and their uses
"""
import html
import pathlib
import re
import sys
from dataclasses import dataclass, field

from bs4 import BeautifulSoup

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import blocks as B  # noqa: E402

ROOT = B.ROOT
MAX_LINKS = 8  # "Used in" shows this many links, then a count


@dataclass
class Symbol:
    name: str        # qualified, as a reader writes it: "stepwise::Engine::backward"
    kind: str        # "class", "struct", "function", "var", "enum", "enumerator", "type", "macro"
    page: str        # "engine" (api/engine.html)
    anchor: str      # the <dt>'s id
    signature: str   # the <dt>'s text
    text: str        # the entry's own description (not its members')
    option: bool = False  # a TORCH_ARG option (Doxygen sees `T name_`): set with .name(value)
    uses: list = field(default_factory=list)  # [(page, block id)]

    @property
    def short(self):
        return self.name.split("::")[-1]

    @property
    def title(self):
        """The name without `stepwise::`, as the search shows it."""
        return self.name[len("stepwise::"):] if self.name.startswith("stepwise::") else self.name


@dataclass
class Page:
    name: str      # "engine"
    title: str     # "Engine (stepwise/engine.h)"
    body: str = ""  # HTML, set by render()


def _text(node):
    return re.sub(r"\s+", " ", node.get_text(" ")).strip()


def toctree(api_dir):
    """The pages in index.html's toctree order, index first."""
    soup = BeautifulSoup((api_dir / "index.html").read_text(encoding="utf-8"), "html.parser")
    title = lambda node: re.sub(r"\s+", " ", node.get_text("")).replace("¶", "").strip()  # noqa: E731
    pages = [Page("index", title(soup.find("h1")))]
    for a in soup.select(".toctree-wrapper a.reference.internal"):
        name = a["href"].split("#")[0][: -len(".html")]
        if name not in [p.name for p in pages]:
            pages.append(Page(name, title(a)))
    return pages


def _body(api_dir, page):
    soup = BeautifulSoup((api_dir / f"{page}.html").read_text(encoding="utf-8"), "html.parser")
    body = soup.select_one('div.body[role="main"]') or soup.select_one("div.body")
    if body is None:
        raise ValueError(f"{api_dir / (page + '.html')}: no Sphinx page body (div.body)")
    return soup, body


def _qualified(dt, enclosing):
    """The entry's name (after a `template<...>` line, whose parameters are sig-names too),
    qualified by its prefix or by the class it is declared in."""
    prename, name, after_template = None, None, False
    is_template = any(_text(k) == "template" for k in dt.select(".k")[:1])
    for node in dt.descendants:
        if getattr(node, "name", None) == "br":
            after_template = True
        classes = getattr(node, "get", lambda *_: None)("class") or []
        if is_template and not after_template:
            continue
        if "sig-prename" in classes and prename is None:
            prename = _text(node).replace(" ", "")
        if "sig-name" in classes:
            name = _text(node).replace(" ", "")
            break
    if name is None:
        return None
    if prename is not None:
        return prename + name
    return f"{enclosing}::{name}" if enclosing else name


def symbols_of(body, page):
    """Every entry of one page, outer before inner."""
    out = []
    for dl in body.find_all("dl"):
        classes = dl.get("class") or []
        if len(classes) < 2 or classes[0] not in ("cpp", "c"):
            continue
        kind = classes[1]
        dt = dl.find("dt", recursive=False)
        if dt is None or not dt.get("id"):
            continue
        enclosing = None
        for parent in dl.find_parents("dl"):
            pc = parent.get("class") or []
            if len(pc) >= 2 and pc[0] == "cpp" and pc[1] in ("class", "struct"):
                enclosing = parent.find("dt", recursive=False).get("data-sw-name")
                break
        name = _qualified(dt, enclosing)
        if name is None:
            continue
        dt["data-sw-name"] = name
        signature = _text(dt).replace("¶", "").strip()
        dd = dl.find("dd", recursive=False)
        own = [c for c in (dd.children if dd else []) if getattr(c, "name", None) == "p"]
        option = kind == "var" and name.endswith("_")
        if option:
            name = name[:-1]
        out.append(Symbol(name, kind, page, dt["id"], signature, " ".join(_text(p) for p in own), option))
    return out


def _pattern(sym):
    """How code uses the symbol (by name: the blocks are not type-checked here)."""
    s = re.escape(sym.short)
    if sym.kind in ("class", "struct", "enum", "type", "macro"):
        return re.compile(rf"\b{s}\b")
    if sym.kind == "enumerator":
        return re.compile(rf"::\s*{s}\b")
    if sym.short.startswith("~") or sym.short.startswith("operator"):
        return None
    enclosing = sym.name.split("::")[-2] if sym.name.count("::") >= 1 else ""
    if sym.kind == "function" and sym.short == enclosing:  # a constructor: T(..), T x(..), <T>(..)
        return re.compile(rf"\b{s}(?:\s*[({{]|\s+\w+\s*[({{]|>\s*\()")
    member = sym.name.count("::") >= 2 and enclosing[:1].isupper()
    if sym.kind == "function" or sym.option:
        return re.compile(rf"(?:\.|->|::)\s*{s}\s*\(") if member else re.compile(rf"\b{s}\s*\(")
    return re.compile(rf"(?:\.|->|::)\s*{s}\b")  # a field or a variable


def tested_blocks(docs_dir=ROOT / "docs"):
    """(page name, block id, code) of every program and fragment of docs/ and of the usage
    example atop each public header (page "headers", shown on its API page): what the
    snippet tests compile and run (compile-fail blocks show misuse; no-compile ones are not
    run)."""
    out = []
    pages = [(path, B.parse_file(path, ROOT)) for path in B.doc_pages(docs_dir)]
    pages += [(h, B.header_blocks(h, ROOT)) for h in B.public_headers(ROOT)]
    for path, blocks in pages:
        for b in blocks:
            if b.is_cpp and b.kind in ("program", "fragment") and b.id:
                code = "\n".join(l for l in b.compiled_lines() if not l.lstrip().startswith("//"))
                # a header's example is shown on its API page: api/<header's stem>
                page = (b.page[len("docs/"):-len(".md")] if b.page.startswith("docs/")
                        else "api/" + pathlib.Path(b.page).stem)
                out.append((page, b.id, code))
    return out


def find_uses(symbols, blocks):
    for sym in symbols:
        pattern = _pattern(sym)
        if pattern is None:
            continue
        sym.uses = [(page, ident) for page, ident, code in blocks if pattern.search(code)]


def counted(sym):
    """Whether the symbol counts in the "used by no tested block" figure."""
    return _pattern(sym) is not None


def _used_in(soup, sym):
    p = soup.new_tag("p", attrs={"class": "sw-used-in"})
    if not sym.uses:
        p.append("Used in: no tested block of the guide yet.")
        return p
    p.append("Used in: ")
    for i, (page, ident) in enumerate(sym.uses[:MAX_LINKS]):
        if i:
            p.append(", ")
        a = soup.new_tag("a", href=f"../{page}.html#snippet-{ident}", attrs={"class": "sw-used-in-link"})
        a.string = f"{page}#{ident}"
        p.append(a)
    if len(sym.uses) > MAX_LINKS:
        p.append(f", and {len(sym.uses) - MAX_LINKS} more")
    p.append(" (tested blocks)")
    return p


def render(soup, body, symbols):
    """The page body as the site shows it."""
    by_anchor = {s.anchor: s for s in symbols}
    h1 = body.find("h1")
    if h1 is not None:
        h1.decompose()  # the site's page title replaces it
    for a in body.find_all("a", href=True):
        target = a["href"].split("#")[0]
        if target in ("genindex.html", "search.html", "py-modindex.html") or target.startswith("_sources/"):
            a.unwrap()
    for dt in body.find_all("dt", id=True):
        sym = by_anchor.get(dt["id"])
        del dt["data-sw-name"]
        if sym is None:
            continue
        dd = dt.find_next_sibling("dd")
        if dd is None:
            continue
        extra = [_used_in(soup, sym)] if counted(sym) else []
        if sym.option:
            note = soup.new_tag("p", attrs={"class": "sw-option"})
            note.append(f"An option: set it with .{sym.short}(value), read it with .{sym.short}().")
            extra.insert(0, note)
        first_member = next((c for c in dd.children if getattr(c, "name", None) in ("div", "dl")), None)
        for node in extra:
            if first_member is not None:
                first_member.insert_before(node)
            else:
                dd.append(node)
    # Sphinx's permalinks (a.headerlink) stay: Material styles them like its own.
    return "".join(str(c) for c in body.children)


def build(api_dir):
    """(pages, symbols) of the Sphinx output in `api_dir`, with "Used in" filled in."""
    api_dir = pathlib.Path(api_dir)
    pages = toctree(api_dir)
    # A header's example counts where its header has a page (stepwise.h, which only
    # includes the others, has none).
    site = {f"api/{p.name}" for p in pages}
    blocks = [b for b in tested_blocks() if not b[0].startswith("api/") or b[0] in site]
    all_symbols = []
    for page in pages:
        soup, body = _body(api_dir, page.name)
        symbols = symbols_of(body, page.name)
        find_uses(symbols, blocks)
        page.body = render(soup, body, symbols)
        all_symbols += symbols
    return pages, all_symbols


def search_entries(symbols):
    """Entries for MkDocs' search index: one per symbol, at its anchor."""
    out = []
    for s in symbols:
        words = f"{s.short} {s.title.replace('::', ' ')}"
        out.append({"location": f"api/{s.page}.html#{s.anchor}", "title": s.title,
                    "text": html.escape(f"{words} — {s.signature}. {s.text}")})
    return out


def main(argv):
    pages, symbols = build(argv[1] if len(argv) > 1 else ROOT / "build" / "docs" / "api")
    unused = [s for s in symbols if counted(s) and not s.uses]
    for s in symbols:
        print(f"{s.kind:10} {s.title:60} {len(s.uses):3} uses  api/{s.page}.html#{s.anchor}")
    print(f"{len(pages)} pages, {len(symbols)} symbols, {len(unused)} used by no tested block")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
