"""Video (issue 31): frames per second end to end against the same frames' batched traced forwards alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

import vitviz
from timing import report, verdict
from workbench import PHOTO, Bench

TARGET = 1.25


def measure(bench: Bench, items: set[str]) -> None:
    """`vitviz.video.explain_video` (decode, both models, rollout, drawing, H.264 encoding) on a 640x480 clip of
    the example photo panning, against the same frames' batched traced forwards alone (the frames decoded once,
    beforehand): frames per second of each, and their ratio (time end to end / time of the forwards)."""
    import av

    count = 8 if bench.quick else 48
    path = bench.tmp / "pan.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        photo = Image.open(PHOTO).convert("RGB").resize((960, 480))
        for k in range(count * 3):   # sampled at 8 of its 24 frames a second
            frame = np.asarray(photo.crop((k * 4, 0, k * 4 + 640, 480)))
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    for what, names in {"bundled pair": bench.bundled_pair[:2], "ImageNet pair": bench.imagenet_pair}.items():
        one_pair(bench, path, what, names)


def one_pair(bench: Bench, path: Path, what: str, names: tuple[str, str]) -> None:
    """The line of one pair of models (`what`: how the line names it) on the clip at `path`."""
    import av

    from vitviz import video as clips

    models = [vitviz.load(n, device=bench.device) for n in names]
    frames = [f.image for f in clips.read_frames(path, fps=8, resize=max(
        m.transform.resize if isinstance(m.transform.resize, int) else max(m.transform.resize) for m in models))]
    pixels = [[torch.cat([m.transform(f) for f in frames[i:i + 8]]).to(bench.device) for i in range(0, len(frames), 8)]
              for m in models]

    def forwards():
        with torch.inference_mode():
            for m, batches in zip(models, pixels):
                for p in batches:
                    m.model.trace(p)
    out = bench.folder(f"video-{what}")
    t = bench.time({"video": lambda: clips.explain_video(path, models, methods=["rollout"], out=out, fps=8),
                    "forwards": forwards})
    with av.open(str(out / clips.VIDEO_FILE)) as container:   # what it wrote: the side-by-side frames
        written = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]

    def encode():   # the H.264 encoding alone, part of end to end's time that no model choice changes
        writer = clips.VideoWriter(bench.tmp / "encoded.mp4", fps=8)
        for image in written:
            writer.write(image)
        writer.close()
    encoding = bench.time({"encode": encode})["encode"]
    rate, floor = len(frames) / t["video"].median, len(frames) / t["forwards"].median
    report(f"video {len(frames)} frames 640x480, {what}: end to end {rate:.1f} frames/s ({t['video']}), the batched "
           f"traced forwards alone {floor:.1f} frames/s ({t['forwards']}), of end to end the H.264 encoding of its "
           f"{written[0].shape[1]}x{written[0].shape[0]} frames alone {encoding.median / len(written) * 1000:.1f} ms a "
           f"frame, " + verdict(t["video"].median / t["forwards"].median, TARGET))
