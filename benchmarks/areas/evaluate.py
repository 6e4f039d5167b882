"""`vitviz evaluate` (faithfulness over a data set) against its floor of batched forwards (issue 15)."""
from __future__ import annotations

import contextlib
import io

import torch

import vitviz
from timing import CLOCKS, Timing, ms, report, verdict
from workbench import Bench, photos

TARGET = 1.25


def per_image_forward(bench: Bench, model: torch.nn.Module, batch: int, size: tuple[int, int]) -> float:
    """Seconds per image of a batched forward of `batch` images: the floor of anything that must forward them."""
    pixels = torch.randn(batch, 3, *size, device=bench.device)
    with torch.inference_mode():
        return bench.time({"forward": lambda: model(pixels)})["forward"].median / batch


def measure(bench: Bench, items: set[str]) -> None:
    """`vitviz evaluate` (every method, all five tests) on the bundled pair against its floor: the images it
    sends through each model (counted by a forward hook) times one image's share of a batched forward."""
    from vitviz.data import Dataset
    from vitviz.distributed import ranks
    from vitviz.evaluate import Settings, evaluate
    from vitviz.explain import METHODS

    vit, cvt, what = bench.bundled_pair
    settings = Settings(batch_size=8, forward_batch=64, steps=4, regions=8) if bench.quick else Settings()
    settings = settings.on(bench.device)
    images = photos(16 if bench.quick else 64, (32, 32))
    data = Dataset(name="bench photos", ids=tuple(map(str, range(len(images)))), labels=None, classes=None,
                   source=images.__getitem__)
    with ranks(bench.device) as process:   # evaluate's device ('cuda' becomes 'cuda:0'): the models it loads
        device = process.device
    loaded = [vitviz.load(name, device=device) for name in (vit, cvt)]
    forwarded = {m.name: 0 for m in loaded}

    def count(name):
        return lambda module, args: forwarded.__setitem__(name, forwarded[name] + args[0].shape[0])

    hooks = [m.model.register_forward_pre_hook(count(m.name)) for m in loaded]
    seconds = []
    try:
        for r in range(max(1, bench.repeats // 3)):   # minutes per round on a CPU: fewer rounds
            forwarded.update(dict.fromkeys(forwarded, 0))
            start = CLOCKS[bench.clock]()
            with contextlib.redirect_stdout(io.StringIO()):   # the table: not a benchmark line
                evaluate(models=[vit, cvt], data=data, out=bench.folder(f"evaluate-{r}"), settings=settings,
                         device=str(bench.device), progress=False)
            seconds.append(CLOCKS[bench.clock]() - start)
    finally:
        for hook in hooks:
            hook.remove()
    if not all(forwarded.values()):
        raise RuntimeError(f"the hooks counted {forwarded} images: evaluate ran other models than the ones hooked")
    per_image = {m.name: per_image_forward(bench, m.model, settings.forward_batch, m.transform.crop) for m in loaded}
    floor = sum(forwarded[name] * per_image[name] for name in forwarded)
    total = Timing(seconds)
    report(f"evaluate {len(images)} images, {what}, {len(METHODS)} methods + random, 5 tests: {total} "
           f"for {sum(forwarded.values())} images through the models; floor (each image's share of a batched forward "
           f"of {settings.forward_batch}) {ms(floor)} ms, " + verdict(total.median / floor, TARGET))
