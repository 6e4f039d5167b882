"""Reading a person's image safely: checked before it is decoded, decoded once, returned as plain RGB.

`read_image` is the one door for user images (the app and the CLI both use it). In order, it
1. refuses a file above `MAX_UPLOAD_BYTES` (from its size on disk, before reading it);
2. names the format from the first bytes, never from the file name: JPEG, PNG, GIF, WebP, AVIF,
   TIFF and BMP are read; empty files, text, HTML, SVG, PDF, HEIC and videos get their own message;
3. opens the file lazily (header only) and checks the declared size: at most `MAX_PIXELS`, at least
   `MIN_SIDE` pixels on each side, at most `MAX_ASPECT_RATIO`:1 (the models see a centred square, so a
   long strip would be explained through a sliver of it); PIL's own decompression-bomb refusal,
   raised while opening, becomes the same plain message;
4. decodes: a JPEG larger than `target_size` decodes reduced (libjpeg's DCT scaling by 1/2, 1/4 or
   1/8 via `Image.draft`), never below `target_size`, so the model's own resize still makes the
   final, exact downscale. This saves most of the decode time of a phone photo but changes pixels
   slightly compared with a full decode (DCT-domain scaling instead of a resize from full size);
5. normalises: EXIF orientation applied as the camera meant, first frame of an animation,
   transparency composited on `BACKGROUND`, 16-bit samples scaled to 8 bits (not clipped), CMYK,
   grayscale and palette converted to RGB. `info["full_size"]` keeps the (width, height) the photo
   has upright at full size, as a browser shows it: where a click on the shown photo lands on a
   reduced decode.
Truncated or damaged files are refused with `ImageError`; PIL's global switches
(`ImageFile.LOAD_TRUNCATED_IMAGES`, `Image.MAX_IMAGE_PIXELS`) are never changed.

Gradio: `gr.Image` opens every upload with PIL before the app sees it (and, with its default
`image_mode="RGB"`, decodes and re-saves non-RGB ones), so its errors are Gradio's, not these. Give
the event `preprocess=False` and call `read_image(payload["path"])`: Gradio still moves the upload
into its cache and checks the path first; and `launch(max_file_size=...)` refuses oversized uploads
before they are stored (the app's limit is the Video tab's, `video.APP_MAX_BYTES`, so an image between
the two limits is refused here, in words).
"""
from __future__ import annotations

import io
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

MAX_UPLOAD_BYTES = 25_000_000    # 25 MB: a 50 MP phone JPEG fits; PNG screenshots of 4K screens fit
MAX_PIXELS = 64_000_000          # 64 MP: below PIL's bomb warning (about 89 MP); ~200 MB once decoded
MIN_SIDE = 16                    # one ViT patch; anything smaller is upscaled noise to the model
MAX_ASPECT_RATIO = 10            # longer side / shorter side; phone panoramas are up to about 4:1 to 8:1
BACKGROUND = (255, 255, 255)     # transparent pixels become white, as most viewers show them
SUPPORTED = "JPEG, PNG, GIF, WebP, AVIF, TIFF or BMP"

_HEAD_BYTES = 4096               # enough to see past an XML prolog and comments to an <svg> tag
_PIL_FORMATS = {"JPEG": ["JPEG", "MPO"], "PNG": ["PNG"], "GIF": ["GIF"], "WebP": ["WEBP"],
                "AVIF": ["AVIF"], "TIFF": ["TIFF"], "BMP": ["BMP"]}
_MAGIC = [(b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
          (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"BM", "BMP")]
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs", b"mif1", b"msf1"}
_ORIENTATIONS_SWAPPING_SIDES = {5, 6, 7, 8}
_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}    # PIL opens some 16-bit files as 32-bit "I"


class ImageError(ValueError):
    """An image we will not read; the message says why in plain words, and what to do instead."""


def read_image(source: bytes | str | os.PathLike | Image.Image, *, max_bytes: int = MAX_UPLOAD_BYTES,
               max_pixels: int = MAX_PIXELS, target_size: int | tuple[int, int] | None = None) -> Image.Image:
    """A checked, fully loaded RGB image from file bytes, a file path, or a PIL image.

    Bytes and paths get every check before decoding (prefer them for uploads). A PIL image was
    already decoded by whoever opened it; it gets the size checks and the same normalisation.
    `target_size` means what `Transform.resize` means: an int is the shorter side, (h, w) an exact
    size; JPEGs then decode reduced to no less than that. Raises `ImageError` for any image a
    person should fix, `ValueError`/`TypeError` for a wrong call.
    """
    if not 0 < max_pixels <= Image.MAX_IMAGE_PIXELS:
        # above PIL's limit, PIL would warn or refuse on its own before our check could speak
        raise ValueError(f"max_pixels must be in 1..{Image.MAX_IMAGE_PIXELS} (PIL's bomb limit), not {max_pixels}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, not {max_bytes}")
    draft_hw = _draft_size(target_size)
    if isinstance(source, Image.Image):
        _check_dimensions(*source.size, max_pixels=max_pixels)
        with _plain_errors(source.format or "image", max_pixels=max_pixels):
            return _to_rgb(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        _check_byte_size(len(data), max_bytes)
        kind, file = _sniff(data[:_HEAD_BYTES]), io.BytesIO(data)
    elif isinstance(source, (str, os.PathLike)):
        file = Path(source)
        if not file.is_file():
            raise ImageError(f"There is no image file at {file}" + (" (it is a folder)" if file.is_dir() else ""))
        _check_byte_size(file.stat().st_size, max_bytes)
        with file.open("rb") as f:
            kind = _sniff(f.read(_HEAD_BYTES))
    else:
        raise TypeError(f"read_image takes bytes, a path or a PIL image, not {type(source).__name__}")
    with _plain_errors(kind, max_pixels=max_pixels), Image.open(file, formats=_PIL_FORMATS[kind]) as image:
        _check_dimensions(*image.size, max_pixels=max_pixels)
        on_its_side = image.getexif().get(ExifTags.Base.Orientation) in _ORIENTATIONS_SWAPPING_SIDES
        full_size = image.size[::-1] if on_its_side else image.size
        if draft_hw is not None and kind == "JPEG":    # only libjpeg can decode reduced
            h, w = draft_hw[::-1] if on_its_side else draft_hw   # the stored sides are the upright ones swapped
            image.draft("RGB", (w, h))
        picture = _to_rgb(image)
        picture.info["full_size"] = full_size
        return picture


def _draft_size(target_size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """Transform.resize-style target -> (h, w) both sides must keep after a reduced decode."""
    if target_size is None:
        return None
    hw = (target_size, target_size) if isinstance(target_size, int) else tuple(target_size)
    if len(hw) != 2 or not all(isinstance(side, int) and side > 0 for side in hw):
        raise ValueError(f"target_size must be a positive int or (h, w), not {target_size!r}")
    return hw


def _check_byte_size(size: int, max_bytes: int) -> None:
    if size == 0:
        raise ImageError("The file is empty (0 bytes): the upload may have failed; try again.")
    if size > max_bytes:
        raise ImageError(f"The file is {size / 1e6:.1f} MB; the limit is {max_bytes / 1e6:g} MB. "
                         "Save a smaller version (e.g. as JPEG) and try again.")


def _sniff(head: bytes) -> str:
    """The image format the first bytes announce, or an ImageError naming what the file is instead."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if head[4:8] == b"ftyp":
        brands = {head[i:i + 4] for i in range(8, min(int.from_bytes(head[:4], "big"), len(head)), 4)}
        if brands & {b"avif", b"avis"}:
            return "AVIF"
        if brands & _HEIF_BRANDS:
            raise ImageError("HEIC/HEIF photos (the iPhone default) are not supported: export or share the photo "
                             "as JPEG (iPhone: Settings > Camera > Formats > Most Compatible) and try again.")
        raise ImageError("This file is a video (MP4/MOV), not an image: take a screenshot of the frame you want.")
    if head.startswith(b"%PDF-"):
        raise ImageError("PDF documents are not supported: export the page as PNG or JPEG and try again.")
    text = _as_text(head)
    if text is None:
        raise ImageError(f"This file is not an image we can read: it is not {SUPPORTED}.")
    start = text.lstrip("\ufeff \t\r\n").lower()
    if "<svg" in start and not start.startswith(("<!doctype html", "<html")):
        raise ImageError("SVG drawings are not supported: export it as PNG or JPEG and try again.")
    if start.startswith(("<!doctype html", "<html")) or any(tag in start for tag in ("<html", "<head", "<body")):
        raise ImageError("This file is not an image (it looks like HTML text, e.g. a web page saved under an image "
                         "name): save the image itself, or take a screenshot.")
    raise ImageError("This file is not an image (it looks like plain text).")


def _as_text(head: bytes) -> str | None:
    if b"\x00" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as error:
        # a multi-byte character cut by the end of the head is still text
        return head[:error.start].decode("utf-8") if error.start >= len(head) - 3 else None


def _check_dimensions(width: int, height: int, *, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise ImageError(f"The image is {width}x{height} pixels ({width * height / 1e6:.1f} megapixels); the limit "
                         f"is {max_pixels / 1e6:g} megapixels. Scale it down and try again.")
    short, long = sorted((width, height))
    if short < MIN_SIDE:
        raise ImageError(f"The image is {width}x{height} pixels; it needs at least {MIN_SIDE} pixels on each side.")
    if long > MAX_ASPECT_RATIO * short:
        raise ImageError(f"The image is {width}x{height} pixels, a {long / short:.0f}:1 strip; the limit is "
                         f"{MAX_ASPECT_RATIO}:1 because the models see a centred square. "
                         "Crop the part you want explained and try again.")


@contextmanager
def _plain_errors(kind: str, *, max_pixels: int):
    """PIL's refusals while opening or decoding -> ImageError in words a person can act on."""
    try:
        yield
    except ImageError:
        raise
    except Image.DecompressionBombError as error:
        raise ImageError(f"The image declares more than {2 * Image.MAX_IMAGE_PIXELS / 1e6:.0f} megapixels (a "
                         f"'decompression bomb' or a giant scan); the limit is {max_pixels / 1e6:g} megapixels. "
                         "Scale it down and try again.") from error
    except UnidentifiedImageError as error:    # its text names a Python object, not the problem
        raise ImageError(f"The file starts like a {kind} but the rest is not: it is damaged or cut off. "
                         "Try the original file again.") from error
    except (OSError, SyntaxError, EOFError, ValueError) as error:
        if isinstance(error, EOFError) or "truncated" in str(error).lower():
            raise ImageError(f"The file is cut off (truncated {kind}): the upload or download did not finish. "
                             "Try the original file again.") from error
        raise ImageError(f"The {kind} file is damaged and cannot be decoded ({error}).") from error


def _to_rgb(image: Image.Image) -> Image.Image:
    """Any loaded mode -> a new RGB image, upright as the camera meant; the first frame only."""
    image.load()
    image = ImageOps.exif_transpose(image)    # always a new image, detached from the file
    if image.mode in _SIXTEEN_BIT_MODES:
        # PIL's own convert clips 16-bit values at 255; scale the 0..65535 range instead
        samples = np.asarray(image).astype(np.float32).clip(0, 65535)
        image = Image.fromarray(np.rint(samples / 257).astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        backdrop = Image.new("RGBA", image.size, BACKGROUND + (255,))
        image = Image.alpha_composite(backdrop, image.convert("RGBA"))
    return image if image.mode == "RGB" else image.convert("RGB")
