"""Attention in motion: a video through two models, frame by frame, written as one side-by-side video.

    python -m vitviz video clip.mp4 --models vit-base cvt-13 --methods rollout chefer --fps 8 --out runs/

Reading (`frames.py`): frames sampled at `fps`, upright, decoded small, one at a time. Nothing is held whole:
frames are read, sent through the models `batch_size` at a time, drawn, encoded and dropped; only the small token
maps and the predictions are kept, for the arrays and the stability numbers.

Per frame, each model gets what a photo gets (`session.explain_image`): its predictions and the chosen
methods' maps, a targeted method explaining that frame's top class. The video shows each model's first
method over the frame with its top class and probability; where that method reads attention and the model
has none (a CNN), the model's first-screen map instead, Grad-CAM, and the caption says so (`drawn_method`).
A model without a classifier shows instead DINO's display of its last layer: the class token's attention
(head mean) with the smallest set of tokens holding 60 % of it outlined (`explain.mass_threshold`).

Stability. Per model, the mean Spearman rank correlation of consecutive frames' maps (1: steady; lower:
the explanation flickers), and per frame the two models' agreement, the rank correlation of the maps they
drew over the image region both saw (the first screen's comparison line, `session.agreement`). `smoothing` w
replaces each map by an exponential moving average m_t = w m_(t-1) + (1 - w) x_t before it is drawn,
saved and measured; off (0) by default, and the manifest says when it is on.

Writing. One H.264 MP4 (yuv420p, even sides, `+faststart` so a browser plays it while it loads) of the
two panels side by side at the sampling rate; per model `<model>/<method>.npy` (frames gh gw) for each
method it computed (those asked that apply to it, and the one it drew) and `predictions.json` (per frame:
time, top 5); `timeline.png` (each model's top-1 probability over time, shaded where the two disagree, and
their agreement); and `manifest.json` (source, frames and their times, models, methods, the method each
model drew, stability).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from . import __version__, explain, render
from .agreement import agreement, spearman
from .export import model_entry
from .files import npy_bytes, png_bytes, safe_name, write_atomic
from .frames import DEFAULT_FPS, Frame, VideoError, VideoInfo, probe, read_frames
from .gate import MODEL_GATE
from .models.trace import Embedding
from .session import MapRequest, autocast, class_map, overview_method

APP_MAX_SECONDS, APP_MAX_FRAMES = 30.0, 300   # what the app takes of a video (the CLI takes all of it)
APP_MAX_BYTES = 300_000_000                    # the app's uploads: a 30 s 4K phone clip is about 200 MB
VIDEO_FILE, TIMELINE_FILE, MANIFEST_FILE, PREDICTIONS_FILE = ("side-by-side.mp4", "timeline.png", "manifest.json",
                                                              "predictions.json")
DINO_MASS = explain.DEFAULT_MASS
# the captions' text, times a view's: the two panels side by side play in a phone's 360 px at a quarter to half of
# their size, where a view's text would be 2 to 4 px tall
CAPTION_SCALE = 2.0
Progress = Callable[[int, int | None], None]   # (frames done, frames in all when known)


# ---- the models on a batch of frames -------------------------------------------------------------------------

@dataclass
class FrameReading:
    """One model on one frame, as plain data (it crosses from the app's GPU functions): its top 5 (index, prob),
    each method's map (gh gw float32), and for a model without a classifier its DINO display map."""
    top: list[tuple[int, float]]
    maps: dict[str, np.ndarray]
    heads: np.ndarray | None = None   # gh gw: the last layer's class-token attention, head mean (no classifier)


@dataclass
class BatchReading:
    """One model on a batch of frames: each frame's reading, the method its half of the video draws
    (`drawn_method`), and the geometry the drawing needs (its token embeddings for these pixels, the last block's
    stage, whether it attends)."""
    frames: list[FrameReading]
    drawn: str | None
    embeddings: list[Embedding]
    last_stage: int
    attends: bool


def drawn_method(methods: Sequence[str], *, attends: bool) -> str | None:
    """The map a model's half of the video draws: the first of `methods`, or, where that one reads attention and
    the model has none (a convolutional network), the map the model's first screen shows
    (`session.overview_method`: Grad-CAM), so neither half is ever left without a map. None when no method is asked."""
    if not methods:
        return None
    first = explain.method(methods[0])
    return first.name if attends or not first.reads_attention else overview_method(attends=attends)


def read_batch(loaded, pixels: torch.Tensor, methods: Sequence[str]) -> BatchReading:
    """`loaded` on b 3 h w pixels: each frame's top 5 and the maps of `methods` and of the method it draws
    (`drawn_method`), as `ModelRun.token_map` computes them for a photo (a targeted method explains each frame's
    top class; a model without a classifier, the similarity of its pooled output to its own direction). Methods
    that read attention are skipped for a model without it."""
    pixels = pixels.to(loaded.device)
    with MODEL_GATE(), torch.inference_mode(), autocast(pixels.device):
        trace = loaded.model.trace(pixels)
    probs = trace.logits.float().softmax(dim=-1)
    readings = []
    for i in range(len(pixels)):
        top = [(int(k), float(p)) for p, k in zip(*probs[i].topk(min(5, probs.shape[-1])))] if probs.shape[-1] else []
        readings.append(FrameReading(top=top, maps={}))
    attends = trace.blocks[-1].attends
    drawn = drawn_method(methods, attends=attends)
    for method in dict.fromkeys([*methods, *([drawn] if drawn else [])]):
        m = explain.method(method)
        if m.reads_attention and not attends:
            continue
        if not m.targeted:
            for reading, values in zip(readings, m.from_trace(trace)):
                reading.maps[method] = values.float().cpu().numpy()
            continue
        for i, reading in enumerate(readings):   # one image at a time, as a photo's map is computed
            direction = None if reading.top else trace.pooled[i].detach().float().cpu()
            request = MapRequest(method, reading.top[0][0] if reading.top else 0, direction, {})
            reading.maps[method] = class_map(loaded.model, pixels[i:i + 1], request)
    if not trace.has_classifier and attends and "cls" in trace.blocks[-1].prefix_kinds:
        heads = explain.head_attention(trace, layer=-1, query="cls", on_query_grid=True).mean(dim=1)
        for reading, values in zip(readings, heads):
            reading.heads = values.float().cpu().numpy()
    return BatchReading(readings, drawn, trace.embeddings, trace.blocks[-1].stage, attends)


def frame_saver(folder: Path, quality: int = 90) -> Callable[[Frame], None]:
    """Keep each sampled frame as a JPEG in `folder` (frame-0000.jpg, ...), so one can be explained later (the app's
    frame slider) without decoding the video again."""
    folder.mkdir(parents=True, exist_ok=True)
    return lambda frame: frame.image.save(folder / f"frame-{frame.index:04d}.jpg", quality=quality)


# ---- drawing and encoding -----------------------------------------------------------------------------------

def panel(canvas: render.Canvas, loaded, reading: FrameReading, batch: BatchReading, asked: str | None, *,
          time: float) -> np.ndarray:
    """One model's picture of one frame: the map it draws (`batch.drawn`: the first method `asked`, or Grad-CAM in
    its place for a model without attention, which the caption then says; a model without a classifier: DINO's
    display) over the frame, captioned with the method, its top class and probability."""
    note, large = f"{time:.2f} s", dict(text_scale=CAPTION_SCALE)
    if reading.heads is not None:
        mask = explain.mass_threshold(torch.from_numpy(reading.heads), DINO_MASS).numpy()
        view = render.head_tile(canvas, reading.heads, field=batch.last_stage, mask=mask, style="outline")
        return render.caption(view, model=loaded.name, method=f"class-token attention, {DINO_MASS:.0%} of it "
                                                              f"outlined", note=note, **large)
    if batch.drawn is None:
        return render.caption(render.notice(canvas, "no method asked for"), model=loaded.name, method="no map",
                              note=note, **large)
    title = explain.method(batch.drawn).title
    if batch.drawn != asked:
        note += f"; no attention, so {title}, not {explain.method(asked).title}"
    view = render.overlay(canvas, reading.maps[batch.drawn])
    target = f"{loaded.labels[reading.top[0][0]]} {reading.top[0][1]:.0%}" if reading.top else None
    return render.caption(view, model=loaded.name, method=title, target=target, note=note, **large)


def side_by_side(panels: Sequence[np.ndarray]) -> np.ndarray:
    """The panels in one row, padded to the tallest and to even sides (yuv420p needs them)."""
    height = max(p.shape[0] for p in panels)
    padded = [np.pad(p, ((0, height - p.shape[0]), (0, 0), (0, 0)), constant_values=24) for p in panels]
    row = np.concatenate(padded, axis=1)
    return np.pad(row, ((0, row.shape[0] % 2), (0, row.shape[1] % 2), (0, 0)), constant_values=24)


class VideoWriter:
    """An H.264 MP4 written frame by frame (yuv420p, `+faststart`), its size set by the first frame, under a
    temporary name until it is complete."""

    def __init__(self, path: Path, fps: float):
        import av

        self.path, self.fps = Path(path), fps
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.stem}.tmp.mp4")
        self.container = av.open(str(self.tmp), "w", format="mp4", options={"movflags": "+faststart"})
        self.stream = None
        self.frames = 0

    def write(self, image: np.ndarray) -> None:
        import av

        if self.stream is None:
            self.stream = self.container.add_stream("libx264", rate=Fraction(self.fps).limit_denominator(1000))
            self.stream.width, self.stream.height = image.shape[1], image.shape[0]
            self.stream.pix_fmt = "yuv420p"
            self.stream.options = {"crf": "23", "preset": "veryfast"}
        if image.shape[:2] != (self.stream.height, self.stream.width):   # every frame the first one's size
            image = np.asarray(Image.fromarray(image).resize((self.stream.width, self.stream.height)))
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        for packet in self.stream.encode(frame):
            self.container.mux(packet)
        self.frames += 1

    def close(self) -> Path:
        if self.stream is not None:
            for packet in self.stream.encode():
                self.container.mux(packet)
        self.container.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        try:
            self.container.close()
        finally:
            self.tmp.unlink(missing_ok=True)


# ---- stability and the timeline ---------------------------------------------------------------------------------

def steadiness(maps: Sequence[np.ndarray]) -> float | None:
    """The mean Spearman correlation of consecutive frames' maps; None for fewer than 2 frames."""
    values = [spearman(a.ravel(), b.ravel()) for a, b in zip(maps[:-1], maps[1:])]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def timeline_plot(times: Sequence[float], top1: dict[str, Sequence[float]], labels: dict[str, Sequence[str]],
                  agreements: Sequence[float | None]) -> np.ndarray:
    """Each model's top-1 probability over time, shaded where the two models' top classes differ; below, the two
    models' agreement (rank correlation of their maps) per frame."""
    from matplotlib.figure import Figure

    from .render.plots import PLOT_COLOURS, figure_to_rgb

    fig = Figure(figsize=(6.4, 3.4), dpi=125, layout="constrained")   # 800 x 425 px, its text readable at half that
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    t = np.asarray(times, dtype=float)
    for k, (name, probs) in enumerate(top1.items()):
        top.plot(t, probs, lw=2, color=PLOT_COLOURS[k % len(PLOT_COLOURS)], label=name)
    names = list(labels)
    if len(names) == 2 and all(labels.values()):
        differ = np.array([a != b for a, b in zip(labels[names[0]], labels[names[1]])])
        half = (t[1] - t[0]) / 2 if len(t) > 1 else 0.5
        for i in np.flatnonzero(differ):
            top.axvspan(t[i] - half, t[i] + half, color="0.85", lw=0)
        if differ.any():
            top.plot([], [], color="0.85", lw=6, label="top classes differ")
    top.set_ylim(0, 1.02)
    top.set_ylabel("top-1 probability")
    top.grid(alpha=0.3)
    if top1:
        top.legend(fontsize=8, loc="lower left")
    agree = np.array([np.nan if v is None else v for v in agreements], dtype=float)
    bottom.plot(t, agree, color="0.3", lw=1.5)
    bottom.set_ylim(-1, 1)
    bottom.axhline(0, color="0.7", lw=1)
    bottom.set_ylabel("maps agree (ρ)")
    bottom.set_xlabel("time (s)")
    bottom.grid(alpha=0.3)
    return figure_to_rgb(fig)


# ---- the whole video ---------------------------------------------------------------------------------------------

Read = Callable[[Sequence, list[torch.Tensor], list[str]], list[BatchReading]]


@dataclass
class VideoResult:
    """What a video run wrote: its folder, the MP4, the timeline picture (h w 3 uint8) and the manifest, which
    holds what was measured over time."""
    folder: Path
    video: Path
    timeline: np.ndarray
    manifest: dict

    @property
    def stability(self) -> dict:
        return self.manifest["stability"]

    @property
    def drawn(self) -> dict[str, str | None]:
        """Each model's method in the video, by model name (`drawn_method`)."""
        return self.manifest["drawn"]

    def fallbacks(self) -> list[str]:
        """For each model that drew another method than the first asked (a model without attention), what it drew
        instead and why, in words."""
        asked = self.manifest["methods"][0] if self.manifest["methods"] else None
        return [f"{name} has no attention, so its half of the video shows {explain.method(method).title} (as its "
                f"first screen does) in place of {explain.method(asked).title}; its steadiness and the agreement are "
                f"measured on that map." for name, method in self.drawn.items() if method != asked]


def explain_video(path: str | os.PathLike, models: Sequence, *, methods: Sequence[str] = ("rollout",),
                  out: str | os.PathLike, fps: float = DEFAULT_FPS, smoothing: float = 0.0, batch_size: int = 8,
                  max_seconds: float | None = None, max_frames: int | None = None, read: Read | None = None,
                  progress: Progress | None = None, keep: Callable[[Frame], None] | None = None) -> VideoResult:
    """The video at `path` through `models` (`LoadedModel`s or their cards, one or two), frame by frame, into the
    folder `out` (what is written: the module docstring). `read(models, pixels, methods)` runs the models on a
    batch (default: here, `read_batch`; the app passes its GPU function); `progress(done, total)` hears each
    batch (total None when the container does not say how long it is); `keep(frame)` hears every sampled frame."""
    for method in methods:
        explain.method(method)
    if not 0.0 <= smoothing < 1.0:
        raise VideoError(f"The smoothing weight must be in [0, 1) (0: off), not {smoothing!r}.")
    if batch_size < 1:
        raise VideoError(f"The batch size must be at least 1, not {batch_size}.")
    out = Path(out)
    info = probe(path)
    resize = max(max(m.transform.resize) if isinstance(m.transform.resize, tuple) else m.transform.resize
                 for m in models)
    total = _expected_frames(info, fps, max_seconds, max_frames)
    read = read or (lambda ms, pixels, asked: [read_batch(m, p, asked) for m, p in zip(ms, pixels)])
    writer = VideoWriter(out / VIDEO_FILE, fps=min(fps, info.rate or fps))   # a slower source plays at its own rate
    maps: dict[tuple[int, str], list[np.ndarray]] = {}   # (model, method): each frame's map, in the order computed
    drawn: dict[int, str | None] = {}                    # model: the method its half draws
    predictions = [[] for _ in models]
    times, agreements, previous = [], [], {}
    first = methods[0] if methods else None
    batch: list[Frame] = []

    def flush() -> None:
        pixels = [torch.cat([m.transform(f.image) for f in batch]) for m in models]   # CPU: cards have no device
        readings = read(models, pixels, list(methods))
        for i, frame in enumerate(batch):
            canvases = []
            for k, (model, reading) in enumerate(zip(models, readings)):
                frame_reading = reading.frames[i]
                for method in list(frame_reading.maps):
                    if smoothing and (k, method) in previous:
                        frame_reading.maps[method] = (smoothing * previous[(k, method)]
                                                      + (1 - smoothing) * frame_reading.maps[method])
                    previous[(k, method)] = frame_reading.maps[method]
                    maps.setdefault((k, method), []).append(frame_reading.maps[method])
                drawn[k] = reading.drawn
                predictions[k].append({"time": frame.time, "top5": [
                    {"index": c, "label": model.labels[c], "prob": round(p, 6)} for c, p in frame_reading.top]})
                canvases.append(render.Canvas(frame.image, model.transform, reading.embeddings))
            writer.write(side_by_side([panel(canvas, model, reading.frames[i], reading, first, time=frame.time)
                                       for canvas, model, reading in zip(canvases, models, readings)]))
            times.append(frame.time)
            both = [reading.frames[i].maps.get(reading.drawn) for reading in readings]   # what each half shows
            agreements.append(agreement(*canvases, *both) if len(both) == 2 and all(m is not None for m in both)
                              else None)
        if progress is not None:
            progress(len(times), total)
        batch.clear()

    try:
        for frame in read_frames(path, fps=fps, resize=resize, max_seconds=max_seconds, max_frames=max_frames):
            if keep is not None:
                keep(frame)
            batch.append(frame)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
        video = writer.close()
    except BaseException:
        writer.abort()
        raise
    return _write_outputs(out, Path(path), info, models, methods, drawn, fps, smoothing, times, maps, predictions,
                          agreements, video, cut=(max_seconds, max_frames))


def _expected_frames(info: VideoInfo, fps: float, max_seconds: float | None, max_frames: int | None) -> int | None:
    """About how many frames sampling keeps (for a progress bar), None where the container gives no duration."""
    if not info.duration:
        return None
    seconds = min(info.duration, max_seconds or info.duration)
    frames = int(math.ceil(seconds * min(fps, info.rate or fps)))
    return min(frames, max_frames) if max_frames else frames


def _write_outputs(out: Path, path: Path, info: VideoInfo, models, methods, drawn, fps, smoothing, times, maps,
                   predictions, agreements, video: Path, *, cut) -> VideoResult:
    """The arrays, predictions, timeline and manifest beside the video; the stability numbers."""
    stability = {"consecutive_frames_spearman": {}, "agreement": {
        "per_frame": [None if a is None else round(a, 6) for a in agreements],
        "mean": None if not [a for a in agreements if a is not None] else
        round(float(np.mean([a for a in agreements if a is not None])), 6)},
        "smoothing": smoothing or None}
    files = {}
    for k, model in enumerate(models):
        folder = safe_name(model.name)
        steady = {}
        for method in [method for j, method in maps if j == k]:   # those asked that apply, and what it drew
            stack = np.stack(maps[(k, method)])
            write_atomic(out / folder / f"{method}.npy", npy_bytes(stack))
            files[f"{folder}/{method}.npy"] = list(stack.shape)
            value = steadiness(stack)
            steady[method] = None if value is None else round(value, 6)
        stability["consecutive_frames_spearman"][model.name] = steady
        write_atomic(out / folder / PREDICTIONS_FILE, (json.dumps(predictions[k], indent=1) + "\n").encode())
    top1 = {m.name: [p["top5"][0]["prob"] for p in predictions[k]] for k, m in enumerate(models)
            if predictions[k] and predictions[k][0]["top5"]}
    labels = {m.name: [p["top5"][0]["label"] for p in predictions[k]] for k, m in enumerate(models)
              if predictions[k] and predictions[k][0]["top5"]}
    timeline = timeline_plot(times, top1, labels, agreements)
    write_atomic(out / TIMELINE_FILE, png_bytes(timeline))
    seconds, frames = cut
    manifest = {"vitviz_version": __version__,
                "source": {"path": str(path), "width": info.width, "height": info.height, "rotation": info.rotation,
                           "duration": info.duration, "rate": info.rate, "codec": info.codec},
                "sampling": {"fps": fps, "frames": len(times), "times": times, "max_seconds": seconds,
                             "max_frames": frames},
                "models": [model_entry(m) for m in models], "methods": list(methods),
                "drawn": {m.name: drawn.get(k) for k, m in enumerate(models)},
                "files": {VIDEO_FILE: {"frames": len(times), "codec": "h264", "pixel_format": "yuv420p"},
                          TIMELINE_FILE: {}, **{name: {"shape": shape} for name, shape in files.items()},
                          **{f"{safe_name(m.name)}/{PREDICTIONS_FILE}": {} for m in models}},
                "stability": stability}
    write_atomic(out / MANIFEST_FILE, (json.dumps(manifest, indent=1) + "\n").encode())
    return VideoResult(out, video, timeline, manifest)
