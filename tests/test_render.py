"""Views: drawn where the model really looked (resize + centre crop inverted), right-sized, and numerically
faithful (PCA tiles, position similarities) to formulas written out here."""
import numpy as np
import pytest
import torch
from matplotlib import colormaps
from PIL import Image

from vitviz import render
from vitviz.models import CvT, CvTConfig, CvTStageConfig, ViT, ViTConfig
from vitviz.preprocess import Transform

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def blocks_image(h: int, w: int, *, block=(11, 13), seed=0, low=0) -> np.ndarray:
    """An original whose every 11x13 block has its own random colour (not aligned to any patch)."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(low, 256, size=(h // block[0] + 1, w // block[1] + 1, 3), dtype=np.uint8)
    return np.repeat(np.repeat(colours, block[0], axis=0), block[1], axis=1)[:h, :w]


def model_pixels(transform: Transform, original: np.ndarray) -> np.ndarray:
    """What the model sees, by the real preprocessing, de-normalised back to [0, 1]: h w 3."""
    x = transform(Image.fromarray(original))[0].permute(1, 2, 0).numpy()
    return x * np.array(transform.std) + np.array(transform.mean)


def box_mean(image: np.ndarray, box) -> np.ndarray:
    """Area-weighted mean colour of an image over a fractional rectangle (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    top, left = int(np.floor(y0)), int(np.floor(x0))
    image = image[top:int(np.ceil(y1)), left:int(np.ceil(x1))].astype(np.float64)

    def weights(a, b, start, n):   # overlap of pixel k = [k, k+1) with [a, b)
        k = np.arange(start, start + n)
        return np.clip(np.minimum(k + 1, b) - np.maximum(k, a), 0, None)
    wy, wx = weights(y0, y1, top, image.shape[0]), weights(x0, x1, left, image.shape[1])
    return np.einsum('y,yxc,x->c', wy, image, wx) / (wy.sum() * wx.sum())


def tiny_vit(img_size=(64, 64)) -> ViT:
    torch.manual_seed(0)
    return ViT(ViTConfig(img_size=img_size, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10,
                         reg_tokens=2)).eval()


def tiny_cvt() -> CvT:
    torch.manual_seed(0)
    windows = ((7, 4, 2), (3, 2, 1), (3, 2, 1))
    return CvT(CvTConfig(num_classes=10, stages=tuple(
        CvTStageConfig(embed_dim=d, depth=1, num_heads=1, patch_size=k, patch_stride=s, patch_padding=p,
                       cls_token=i == 2) for i, (d, (k, s, p)) in enumerate(zip((8, 16, 24), windows))))).eval()


def canvas_for(model, transform, original) -> render.Canvas:
    trace = model.trace(transform(Image.fromarray(original)))
    return render.Canvas(original, transform, trace.embeddings)


GEOMETRIES = [   # (original h, w), transform: landscape, portrait, odd margins both ways, exact resize, non-square crop
    ((300, 451), Transform(crop=(64, 64), resize=72, mean=MEAN, std=STD)),
    ((451, 300), Transform(crop=(64, 64), resize=80, mean=MEAN, std=STD)),
    ((333, 333), Transform(crop=(64, 64), resize=75, mean=MEAN, std=STD)),
    ((333, 333), Transform(crop=(64, 64), resize=75, mean=MEAN, std=STD, crop_rounding="floor")),
    ((300, 451), Transform(crop=(64, 64), resize=(64, 64), mean=MEAN, std=STD)),
    ((300, 451), Transform(crop=(48, 80), resize=80, mean=MEAN, std=STD)),
]


def mapping_errors(canvas: render.Canvas, field: render.Field, pixels: np.ndarray, original: np.ndarray,
                   shift=(0.0, 0.0), seen: np.ndarray | None = None) -> np.ndarray:
    """|colour a token saw - mean colour of its back-mapped rectangle in the original| per token, the
    back-mapping optionally shifted by (dx, dy) input px. What a token saw: `seen` (gh gw 3, 0-1) when
    given, else the mean of the model's pixels over its receptive field (clipped to the input)."""
    h, w = pixels.shape[:2]
    errors = []
    for i in range(field.grid[0]):
        for j in range(field.grid[1]):
            x0, y0, x1, y1 = field.box(i, j)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
            colour = (seen[i, j] if seen is not None else box_mean(pixels, (x0, y0, x1, y1))) * 255
            (ox0, ox1), (oy0, oy1) = canvas.frame.to_original(np.array([x0, x1]) + shift[0],
                                                                np.array([y0, y1]) + shift[1])
            errors.append(np.abs(colour - box_mean(original, (ox0, oy0, ox1, oy1))).max())
    return np.array(errors)


def mean_colour_per_patch(model: ViT, pixels: np.ndarray) -> np.ndarray:
    """What each token's patch holds, computed by a convolution shaped like the model's own patch
    embedding whose filters average each colour channel: gh gw 3."""
    proj = model.patch_embed.proj
    conv = torch.nn.Conv2d(3, 3, proj.kernel_size, proj.stride, proj.padding, bias=False)
    with torch.no_grad():
        conv.weight.zero_()
        for c in range(3):
            conv.weight[c, c] = 1.0 / (proj.kernel_size[0] * proj.kernel_size[1])
        return conv(torch.tensor(pixels, dtype=torch.float32).permute(2, 0, 1)[None])[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("size, transform", GEOMETRIES)
def test_vit_patch_maps_back_to_where_it_was_cut_from_the_original(size, transform):
    original = blocks_image(*size)
    model = tiny_vit(transform.crop)
    canvas = canvas_for(model, transform, original)
    pixels = model_pixels(transform, original)
    field, seen = canvas.fields[0], mean_colour_per_patch(model, pixels)
    assert field.grid == seen.shape[:2]
    errors = mapping_errors(canvas, field, pixels, original, seen=seen)
    # resampling blurs block edges a little (under 1/255 on average); a mapping off by a single input
    # pixel is an order of magnitude further off
    assert errors.mean() < 1.5 and errors.max() < 3.0
    assert mapping_errors(canvas, field, pixels, original, shift=(1, 1), seen=seen).mean() > 5 * errors.mean()


@pytest.mark.parametrize("size, transform", GEOMETRIES)
def test_cvt_stage_receptive_fields_map_back_to_where_they_were_cut_from_the_original(size, transform):
    # the receptive fields themselves are checked against the convolutions' gradients below
    original = blocks_image(*size)
    canvas = canvas_for(tiny_cvt(), transform, original)
    pixels = model_pixels(transform, original)
    for field in canvas.fields:
        errors = mapping_errors(canvas, field, pixels, original)
        assert errors.mean() < 1.5 and errors.max() < 3.0, field
        assert mapping_errors(canvas, field, pixels, original, shift=(1, 1)).mean() > 5 * errors.mean(), field


def test_cvt_receptive_fields_equal_the_gradient_support_of_the_chained_embedding_convolutions():
    model, transform = tiny_cvt(), Transform(crop=(64, 48), resize=64, mean=MEAN, std=STD)   # portrait crop
    canvas = canvas_for(model, transform, blocks_image(300, 451))
    pixels = torch.randn(1, 3, 64, 48, requires_grad=True)
    x = pixels
    for stage, field in zip(model.stages, canvas.fields):
        x = stage.patch_embed.proj(x)   # the embedding convolutions alone: attention would mix everything
        assert tuple(x.shape[2:]) == field.grid
        for i, j in [(0, 0), (1, 2), (field.grid[0] - 1, field.grid[1] - 1), (field.grid[0] // 2, 1)]:
            grad, = torch.autograd.grad(x[0, :, i, j].sum(), pixels, retain_graph=True)
            rows, cols = np.nonzero(grad[0].abs().sum(0).numpy())
            x0, y0, x1, y1 = field.box(i, j)
            assert (rows.min(), rows.max() + 1) == (max(y0, 0), min(y1, 64))
            assert (cols.min(), cols.max() + 1) == (max(x0, 0), min(x1, 48))


def test_vit_patches_equal_the_gradient_support_of_the_patch_embedding():
    model = tiny_vit()
    canvas = canvas_for(model, Transform(crop=(64, 64), resize=72, mean=MEAN, std=STD), blocks_image(300, 451))
    field, pixels = canvas.fields[0], torch.randn(1, 3, 64, 64, requires_grad=True)
    x = model.patch_embed(pixels)
    for i, j in [(0, 0), (3, 5), (7, 7)]:
        grad, = torch.autograd.grad(x[0, :, i, j].sum(), pixels, retain_graph=True)
        rows, cols = np.nonzero(grad[0].abs().sum(0).numpy())
        assert (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1) == field.box(i, j)


def test_a_one_hot_map_drawn_nearest_lights_exactly_its_back_mapped_patch():
    h, w = 300, 451
    transform = Transform(crop=(64, 64), resize=72, mean=MEAN, std=STD)
    original = np.full((h, w, 3), 200, np.uint8)
    canvas = canvas_for(tiny_vit(), transform, original)
    one_hot = np.zeros((8, 8))
    one_hot[2, 5] = 1.0
    view = render.overlay(canvas, one_hot, mode="nearest", style="mask")
    # the patch, by the preprocessing's arithmetic: resized 72 x 108, centre crop 64 at (4, 22)
    scale = h / 72
    crop = view[int(4 * scale) + 1:int(68 * scale), int(22 * scale) + 1:int(86 * scale)]
    lit_rows, lit_cols = np.nonzero(crop.sum(axis=2) > 450)
    lit_rows, lit_cols = lit_rows + int(4 * scale) + 1, lit_cols + int(22 * scale) + 1
    assert (lit_cols.min(), lit_cols.max() + 1) == pytest.approx(((22 + 40) * scale, (22 + 48) * scale), abs=1)
    assert (lit_rows.min(), lit_rows.max() + 1) == pytest.approx(((4 + 16) * scale, (4 + 24) * scale), abs=1)


@pytest.mark.parametrize("size", [(300, 451), (451, 300)])
def test_views_have_the_original_size_and_shade_what_the_crop_removed(size):
    h, w = size
    transform = Transform(crop=(64, 64), resize=64, mean=MEAN, std=STD)
    original = blocks_image(h, w, low=120)
    vit, cvt = tiny_vit(), tiny_cvt()
    pixels = transform(Image.fromarray(original))
    vit_trace, cvt_trace = vit.trace(pixels), cvt.trace(pixels)
    vc = render.Canvas(original, transform, vit_trace.embeddings)
    cc = render.Canvas(original, transform, cvt_trace.embeddings)
    rng = np.random.default_rng(0)
    views = [render.overlay(vc, rng.random((8, 8))), render.overlay(cc, torch.rand(1, 4, 4), mode="nearest"),
             render.overlay(vc, rng.random((8, 8)), style="mask"),
             render.patch_grid(vc, prefix_kinds=vit.config.prefix_kinds, point=(w / 2, h / 2)),
             *render.stage_grids(cc, point=(w / 2, h / 2)),
             *[render.stage_pca(cc, f, stage=s) for s, f in enumerate(cvt_trace.features)],
             render.feature_norm(cc, cvt_trace.features[0], stage=0),
             render.token_norm_map(vc, rng.random((8, 8)) + 1)]
    # the crop keeps the central min(h, w) square: the bands beside it were never seen
    band = (slice(None), slice(0, (w - h) // 2 - 2)) if w > h else (slice(0, (h - w) // 2 - 2), slice(None))
    for view in views:
        assert view.shape == (h, w, 3) and view.dtype == np.uint8
        assert view[band].mean() < 0.6 * original[band].mean()


def test_a_huge_original_is_drawn_at_the_display_size_with_its_aspect():
    transform = Transform(crop=(64, 64), resize=64, mean=MEAN, std=STD)
    original = blocks_image(1000, 3000)
    canvas = canvas_for(tiny_vit(), transform, original)
    assert canvas.size == (256, 768)
    assert render.overlay(canvas, np.random.rand(8, 8)).shape == (256, 768, 3)
    # the geometry is exact in the scaled frame: the seen square is the central 256 x 256
    x0, y0, x1, y1 = canvas.frame.box_to_display(canvas.frame.seen_box(canvas.fields[0]))
    assert (x0, y0, x1, y1) == pytest.approx((256, 0, 512, 256), abs=0.2)


def test_a_display_point_picks_the_token_under_it_in_both_models_and_none_outside_the_crop():
    transform = Transform(crop=(64, 64), resize=72, mean=MEAN, std=STD)
    original = blocks_image(300, 451)
    vc, cc = canvas_for(tiny_vit(), transform, original), canvas_for(tiny_cvt(), transform, original)
    rng = np.random.default_rng(1)
    x0, y0, x1, y1 = vc.frame.box_to_display(vc.frame.seen_box(vc.fields[0]))
    for x, y in zip(rng.uniform(x0, x1, 50), rng.uniform(y0, y1, 50)):
        i, j = vc.token_at((x, y), vc.fields[0])
        bx0, by0, bx1, by1 = vc.frame.box_to_display(vc.fields[0].box(i, j))
        assert bx0 <= x < bx1 and by0 <= y < by1
        for field in cc.fields:   # nearest receptive-field centre: within half a stride
            i, j = cc.token_at((x, y), field)
            cx, cy = cc.frame.to_display(field.centre(j), field.centre(i))
            half = cc.frame.to_display(field.stride / 2, 0)[0] - cc.frame.to_display(0, 0)[0]
            assert abs(cx - x) <= half + 1e-6 or j in (0, field.grid[1] - 1)
            assert abs(cy - y) <= half + 1e-6 or i in (0, field.grid[0] - 1)
    assert vc.token_at((x0 - 3, (y0 + y1) / 2), vc.fields[0]) is None
    assert cc.token_at((x1 + 3, (y0 + y1) / 2), cc.fields[2]) is None


def test_filter_components_match_numpy_svd_of_the_centred_filters():
    rng = np.random.default_rng(0)
    for weight in (rng.normal(size=(96, 3, 4, 4)), rng.normal(size=(16, 3, 7, 7))):   # more filters / more pixels
        flat = weight.reshape(len(weight), -1)
        _, _, vt = np.linalg.svd(flat - flat.mean(axis=0), full_matrices=False)
        count = min(10, len(weight) - 1)
        ours = render.filter_components(torch.tensor(weight), count=count)
        for k in range(count):
            component = vt[k].reshape(3, weight.shape[2], weight.shape[3]).transpose(1, 2, 0)
            expected = (component - component.min()) / (component.max() - component.min())
            # a principal component's sign is arbitrary: flipping it turns t into 1 - t
            assert np.allclose(ours[k], expected, atol=1e-6) or np.allclose(ours[k], 1 - expected, atol=1e-6)
        tiles = render.filter_tiles(weight, count=count, cols=5, tile_px=weight.shape[2] * 8)
        gap = max(2, 8 // 4)
        assert np.array_equal(tiles[gap:gap + 8:8, gap:gap + 8 * weight.shape[3]:8], np.round(ours[0] * 255)[:1])


def test_embedding_filters_are_the_first_pixel_convolution_of_each_model():
    vit, cvt = tiny_vit(), tiny_cvt()
    assert np.array_equal(render.embedding_filters(vit), vit.patch_embed.proj.weight.detach().numpy())
    assert render.embedding_filters(cvt).shape == (8, 3, 7, 7)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_position_similarity_tiles_match_the_cosine_formula(no_embed_class):
    torch.manual_seed(0)
    vit = ViT(ViTConfig(img_size=(32, 48), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3,
                        reg_tokens=2, no_embed_class=no_embed_class))
    pos, grid = render.position_embedding(vit)
    assert grid == (4, 6)
    slots = vit.pos_embed[0].detach().numpy()
    patches = slots if no_embed_class else slots[3:]   # cls + 2 registers hold the first slots
    similarity = render.position_similarity(pos, grid)
    for (i, j), (i2, j2) in [((0, 0), (0, 0)), ((1, 2), (3, 5)), ((3, 0), (0, 4))]:
        a, b = patches[i * 6 + j], patches[i2 * 6 + j2]
        assert similarity[i, j, i2, j2] == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), abs=1e-6)
    tiles = render.position_tiles(render.position_embedding(vit), side=240)
    factor = 240 // 6 // 6
    gap = factor // 2 + 1
    viridis = colormaps["viridis"].resampled(256)
    y = gap + 1 * (4 * factor + gap) + 3 * factor   # tile (1, 2), cell (3, 5)
    x = gap + 2 * (6 * factor + gap) + 5 * factor
    expected = np.round(np.array(viridis(int(round((similarity[1, 2, 3, 5] + 1) / 2 * 255)))[:3]) * 255)
    assert np.abs(tiles[y, x].astype(int) - expected).max() <= 1


def test_cvt_has_no_position_embedding_and_its_panel_is_an_image():
    cvt = tiny_cvt()
    assert render.position_embedding(cvt) is None
    panel = render.position_tiles(render.position_embedding(cvt))
    assert panel.dtype == np.uint8 and panel.ndim == 3 and panel.shape[2] == 3 and panel.std() > 0


def test_stage_pca_colours_are_the_first_three_principal_component_scores():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(12, 5, 7)) * np.arange(1, 13)[:, None, None]   # distinct variances
    rgb = render.feature_pca(features)
    tokens = features.reshape(12, -1).T
    u, s, _ = np.linalg.svd(tokens - tokens.mean(axis=0), full_matrices=False)
    for k in range(3):
        scores = (u[:, k] * s[k]).reshape(5, 7)
        for signed in (scores, -scores):
            low, high = np.percentile(signed, [1, 99])
            if np.allclose(rgb[..., k], np.clip((signed - low) / (high - low), 0, 1), atol=1e-5):
                break
        else:
            raise AssertionError(f"channel {k} is not principal component {k}")


def test_outlier_tokens_flags_only_the_injected_high_norm_tokens():
    rng = np.random.default_rng(0)
    norms = rng.normal(10, 0.5, size=(14, 14))
    norms[3, 4], norms[9, 1] = 60.0, 45.0
    expected = np.zeros((14, 14), bool)
    expected[3, 4] = expected[9, 1] = True
    assert np.array_equal(render.outlier_tokens(norms), expected)


def test_caption_adds_a_strip_under_the_image_and_leaves_the_image_untouched():
    image = blocks_image(120, 300)
    out = render.caption(image, model="ViT-B/16", method="attention rollout", layer=12, head="mean",
                         target="tabby cat", note="a long note " * 12)
    assert out.shape[1] == 300 and out.shape[0] > 120 and np.array_equal(out[:120], image)
    assert out[120:].std() > 0   # text was written


def test_colour_bar_runs_from_vmax_at_the_top_to_vmin_at_the_bottom():
    strip = render.colorbar(300, vmin=0.0, vmax=2.0, cmap="viridis")
    lut = np.round(colormaps["viridis"].resampled(256)(np.arange(256))[:, :3] * 255)
    bar = strip[:, strip.shape[1] // 8]
    rows = np.nonzero(np.abs(bar[:, None].astype(int) - lut[None]).sum(-1).min(axis=1) <= 3)[0]
    top, bottom = bar[rows.min()].astype(int), bar[rows.max()].astype(int)
    assert np.abs(top - lut[-1]).max() <= 3 and np.abs(bottom - lut[0]).max() <= 3


def test_shipped_colour_maps_are_matplotlibs_tables_and_other_names_still_come_from_matplotlib():
    from vitviz.render.overlay import SHIPPED_CMAPS, colormap
    with np.load(SHIPPED_CMAPS) as shipped:
        names = shipped.files
    assert {render.DEFAULT_CMAP, render.SIGNED_CMAP, "viridis", "turbo", "magma"} <= set(names)
    for name in names:
        lut = np.round(colormaps[name].resampled(256)(np.arange(256))[:, :3] * 255).astype(np.uint8)
        assert np.array_equal(colormap(name), lut), name
    plasma = np.round(colormaps["plasma"].resampled(256)(np.arange(256))[:, :3] * 255).astype(np.uint8)
    assert "plasma" not in names and np.array_equal(colormap("plasma"), plasma)
    with pytest.raises(ValueError, match="unknown colour map 'no-such-map'"):
        colormap("no-such-map")


def test_shared_scale_spans_every_map_and_per_uniform_has_mean_one():
    a, b = np.array([[0.0, 2.0]]), torch.tensor([[1.0, 5.0]])
    assert render.shared_scale(a, b) == (0.0, 5.0)
    assert render.per_uniform(b).mean() == pytest.approx(1.0)


def test_plots_are_rgb_images_and_reject_mismatched_curves():
    distance = render.attention_distance_plot({"ViT": [[10, 20, 30]] * 4, "CvT": [[5], [8, 9, 10], [30] * 6]})
    assert distance.dtype == np.uint8 and distance.shape[2] == 3
    f = np.linspace(0, 1, 11)
    faith = render.faithfulness_plot(fractions=f, deletion={"rollout": 1 - f, "random": 1 - f},
                                     insertion={"rollout": f, "random": f})
    assert faith.dtype == np.uint8 and faith.shape[2] == 3
    with pytest.raises(ValueError, match="points"):
        render.faithfulness_plot(fractions=f, deletion={"rollout": f[:5]}, insertion={"rollout": f})


def test_a_token_map_of_no_grid_of_the_model_is_refused_with_the_grids_it_could_be():
    canvas = canvas_for(tiny_cvt(), Transform(crop=(64, 64), resize=72, mean=MEAN, std=STD), blocks_image(300, 451))
    with pytest.raises(ValueError, match=r"\(16, 16\), \(8, 8\), \(4, 4\)"):
        render.overlay(canvas, np.zeros((7, 7)))
