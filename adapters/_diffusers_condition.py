"""What the diffusers adapters that take a condition image share (``flux_kontext``, ``wan_i2v``).

The core calls ``encode_conditions(prompts, images)`` on an adapter with ``takes_condition_image``
(``vgrpo_platform.conditions``); ``encode_prompts`` alone is refused in one line, because a prompt
without its source is not a valid input. The text part is the base adapter's cached encoding
(``text_conditioning``); CFG's null conditioning swaps the text only, as the pipelines do: the source
stays the same in both halves of the guided batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vgrpo_adapters._diffusers_common import DiffusersFlowAdapter
from vgrpo_adapters._diffusers_common import resized_source as resized_source  # re-exported: its old home

from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import Conditioning


class ConditionImageMixin:
    """Put it first in the bases of an adapter that encodes each prompt's condition image."""

    takes_condition_image = True
    adapter_name: str = "this adapter"
    negative_prompt: str = ""

    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        raise RecipeError(
            f'{self.adapter_name} takes a condition image: give each prompt one with an "image" field in a '
            ".jsonl prompt file (the core then calls encode_conditions)"
        )

    def text_conditioning(self, prompts: Sequence[str]) -> Conditioning:
        """The base adapter's text conditioning, cached per prompt text."""
        return DiffusersFlowAdapter.encode_prompts(self, prompts)  # type: ignore[arg-type]

    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """CFG's unconditional half: the negative prompt's text, the rows' own condition image."""
        negative = self.text_conditioning([self.negative_prompt])  # [1, ...]
        return {
            k: negative[k].expand(batch, *negative[k].shape[1:]) if k in negative else cond[k] for k in cond
        }

    def one_image_each(self, prompts: Sequence[str], images: Sequence[Sequence[torch.Tensor]]) -> None:
        """Refuse anything but one condition image per prompt, in one line."""
        if len(images) != len(prompts) or any(len(im) != 1 for im in images):
            counts = sorted({len(im) for im in images})
            raise RecipeError(
                f"{self.adapter_name} takes exactly one condition image per prompt, got {counts}; give one "
                '"image" path per line'
            )
