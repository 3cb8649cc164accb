"""Line plots for output blocks with `plot="lr"`: each output line is `NAME v0 v1 ...`,
drawn as one small SVG chart (x = optimizer steps, y = lr). The values are the block's
verified output, so the plot is drawn from the engine's own scheduler code."""
import html

W, H, PAD = 300, 140, 28


def _chart(name, values):
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    n = max(len(values) - 1, 1)
    pts = " ".join(f"{PAD + (W - 2 * PAD) * i / n:.1f},{H - PAD - (H - 2 * PAD) * (v - lo) / span:.1f}"
                   for i, v in enumerate(values))
    label = html.escape(name)
    return (f'<svg class="sw-plot" role="img" aria-label="{label} lr schedule" '
            f'viewBox="0 0 {W} {H}" width="{W}" height="{H}">'
            f'<title>{label}: lr over {len(values)} steps</title>'
            f'<text x="{PAD}" y="16" font-size="12" font-weight="bold">{label}</text>'
            f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#888"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#888"/>'
            f'<text x="{PAD}" y="{H - 8}" font-size="10">0</text>'
            f'<text x="{W - PAD}" y="{H - 8}" font-size="10" text-anchor="end">{len(values) - 1} steps</text>'
            f'<text x="{PAD - 2}" y="{PAD + 4}" font-size="9" text-anchor="end">{hi:.3g}</text>'
            f'<text x="{PAD - 2}" y="{H - PAD}" font-size="9" text-anchor="end">{lo:.3g}</text>'
            f'<polyline fill="none" stroke="#3f51b5" stroke-width="2" points="{pts}"/></svg>')


def lr_charts(lines):
    """One HTML line holding a chart per `NAME v0 v1 ...` line; bad lines are an error."""
    charts = []
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        try:
            values = [float(v) for v in parts[1:]]
        except ValueError as e:
            raise ValueError(f"plot line is not 'NAME numbers...': {line!r}") from e
        if len(values) < 2:
            raise ValueError(f"plot line needs at least two values: {line!r}")
        charts.append(_chart(parts[0], values))
    return '<div class="sw-plots">' + "".join(charts) + "</div>"


COLORS = ("#3f51b5", "#e65100", "#2e7d32", "#ad1457")
CW, CH = 460, 220


def read_curve(path):
    """(x, y) pairs of a csv_monitor file: a `step,<name>` header, then `step,value` rows."""
    rows = []
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines[1:]:
        if line.strip():
            x, y = line.split(",")
            rows.append((float(x), float(y)))
    if len(rows) < 2:
        raise ValueError(f"{path}: a curve needs at least two rows")
    return rows


def curves_chart(title, series):
    """One SVG chart of several (label, [(x, y), ...]) curves on shared axes, with a legend."""
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = lambda x: PAD + 10 + (CW - 2 * PAD - 10) * (x - x0) / ((x1 - x0) or 1.0)
    sy = lambda y: CH - PAD - (CH - 2 * PAD) * (y - y0) / ((y1 - y0) or 1.0)
    label = html.escape(title)
    parts = [f'<svg class="sw-plot" role="img" aria-label="{label}" viewBox="0 0 {CW} {CH}" '
             f'width="{CW}" height="{CH}"><title>{label}</title>',
             f'<text x="{PAD}" y="16" font-size="12" font-weight="bold">{label}</text>',
             f'<line x1="{PAD + 10}" y1="{CH - PAD}" x2="{CW - PAD}" y2="{CH - PAD}" stroke="#888"/>',
             f'<line x1="{PAD + 10}" y1="{PAD}" x2="{PAD + 10}" y2="{CH - PAD}" stroke="#888"/>',
             f'<text x="{PAD + 10}" y="{CH - 8}" font-size="10">{x0:.0f}</text>',
             f'<text x="{CW - PAD}" y="{CH - 8}" font-size="10" text-anchor="end">'
             f'{x1:.0f} samples</text>',
             f'<text x="{PAD + 8}" y="{PAD + 4}" font-size="9" text-anchor="end">{y1:.3g}</text>',
             f'<text x="{PAD + 8}" y="{CH - PAD}" font-size="9" text-anchor="end">{y0:.3g}</text>']
    for k, (name, pts) in enumerate(series):
        color = COLORS[k % len(COLORS)]
        dash = ' stroke-dasharray="5,4"' if k % 2 else ""
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} '
                     f'points="{line}"/>')
        parts.append(f'<text x="{CW - PAD}" y="{PAD + 14 * k}" font-size="11" fill="{color}" '
                     f'text-anchor="end">{html.escape(name)}</text>')
    return "".join(parts) + "</svg>"


def curves_block(title, lines, docs_dir):
    """A `.curves` block: each line `FILE LABEL...` (FILE relative to docs/) is one curve."""
    series = []
    for line in lines:
        if not line.strip():
            continue
        path, _, name = line.strip().partition(" ")
        series.append((name or path, read_curve(docs_dir / path)))
    if not series:
        raise ValueError(f"curves block {title!r} names no file")
    return '<div class="sw-plots">' + curves_chart(title, series) + "</div>"


# The window timeline (`plot="timeline"`): one column per micro-batch of the glossary's
# program output, whose lines are `mb | loss | backward() | boundary | step() | micro |
# global | lr` (a `flush` row: the flush() call). Drawn at build time from the
# verified output, so the picture is what the engine did.
TW, TLEFT, TROW = 72, 100, 26


def _timeline_rows(lines):
    if not lines or [c.strip() for c in lines[0].split("|")][:1] != ["mb"]:
        raise ValueError(f"timeline block must start with its header line `mb | loss | ...`, "
                         f"got {lines[:1]!r}")
    rows = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("|")]
        if not line.strip():
            continue
        if len(cells) != 8:
            raise ValueError(f"timeline line has {len(cells)} cells, not 8: {line!r}")
        rows.append({"mb": cells[0], "loss": cells[1], "returns": cells[2],
                     "boundary": cells[3] == "yes", "stepped": cells[4] == "the step",
                     "micro": cells[5], "global": cells[6], "lr": cells[7]})
    if not rows:
        raise ValueError("timeline block has no rows")
    return rows


def _returned(row):
    """What backward() returned: "loss / N" when the printed values give a whole N (to 1%),
    else the value as printed."""
    if not row["returns"]:
        return "-"
    loss, returned = float(row["loss"]), float(row["returns"])
    if returned > 0:
        n = loss / returned
        if round(n) >= 1 and abs(n - round(n)) <= 0.01 * round(n):
            return f"loss / {round(n)}"
    return row["returns"]


def timeline_chart(lines):
    """One SVG: the micro-batches as columns, grouped into windows, each with what backward()
    returned, what step() did (counted, or the boundary's optimizer and scheduler step), the
    counters and the lr after it. A flush() that stepped ends its window; one with nothing
    pending ends none."""
    rows = _timeline_rows(lines)
    width, height = TLEFT + TW * len(rows) + 8, 58 + TROW * 5
    x = lambda k: TLEFT + TW * k
    parts = [f'<svg class="sw-plot sw-timeline" role="img" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" aria-label="timeline of {len(rows)} calls">'
             f'<title>What the engine did at each micro-batch and at flush()</title>']
    labels = ["backward()", "step()", "micro_steps()", "global_steps()", "lr after"]
    for r, name in enumerate(labels):
        parts.append(f'<text x="{TLEFT - 8}" y="{58 + TROW * r}" font-size="11" '
                     f'text-anchor="end">{name}</text>')

    def bracket(first, last, name):  # a window's bracket over its columns
        x0, x1 = x(first) + 3, x(last) + TW - 3
        parts.append(f'<path d="M{x0},24 v-6 H{x1} v6" fill="none" stroke="#888"/>'
                     f'<text x="{(x0 + x1) / 2:.0f}" y="12" font-size="11" '
                     f'text-anchor="middle">{html.escape(name)}</text>')

    start, window = 0, 1
    for k, row in enumerate(rows):
        flush = row["mb"] == "flush"
        if flush and not row["stepped"]:  # nothing pending: the open window (if any) ends before
            if start < k:
                bracket(start, k - 1, f"window {window}")
                window += 1
            start = k + 1
        elif row["boundary"] or flush or k == len(rows) - 1:
            bracket(start, k, f"window {window}" + (" (flushed)" if flush else ""))
            start, window = k + 1, window + 1
        cx = x(k) + TW / 2
        head = "flush()" if flush else f"mb {html.escape(row['mb'])}"
        parts.append(f'<text x="{cx:.0f}" y="36" font-size="11" font-weight="bold" '
                     f'text-anchor="middle">{head}</text>')
        parts.append(f'<text x="{cx:.0f}" y="58" font-size="10" text-anchor="middle">'
                     f'{html.escape(_returned(row))}</text>')
        if row["stepped"]:
            kind, fill, on, did = "sw-step", "#3f51b5", ' class="sw-on-step"', "opt + sched"
        else:
            kind, fill, on, did = ("sw-none", "#f5f5f5", "", "nothing") if flush else (
                "sw-count", "#e0e0e0", "", "counted")
        parts.append(f'<rect class="{kind}" x="{x(k) + 4}" '
                     f'y="{58 + TROW - 13}" width="{TW - 8}" height="18" rx="3" fill="{fill}"/>'
                     f'<text{on} x="{cx:.0f}" y="{58 + TROW}" font-size="10" '
                     f'text-anchor="middle">{did}</text>')
        for r, key in enumerate(("micro", "global", "lr"), start=2):
            parts.append(f'<text x="{cx:.0f}" y="{58 + TROW * r}" font-size="10" '
                         f'text-anchor="middle">{html.escape(row[key])}</text>')
    parts.append(f'<text x="{TLEFT}" y="{height - 8}" font-size="10">opt + sched: the '
                 f'optimizer step, then the scheduler step (gradients set to none after)</text>')
    return '<div class="sw-plots">' + "".join(parts) + "</svg></div>"


# The output blocks' `plot="KIND"`: what draws each from the block's lines. The MkDocs hook
# draws with it; docs:check-blocks refuses any other kind.
CHARTS = {"lr": lr_charts, "timeline": timeline_chart}
