"""Writing a diffusers-backed adapter's trained weights in a layout its pipeline (or peft) loads back.

The steps every export shares (LoRA state on the CPU, its peft metadata, the ``save_pretrained`` of full
fine-tuning, the ``vgrpo_export.json`` note) live here once; ``TransformerExport`` leaves each adapter
only what differs: which LoRA saver and load hint (``_save_lora``), and which facts the note records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vgrpo_platform.finetune import lora_config, uses_lora
from vgrpo_platform.lora_files import EXPORT_INFO as EXPORT_INFO  # re-exported: adapters import it here
from vgrpo_platform.lora_files import LORA_FILE as LORA_FILE
from vgrpo_platform.lora_files import write_export_info as write_export_info


def lora_layers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA weights peft injected into ``module``, detached, on the CPU and contiguous (safetensors)."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().to("cpu").contiguous() for k, v in get_peft_model_state_dict(module).items()}


def lora_metadata(module: torch.nn.Module) -> dict[str, Any] | None:
    """The default adapter's ``LoraConfig`` as a dict (rank, alpha, targets), or None without one."""
    config = lora_config(module)
    return config.to_dict() if config is not None else None


def save_diffusers_lora(
    saver: Any, out: Path, layers: dict[str, torch.Tensor], metadata: dict[str, Any] | None
) -> None:
    """``pytorch_lora_weights.safetensors`` via a diffusers LoRA loader mixin (rank, alpha as metadata)."""
    saver.save_lora_weights(out, transformer_lora_layers=layers, transformer_lora_adapter_metadata=metadata)


PEFT_LORA_FILE, PEFT_LORA_CONFIG = "transformer_lora.safetensors", "transformer_lora_config.json"
PEFT_LORA_HINT = (
    "peft.inject_adapter_in_model(LoraConfig(**config), pipe.transformer); "
    "peft.set_peft_model_state_dict(pipe.transformer, load_file('transformer_lora.safetensors'))"
)


def save_peft_lora(module: torch.nn.Module, out: Path) -> str:
    """For a transformer whose pipeline has no LoRA loader: ``PEFT_LORA_FILE`` and its ``LoraConfig`` as
    ``PEFT_LORA_CONFIG``, which peft's ``inject_adapter_in_model`` + ``set_peft_model_state_dict`` load;
    returns that hint."""
    import json

    from safetensors.torch import save_file

    save_file(lora_layers(module), out / PEFT_LORA_FILE)
    metadata = lora_metadata(module)
    if metadata is not None:
        config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in metadata.items()}
        (out / PEFT_LORA_CONFIG).write_text(json.dumps(config, indent=2, default=str))
    return PEFT_LORA_HINT


def base_model_name(pipe: Any) -> str:
    """What the exported weights apply to: the pipeline's hub id or folder, when it knows it."""
    return getattr(pipe, "name_or_path", None) or "<base model>"


class TransformerExport:
    """``export_trained`` for an adapter whose ``denoiser`` is the pipeline's ``transformer``.

    LoRA: ``pytorch_lora_weights.safetensors`` that ``pipe.load_lora_weights(out_dir)`` reads (rank and
    alpha in its metadata). Full fine-tuning: ``out_dir/transformer`` via ``save_pretrained``. Expects
    ``pipe``, ``pipeline_class``, ``denoiser``, ``resolution`` and ``schedule`` on the adapter.
    """

    pipe: Any
    pipeline_class: type
    denoiser: Any
    resolution: Any
    schedule: Any

    def export_trained(self, out_dir: str | Path) -> None:
        """Write the trained weights and ``vgrpo_export.json`` (what they are, how to load them)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        base = self._base_model()
        if uses_lora(self.denoiser):
            info = {"kind": "lora", "load": self._save_lora(out, base)}
        else:
            self._save_full(out)
            info = {"kind": "full", "load": self._full_load_hint(out / "transformer")}
        info.update(base_model=base, **self._export_facts())
        write_export_info(out, info)

    def _base_model(self) -> str:
        """What the weights apply to (the model card's ``base_model``): the pipeline's hub id or folder."""
        return base_model_name(self.pipe)

    def _save_full(self, out: Path) -> None:
        """Full fine-tuning: the trained transformer as ``out/transformer`` (``save_pretrained``)."""
        self.denoiser.save_pretrained(out / "transformer")

    def _save_lora(self, out: Path, base: str) -> str:
        """Write the LoRA under ``out``; returns how to load it."""
        save_diffusers_lora(
            self.pipeline_class, out, lora_layers(self.denoiser), lora_metadata(self.denoiser)
        )
        return self._lora_load_hint(out, base)

    def _lora_load_hint(self, out: Path, base: str) -> str:
        return f"{self.pipeline_class.__name__}.from_pretrained('{base}').load_lora_weights('{out}')"

    def _full_load_hint(self, folder: Path) -> str:
        return (
            f"{type(self.denoiser).__name__}.from_pretrained('{folder}')"
            " then pass transformer=... to the pipeline's from_pretrained"
        )

    def _export_facts(self) -> dict[str, Any]:
        """What the note records besides the base model: the size trained at and the timestep shift."""
        return {"resolution": self.resolution, "shift": self.schedule.shift}


class FolderModelExport(TransformerExport):
    """``TransformerExport`` for a pixel-space model loaded from a folder of its three parts
    (``transformer/``, ``text_encoder/``, ``tokenizer/``: ``toy``, ``shapes``, ``moving_shapes``). There is
    no pipeline to build (no VAE): ``pipeline_class`` only lends its ``save_lora_weights`` (the LoRA layout
    of the transformer's family), the LoRA loads into the bare transformer, and full fine-tuning writes a
    whole folder that ``adapter.options.model_path`` loads. Expects ``model_folder``, ``text_encoder`` and
    ``tokenizer`` on the adapter besides what ``TransformerExport`` expects."""

    model_folder: Any
    text_encoder: Any
    tokenizer: Any
    folder_placeholder: str = "<model folder>"  # the base model's name when the folder is unknown

    def _base_model(self) -> str:
        return str(self.model_folder) if self.model_folder is not None else self.folder_placeholder

    def _lora_load_hint(self, out: Path, base: str) -> str:
        # weight_name: with a file path instead, diffusers drops the metadata and guesses alpha = rank
        return (
            f"{type(self.denoiser).__name__}.from_pretrained('{base}/transformer')"
            f".load_lora_adapter('{out}', weight_name='{LORA_FILE}')"
        )

    def _save_full(self, out: Path) -> None:
        """A whole model folder, so ``adapter.options.model_path`` can point at the export."""
        self.denoiser.save_pretrained(out / "transformer")
        self.text_encoder.save_pretrained(out / "text_encoder")
        self.tokenizer.save_pretrained(out / "tokenizer")

    def _full_load_hint(self, folder: Path) -> str:
        folder = folder.parent
        return f"[adapter.options] model_path = '{folder}' (or {type(self).__name__}.load('{folder}'))"
