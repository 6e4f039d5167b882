"""Make the Video tab's example clip from one of these photos: a slow pan and zoom over the horse.

    python assets/make_example_clip.py     # writes assets/horse_pan_zoom.mp4

A 4 s clip at 8 frames a second, 320x240, H.264 (yuv420p, +faststart): a 3:4 window that starts on the
left third of `horse.jpg` at its full height, pans right while it narrows to 60 % (a zoom of 1.7x) and
ends on the right third; each frame is the window resized with Lanczos. The photo is CC0 (README.md).
"""
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
SOURCE, OUT = HERE / "horse.jpg", HERE / "horse_pan_zoom.mp4"
SIZE, FPS, SECONDS = (320, 240), 8, 4


def main() -> None:
    photo = Image.open(SOURCE).convert("RGB")
    w, h = photo.size
    container = av.open(str(OUT), "w", format="mp4", options={"movflags": "+faststart"})
    stream = container.add_stream("libx264", rate=Fraction(FPS))
    stream.width, stream.height, stream.pix_fmt = *SIZE, "yuv420p"
    stream.options = {"crf": "26", "preset": "veryslow"}
    frames = FPS * SECONDS
    for k in range(frames):
        t = k / (frames - 1)
        box_h = h * (1.0 - 0.4 * t)                 # the zoom: full height down to 60 % of it
        box_w = box_h * SIZE[0] / SIZE[1]
        x = (w - box_w) * (0.15 + 0.7 * t)          # the pan: from the left third to the right third
        y = (h - box_h) * 0.5
        crop = photo.resize(SIZE, Image.LANCZOS, box=(x, y, x + box_w, y + box_h))
        for packet in stream.encode(av.VideoFrame.from_ndarray(np.asarray(crop), format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    print(f"{OUT}: {frames} frames, {OUT.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
