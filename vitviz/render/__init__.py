"""Views: pure numpy/OpenCV functions from an image, a trace's geometry and token maps to RGB uint8
arrays, drawn in the coordinates of the user's original image (resize and centre crop inverted; what
the model never saw shaded). Build a `Canvas` once per (image, transform, model), then draw on it."""
from .anatomy import (
                      attention_distance_plot,
                      embedding_filters,
                      faithfulness_plot,
                      filter_components,
                      filter_tiles,
                      outlier_tokens,
                      pca,
                      position_embedding,
                      position_similarity,
                      position_tiles,
                      relative_bias_tiles,
                      relative_position_biases,
                      ring_tokens,
                      token_norm_map,
)
from .canvas import Canvas
from .captions import caption, tile
from .evaluation import evaluation_plot
from .geometry import Field, Frame, display_size, fields
from .grid import notice, patch_grid, prefix_legend, stage_grids, stage_lines
from .heads import head_tile, layer_strip
from .overlay import DEFAULT_CMAP, SIGNED_CMAP, colorbar, overlay, per_uniform, shared_scale, with_colorbar
from .stages import channel_gallery, feature_norm, feature_pca, foreground_pca, foreground_pca_view, stage_pca
from .windows import rolled_view, token_windows, window_view

__all__ = ["Canvas", "DEFAULT_CMAP", "Field", "Frame", "SIGNED_CMAP", "attention_distance_plot", "caption",
           "channel_gallery", "colorbar", "display_size", "embedding_filters", "evaluation_plot",
           "faithfulness_plot", "feature_norm", "feature_pca", "fields", "filter_components", "filter_tiles",
           "foreground_pca", "foreground_pca_view", "head_tile", "layer_strip", "notice", "outlier_tokens", "overlay",
           "patch_grid", "pca", "per_uniform", "position_embedding", "position_similarity", "position_tiles",
           "relative_bias_tiles", "relative_position_biases",
           "prefix_legend", "ring_tokens", "rolled_view", "shared_scale", "stage_grids", "stage_lines", "stage_pca",
           "tile", "token_norm_map", "token_windows", "window_view", "with_colorbar"]
