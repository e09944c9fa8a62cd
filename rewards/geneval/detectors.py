"""The detectors ``geneval`` can use, behind one interface: ``detect(images, classes)``.

- ``mask2former``: GenEval's own detector family, instance segmentation trained on COCO, through
  transformers' ``Mask2FormerForUniversalSegmentation`` (e.g.
  ``facebook/mask2former-swin-small-coco-instance``; GenEval ships mmdetection's Swin-S checkpoint of
  the same model). Its post-processing is mmdetection's: the top ``num_queries`` (query, class)
  pairs scored by class probability times mean mask probability; boxes are the masks' extents.
- ``owlv2`` / ``owlvit``: open-vocabulary detectors (``Owlv2ForObjectDetection``,
  ``OwlViTForObjectDetection``) queried with ``"a photo of a <class>"``; no masks, so the colour crop is
  the box. Their confidences are sigmoid scores on another scale than Mask2Former's.

Images travel as uint8 ``[H, W, 3]`` arrays through the model's own processor: detectors resize and pad in
ways a torch re-implementation would have to track per checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from vgrpo_platform.errors import RewardError

from .._clip_common import batches, load_or_explain, pick_device, pick_dtype, resolve_source
from .classes import canonical, with_article
from .rules import Detection

FIX = (
    "download one with `huggingface-cli download facebook/mask2former-swin-small-coco-instance --local-dir "
    "DIR` (or google/owlv2-base-patch16-ensemble for detector 'owlv2') and set the reward's options.model "
    "to that folder"
)


class Detector(Protocol):
    """What ``geneval`` needs of a detector: every detection at or above ``floor`` confidence."""

    def detect(self, images: np.ndarray, classes: Sequence[str], floor: float) -> list[list[Detection]]:
        """``images`` ``[B, H, W, 3]`` uint8; ``classes``, the GenEval names the batch's prompts ask about
        (open-vocabulary detectors query them; closed ones raise ``RewardError`` for one they lack)."""
        ...


def load_detector(kind: str, model: str, dtype: str | None, batch_size: int, context: Any) -> Detector:
    """The detector ``kind`` with weights from ``model`` (a folder or hub id) on the run's device."""
    from transformers import AutoProcessor

    source = resolve_source(model, context)
    torch_dtype = pick_dtype(dtype, context)
    what = f"GenEval detector ({kind})"
    if kind == "mask2former":
        from transformers import AutoImageProcessor, Mask2FormerForUniversalSegmentation

        net: Any = load_or_explain(
            lambda: Mask2FormerForUniversalSegmentation.from_pretrained(source, dtype=torch_dtype),
            what,
            source,
            FIX,
        )
        processor = load_or_explain(lambda: AutoImageProcessor.from_pretrained(source), what, source, FIX)
    else:
        from transformers import Owlv2ForObjectDetection, OwlViTForObjectDetection

        cls = Owlv2ForObjectDetection if kind == "owlv2" else OwlViTForObjectDetection
        net = load_or_explain(lambda: cls.from_pretrained(source, dtype=torch_dtype), what, source, FIX)
        processor = load_or_explain(lambda: AutoProcessor.from_pretrained(source), what, source, FIX)
    net.to(device=pick_device(context), dtype=torch_dtype).eval().requires_grad_(False)
    if kind == "mask2former":
        return Mask2FormerDetector(net, processor, batch_size)
    return OwlDetector(net, processor, batch_size, pad_square=kind == "owlv2")


def _inputs(encoded: Any, net: torch.nn.Module) -> dict[str, Any]:
    """The processor's tensors on the model's device, pixels in the model's dtype."""
    param = next(net.parameters())
    return {
        k: v.to(param.device, param.dtype if v.is_floating_point() else v.dtype)
        for k, v in encoded.items()
        if isinstance(v, torch.Tensor)
    }


class Mask2FormerDetector:
    """COCO instance segmentation; the checkpoint's ``id2label`` names the classes (COCO's or GenEval's)."""

    def __init__(self, net: Any, processor: Any, batch_size: int) -> None:
        self.net, self.processor, self.batch_size = net, processor, batch_size
        self.labels = {int(i): canonical(name) for i, name in net.config.id2label.items()}

    @torch.no_grad()
    def detect(self, images: np.ndarray, classes: Sequence[str], floor: float) -> list[list[Detection]]:
        missing = sorted(set(classes) - set(self.labels.values()))
        if missing:
            raise RewardError(
                f"geneval: the Mask2Former checkpoint has no class {missing[0]!r} (it knows e.g. "
                f"{', '.join(list(self.labels.values())[:4])}); use a COCO instance-segmentation checkpoint "
                "(facebook/mask2former-swin-small-coco-instance) or options.detector = 'owlv2'"
            )
        out: list[list[Detection]] = []
        for sl in batches(len(images), self.batch_size):
            part = list(images[sl])
            encoded = self.processor(images=part, return_tensors="pt")
            outputs = self.net(**_inputs(encoded, self.net))
            results = self.processor.post_process_instance_segmentation(
                outputs, threshold=floor, target_sizes=[im.shape[:2] for im in part], return_binary_maps=True
            )
            for result in results:
                maps = result["segmentation"]  # [N, H, W] binary, one per segment (None when none)
                dets = []
                for k, info in enumerate(result["segments_info"]):
                    mask = maps[k].bool().cpu().numpy()
                    ys, xs = np.nonzero(mask)
                    if len(xs) == 0:
                        continue
                    box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
                    dets.append(
                        Detection(self.labels[int(info["label_id"])], float(info["score"]), box, mask)
                    )
                out.append(dets)
        return out


class OwlDetector:
    """OWL-ViT / OWLv2 queried with one text per asked class."""

    def __init__(self, net: Any, processor: Any, batch_size: int, pad_square: bool) -> None:
        self.net, self.processor, self.batch_size, self.pad_square = net, processor, batch_size, pad_square
        # every query padded to the text tower's positions (16 in OWL's checkpoints), as OWL's processor does
        length = net.config.text_config.max_position_embeddings
        self.text_length = {"padding": "max_length", "max_length": length, "truncation": True}

    @torch.no_grad()
    def detect(self, images: np.ndarray, classes: Sequence[str], floor: float) -> list[list[Detection]]:
        names = sorted(set(classes))
        if not names:
            return [[] for _ in images]
        queries = [f"a photo of {with_article(n)}" for n in names]
        out: list[list[Detection]] = []
        for sl in batches(len(images), self.batch_size):
            part = list(images[sl])
            # OWL takes the queries of every image flattened, [b * n_queries, length]
            encoded = dict(
                self.processor.tokenizer(queries * len(part), return_tensors="pt", **self.text_length)
            )
            encoded.update(self.processor.image_processor(images=part, return_tensors="pt"))
            outputs = self.net(**_inputs(encoded, self.net))
            # OWLv2 pads each image to a square at the bottom/right: its boxes are relative to that square
            sizes = [(max(im.shape[:2]),) * 2 if self.pad_square else im.shape[:2] for im in part]
            results = self.processor.image_processor.post_process_object_detection(
                outputs, threshold=floor, target_sizes=sizes
            )
            for im, result in zip(part, results, strict=True):
                h, w = im.shape[:2]
                dets = []
                for score, label, box in zip(
                    result["scores"].tolist(),
                    result["labels"].tolist(),
                    result["boxes"].tolist(),
                    strict=True,
                ):
                    if score < floor:
                        continue
                    x0, y0, x1, y1 = (min(max(v, 0.0), lim) for v, lim in zip(box, (w, h, w, h), strict=True))
                    dets.append(Detection(names[label], float(score), (x0, y0, x1, y1)))
                out.append(dets)
        return out
