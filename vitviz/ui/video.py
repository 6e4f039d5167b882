"""Video: a clip through both models frame by frame (`vitviz.video`), the side-by-side result playing in the
page with its timeline and how steady each model's explanation is, and a frame slider that sends any frame to
the main Explain, so every tab explains it. The models run through `gpu/` (their cards once, then one call
per chunk of frames); reading, drawing and encoding happen here, in the app's process."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import numpy as np

from .. import video as clips
from ..explain import METHODS
from . import gpu
from .shared import DEFAULT_PROMPTS, HIDDEN, INSTANT, MODEL_EVENTS, Page, cache_folder, prompts_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "assets" / "horse_pan_zoom.mp4"   # how it was made: assets/make_example_clip.py
FRAMES = "frames"   # the sampled frames' JPEGs, beside the result in the request's own folder
MAX_APP_FPS = 30.0


class VideoAnswer(NamedTuple):
    """What /explain_video returns: the side-by-side MP4, the timeline and the stability numbers in words; and the
    folder of the sampled frames, which the page keeps for its frame slider (a State: not part of the API)."""
    video: str
    timeline: np.ndarray
    stability: str
    frames: str


def video_path(payload) -> str:
    if payload is None:
        raise gr.Error("Upload a video first, or click the example clip.")
    if isinstance(payload, dict):
        payload = payload.get("video", payload)
        payload = payload.get("path") if isinstance(payload, dict) else payload
    return str(payload)


def checked_methods(methods) -> list[str]:
    methods = list(dict.fromkeys(methods or ["rollout"]))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise gr.Error(f"Unknown map {unknown[0]!r}: choose from {', '.join(METHODS)}.")
    return methods


def checked_fps(fps) -> float:
    try:
        fps = float(fps)
    except (TypeError, ValueError):
        fps = None
    if fps is None or not 0 < fps <= MAX_APP_FPS:
        raise gr.Error(f"Sample from 1 to {MAX_APP_FPS:g} frames a second, not {fps!r}.")
    return fps


def stability_words(result: clips.VideoResult, cut: str) -> str:
    """The stability numbers in words: per model and method, how alike consecutive frames' maps are; where a model
    drew another method than the first asked, which and why; whose drawn map is steadier, and how much the two
    drawn maps agree."""
    steady = result.stability["consecutive_frames_spearman"]
    lines = [f"**{result.manifest['sampling']['frames']} frames** at {result.manifest['sampling']['fps']:g} per second"
             + (f" ({cut})" if cut else "") + ".", ""]
    for model, by in steady.items():
        values = ", ".join(f"{METHODS[m].title} **{v:.2f}**" for m, v in by.items() if v is not None)
        lines.append(f"- {model}: consecutive frames' maps correlate {values or 'on no method'} (Spearman; 1 = steady)")
    lines.append("")   # the list ends: what follows is a paragraph of its own
    for note in result.fallbacks():   # a paragraph each
        lines += [note, ""]
    scored = {model: (method, steady[model][method]) for model, method in result.drawn.items()
              if steady[model].get(method) is not None}
    if len(scored) == 2:
        (a, (ma, va)), (b, (mb, vb)) = sorted(scored.items(), key=lambda item: -item[1][1])
        other = "" if ma == mb else f" {METHODS[mb].title}"
        lines.append(f"**{a}'s {METHODS[ma].title} is steadier** than {b}'s{other} ({va:.2f} against {vb:.2f}).")
    agree = result.stability["agreement"]["mean"]
    if agree is not None:
        titles = " and ".join(dict.fromkeys(METHODS[m].title for m in result.drawn.values()))
        lines.append(f"The two models' maps ({titles}) agree with a mean rank correlation of **{agree:.2f}** over "
                     f"the frames.")
    if result.stability["smoothing"]:
        lines.append(f"Smoothed over time: each map is {result.stability['smoothing']:g} of the previous one's plus "
                     f"the rest of its own.")
    return "\n".join(lines)


def explain_video(video, model_a, model_b, methods=("rollout",), fps=clips.DEFAULT_FPS, prompts=DEFAULT_PROMPTS,
                  progress=gr.Progress()) -> VideoAnswer:
    """The clip (its first APP_MAX_SECONDS s and APP_MAX_FRAMES frames) through both models frame by frame, with
    a progress bar over the frames."""
    path, methods, fps = video_path(video), checked_methods(methods), checked_fps(fps)
    names, prompts = [(model_a or "").strip(), (model_b or "").strip()], prompts_of(prompts)
    try:
        info = clips.probe(path)
    except clips.VideoError as e:
        raise gr.Error(str(e)) from None
    progress(0.0, desc="loading the models")
    cards = gpu.cards(names, prompts)
    folder = cache_folder()

    def read(models, pixels, asked):
        return gpu.video_frames(names, pixels, asked, prompts)

    def step(done, total):
        progress((done, total) if total else 0.5, desc=f"frame {done}" + (f" of {total}" if total else ""),
                 unit="frames")
    try:
        result = clips.explain_video(path, cards, methods=methods, out=folder, fps=fps,
                                     max_seconds=clips.APP_MAX_SECONDS, max_frames=clips.APP_MAX_FRAMES, read=read,
                                     progress=step, keep=clips.frame_saver(folder / FRAMES))
    except clips.VideoError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise gr.Error(str(e)) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    frames = result.manifest["sampling"]["frames"]
    cut = ""
    if info.duration and info.duration > clips.APP_MAX_SECONDS:
        cut = f"the first {clips.APP_MAX_SECONDS:g} s of {info.duration:.0f} s: the app takes at most that much"
    elif frames >= clips.APP_MAX_FRAMES:
        cut = f"the first {clips.APP_MAX_FRAMES} frames: the app takes at most that many"
    return VideoAnswer(str(result.video), result.timeline, stability_words(result, cut), str(folder / FRAMES))


def frame_slider(frames: str | None) -> gr.Slider:
    """The frame slider over the frames just explained."""
    count = len(list(Path(frames).glob("frame-*.jpg"))) if frames else 0
    return gr.Slider(minimum=1, maximum=max(count, 2), value=1, step=1, interactive=count > 1)


def chosen_frame(frames: str | None, number) -> str:
    """The sampled frame the slider is on, as the page's input image."""
    if not frames:
        raise gr.Error("Explain a video first: its frames are what the slider picks from.")
    path = Path(frames) / f"frame-{int(number) - 1:04d}.jpg"
    if not path.is_file():
        raise gr.Error(f"There is no frame {number} (the frames of this video were removed: explain it again).")
    return str(path)


@dataclass
class Video:
    chosen: object   # the event of a frame sent to the page's image: page.build chains an Explain on it


def layout(page: Page, prompts: gr.Textbox) -> Video:
    with gr.Tab("Video", id="video"):
        gr.Markdown("Both models on every frame of a clip (its first 30 s, at most 300 frames), side by side in one "
                    "video: each with its first map (a CNN, which has no attention, with Grad-CAM where that map "
                    "reads attention), its top class and probability. The timeline shows each model's "
                    "confidence over time (shaded: they disagree) and how much their maps agree; the numbers say "
                    "whose explanation is steadier from one frame to the next.")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=240):
                upload = gr.Video(label="a video (MP4, WebM, MOV, MKV, AVI or animated GIF)", sources=["upload"],
                                  height=240, elem_id="video-input")
                gr.Examples([str(EXAMPLE)], inputs=[upload], label="example clip (a pan and zoom over the horse "
                                                                  "photo: assets/make_example_clip.py)")
            with gr.Column(scale=3, min_width=280):
                methods = gr.CheckboxGroup([(m.title, k) for k, m in METHODS.items()], value=["rollout"],
                                           label="maps per frame (the video draws the first)")
                fps = gr.Slider(1, MAX_APP_FPS, value=clips.DEFAULT_FPS, step=1, label="frames sampled per second")
                run = gr.Button("Explain the video", variant="primary", elem_id="video-run")
        result = gr.Video(label="both models, frame by frame", interactive=False, elem_id="video-result")
        stability = gr.Markdown(elem_id="video-stability")
        timeline = gr.Image(label="top-1 probability over time, and the agreement of the maps", interactive=False,
                            elem_id="video-timeline")
        with gr.Row():
            frame = gr.Slider(1, 2, value=1, step=1, label="frame", interactive=False, elem_id="video-frame")
            send = gr.Button("Explain this frame in every tab", elem_id="video-send")
        frames = gr.State(None)
    # the upload skips Gradio's own handling: `frames.probe` reads it with every check
    done = run.click(explain_video, inputs=[upload, page.model_a, page.model_b, methods, fps, prompts],
                     outputs=[result, timeline, stability, frames], preprocess=False, api_name="explain_video",
                     **MODEL_EVENTS)
    done.success(frame_slider, inputs=[frames], outputs=[frame], **INSTANT, **HIDDEN)
    chosen = send.click(chosen_frame, inputs=[frames, frame], outputs=[page.image], api_name="choose_frame",
                        api_visibility="undocumented", **INSTANT)
    return Video(chosen=chosen)
