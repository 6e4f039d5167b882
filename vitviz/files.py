"""What the exporter, the concepts, the data sets and the long-running commands share for writing files: names
safe as one path component, writes that never leave half a file, PNG and .npy bytes, and numpy's BLAS kept on one
thread where vitviz draws on threads of its own.
"""
from __future__ import annotations

import io
import os
import re
import struct
from pathlib import Path

import numpy as np
from isal import isal_zlib
from threadpoolctl import threadpool_limits


def safe_name(name: str) -> str:
    """A model or image name as one path component: 'microsoft/cvt-13' -> 'microsoft--cvt-13'."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace("/", "--")).strip(".-")
    return name or "unnamed"


def write_atomic(path: Path, data: bytes) -> None:
    """`data` written to `path` (its folders made) through a temporary file renamed into place, so a
    reader never finds half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


PNG_COLOUR_TYPES = {1: 0, 3: 2, 4: 6}   # channels -> PNG colour type: grey, RGB, RGBA (8 bits each)
PNG_DEFLATE_LEVEL = 2   # ISA-L's levels are 0-3; 2 is its fastest on the views, at zlib level 1's file size


def png_bytes(image: np.ndarray) -> bytes:
    """An h w (grey), h w 3 or h w 4 uint8 image as PNG bytes. Every row has PNG's Sub filter (each byte minus
    the same channel's a pixel to the left, mod 256) and the rows are deflated by ISA-L (`isal`): a standard PNG
    that every decoder reads to the same pixels, encoded in about a third of Pillow's time at zlib's fastest
    level (a 640x520 view: 8 ms against 24 ms), which is most of the time of an export with PNGs."""
    image = np.ascontiguousarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
        raise ValueError(f"a PNG is drawn from h w, h w 3 or h w 4 uint8 pixels, not {image.dtype} {image.shape}")
    h, w = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    rows = image.reshape(h, w * channels)
    filtered = np.empty((h, 1 + w * channels), np.uint8)
    filtered[:, 0] = 1   # the Sub filter's number
    filtered[:, 1:1 + channels] = rows[:, :channels]
    np.subtract(rows[:, channels:], rows[:, :-channels], out=filtered[:, 1 + channels:])   # uint8: mod 256

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = isal_zlib.crc32(data, isal_zlib.crc32(kind))   # ISA-L's CRC-32: 4x zlib's on a view's megabyte
        return b"".join([struct.pack(">I", len(data)), kind, data, struct.pack(">I", crc)])
    header = struct.pack(">IIBBBBB", w, h, 8, PNG_COLOUR_TYPES[channels], 0, 0, 0)   # 8 bits, deflate, no interlace
    pixels = isal_zlib.compress(filtered, PNG_DEFLATE_LEVEL)
    return b"".join([b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", header), chunk(b"IDAT", pixels), chunk(b"IEND", b"")])


def drawing_threads() -> threadpool_limits:
    """numpy's BLAS on one thread, for as long as the context lasts: where vitviz draws on threads of its own
    (the CLI's export pool, the app's requests), BLAS's threads on the views' small matrices (a stage's
    principal components: a 64x64 eigenproblem) only oversubscribe the cores; with them an export spent 40 %
    more CPU time and an eigendecomposition took 55 ms instead of 1.4 on a busy machine."""
    return threadpool_limits(limits=1, user_api="blas")


def npy_bytes(array: np.ndarray) -> bytes:
    """An array as .npy bytes in float32, saved without pickle: what every exported map is."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array, dtype=np.float32), allow_pickle=False)
    return buffer.getvalue()
