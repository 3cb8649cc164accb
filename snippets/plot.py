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
