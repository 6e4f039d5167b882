"""The benchmark runs end to end on tiny models and prints every measurement it promises (issue 8).

No timing is asserted: the numbers depend on the machine. What is checked is that each item's line
is there, once, in the format the README documents, with a ratio and a verdict where a target exists.
"""
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMES = r"[\d.]+ / [\d.]+ / [\d.]+ ms"
RATIO = r"ratio [\d.]+ \(target <= [\d.]+\) (OK|MISSED)"
AT_LEAST = r"ratio [\d.]+ \(target >= [\d.]+\) (OK|MISSED)"
EXPECTED = {   # line start -> the rest of it; one line each
    **{f"vit forward b{b} {shape}": rf": vitviz {TIMES}, timm {TIMES}, {RATIO}$"
       for shape in ("vit_small_patch16_224", "vit_base_patch16_224") for b in (1, 8)},
    **{f"vit traced b{b} {shape}": rf": vitviz trace {TIMES}, timm plain {TIMES}, {RATIO}$"
       for shape in ("vit_small_patch16_224", "vit_base_patch16_224") for b in (1, 8)},
    **{f"cvt forward b{b} CvT-13": rf": vitviz {TIMES}, transformers {TIMES}, {RATIO}$" for b in (1, 8)},
    "explain pipeline ViT-B/16 on one": rf" \d+x\d+ photo: vitviz .* {TIMES}, transformers eager .* {TIMES}, {RATIO}; "
                                        rf"floor: its traced forward alone {TIMES}, [\d.]+ of the peer's pipeline"
                                        rf"(, above the target: out of reach at this forward's speed)?$",
    "explain pipeline ViT-B/16 stages": r", vitviz on one \d+x\d+ photo \(medians\): decode [\d.]+ ms, resize \+ "
                                        r"normalise [\d.]+ ms, trace [\d.]+ ms, map \(rollout\) [\d.]+ ms, overlay "
                                        r"[\d.]+ ms, encode \(PNG\) [\d.]+ ms; their sum [\d.]+ ms, the pipeline "
                                        r"[\d.]+ ms$",
    **{f"app request 1 MP JPEG, {pair}": rf": request {TIMES} \(of which JPEG decode to \d+x\d+ [\d.]+ ms\), "
                                          rf"plain forwards [\d.]+ \+ [\d.]+ ms, {RATIO}$"
       for pair in ("ImageNet pair", "stand-ins")},
    **{f"app re-render ({action}), {pair}": rf": {TIMES} vs request [\d.]+ ms, {RATIO}$"
       for pair in ("ImageNet pair", "stand-ins") for action in ("layer/head slider", "colour map")},
    **{f"cold start python app.py, {pair}": rf": first page [\d.]+ s, first answered request [\d.]+ s "
                                            rf"\(the client's connection to the page [\d.]+ s of it\), warm requests "
                                            rf"{TIMES}, \(first answer - first page\) / warm request {RATIO}; floor: "
                                            rf"import gradio, torch and both models loaded in a fresh process [\d.]+ s "
                                            rf"\+ one warm request = [\d.]+ s, first answer / floor {RATIO}$"
       for pair in ("ImageNet pair", "stand-ins")},
    "start-up imports, fresh interpreters taking turns": rf": import app {TIMES}, import gradio, torch {TIMES}, "
                                                          rf"{RATIO}$",
    "app memory, ImageNet pair, after": r"RSS [\d.]+ GiB, peak RSS [\d.]+ GiB",
    "machine peak fp32 matmul": r"[\d.]+ GFLOP/s .* b1 [\d.]+ GFLOP in [\d.]+ ms = [\d.]+ GFLOP/s, \d+% of peak",
    **{f"attribution {method} b1 vit_base_patch16_224": rf": vitviz {TIMES} = [\d.]+ forwards, {peer} {TIMES} = "
                                                        rf"[\d.]+ forwards \(vitviz forward [\d.]+ ms\), {RATIO}$"
       for method, peer in (("legrad", "torchcam LeGrad on torchvision's ViT"),
                            ("gradcam", "grad-cam GradCAM on timm"),
                            ("attnlrp", "lxt AttnLRP on torchvision's ViT"))},
    "evaluate 16 images, stand-ins": rf", \d+ methods \+ random, 5 tests: {TIMES} for \d+ images through the models; "
                                     rf"floor \(each image's share of a batched forward of 64\) [\d.]+ ms, {RATIO}$",
    "region perturbation 4 images x 8 regions, ViT-Ti/16 224 px": rf": vitviz {TIMES}, quantus RegionPerturbation "
                                                                  rf"{TIMES}, {RATIO}$",
    "batch explain 8 photos 320x240, stand-ins": r": --formats npy [\d.]+ images/s \(target >= 10\) (OK|MISSED); "
                                                 r"--formats png npy [\d.]+ images/s \(target >= 10\) (OK|MISSED), "
                                                 r"npy alone [\d.]+x faster; with the default --faithfulness-steps 8 "
                                                 r"[\d.]+ images/s$",
    "compare 32 images, stand-ins for the bundled pair (micro, random weights: checkpoints/ not trained yet), "
    "tokens=mean": rf": vitviz {TIMES}, its traced forwards {TIMES}, {RATIO}$",
    "compare 32 images, stand-ins for the bundled pair (micro, random weights: checkpoints/ not trained yet), "
    "tokens=flat": rf": vitviz {TIMES}, pytorch-cka compute_cka on timm's ViT and vitviz's CvT {TIMES}, {RATIO}$",
    **{f"clip image features b{b} ViT-B-16-quickgelu": rf": vitviz {TIMES}, open_clip encode_image {TIMES}, {RATIO}$"
       for b in (1, 8)},
    **{f"decide attribution b1 {name}": rf": trace \+ direct logit attribution \+ token effects {TIMES}, "
                                       rf"traced forward {TIMES}, {RATIO}$"
       for name in ("vit_base_patch16_224", "CvT-13")},
    "decide patching resid ViT-Ti/16 112 px": rf", \d+ patched images in \d+ forwards of <= 64: vitviz {TIMES}, "
                                              rf"floor {TIMES}, {RATIO}; timm forward hooks one position per forward "
                                              rf"{TIMES}, {RATIO}$",
    "clip text features 8 prompts ViT-B-16-quickgelu": rf": vitviz {TIMES}, open_clip encode_text {TIMES}, {RATIO}$",
    "clip legrad 1 image x 3 prompts ViT-B-16-quickgelu": rf": vitviz {TIMES}, legrad_torch's algorithm {TIMES}, "
                                                          rf"{RATIO}$",
    **{f"swin forward b{b} Swin-T": rf": vitviz {TIMES}, timm {TIMES}, {RATIO}$" for b in (1, 8)},
    **{f"swin traced b{b} Swin-T": rf": vitviz trace {TIMES}, timm plain {TIMES}, {RATIO}$" for b in (1, 8)},
    "swin rollout to stage 1 b1 Swin-T": rf": {TIMES}, traced forward {TIMES}, {RATIO}$",
    "swin trace memory b1 Swin-T 224 px": rf": [\d.]+ MiB kept, windowed attention [\d.]+ MiB \(dense token x token "
                                          rf"matrices would be \d+ MiB\), {RATIO}$",
    **{f"cnn forward b{b} {name}": rf": vitviz {TIMES}, timm {TIMES}, {RATIO}$"
       for name in ("resnet50", "convnext_tiny") for b in (1, 8)},
    **{f"cnn traced b{b} {name}": rf": vitviz trace {TIMES}, timm plain {TIMES}, {RATIO}$"
       for name in ("resnet50", "convnext_tiny") for b in (1, 8)},
    **{f"cnn receptive fields 4 blocks b1 {name}": rf": vitviz {TIMES}, timm hooks \+ autograd.grad {TIMES}, {RATIO}$"
       for name in ("resnet50", "convnext_tiny")},
    **{f"video 8 frames 640x480, {pair}": rf": end to end [\d.]+ frames/s \({TIMES}\), the batched traced forwards "
                                         rf"alone [\d.]+ frames/s \({TIMES}\), of end to end the H.264 encoding "
                                         rf"of its \d+x\d+ frames alone [\d.]+ ms a frame, {RATIO}$"
       for pair in ("bundled pair", "ImageNet pair")},
    "concepts caching": rf", \d+ 32 px images through [\w-]+'s last block: \d+ images/s \({TIMES}\), the traced "
                        rf"forwards alone \d+ images/s \({TIMES}\), {AT_LEAST}$",
    "concepts training": rf", [1-9]\d* TopK steps of \d+ tokens \(d \d+, \d+ concepts, k \d+\): vitviz [\d.]+ "
                         rf"steps/s \({TIMES}\), Overcomplete's train_sae [\d.]+ steps/s \({TIMES}\), {AT_LEAST}$",
    # --quick has no bundled dictionaries to time the tab with
    "concepts tab": r": skipped \(needs the bundled pair and its bundled dictionaries; not with --quick\)$",
    "concepts at ImageNet scale": r": skipped \(measures ViT-B/16 at full size; not with --quick\)$",
    "circuits": r": skipped \(needs the bundled pair and their dictionaries at four depths; not with --quick\)$",
    "looks step": rf", \d+ pictures x \d+ crops of [\w/.-]+ \(maco, \d+ steps a round\): draw {TIMES} a step, traced "
                  rf"forward \+ backward of the crops {TIMES}, {RATIO}$",
    "looks one concept": r": skipped \(needs the bundled pair and its bundled dictionary; not with --quick\)$",
    "training": r": skipped \(times the bundled run's checkpoints; not with --quick\)$",
    "atlas": r": skipped \(needs the bundled models and their dictionary across models; not with --quick\)$",
}


def test_quick_benchmark_prints_every_measurement_line_with_its_ratio_and_verdict(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick", "--threads", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("vitviz benchmark: torch ")
    for prefix, pattern in EXPECTED.items():
        matching = [line for line in lines if line.startswith(prefix)]
        assert len(matching) == 1, f"{prefix!r}: {len(matching)} lines in\n{done.stdout}"
        assert re.search(pattern, matching[0]), f"{matching[0]!r} does not match {pattern!r}"
    assert len(lines) == 1 + len(EXPECTED), done.stdout


def test_an_area_that_fails_prints_one_line_and_the_later_areas_still_run(monkeypatch, capsys):
    """A broken area (as `--only evaluate` once was on CUDA) must not take the areas after it with it."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench

    ran = []

    def broken(bench, items):
        raise ZeroDivisionError("float division by zero")

    areas = (SimpleNamespace(__name__="areas.broken", measure=broken),
             SimpleNamespace(__name__="areas.fine", measure=lambda bench, items: ran.append(sorted(items))))
    monkeypatch.setattr(bench, "AREAS", ((("forward",), areas[0]), (("cvt",), areas[1])))
    with pytest.raises(SystemExit) as exit:
        bench.main(["--quick", "--only", "forward", "cvt"])
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "FAILED" in line] == [
        next(line for line in lines if line.startswith("broken FAILED: ZeroDivisionError: float division by zero"))]
    assert ran == [["cvt", "forward"]]
    assert "1 area(s) failed: broken" in str(exit.value)
