"""Frames in: a video file read with PyAV (FFmpeg in-process), checked before a frame is decoded, sampled, turned
upright and decoded no larger than the models and the views need, one frame at a time.

Reading (PyAV, FFmpeg in-process). Frames are decoded in order and sampled at `fps` (default 8): a frame
is kept when its time reaches the next sample time k / fps, so a source slower than `fps` keeps every
frame, and a variable frame rate keeps the frames' own times. Each kept frame is turned upright by the
stream's display matrix (a phone's portrait video is stored on its side), and decoded no larger than the
models and the views need: its shorter side at least every model's resize, its longer side at least the
views' `MAX_SIDE` (FFmpeg's scaler does the shrinking).
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from .render.geometry import MAX_SIDE

DEFAULT_FPS = 8.0
MAX_FPS = 60.0
MAX_VIDEO_BYTES = 2_000_000_000        # 2 GB: a long phone video fits; the app's uploads are bounded lower
MAX_FRAME_PIXELS = 8192 * 4320         # 8K: larger frames are refused before one is decoded


class VideoError(ValueError):
    """A video we will not read; the message says why in plain words."""


@dataclass(frozen=True)
class VideoInfo:
    """What a clip's first video stream says of itself, read before any frame is decoded."""
    width: int           # stored frame size (before the display rotation)
    height: int
    rotation: int        # counter-clockwise degrees the display matrix turns a frame by (0, 90, 180, 270)
    duration: float | None   # seconds, where the container says
    rate: float | None   # the stream's average frame rate
    codec: str


@dataclass(frozen=True)
class Frame:
    """One sampled frame, upright, with its place in the clip."""
    index: int           # among the sampled frames
    time: float          # seconds from the stream's start
    image: Image.Image   # upright RGB


def probe(path: str | os.PathLike) -> VideoInfo:
    """The first video stream's geometry and timing, or a VideoError in words (not a video, no video stream, an
    unreadable or enormous one)."""
    import av

    path = Path(path)
    if not path.is_file():
        raise VideoError(f"There is no video file at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    size = path.stat().st_size
    if size == 0:
        raise VideoError("The file is empty (0 bytes): the upload may have failed; try again.")
    if size > MAX_VIDEO_BYTES:
        raise VideoError(f"The file is {size / 1e9:.1f} GB; the limit is {MAX_VIDEO_BYTES / 1e9:g} GB.")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                kinds = sorted({s.type for s in container.streams}) or ["no"]
                raise VideoError(f"The file has no video stream (it holds {' and '.join(kinds)} streams"
                                 f"{': an audio file?' if 'audio' in kinds else ''}).")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            duration = float(container.duration / 1e6) if container.duration else None
            rate = float(stream.average_rate) if stream.average_rate else None
            codec = stream.codec_context.name
            rotation = _rotation_of(container, stream)
    except VideoError:
        raise
    except (av.error.InvalidDataError, av.error.FFmpegError, UnicodeDecodeError) as e:
        raise VideoError(f"This file is not a video FFmpeg can read ({_reason(e)}). vitviz reads MP4, WebM, MOV, "
                         f"MKV, AVI and animated GIF.") from None
    if not width or not height:
        raise VideoError("The video stream has no frame size: the file is damaged or not a video.")
    if width * height > MAX_FRAME_PIXELS:
        raise VideoError(f"The video's frames are {width}x{height} pixels; vitviz reads frames up to 8K "
                         f"({MAX_FRAME_PIXELS / 1e6:.0f} MP). Scale it down (e.g. to 1920 px wide) and try again.")
    return VideoInfo(width, height, rotation, duration, rate, codec)


def _rotation_of(container, stream) -> int:
    """The display rotation of the stream, from its first frame's display matrix (0 if it has none, or no frame)."""
    import av

    try:
        for frame in container.decode(stream):
            return int(round(frame.rotation or 0)) % 360
    except av.error.EOFError:   # a stream without a single frame: `read_frames` says so
        pass
    return 0


def _reason(error: BaseException) -> str:
    """FFmpeg's own few words for what went wrong ('Invalid data found when processing input')."""
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return text[:160]


def _upright(image: Image.Image, rotation: int) -> Image.Image:
    """A decoded frame turned as its display matrix says (counter-clockwise degrees)."""
    turn = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}
    return image.transpose(turn[rotation]) if rotation in turn else image


def decode_scale(width: int, height: int, rotation: int, *, resize: int) -> float:
    """How far to shrink a frame while decoding: its shorter side stays at least `resize` (the models' largest)
    and its longer side at least MAX_SIDE (the views'); never enlarged."""
    if rotation in (90, 270):
        width, height = height, width
    return min(1.0, max(resize / min(width, height), MAX_SIDE / max(width, height)))


def read_frames(path: str | os.PathLike, *, fps: float = DEFAULT_FPS, resize: int = MAX_SIDE,
                max_seconds: float | None = None, max_frames: int | None = None) -> Iterator[Frame]:
    """The video's frames sampled at `fps` (see the module docstring), upright and decoded small, one at a time;
    at most `max_seconds` of it and `max_frames` frames. A truncated or damaged stream ends with a VideoError
    that says how far it got; a video with no frame at all is one too."""
    import av

    if not 0 < fps <= MAX_FPS:
        raise VideoError(f"The frame rate must be above 0 and at most {MAX_FPS:g} frames a second, not {fps!r}.")
    info = probe(path)
    scale = decode_scale(info.width, info.height, info.rotation, resize=resize)
    width, height = max(2, round(info.width * scale)), max(2, round(info.height * scale))
    step, next_time, count, start = 1.0 / fps, 0.0, 0, None
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if frame.time is None:
                    continue
                start = frame.time if start is None else start
                t = frame.time - start
                if max_seconds is not None and t >= max_seconds:
                    break
                if t + 1e-6 < next_time:
                    continue
                image = frame.to_image(width=width, height=height, interpolation="AREA")
                yield Frame(count, round(t, 6), _upright(image, info.rotation))
                count += 1
                next_time = (math.floor(t / step + 1e-6) + 1) * step
                if max_frames is not None and count >= max_frames:
                    break
    except av.error.EOFError:
        pass   # the end, reached early: the frames so far are the video
    except (av.error.InvalidDataError, av.error.FFmpegError) as e:
        raise VideoError(f"The video is damaged or cut short: decoding stopped after {count} sampled frame(s) "
                         f"({_reason(e)}).") from None
    if count == 0:
        raise VideoError("The video has no frame that can be decoded.")
