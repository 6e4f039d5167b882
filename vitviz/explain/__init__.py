"""Explanations: pure functions from a trace (and, for gradient methods, the model and a target) to maps.

Every map is a b gh gw tensor on a token grid of the model; the families are told apart by the
trace's structure (key windows, attention windows, stages, prefix tokens, whether blocks attend), never
by class names. CvT's adaptation of rollout (the key-to-query operator D) is derived in `cvt.py`, Swin's
(rollout through shifted windows and patch merging) in `windows.py`; a method that reads attention
refuses a convolutional network in words (`NoAttention`).
"""
from .artefacts import OUTLIER_Z, artefact_tokens, outliers
from .attention import class_attention, head_attention, key_attention, query_attention
from .cvt import keys_to_queries, queries_to_keys, spread_to_input
from .decide import Attribution, direct_logit_attribution, token_effect_maps
from .distance import mean_attention_distance, token_centres
from .faithfulness import Curve, deletion_curve, insertion_curve, random_saliency
from .gradcam import gradcam, gradcam_from_trace
from .gradients import (
                        attention_gradients,
                        chefer_relevance,
                        chefer_relevance_from_trace,
                        gradient_rollout,
                        gradient_rollout_from_trace,
                        resolve_target,
)
from .heads import DEFAULT_MASS, mass_threshold
from .legrad import legrad, legrad_from_trace
from .lens import (
                        ResidualShare,
                        final_class_probability,
                        lens_layers,
                        logit_lens,
                        patch_top_class,
                        relative_depth,
                        residual_share,
)
from .lrp import attnlrp
from .methods import FAMILIES, METHODS, Method, method
from .norms import token_norms
from .patching import CORRUPTIONS, SITES, Patching, Plan, corrupt, patch_activations, patching_plan
from .receptive import ReceptiveField, ReceptiveFieldSum, receptive_field
from .rollout import HEAD_FUSIONS, NoAttention, attention_rollout
from .similarity import SimilarityTarget

__all__ = ["Attribution", "CORRUPTIONS", "Patching", "Plan", "SITES", "corrupt", "direct_logit_attribution",
           "patch_activations", "patching_plan", "token_effect_maps",
           "ResidualShare", "final_class_probability", "lens_layers", "logit_lens", "patch_top_class", "relative_depth",
           "residual_share",
           "Curve", "DEFAULT_MASS", "FAMILIES", "HEAD_FUSIONS", "METHODS", "Method", "NoAttention", "OUTLIER_Z",
           "ReceptiveField", "ReceptiveFieldSum", "SimilarityTarget", "receptive_field",
           "artefact_tokens", "attention_gradients", "attention_rollout", "attnlrp", "chefer_relevance",
           "chefer_relevance_from_trace", "class_attention", "deletion_curve", "gradcam", "gradcam_from_trace",
           "gradient_rollout", "gradient_rollout_from_trace", "head_attention", "insertion_curve", "key_attention",
           "keys_to_queries", "legrad", "legrad_from_trace", "mass_threshold", "mean_attention_distance", "method",
           "outliers", "queries_to_keys", "query_attention", "random_saliency", "resolve_target", "spread_to_input",
           "token_centres", "token_norms"]
