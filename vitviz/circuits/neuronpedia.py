"""A circuit in the graph file circuit viewers read: circuit-tracer's JSON for Neuronpedia's attribution-graph viewer
(`circuit_tracer/frontend/graph_models.py`: `metadata`, `qParams`, `nodes`, `links`), so a graph made here opens
where language-model researchers already read theirs.

How vitviz's nodes map onto the viewer's:

- the photo is the one "token" (`prompt_tokens` ["<photo>"], every node's `ctx_idx` 0): a concept node sums its
  codes over the photo's tokens, as the graph's do; in a graph per position (`positions.py`) the tokens are the
  cells of its finest site ("<cls>" first where it reads the class token, then "(row, column)" row-major) and a
  node's `ctx_idx` its row at its own site (where two sites' grids differ, one index is not one place at both);
- a concept is a feature (`feature_type` "cross layer transcoder", the type the viewer draws features with) at
  `layer` its block (counted from 0), `node_id` "layer_concept_0", `feature` the Cantor pairing of layer and
  concept as circuit-tracer numbers them, `clerp` its name, `activation` its codes summed;
- a block's error node is "layer_-1_0" (`feature` -1, "mlp reconstruction error"); a group node ("+N more
  concepts") is "layer_-2_0" (`feature` -2), its members named in its `clerp`; what a block's dictionary does not
  read is "layer_-3_0" (`feature` -3, drawn as an error);
- the photo is the embedding "E_0_0", the answer the logit "L_target_0" at layer depth + 1, `is_target_logit`;
- `influence`: each node's |effect| as a share of the graph's largest, so the viewer's ordering is the graph's;
- `links`: the graph's edges, in the metric's units; `qParams.pinnedIds` the concept nodes drawn one by one.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

SCHEMA_VERSION = 1
PHOTO_TOKEN = "<photo>"
FEATURE, ERROR, EMBEDDING, LOGIT_TYPE = "cross layer transcoder", "mlp reconstruction error", "embedding", "logit"
GROUP_FEATURE = -2   # a group node's feature number: never a concept's (0 ..) or an error's (-1)
UNREAD_FEATURE = -3  # what a block's dictionary does not read


def cantor(x: int, y: int) -> int:
    """circuit-tracer's feature number for (layer, feature index)."""
    return (x + y) * (x + y + 1) // 2 + y


def neuronpedia_graph(graph: Mapping, *, depth: int, prompt: str, probability: float,
                      dictionaries: Sequence[str]) -> dict:
    """`graph` (`Circuit.to_json()`) as circuit-tracer's graph file: `depth` the model's blocks (the logit's layer is
    depth + 1), `prompt` what the photo is called (its file name), `probability` the model's probability of the
    target class, `dictionaries` the sources its sites read (the viewer's `transcoder_list`)."""
    biggest = max((abs(n["effect"]) for n in graph["nodes"] if n.get("effect") is not None), default=0.0) or 1.0
    tokens = cell_tokens(graph["sites"]) if any("position" in n for n in graph["nodes"]) else [PHOTO_TOKEN]
    ids, nodes = {}, []
    for node in graph["nodes"]:
        kind, at = node["kind"], node.get("position", 0)   # the photo and the answer: at the first token
        if kind == "input":
            entry = dict(node_id="E_0_0", feature=0, layer="E", feature_type=EMBEDDING, jsNodeId="E_0-0",
                         clerp="the photo")
        elif kind == "logit":
            target = graph["target"]
            entry = dict(node_id=f"{depth + 1}_{target}_0", feature=target, layer=str(depth + 1),
                         feature_type=LOGIT_TYPE, token_prob=probability, is_target_logit=True,
                         jsNodeId=f"L_{target}-0", clerp=f'Output "{graph["target_label"]}" (p={probability:.3f})')
        else:
            layer = node["block"]
            feature = {"concept": node.get("concept"), "error": -1, "group": GROUP_FEATURE,
                       "unread": UNREAD_FEATURE}[kind]
            entry = dict(node_id=f"{layer}_{feature}_{at}", layer=str(layer),
                         feature=cantor(layer, feature) if kind == "concept" else feature,
                         feature_type=FEATURE if kind in ("concept", "group") else ERROR,
                         jsNodeId=f"{layer}_{feature}-{at}",
                         clerp=node["name"] if kind != "group" else
                         f"{node['name']}: " + ", ".join(f"#{c}" for c in node["concepts"]),
                         activation=node.get("activation"))
        entry.update(ctx_idx=at, run_idx=0, reverse_ctx_idx=len(tokens) - 1 - at,
                     influence=None if node.get("effect") is None else abs(node["effect"]) / biggest)
        entry.setdefault("token_prob", 0.0)
        entry.setdefault("is_target_logit", False)
        ids[node["id"]] = entry["node_id"]
        nodes.append(entry)
    slug = f"{graph['model']}-{prompt}".replace("/", "-").replace(" ", "-")
    return {
        "metadata": {"slug": slug, "scan": graph["model"], "transcoder_list": list(dictionaries),
                     "prompt_tokens": tokens, "prompt": prompt, "node_threshold": None,
                     "schema_version": SCHEMA_VERSION},
        "qParams": {"pinnedIds": [ids[n["id"]] for n in graph["nodes"] if n["kind"] == "concept"], "supernodes": [],
                    "linkType": "both", "clickedId": "", "sg_pos": ""},
        "nodes": nodes,
        "links": [{"source": ids[e["source"]], "target": ids[e["target"]], "weight": e["weight"]}
                  for e in graph["edges"]],
    }


def cell_tokens(sites: Sequence[Mapping]) -> list[str]:
    """A graph per position's "tokens": the rows of its site with the most ("<cls>", then "(row, column)")."""
    site = max(sites, key=lambda site: site["grid"][0] * site["grid"][1] + site["class_token"])
    cells = [f"({r}, {c})" for r in range(site["grid"][0]) for c in range(site["grid"][1])]
    return ["<cls>", *cells] if site["class_token"] else cells
