"""A CvT's (or any model's) per-stage token features: first three principal components as RGB, per-token
L2 norm, and the most active channels. `features` is one entry of `Trace.features` (c h w, batch 1).

`foreground_pca` is the DINOv2 paper's picture (Oquab et al. 2023, fig. 1): a first PCA over the
image's patch features splits foreground from background by the sign of the first component; a
second PCA over the foreground patches alone gives their RGB, the background black. The first
component's sign is arbitrary, so which side is the foreground needs a rule; the one here is that
the background is the side holding more of the grid's border tokens (a photo's subject rarely fills
its edges; a tie leaves the positive side the foreground). The threshold is 0, the component's mean
over the image, as in the paper.
"""
from __future__ import annotations

import cv2
import numpy as np
from einops import rearrange

from .anatomy import pca, token_norm_map
from .canvas import Canvas, as_map
from .captions import put_text, tile
from .overlay import DEFAULT_CMAP, overlay

PCA_CLIP = (1.0, 99.0)   # percentiles each component is stretched between, so a few extreme tokens don't wash it out


def feature_pca(features) -> np.ndarray:
    """c h w features -> h w 3 in [0, 1]: the tokens' scores on the first three principal components
    (centred over the stage's tokens), each stretched between its 1st and 99th percentile."""
    fmap = as_map(features, channels=True)
    h, w = fmap.shape[1:]
    unit = _rgb(pca(rearrange(fmap, 'c h w -> (h w) c'), 3)[0])
    return rearrange(unit, '(h w) k -> h w k', h=h, w=w).astype(np.float32)


def _rgb(scores: np.ndarray) -> np.ndarray:
    """n k principal-component scores -> n 3 in [0, 1], each stretched between its PCA_CLIP percentiles;
    fewer than 3 components (too few channels or tokens): black."""
    scores = np.pad(scores, ((0, 0), (0, 3 - scores.shape[1])))
    low, high = np.percentile(scores, PCA_CLIP, axis=0)
    return np.clip((scores - low) / np.where(high > low, high - low, 1.0), 0.0, 1.0)


def foreground_pca(features) -> tuple[np.ndarray, np.ndarray]:
    """c h w patch features -> (h w 3 colours in [0, 1], h w bool foreground): the DINOv2 picture (see above)."""
    fmap = as_map(features, channels=True)
    h, w = fmap.shape[1:]
    tokens = rearrange(fmap, 'c h w -> (h w) c')
    positive = pca(tokens, 1)[0][:, 0] > 0
    border = np.ones((h, w), bool)
    border[1:-1, 1:-1] = False
    border = border.ravel()
    foreground = ~positive if positive[border].mean() > 0.5 else positive
    rgb = np.zeros((h * w, 3))
    if foreground.sum() > 1:
        rgb[foreground] = _rgb(pca(tokens[foreground], 3)[0])
    return (rearrange(rgb, '(h w) k -> h w k', h=h, w=w).astype(np.float32),
            rearrange(foreground, '(h w) -> h w', h=h, w=w))


def foreground_pca_view(canvas: Canvas, features, *, stage: int) -> tuple[np.ndarray, np.ndarray]:
    """(`foreground_pca` on the image: the foreground tokens' colours, the background black; the h w foreground)."""
    field = canvas.fields[stage]
    rgb, foreground = foreground_pca(features)
    seen = canvas.seen_slices(field)
    coloured = canvas.sample(rgb, field, at=seen)
    out = canvas.shaded(field).copy()
    out[seen] = np.round(np.clip(coloured, 0.0, 1.0) * 255).astype(np.uint8)
    return out, foreground


def stage_pca(canvas: Canvas, features, *, stage: int, mode: str = "bilinear") -> np.ndarray:
    """The stage's first three principal components as the red, green and blue of the image region
    the model saw (tokens with similar features get similar colours)."""
    field = canvas.fields[stage]
    seen = canvas.seen_slices(field)   # a rectangle: sampled and written by slices, not through a mask
    rgb = canvas.sample(feature_pca(features), field, mode=mode, at=seen)
    out = canvas.shaded(field).copy()
    out[seen] = cv2.convertScaleAbs(rgb, alpha=255)   # rgb is in [0, 1]: one pass for np.round(rgb * 255)
    return out


def feature_norm(canvas: Canvas, features, *, stage: int) -> np.ndarray:
    """Per-token L2 norm of the stage's features, high-norm outliers flagged."""
    return token_norm_map(canvas, np.linalg.norm(as_map(features, channels=True), axis=0), field=stage)


def channel_gallery(canvas: Canvas, features, *, stage: int, count: int = 8, cols: int = 4, side: int = 224,
                    cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """The `count` channels with the highest mean activation over the stage's tokens, each over a
    thumbnail of the image on its own colour scale, labelled with its index and mean."""
    fmap = as_map(features, channels=True)
    means = fmap.mean(axis=(1, 2))
    thumb = canvas.thumbnail(side)
    tiles = []
    for c in np.argsort(-means)[:count]:
        view = overlay(thumb, fmap[c], field=stage, cmap=cmap, alpha=0.7)
        put_text(view, f"channel {c}, mean {means[c]:.2g}", (4, thumb.ink.line_height()), thumb.ink)
        tiles.append(view)
    return tile(tiles, cols=min(cols, len(tiles)))
