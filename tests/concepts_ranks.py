"""`python -m torch.distributed.run --nproc_per_node=2 tests/concepts_ranks.py OUT`: every rank trains the
dictionaries of `RUNS` and `STREAM` on `activations()` and writes what it ended with to OUT/NAME-rankR.safetensors,
for test_concepts_distributed.py to compare with one process. "batchtopk-resumed" is the stream's run interrupted
in its second epoch and resumed, after a barrier (as a relaunch would be), from rank 0's checkpoint. Then two runs
the ranks must refuse, each writing its message to OUT/refused-WHY-rankR.txt: "steps" (rank 0 finds the finished
checkpoint, rank 1 none) and "activations" (each rank is given its own).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from interrupting import Interrupting  # beside this script: its folder is on sys.path
from vitviz import concepts
from vitviz.concepts import ConceptsError, Dictionary
from vitviz.distributed import ranks

TOKENS, WIDTH, SPAN = 3993, 16, 4
COMMON = dict(expansion=4, epochs=3, batch_size=499, lr=2e-3, warmup=5, norm_tokens=1000)   # 9 steps an epoch:
# 8 batches of 499, split 249 / 250 over two ranks, and one of a single token, split 0 / 1
DEAD_AFTER = 1000   # two batches: with the atoms in a 4-dimensional span, AuxK revives a few concepts most steps
RUNS = {"standard": dict(kind="standard", l1=0.3), "topk": dict(kind="topk", k=4, dead_after=DEAD_AFTER),
        "batchtopk": dict(kind="batchtopk", k=4, dead_after=DEAD_AFTER)}
STREAM = dict(kind="batchtopk", k=4, dead_after=DEAD_AFTER, progress=False)   # on `chunks(activations())`
INTERRUPTED_AT = 14 + 8   # the 8th of the 14 chunks in the second pass: in step 14; the checkpoint is step 12's


def activations() -> torch.Tensor:
    """TOKENS tokens, each 3 of 32 random unit atoms in a SPAN-dimensional subspace with weights in [0.5, 1.5], plus
    noise and an offset. (Concepts whose encoder columns lie mostly outside the span stop firing: AuxK is at work.)"""
    g = torch.Generator().manual_seed(7)
    span = torch.linalg.qr(torch.randn(WIDTH, SPAN, generator=g)).Q.T
    atoms = torch.randn(32, SPAN, generator=g) @ span
    atoms /= atoms.norm(dim=1, keepdim=True)
    chosen = torch.rand(TOKENS, 32, generator=g).argsort(1)[:, :3]
    codes = torch.zeros(TOKENS, 32).scatter(1, chosen, torch.rand(TOKENS, 3, generator=g) + 0.5)
    return codes @ atoms + 0.05 * torch.randn(TOKENS, WIDTH, generator=g) + 2.0


def chunks(x: torch.Tensor) -> list[torch.Tensor]:
    """The tokens as a stream of 300-token chunks (the last one 93)."""
    return [x[i:i + 300] for i in range(0, len(x), 300)]


def write(out: Path, name: str, rank: int, dictionary: Dictionary) -> None:
    save_file(dictionary.state_dict(), out / f"{name}-rank{rank}.safetensors",
              metadata={"training_record": json.dumps(dictionary.training_record)})


def main(out: Path) -> None:
    x = activations()
    with ranks("cpu") as here:
        for name, settings in RUNS.items():
            write(out, name, here.rank, concepts.train(x, **settings, **COMMON))
        stream = chunks(x)
        write(out, "batchtopk-stream", here.rank, concepts.train(stream, **STREAM, **COMMON))
        resuming = dict(checkpoint=out / "run.ckpt", checkpoint_every=4, **STREAM, **COMMON)
        try:
            concepts.train(Interrupting(stream, INTERRUPTED_AT), **resuming)
            raise AssertionError("the run was not interrupted")
        except KeyboardInterrupt:
            pass
        dist.barrier()
        write(out, "batchtopk-resumed", here.rank, concepts.train(stream, **resuming))
        for why, data, checkpoint in (("steps", stream, out / ("run.ckpt" if here.leader else "elsewhere.ckpt")),
                                      ("activations", [chunk + here.rank for chunk in stream], None)):
            try:
                concepts.train(data, **{**resuming, "checkpoint": checkpoint})
                raise AssertionError(f"ranks that differ in their {why} were not refused")
            except ConceptsError as e:
                (out / f"refused-{why}-rank{here.rank}.txt").write_text(str(e))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
