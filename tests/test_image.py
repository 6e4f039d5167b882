"""read_image: every bad file a public demo gets, made here (no downloads), refused in words or read correctly.

Expected pixels are written out from the definitions (alpha compositing, 16-bit scaling, EXIF
orientation meanings), not taken from the code under test.
"""
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from vitviz.image import MAX_UPLOAD_BYTES, MIN_SIDE, ImageError, read_image

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def noisy(width: int, height: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


def quadrants(width: int, height: int) -> Image.Image:
    """Top-left red, top-right green, bottom-left blue, bottom-right white."""
    pixels = np.empty((height, width, 3), np.uint8)
    h, w = height // 2, width // 2
    pixels[:h, :w], pixels[:h, w:], pixels[h:, :w], pixels[h:, w:] = RED, GREEN, BLUE, WHITE
    return Image.fromarray(pixels)


def solid_gray_jpeg(width: int, height: int) -> bytes:
    """A real baseline JPEG, mid-gray everywhere, written by hand so that a giant one costs no memory.

    Grayscale, quantisation 1, and Huffman tables with one 1-bit code each (DC difference 0; end of
    block): every 8x8 block is the two bits '00', so the scan is zero bytes (padded with 1-bits).
    """
    blocks = -(-width // 8) * -(-height // 8)
    full_bytes, rest = divmod(blocks, 4)
    scan = bytes(full_bytes) + (bytes([0xFF >> (2 * rest)]) if rest else b"")

    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    one_code = bytes([1] + [0] * 15) + b"\x00"
    return (b"\xff\xd8" + segment(0xDB, b"\x00" + bytes([1] * 64))
            + segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
            + segment(0xC4, b"\x00" + one_code) + segment(0xC4, b"\x10" + one_code)
            + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + scan + b"\xff\xd9")


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def gray_png(width: int, height: int, *, rows: int) -> bytes:
    """An 8-bit grayscale PNG declaring width x height whose data holds `rows` rows of zeros."""
    compressor, row = zlib.compressobj(9), bytes(width + 1)    # filter byte + pixels
    data = b"".join(compressor.compress(row) for _ in range(rows)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b"")


def refusal(source, **options) -> str:
    with pytest.raises(ImageError) as caught:
        read_image(source, **options)
    return str(caught.value)


@pytest.fixture
def no_decoding(monkeypatch):
    """Any pixel decode fails the test: refusals must come from headers alone."""
    def load(self):
        raise AssertionError("pixels were decoded before the image was checked")
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


# --- not images at all ---------------------------------------------------------------------------

def test_empty_file_is_refused_as_empty(tmp_path):
    (tmp_path / "photo.jpg").write_bytes(b"")
    assert "empty" in refusal(b"")
    assert "empty" in refusal(tmp_path / "photo.jpg")


def test_text_renamed_jpg_is_refused_as_plain_text(tmp_path):
    (tmp_path / "photo.jpg").write_text("Dear diary, today I took a photo. \u00e9\u00e8" * 200)
    message = refusal(tmp_path / "photo.jpg")
    assert "not an image" in message and "plain text" in message


@pytest.mark.parametrize("page", ["<!DOCTYPE html>\n<html><body><img src='cat.jpg'></body></html>",
                                  "\n  <html lang='en'><head><title>403 Forbidden</title></head></html>"])
def test_html_renamed_jpg_is_refused_as_html(tmp_path, page):
    (tmp_path / "cat.jpg").write_text(page)
    message = refusal(tmp_path / "cat.jpg")
    assert "not an image" in message and "HTML" in message


@pytest.mark.parametrize("drawing", [
    '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>',
    '<?xml version="1.0"?>\n<!-- Created with Inkscape -->\n<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "">\n'
    '<svg xmlns="http://www.w3.org/2000/svg"></svg>'])
def test_svg_is_refused_with_export_advice(drawing):
    message = refusal(drawing.encode())
    assert "SVG" in message and "PNG or JPEG" in message


def test_pdf_is_refused_with_export_advice():
    message = refusal(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\nendobj\n")
    assert "PDF" in message and "PNG or JPEG" in message


def test_iphone_heic_photo_is_refused_with_jpeg_advice():
    heic = struct.pack(">I", 24) + b"ftypheic" + bytes(4) + b"mif1heic" + bytes(64)
    message = refusal(heic)
    assert "HEIC" in message and "JPEG" in message


def test_mp4_video_is_refused_as_a_video():
    assert "video" in refusal(struct.pack(">I", 24) + b"ftypisom" + bytes(4) + b"isomavc1" + bytes(64))


def test_unknown_binary_is_refused_listing_supported_formats():
    message = refusal(b"PK\x03\x04" + bytes(range(256)) * 4)
    assert "not an image" in message and "JPEG, PNG" in message


def test_missing_file_and_folder_are_refused_in_words(tmp_path):
    assert "no image file" in refusal(tmp_path / "nowhere.jpg")
    assert "folder" in refusal(tmp_path)


# --- too big, too small, damaged -----------------------------------------------------------------

def test_file_above_upload_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "huge.png"
    with big.open("wb") as f:
        f.truncate(MAX_UPLOAD_BYTES + 1)    # sparse zeros: reading it would say "not an image" instead
    message = refusal(big)
    assert "MB" in message and "limit is 25 MB" in message
    small_png = encoded(noisy(64, 64), "PNG")
    assert "limit is 0.001 MB" in refusal(small_png, max_bytes=1000)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_jpeg_and_png_are_refused_as_cut_off(fmt):
    whole = encoded(noisy(64, 64), fmt)
    message = refusal(whole[:len(whole) // 2])
    assert "cut off" in message and fmt in message
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_png_cut_inside_its_header_is_refused_as_damaged():
    message = refusal(encoded(noisy(64, 64), "PNG")[:30])
    assert "starts like a PNG" in message and "damaged" in message


def test_decompression_bomb_is_refused_from_its_header_without_decoding(no_decoding):
    bomb = gray_png(9000, 9000, rows=9000)    # ~80 KB of deflated zeros that would decode to 81 megapixels
    assert len(bomb) < 200_000
    message = refusal(bomb)
    assert "9000x9000" in message and "limit is 64 megapixels" in message


def test_png_declaring_60000x60000_is_refused_by_pil_bomb_guard_in_words(no_decoding):
    max_before = Image.MAX_IMAGE_PIXELS
    message = refusal(gray_png(60000, 60000, rows=1))
    assert "decompression bomb" in message and "limit is 64 megapixels" in message
    assert Image.MAX_IMAGE_PIXELS == max_before


def test_image_in_pil_bomb_warning_band_is_refused_by_pixel_limit(no_decoding):
    with pytest.warns(Image.DecompressionBombWarning):
        message = refusal(gray_png(10000, 10000, rows=1))
    assert "10000x10000" in message and "limit is 64 megapixels" in message


def test_hand_written_jpeg_is_a_real_decodable_jpeg():
    image = Image.open(io.BytesIO(solid_gray_jpeg(37, 21)))
    assert np.array_equal(np.asarray(image), np.full((21, 37), 128, np.uint8))


def test_real_20000x20000_jpeg_is_refused_by_pixel_limit(no_decoding):
    giant = solid_gray_jpeg(20000, 20000)    # 1.6 MB on disk, 400 megapixels decoded
    message = refusal(giant)
    assert "megapixels" in message and "limit is 64" in message


@pytest.mark.parametrize("size", [(1, 1), (3, 5000), (5000, 3), (MIN_SIDE - 1, 100)])
def test_tiny_or_thin_images_are_refused_with_their_size(size):
    message = refusal(encoded(Image.new("RGB", size, RED), "PNG"))
    assert f"{size[0]}x{size[1]} pixels" in message and f"at least {MIN_SIDE} pixels" in message


def test_extreme_aspect_ratio_is_refused_with_crop_advice():
    message = refusal(encoded(Image.new("RGB", (500, 20), RED), "PNG"))
    assert "25:1" in message and "Crop" in message


@pytest.mark.parametrize("size", [(MIN_SIDE, MIN_SIDE), (MIN_SIDE, 10 * MIN_SIDE), (10 * MIN_SIDE, MIN_SIDE)])
def test_images_at_the_size_limits_are_read(size):
    assert read_image(encoded(Image.new("RGB", size, RED), "PNG")).size == size


def test_pixel_limit_is_inclusive():
    assert read_image(encoded(Image.new("RGB", (100, 100)), "PNG"), max_pixels=100 * 100).size == (100, 100)
    assert "100x101" in refusal(encoded(Image.new("RGB", (100, 101)), "PNG"), max_pixels=100 * 100)


# --- every kind of real image becomes the right RGB ----------------------------------------------

def test_grayscale_becomes_rgb_with_equal_channels():
    gray = np.tile(np.arange(0, 256, 8, dtype=np.uint8), (32, 1))
    rgb = np.asarray(read_image(encoded(Image.fromarray(gray), "PNG")))
    assert rgb.shape == (32, 32, 3) and all(np.array_equal(rgb[..., c], gray) for c in range(3))


def over_white(color, alpha):
    return [round(alpha / 255 * c + (1 - alpha / 255) * 255) for c in color]


def test_rgba_transparency_is_composited_on_white():
    pixels = np.zeros((32, 32, 4), np.uint8)
    pixels[:16] = (255, 0, 0, 0)            # invisible red
    pixels[16:, :16] = (0, 0, 255, 255)     # opaque blue
    pixels[16:, 16:] = (0, 0, 0, 128)       # half-transparent black
    rgb = np.asarray(read_image(encoded(Image.fromarray(pixels), "PNG"))).astype(int)
    assert rgb[0, 0].tolist() == list(WHITE)
    assert rgb[20, 0].tolist() == list(BLUE)
    assert np.abs(rgb[20, 20] - over_white((0, 0, 0), 128)).max() <= 1


def test_gray_with_alpha_is_composited_on_white():
    pixels = np.zeros((32, 32, 2), np.uint8)
    pixels[..., 0], pixels[..., 1] = 0, 64
    rgb = np.asarray(read_image(encoded(Image.fromarray(pixels, "LA"), "PNG"))).astype(int)
    assert np.abs(rgb[5, 5] - over_white((0, 0, 0), 64)).max() <= 1


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_palette_transparency_is_composited_on_white(fmt):
    indices = np.zeros((32, 32), np.uint8)
    indices[16:] = 1
    image = Image.fromarray(indices, "P")
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    rgb = np.asarray(read_image(encoded(image, fmt, transparency=0)))
    assert rgb[0, 0].tolist() == list(WHITE) and rgb[20, 0].tolist() == list(BLUE)


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grayscale_is_scaled_to_8_bits_not_clipped(fmt):
    levels = np.array([0, 257, 32896, 65535], np.uint16)    # = 0, 1, 128, 255 times 257
    sixteen = Image.fromarray(np.repeat(np.tile(levels, (16, 1)), 4, axis=1))
    rgb = np.asarray(read_image(encoded(sixteen, fmt)))
    assert rgb[0, ::4, 0].tolist() == [0, 1, 128, 255]


def test_cmyk_jpeg_becomes_rgb():
    cmyk = Image.new("CMYK", (32, 32), (0, 255, 255, 0))    # no cyan, full magenta and yellow: red
    cmyk.paste((255, 0, 0, 0), (0, 16, 32, 32))             # full cyan: (0, 255, 255)
    rgb = np.asarray(read_image(encoded(cmyk, "JPEG", quality=95))).astype(int)
    assert np.abs(rgb[4, 4] - RED).max() < 20 and np.abs(rgb[28, 4] - (0, 255, 255)).max() < 20


@pytest.mark.parametrize("orientation, red_at", [
    (3, "bottom-right"),    # rotated 180
    (6, "top-right"),       # the camera was turned clockwise: display = stored turned 90 degrees clockwise
    (8, "bottom-left"),     # display = stored turned 90 degrees counter-clockwise
])
def test_exif_orientation_is_applied_as_the_camera_meant(orientation, red_at):
    stored = Image.new("RGB", (48, 32), BLUE)                # wide as stored
    stored.paste(RED, (0, 0, 24, 16))                        # top-left quarter red
    exif = Image.Exif()
    exif[0x0112] = orientation
    upright = read_image(encoded(stored, "JPEG", quality=95, exif=exif.tobytes()))
    width, height = upright.size
    assert (width, height) == ((48, 32) if orientation == 3 else (32, 48))
    corners = {"top-left": (4, 4), "top-right": (width - 5, 4), "bottom-left": (4, height - 5),
               "bottom-right": (width - 5, height - 5)}
    for corner, xy in corners.items():
        expected = RED if corner == red_at else BLUE
        assert np.abs(np.asarray(upright.getpixel(xy)) - expected).max() < 30, corner


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_animation_gives_its_first_frame(fmt):
    frames = [Image.new("RGB", (32, 32), color) for color in (RED, GREEN, BLUE)]
    options = {"lossless": True} if fmt == "WEBP" else {}
    animation = encoded(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, **options)
    assert Image.open(io.BytesIO(animation)).n_frames == 3
    assert np.asarray(read_image(animation))[16, 16].tolist() == list(RED)


@pytest.mark.parametrize("fmt, options, tolerance", [
    ("WEBP", {"lossless": True}, 0), ("TIFF", {}, 0), ("BMP", {}, 0), ("PNG", {}, 0),
    ("JPEG", {"quality": 95}, 30), ("AVIF", {"quality": 90}, 30)])
def test_each_supported_format_reads_as_rgb(fmt, options, tolerance):
    reference = quadrants(64, 48)
    image = read_image(encoded(reference, fmt, **options))
    assert image.mode == "RGB" and image.size == (64, 48)
    for xy in [(8, 8), (56, 8), (8, 40), (56, 40)]:
        assert np.abs(np.subtract(image.getpixel(xy), reference.getpixel(xy))).max() <= tolerance


def test_phone_mpo_jpeg_gives_its_main_picture():
    main, second = Image.new("RGB", (32, 32), RED), Image.new("RGB", (32, 32), BLUE)
    mpo = encoded(main, "MPO", save_all=True, append_images=[second], quality=95)
    for target_size in (None, 16):
        image = read_image(mpo, target_size=target_size)
        assert np.abs(np.subtract(image.getpixel((8, 8)), RED)).max() < 5


def test_format_comes_from_content_not_file_name(tmp_path):
    (tmp_path / "actually_png.jpg").write_bytes(encoded(quadrants(32, 32), "PNG"))
    assert read_image(tmp_path / "actually_png.jpg").getpixel((0, 0)) == RED
    assert read_image(str(tmp_path / "actually_png.jpg")).getpixel((0, 0)) == RED


def test_pil_image_gets_the_same_checks_and_normalisation():
    rgba = Image.new("RGBA", (32, 32), (255, 0, 0, 0))
    assert read_image(rgba).getpixel((0, 0)) == WHITE
    assert rgba.mode == "RGBA"    # the caller's image is left as it was
    assert "at least" in refusal(Image.new("RGB", (1, 1)))


def test_result_is_detached_from_the_file(tmp_path):
    (tmp_path / "a.png").write_bytes(encoded(quadrants(32, 32), "PNG"))
    image = read_image(tmp_path / "a.png")
    (tmp_path / "a.png").unlink()
    assert image.getpixel((31, 31)) == WHITE and not isinstance(image, ImageFile.ImageFile)


# --- decoding large JPEGs reduced ----------------------------------------------------------------

@pytest.fixture(scope="module")
def photo_4000x3000() -> bytes:
    x, y = np.linspace(0, 255, 4000), np.linspace(0, 255, 3000)[:, None]    # smooth gradients, like a sky
    pixels = np.empty((3000, 4000, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = x, y, (x + y) / 2
    return encoded(Image.fromarray(pixels), "JPEG", quality=90)


@pytest.mark.parametrize("target_size, expected", [
    ((224, 224), (500, 375)),    # 1/8: both sides still >= 224
    (224, (500, 375)),           # int = shorter side, as in Transform.resize
    (384, (1000, 750)),          # 1/4: 1/8 would give 375 < 384 on the shorter side
    ((400, 600), (1000, 750)),   # (h, w): 3000/400 and 4000/600 allow 1/4 at most
    (3000, (4000, 3000))])       # nothing to save: full decode
def test_large_jpeg_decodes_reduced_but_never_below_target(photo_4000x3000, target_size, expected):
    image = read_image(photo_4000x3000, target_size=target_size)
    assert image.size == expected and image.mode == "RGB"
    assert image.info["full_size"] == (4000, 3000)   # what the browser shows, where clicks land


def test_reduced_decode_is_close_to_full_decode_then_resize(photo_4000x3000):
    reduced = np.asarray(read_image(photo_4000x3000, target_size=224)).astype(int)
    full = read_image(photo_4000x3000).resize((500, 375), Image.BOX)
    difference = np.abs(reduced - np.asarray(full))
    assert difference.mean() < 0.5 and difference.max() <= 4


def test_small_jpeg_is_not_upscaled_by_target_size():
    assert read_image(encoded(noisy(300, 200), "JPEG"), target_size=224).size == (300, 200)


def test_reduced_decode_of_a_sideways_photo_reduces_its_stored_sides():
    exif = Image.Exif()
    exif[0x0112] = 6                          # stored 1600x800, shown 800 wide and 1600 tall
    sideways = encoded(quadrants(1600, 800), "JPEG", exif=exif.tobytes())
    image = read_image(sideways, target_size=(400, 200))    # shown (h, w) must stay >= (400, 200)
    assert image.size == (200, 400)           # 1/4 of each side; matching unswapped sides only allows 1/2
    assert image.info["full_size"] == (800, 1600)


def test_wrong_calls_raise_value_or_type_error_not_image_error():
    png = encoded(noisy(32, 32), "PNG")
    for bad_call in [lambda: read_image(png, max_pixels=Image.MAX_IMAGE_PIXELS + 1),
                     lambda: read_image(png, target_size=0), lambda: read_image(png, target_size=(1, 2, 3)),
                     lambda: read_image(png, max_bytes=0)]:
        with pytest.raises(ValueError) as caught:
            bad_call()
        assert not isinstance(caught.value, ImageError)
    with pytest.raises(TypeError):
        read_image(12345)
