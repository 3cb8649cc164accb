"""Rewrites the expected-output blocks of docs/*.md from the last test run (update mode).

    update_outputs.py BUILD_DIR [PAGE...]      (run by tools/docs-update-output)

For every runnable block whose last run passed its own checks and wrote
BUILD_DIR/snippets/extracted/<page>/<id>.actual: replace the text of its
```{.text .output for="id"} block, or insert one right after the block if it printed
something and has none yet.
"""
import pathlib
import sys

import blocks as B


def update_page(path, extracted, root):
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    page_blocks = B.parse_file(path, root)
    page = B.page_name(page_blocks[0].page) if page_blocks else ""
    changed = []
    for b in reversed([b for b in page_blocks if b.is_cpp and b.kind in ("program", "fragment")]):
        actual_file = extracted / page / f"{b.id}.actual"
        if not actual_file.exists():
            continue
        actual = actual_file.read_text().splitlines()
        out = B.output_of(page_blocks, b.id)
        ind = (out or b).indent
        new = [ind + l if l else "" for l in actual]
        if out is not None:
            first = out.line  # index of the first content line (0-based == fence line number)
            if lines[first:first + len(out.lines)] != new:
                lines[first:first + len(out.lines)] = new
                changed.append(b.id)
        elif actual:
            end = b.line + len(b.lines)  # 0-based index of the closing fence
            lines[end + 1:end + 1] = ["", f'{ind}```{{.text .output for="{b.id}"}}'] + new + [f"{ind}```"]
            changed.append(b.id)
    if changed:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{path.relative_to(root)}: updated output of " + ", ".join(f"#{i}" for i in reversed(changed)))


def main(argv):
    root = pathlib.Path(__file__).resolve().parent.parent
    extracted = pathlib.Path(argv[1]).resolve() / "snippets" / "extracted"
    wanted = set(argv[2:])
    for path in B.doc_pages(root / "docs"):
        if not wanted or B.page_name(path.relative_to(root).as_posix()) in wanted:
            update_page(path, extracted, root)


if __name__ == "__main__":
    main(sys.argv)
