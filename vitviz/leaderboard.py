"""What an evaluation writes and the app shows of it: the summary's files (summary.json, summary.md, and per model
the summary shipped beside its checkpoint with its curves.png), the leaderboard as Markdown, and the leaderboard of
a bundled model read from its shipped summary."""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np

from . import catalog, render
from .files import png_bytes, safe_name, write_atomic

SUMMARY = "summary.json"      # the summary of one model's evaluation; shipped next to its checkpoint
RANDOM = "random"             # the random map's name in records and summaries


def model_summary(summary: dict, model: str) -> dict:
    """The summary of one model: what is shipped next to its checkpoint."""
    return {**summary, "models": {model: summary["models"][model]}}


def write_summary(out: Path, summary: dict) -> None:
    """An evaluation's summary written into `out`: summary.json and summary.md for all models, and per
    model a folder with its own summary.json (what ships beside a checkpoint) and curves.png."""
    write_atomic(out / SUMMARY, (json.dumps(summary, indent=1) + "\n").encode())
    write_atomic(out / "summary.md", (markdown(summary) + "\n").encode())
    for name in summary["models"]:
        folder = out / safe_name(name)
        write_atomic(folder / SUMMARY, (json.dumps(model_summary(summary, name), indent=1) + "\n").encode())
        write_atomic(folder / "curves.png", png_bytes(plot(summary, name)))


def _cell(result: dict) -> str:
    return f"{result['mean']:.3f} [{result['low']:.3f}, {result['high']:.3f}]"


def markdown(summary: dict) -> str:
    """The leaderboard: per model, every method's mean [95 % interval] per test, and how it compares
    with the random map (the random map's own row last)."""
    tests = summary["tests"]
    data = summary["data"]
    arrow = {"lower": "↓", "higher": "↑"}
    parts = []
    for name, model in summary["models"].items():
        against = ("the true label" if model["score_against"] == "label" else "the unperturbed prediction")
        accuracy = f", accuracy {model['accuracy']:.3f}" if model["accuracy"] is not None else ""
        parts.append(f"**{name}** on {data['images']} images of {Path(data['name']).name}{accuracy}; "
                     f"perturbation tests scored against {against}.\n")
        parts.append("| method | "
                     + " | ".join(f"{t['name']} {t['value']} {arrow[t['better']]}" for t in tests.values())
                     + " | compared with a random map |")
        parts.append("|---" * (len(tests) + 2) + "|")
        for method, results in model["methods"].items():
            if not results:
                continue
            title = "random map" if method == RANDOM else method
            cells = [_cell(results[t]) for t in tests]
            if method == RANDOM:
                note = "(the baseline)"
            else:
                verdicts = {t: results[t]["verdict"] for t in tests}
                worse = [t for t, v in verdicts.items() if v != "better than random"]
                note = ("better on every test" if not worse else
                        "; ".join(f"{v} on {', '.join(t for t in worse if verdicts[t] == v)}"
                                  for v in dict.fromkeys(verdicts[t] for t in worse)))
            parts.append(f"| {title} | " + " | ".join(cells) + f" | {note} |")
        parts.append("")
    if data["skipped"]:
        parts.append(f"{len(data['skipped'])} image(s) skipped: " +
                     "; ".join(f"{s['id']} ({s['reason']})" for s in data["skipped"][:5]))
    return "\n".join(parts).rstrip() + "\n"


def plot(summary: dict, model: str) -> np.ndarray:
    """The mean curves with their 95 % bands, one panel per test, for one model."""
    entry = summary["models"][model]
    panels = {name: {method: results[name]["curve"] for method, results in entry["methods"].items() if results}
              for name in summary["tests"]}
    return render.evaluation_plot(panels, fractions=entry["fractions"],
                                  titles={n: f"{t['title']}: {t['value']}, {t['better']} is better"
                                          for n, t in summary["tests"].items()},
                                  ylabels={n: t["score"] for n, t in summary["tests"].items()},
                                  title=f"{model}: {summary['data']['images']} images")


def shipped_summary_file(name: str) -> Path | None:
    """The summary file shipped next to a bundled model's checkpoint, if there is one."""
    entry = catalog.CATALOG.get(name)
    path = entry.path / SUMMARY if entry is not None and entry.bundled else None
    return path if path is not None and path.is_file() else None


@functools.lru_cache(maxsize=8)
def _drawn_leaderboard(name: str, path: Path, modified: int) -> tuple[str, np.ndarray]:
    """A shipped summary's table and plot, drawn once per version of the file (`modified`: its mtime)."""
    summary = json.loads(path.read_text())
    return markdown(summary), plot(summary, name)


def leaderboard(name: str) -> tuple[str, np.ndarray | None]:
    """What the app shows for a model: its shipped summary's table and plot, or how to make one."""
    path = shipped_summary_file(name)
    if path is not None:
        return _drawn_leaderboard(name, path, path.stat().st_mtime_ns)
    shown = name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/@-]{0,199}", name or "") else "MODEL"
    return (f"**{shown}** has no leaderboard yet. Make one with `python -m vitviz evaluate --models {shown} "
            f"--data DIR --out eval/` (DIR: a folder of images, class sub-folders for labels; an .npz like "
            f"cifar10_jpeg.npz; cifar10, that file where vitviz finds it; or cifar10-test), then put "
            f"`eval/{safe_name(shown)}/{SUMMARY}` beside its checkpoint.\n", None)
