"""Export of a two-expert (Wan 2.2) policy in the layout diffusers loads back.

``WanPipeline.save_lora_weights`` writes one transformer's LoRA; ``WanLoraLoaderMixin.load_lora_weights``
loads a file into ``transformer``, or into ``transformer_2`` with ``load_into_transformer_2=True``. So each
trained expert gets its own folder, named after the pipeline component it belongs to:

- LoRA: ``out/transformer/pytorch_lora_weights.safetensors`` (high-noise expert) and
  ``out/transformer_2/pytorch_lora_weights.safetensors`` (low-noise expert);
- full fine-tuning: ``out/transformer/`` and ``out/transformer_2/`` via ``save_pretrained``.

An expert that was not trained has no folder: the base model's weights are the ones to use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vgrpo_adapters._diffusers_export import (
    base_model_name,
    lora_layers,
    lora_metadata,
    save_diffusers_lora,
    write_export_info,
)

from vgrpo_platform.finetune import uses_lora

COMPONENT = {"high": "transformer", "low": "transformer_2"}
"""Expert -> the ``WanPipeline`` component (and export folder) it is."""


def export_experts(adapter: Any, out: Path) -> None:
    """Write each trained expert of ``adapter.experts`` under ``out`` and ``vgrpo_export.json`` beside it."""
    experts = adapter.experts
    out.mkdir(parents=True, exist_ok=True)
    base = base_model_name(adapter.pipe)
    pipe_cls = adapter.pipeline_class.__name__
    if uses_lora(experts):
        state = lora_layers(experts)  # keys "high.blocks...", "low.blocks..."
        metadata = lora_metadata(experts)
        loads = [f"pipe = {pipe_cls}.from_pretrained('{base}')"]
        for name in experts.trained:
            prefix = f"{name}."
            layers = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
            folder = out / COMPONENT[name]
            save_diffusers_lora(adapter.pipeline_class, folder, layers, metadata)
            into = ", load_into_transformer_2=True" if name == "low" else ""
            loads.append(f"pipe.load_lora_weights('{folder}'{into})")
        info: dict[str, Any] = {"kind": "lora", "load": "; ".join(loads)}
    else:
        for name in experts.trained:
            experts.experts[name].save_pretrained(out / COMPONENT[name])
        info = {
            "kind": "full",
            "load": "WanTransformer3DModel.from_pretrained(folder) for each of "
            + ", ".join(f"'{out / COMPONENT[n]}'" for n in experts.trained)
            + f", passed as that component (transformer= / transformer_2=) to {pipe_cls}.from_pretrained",
        }
    info.update(
        base_model=base,
        resolution=adapter.resolution,
        shift=adapter.schedule.shift,
        trained_experts={name: COMPONENT[name] for name in experts.trained},
        boundary_timestep=experts.boundary_timestep,
    )
    write_export_info(out, info)
