"""How far ``geneval``'s detectors agree on generated images: Mask2Former (GenEval's) against OWLv2.

    python -m benchmarks.geneval_detectors IMAGEDIR --out benchmarks/results/geneval_detectors.json \\
        --detector mask2former=facebook/mask2former-swin-small-coco-instance \\
        --detector owlv2=google/owlv2-base-patch16-ensemble --device cuda

IMAGEDIR is in GenEval's layout (what its generation scripts write): ``IMAGEDIR/<index>/metadata.jsonl``
(one line, the prompt's GenEval metadata) and the images ``IMAGEDIR/<index>/samples/*.png``. Every image
is scored by each detector (GenEval's strict 1/0, the same CLIP colour classifier for all); written: each
image's verdicts, each detector's GenEval score overall and per tag, and for each pair of detectors the
share of images they agree on and Cohen's kappa (agreement beyond what their two pass rates give by
chance). Agreement is not accuracy: only human labels (GenEval's own study) say which is right.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vgrpo_platform.protocols import BuildContext, Samples


def load(imagedir: Path) -> list[tuple[dict[str, Any], Path]]:
    """``(metadata, image path)`` for every image of a GenEval-layout folder, in a stable order."""
    items = []
    for folder in sorted(p for p in imagedir.iterdir() if p.is_dir() and p.name.isdigit()):
        meta = json.loads((folder / "metadata.jsonl").read_text().splitlines()[0])
        items += [(meta, path) for path in sorted((folder / "samples").glob("*.png"))]
    if not items:
        raise SystemExit(f"no <index>/metadata.jsonl with samples/*.png under {imagedir}")
    return items


def kappa(a: list[float], b: list[float]) -> float:
    """Cohen's kappa of two 1/0 verdict lists (1.0 when both are constant and equal)."""
    x, y = np.asarray(a), np.asarray(b)
    observed = float((x == y).mean())
    pa, pb = float(x.mean()), float(y.mean())
    chance = pa * pb + (1 - pa) * (1 - pb)
    return 1.0 if chance >= 1 else (observed - chance) / (1 - chance)


def score_all(items: list[tuple[dict[str, Any], Path]], options: dict[str, Any], device: str) -> list[float]:
    from vgrpo_rewards.geneval import Config, build

    reward = build(Config(**options), BuildContext(device=device))
    verdicts = []
    for meta, path in items:
        image = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy()).permute(2, 0, 1)
        samples = Samples("image", (image.float() / 255)[None].to(device))
        verdicts.append(float(reward.score(samples, [meta.get("prompt", "")], [meta])["correct"][0]))
    return verdicts


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("imagedir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--detector", action="append", default=[], metavar="KIND=MODEL",
        help="a detector (mask2former, owlv2, owlvit) and its weights; repeat (default: the two defaults)",
    )  # fmt: skip
    parser.add_argument("--clip-model", default="openai/clip-vit-large-patch14", help="CLIP for colours")
    parser.add_argument("--color", default="clip", choices=["clip", "pixels"])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    detectors = [d.split("=", 1) for d in args.detector] or [["mask2former", ""], ["owlv2", ""]]
    items = load(args.imagedir)
    verdicts = {}
    for kind, model in detectors:
        options = {
            "detector": kind,
            "model": model or None,
            "clip_model": args.clip_model,
            "color": args.color,
        }
        verdicts[kind] = score_all(items, options, args.device)
    tags = sorted({str(meta.get("tag")) for meta, _ in items})
    summary: dict[str, Any] = {"images": len(items), "detectors": dict(detectors), "score": {}, "pairs": {}}
    for kind, v in verdicts.items():
        per_tag = {
            t: float(np.mean([x for x, (m, _) in zip(v, items, strict=True) if str(m.get("tag")) == t]))
            for t in tags
        }
        summary["score"][kind] = {"overall": float(np.mean(v)), "by_tag": per_tag}
    for a, b in itertools.combinations(verdicts, 2):
        agree = float(np.mean(np.asarray(verdicts[a]) == np.asarray(verdicts[b])))
        summary["pairs"][f"{a}|{b}"] = {"agreement": agree, "kappa": kappa(verdicts[a], verdicts[b])}
    rows = [{"image": str(p.relative_to(args.imagedir)), "tag": m.get("tag"),
             **{k: v[i] for k, v in verdicts.items()}} for i, (m, p) in enumerate(items)]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "images": rows}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
