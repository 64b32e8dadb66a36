"""Writing results: markdown tables, number formats, the .md/.json/.png files, plot axes."""
import json
import os
from typing import Dict, List, Optional


def md_table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_ms(seconds: Optional[float]) -> str:
    if seconds is None or seconds != seconds:
        return "–"
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.3f} ms"


def fmt_x(ratio: Optional[float]) -> str:
    return "–" if ratio is None or ratio != ratio else f"{ratio:.2f}x"


def fmt_mb(mb: Optional[float]) -> str:
    return "–" if mb is None or mb != mb else f"{mb:.0f} MB" if mb >= 10 else f"{mb:.1f} MB"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def write_outputs(out_dir: str, name: str, markdown: str, data: Dict, figure=None):
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    paths["md"] = os.path.join(out_dir, f"{name}.md")
    with open(paths["md"], "w") as f:
        f.write(markdown.rstrip() + "\n")
    paths["json"] = os.path.join(out_dir, f"{name}.json")
    with open(paths["json"], "w") as f:
        json.dump(data, f, indent=1, default=float)
    if figure is not None:
        paths["png"] = os.path.join(out_dir, f"{name}.png")
        figure.savefig(paths["png"], dpi=110, bbox_inches="tight")
    print("wrote " + ", ".join(paths.values()))
    return paths


def log_axes(ax, xlabel: str, ylabel: Optional[str] = None, logy: bool = True):
    """The benchmark plots' axes: lengths / positions on a log2 x axis, a grid, and (by default) log y."""
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def curve_axes(ax, runs: Dict[str, Dict], title: str):
    """The validation curves (``run["curve"]``: [(update, value)]) of several training runs on one axes."""
    for name, run in runs.items():
        if run.get("curve"):
            ax.plot(*zip(*run["curve"]), marker="o", ms=3, label=name)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("updates")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def titled(fig, what: str, data: Dict):
    """The figure, titled with what it shows and the machine it was measured on."""
    fig.suptitle(f"{what}, {data['machine']['cpu']}, {data['machine']['threads']} threads", fontsize=10)
    right = 0.89 if fig.legends else 1  # a figure-level legend sits beside the panels
    fig.tight_layout(rect=(0, 0, right, 0.93))  # after the title, so that the panels leave room for it
    return fig


def pyplot():
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def profile_section(profiles: Optional[Dict[str, Dict]], n: int, what: str) -> List[str]:
    """Markdown lines: where the time of ``what`` goes at length ``n`` (:func:`.measure.profile_call`)."""
    if not profiles:
        return []
    return ["", f"Where the time goes at n={n} (torch.profiler, {what}, self CPU time):", "", *profile_markdown(profiles)]


def profile_markdown(profiles: Dict[str, Dict]) -> List[str]:
    lines = []
    for name, prof in profiles.items():
        lines += [f"`{name}`: {prof['wall_ms']:.0f} ms wall under the profiler", ""]
        lines.append(md_table(["op", "input shapes", "calls", "self ms", "%"], [
            [e["op"], f"`{e['shapes']}`", e["calls"], f"{e['self_ms']:.1f}", f"{e['percent']:.1f}"]
            for e in prof["top"]]))
        lines.append("")
    return lines
