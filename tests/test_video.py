"""Videos through two models (`vitviz.video`): every sampled frame's maps equal the photo pipeline's on the same
decoded frame, frames are sampled, turned upright and timed as the stream says, the output is a playable H.264
MP4 whose timeline and manifest agree with the arrays, a CNN beside a transformer gets a map in its half of
every frame (its first screen's), and every bad input gets plain words. The videos are written here with PyAV."""
from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

import vitviz
from vitviz import frames as reading, video as clips
from vitviz.agreement import agreement
from vitviz.session import explain_image

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PAIR = ("vit-cifar10", "cvt-cifar10")


def write_video(path: Path, *, frames: int = 12, rate: int = 24, size=(96, 128), rotation: int = 0,
                times: list[float] | None = None, codec: str = "libx264") -> Path:
    """A red square moving right over grey noise; `times` (seconds) gives each frame its own time (a variable
    frame rate), `rotation` a display matrix (counter-clockwise degrees)."""
    container = av.open(str(path), "w")
    stream = container.add_stream(codec, rate=rate)
    stream.height, stream.width = size
    stream.pix_fmt = "yuv420p"
    if times is not None:
        stream.codec_context.time_base = Fraction(1, 1000)
    if rotation:
        stream.set_display_rotation(rotation)
    rng = np.random.default_rng(0)
    for i in range(frames):
        image = rng.integers(60, 120, (*size, 3), dtype=np.uint8)
        x = 4 + i * (size[1] - 40) // max(frames - 1, 1)
        image[size[0] // 3:size[0] // 3 + 32, x:x + 32] = (230, 40, 40)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        if times is not None:
            frame.pts, frame.time_base = int(round(times[i] * 1000)), Fraction(1, 1000)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return path


@pytest.fixture(scope="module")
def pair():
    return [vitviz.load(name, device="cpu") for name in PAIR]


def test_every_sampled_frames_maps_equal_the_photo_pipelines_on_the_same_decoded_frame(pair, tmp_path):
    path = write_video(tmp_path / "square.mp4", frames=24, rate=24)
    kept = []
    result = clips.explain_video(path, pair, methods=["rollout", "chefer"], out=tmp_path / "out", fps=8,
                                 keep=kept.append, batch_size=3)
    assert [f.time for f in kept] == pytest.approx([k / 8 for k in range(8)], abs=1e-3)   # one frame in three
    assert result.manifest["sampling"]["times"] == [f.time for f in kept]
    for model in pair:
        folder = tmp_path / "out" / vitviz.files.safe_name(model.name)
        for method in ("rollout", "chefer"):
            saved = np.load(folder / f"{method}.npy")
            assert saved.shape[0] == len(kept)
            for i, frame in enumerate(kept):
                photo = explain_image(frame.image, [model])[0].token_map(method)
                np.testing.assert_allclose(saved[i], photo, rtol=0, atol=1e-5, err_msg=f"{model.name} {method} {i}")
        predictions = json.loads((folder / clips.PREDICTIONS_FILE).read_text())
        assert [p["time"] for p in predictions] == [f.time for f in kept]
        assert all(len(p["top5"]) == 5 for p in predictions)


def test_the_output_is_h264_yuv420p_with_every_frame_and_the_manifest_and_timeline_agree_with_the_arrays(
        pair, tmp_path):
    path = write_video(tmp_path / "square.mp4", frames=16, rate=8)
    result = clips.explain_video(path, pair, methods=["rollout"], out=tmp_path / "out", fps=8)
    with av.open(str(result.video)) as container:
        stream = container.streams.video[0]
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
    assert len(decoded) == 16 and decoded[0].shape[0] % 2 == 0 and decoded[0].shape[1] % 2 == 0
    assert decoded[0].shape[1] >= 2 * 128   # the two panels side by side, each at least the frame's width
    manifest = json.loads((tmp_path / "out" / clips.MANIFEST_FILE).read_text())
    assert manifest["sampling"]["frames"] == 16 and manifest == json.loads(json.dumps(result.manifest))
    for model in pair:
        stack = np.load(tmp_path / "out" / vitviz.files.safe_name(model.name) / "rollout.npy")
        assert manifest["files"][f"{vitviz.files.safe_name(model.name)}/rollout.npy"]["shape"] == list(stack.shape)
        steady = np.mean([clips.spearman(a.ravel(), b.ravel()) for a, b in zip(stack[:-1], stack[1:])])
        assert manifest["stability"]["consecutive_frames_spearman"][model.name]["rollout"] == pytest.approx(
            steady, abs=1e-6)
    assert len(manifest["stability"]["agreement"]["per_frame"]) == 16
    assert (tmp_path / "out" / clips.TIMELINE_FILE).stat().st_size > 10_000 and result.timeline.ndim == 3


def test_a_video_stored_on_its_side_is_read_upright(tmp_path):
    path = write_video(tmp_path / "portrait.mp4", frames=4, rate=8, size=(96, 128), rotation=90)
    frames = list(reading.read_frames(path, fps=8, resize=32))
    assert reading.probe(path).rotation == 90
    assert frames[0].image.size == (96, 128)   # stored 128 wide, 96 high: shown 96 wide, 128 high
    upright = np.asarray(frames[0].image)
    stored = next(iter(av.open(str(path)).decode(video=0))).to_ndarray(format="rgb24")
    np.testing.assert_array_equal(upright, np.rot90(stored, k=1))   # counter-clockwise, as the matrix says


def test_a_variable_frame_rate_keeps_each_frames_own_time(tmp_path):
    times = [0.0, 0.05, 0.1, 0.4, 0.45, 1.0, 1.02, 1.3]
    path = write_video(tmp_path / "vfr.mp4", frames=len(times), rate=24, times=times)
    frames = list(reading.read_frames(path, fps=4, resize=32))   # samples at 0, 0.25, 0.5, 0.75, 1.0, 1.25
    assert [f.time for f in frames] == pytest.approx([0.0, 0.4, 1.0, 1.3], abs=2e-3)


def test_a_source_slower_than_the_rate_asked_keeps_every_frame_and_large_frames_decode_small(tmp_path):
    path = write_video(tmp_path / "slow.mp4", frames=6, rate=4, size=(1080, 1920))
    frames = list(reading.read_frames(path, fps=8, resize=256))
    assert len(frames) == 6
    assert frames[0].image.size == (768, 432)   # the longer side at the views' 768 px: more than 256 on the shorter


@pytest.mark.parametrize("case", ["text", "truncated", "audio", "no frames", "enormous"])
def test_each_bad_input_is_refused_in_words(tmp_path, monkeypatch, case, pair):
    if case == "text":
        path = tmp_path / "notes.mp4"
        path.write_text("not a video at all")
        words = "not a video FFmpeg can read"
    elif case == "truncated":
        whole = write_video(tmp_path / "whole.mp4", frames=48, rate=24).read_bytes()
        path = tmp_path / "cut.mp4"
        path.write_bytes(whole[:len(whole) // 3])
        words = "not a video FFmpeg can read|damaged or cut short"
    elif case == "audio":
        path = tmp_path / "sound.wav"
        with av.open(str(path), "w") as container:
            stream = container.add_stream("pcm_s16le", rate=8000)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
            frame.sample_rate = 8000
            for packet in stream.encode(frame):
                container.mux(packet)
        words = "no video stream .*audio"
    elif case == "no frames":
        path = tmp_path / "empty.avi"
        with av.open(str(path), "w", format="avi") as container:
            stream = container.add_stream("mpeg4", rate=8)
            stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
            container.start_encoding()   # the header alone: a video stream with no frame in it
        words = "The video has no frame that can be decoded"
    else:
        path = write_video(tmp_path / "big.mp4", frames=2, rate=8)
        monkeypatch.setattr(reading, "MAX_FRAME_PIXELS", 96 * 128 - 1)
        words = "frames are 128x96 pixels; vitviz reads frames up to 8K"
    with pytest.raises(reading.VideoError, match=words):
        clips.explain_video(path, pair, out=tmp_path / "out", fps=8)
    assert not (tmp_path / "out" / clips.VIDEO_FILE).exists()
    assert not list((tmp_path / "out").glob(".*tmp*")) if (tmp_path / "out").exists() else True


def test_the_app_takes_the_first_30_seconds_and_says_so(tmp_path, monkeypatch):
    from vitviz.ui import video as tab

    path = write_video(tmp_path / "long.mp4", frames=40, rate=1)   # 40 s at one frame a second
    answer = tab.explain_video({"path": str(path)}, *PAIR, ["rollout"], 1, progress=lambda *a, **k: None)
    assert "the first 30 s of 40 s" in answer.stability
    assert len(list(Path(answer.frames).glob("frame-*.jpg"))) == 30
    with pytest.raises(Exception, match="not a video FFmpeg can read"):
        tab.explain_video({"path": __file__}, *PAIR, ["rollout"], 8, progress=lambda *a, **k: None)


def test_the_video_tab_with_a_cnn_beside_a_transformer_draws_a_map_in_both_halves_of_every_frame(monkeypatch):
    """Swin beside ResNet on the example clip with the tab's default method (attention rollout, which ResNet has no
    attention for): ResNet's half of every frame is the map its first screen shows (`ModelRun.overview_method`),
    drawn and captioned as such, and its steadiness and the two models' agreement are measured on what each drew."""
    from vitviz.ui import video as tab

    captions = []
    caption = clips.render.caption
    monkeypatch.setattr(clips.render, "caption",
                        lambda image, **words: captions.append(words) or caption(image, **words))
    answer = tab.explain_video({"path": str(tab.EXAMPLE)}, "swin-cifar10", "resnet-cifar10", fps=1,
                               progress=lambda *a, **k: None)   # the example's 4 s: 4 frames
    folder = Path(answer.video).parent
    manifest = json.loads((folder / clips.MANIFEST_FILE).read_text())
    maps = {"swin-cifar10": np.load(folder / "swin-cifar10" / "rollout.npy"),
            "resnet-cifar10": np.load(folder / "resnet-cifar10" / "gradcam.npy")}
    with av.open(answer.video) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    swin, resnet = (vitviz.load(name, device="cpu") for name in ("swin-cifar10", "resnet-cifar10"))
    frames = sorted(Path(answer.frames).glob("frame-*.jpg"))
    assert len(frames) == len(decoded) == len(captions) // 2 == 4
    for i, path in enumerate(frames):
        runs = explain_image(Image.open(path), [swin, resnet])
        first_screen = runs[1].overview_method
        assert captions[2 * i + 1]["method"] == vitviz.explain.method(first_screen).title == "Grad-CAM"
        assert "not attention rollout" in captions[2 * i + 1]["note"]
        assert clips.spearman(maps["resnet-cifar10"][i].ravel(), runs[1].token_map(first_screen).ravel()) > 0.99
        h, w = runs[1].canvas.size   # ResNet's half: the second panel, its picture above its caption
        half = decoded[i][:h, w:2 * w].astype(float)
        drawn = clips.render.overlay(runs[1].canvas, maps["resnet-cifar10"][i]).astype(float)
        notice = clips.render.notice(runs[1].canvas, "no map").astype(float)
        assert np.abs(half - drawn).mean() < 8 < np.abs(half - notice).mean(), f"frame {i}"   # H.264 aside
        assert manifest["stability"]["agreement"]["per_frame"][i] == pytest.approx(
            agreement(runs[0].canvas, runs[1].canvas, maps["swin-cifar10"][i], maps["resnet-cifar10"][i]), abs=1e-5)
    steady = manifest["stability"]["consecutive_frames_spearman"]
    for name, method in (("swin-cifar10", "rollout"), ("resnet-cifar10", "gradcam")):
        stack = maps[name]
        expected = np.mean([clips.spearman(a.ravel(), b.ravel()) for a, b in zip(stack[:-1], stack[1:])])
        assert manifest["drawn"][name] == method and steady[name][method] == pytest.approx(expected, abs=1e-6)
    assert manifest["stability"]["agreement"]["mean"] is not None
    assert "resnet-cifar10: consecutive frames' maps correlate Grad-CAM **" in answer.stability
    assert "on no method" not in answer.stability and "resnet-cifar10 has no attention" in answer.stability
    assert "agree with a mean rank correlation" in answer.stability


@pytest.mark.slow
def test_a_300_frame_1080p_clip_stays_below_one_and_a_half_gigabytes(tmp_path):
    """Streamed: frames are decoded, read, drawn, encoded and dropped; only the token maps are kept. The peak is
    the process's own (VmHWM): ru_maxrss would carry over pytest's own peak from before the exec."""
    path = write_video(tmp_path / "hd.mp4", frames=300, rate=30, size=(1080, 1920))
    script = (f"import re, vitviz, vitviz.video as v\n"
              f"models = [vitviz.load(n, device='cpu') for n in {PAIR!r}]\n"
              f"v.explain_video({str(path)!r}, models, out={str(tmp_path / 'out')!r}, fps=30)\n"
              f"print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1800,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.split()[-1]) * 1024
    assert peak < 1.5 * 2 ** 30, f"peak resident memory {peak / 2 ** 30:.2f} GB"
    assert json.loads((tmp_path / "out" / clips.MANIFEST_FILE).read_text())["sampling"]["frames"] == 300
