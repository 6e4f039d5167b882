"""Explanations: pure functions from a trace (and, for gradient methods, the model and a target) to maps.

Every map is a b gh gw tensor on a token grid of the model; ViT and CvT are told apart by the
trace's structure (key windows, stages, prefix tokens), never by class names. CvT's adaptation of
rollout (the key-to-query operator D) is derived in `cvt.py`.
"""
from .attention import class_attention, key_attention, query_attention
from .cvt import keys_to_queries, queries_to_keys, spread_to_input
from .distance import mean_attention_distance, token_centres
from .faithfulness import Curve, deletion_curve, insertion_curve, random_saliency
from .gradients import (attention_gradients, chefer_relevance, chefer_relevance_from_trace, gradient_rollout,
                        gradient_rollout_from_trace, resolve_target)
from .norms import token_norms
from .rollout import HEAD_FUSIONS, attention_rollout

__all__ = ["HEAD_FUSIONS", "Curve", "attention_gradients", "attention_rollout", "chefer_relevance",
           "chefer_relevance_from_trace", "class_attention", "deletion_curve", "gradient_rollout",
           "gradient_rollout_from_trace", "insertion_curve", "key_attention", "keys_to_queries",
           "mean_attention_distance", "queries_to_keys", "query_attention", "random_saliency", "resolve_target",
           "spread_to_input", "token_centres", "token_norms"]
