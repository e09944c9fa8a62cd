"""What the diffusers-backed flow adapters (``flux``, ``sd3``) share.

Loading a pipeline by hub id or folder with a clear error, dtype and timestep-shift resolution, the
per-prompt text-embedding cache, chunked VAE decoding, and writing the trained weights in the format
diffusers loads back (``pipe.load_lora_weights(dir)`` for LoRA, ``save_pretrained`` for full
fine-tuning). Model-specific parts (prompt encoding, the transformer call, latent packing) live in
each adapter's ``impl.py`` as subclasses of ``DiffusersFlowAdapter``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.finetune import uses_lora
from vgrpo_platform.protocols import BuildContext, Conditioning, SamplerSpec, Samples
from vgrpo_platform.sampling import solve_flow_ode
from vgrpo_platform.schedules import RectifiedFlowSchedule

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EXPORT_INFO = "vgrpo_export.json"
"""Written beside the exported weights: what they are and how to load them."""


class ModelWeightsError(VgrpoError):
    """The model's weights could not be found or read."""


# --------------------------------------------------------------------------------------- loading


def resolve_dtype(
    name: str, device: torch.device | str, context_dtype: torch.dtype | None = None
) -> torch.dtype:
    """``auto``: the host's dtype if set, else bf16 on CUDA (what these models ship in), fp32 on CPU."""
    if name != "auto":
        return DTYPES[name]
    if context_dtype is not None:
        return context_dtype
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def resolve_model(model: str, recipe_dir: str | Path | None) -> str:
    """A local folder (absolute, next to the recipe, or relative to the working dir) or the hub id as is."""
    path = Path(model).expanduser()
    if path.is_absolute():
        return str(path)
    if recipe_dir is not None and (Path(recipe_dir) / path).is_dir():
        return str(Path(recipe_dir) / path)
    if path.is_dir():
        return str(path.resolve())
    return model


def load_pipeline(pipeline_class: type, model: str, *, revision: str | None, dtype: torch.dtype) -> Any:
    """``pipeline_class.from_pretrained`` with one actionable error when the weights are not there."""
    try:
        with warnings.catch_warnings():  # diffusers >= 0.36 renames torch_dtype to dtype; older ones lack it
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            return pipeline_class.from_pretrained(model, revision=revision, torch_dtype=dtype)
    except (OSError, ValueError) as exc:  # missing files, offline hub, gated repo without a token
        local = Path(model).expanduser().is_absolute() or Path(model).exists()
        how = (
            "check that the folder holds a diffusers pipeline (model_index.json and its subfolders)"
            if local
            else f"download it first (`huggingface-cli download {model}`, after accepting its licence on "
            "the hub and logging in with `huggingface-cli login` if it is gated), or set "
            "adapter.options.model to a local folder in the diffusers layout"
        )
        raise ModelWeightsError(
            f"could not load {pipeline_class.__name__} weights from {model!r}"
            f"{f' (revision {revision})' if revision else ''}: {str(exc).splitlines()[0]}; {how}"
        ) from exc


def static_shift(scheduler_config: Any, image_seq_len: int) -> float:
    """The timestep shift ``s`` of the model's scheduler at ``image_seq_len`` latent tokens.

    A static scheduler uses ``shift``. FLUX shifts dynamically: ``sigma' = e^mu / (e^mu + (1/sigma - 1))``
    with ``mu`` linear in the token count (diffusers' ``calculate_shift``). That is exactly the static
    shift ``s sigma / (1 + (s - 1) sigma)`` with ``s = e^mu``, so one resolution has one static shift.
    """
    get = (
        scheduler_config.get
        if hasattr(scheduler_config, "get")
        else lambda k, d=None: getattr(scheduler_config, k, d)
    )
    if not get("use_dynamic_shifting", False):
        return float(get("shift", 1.0))
    if get("time_shift_type", "exponential") != "exponential" or get("shift_terminal", None):
        raise ValueError(
            "only exponential dynamic shifting without shift_terminal maps to a static shift; "
            "set adapter.options.shift explicitly for this scheduler"
        )
    base_len, max_len = get("base_image_seq_len", 256), get("max_image_seq_len", 4096)
    base_shift, max_shift = get("base_shift", 0.5), get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_len - base_len)
    mu = base_shift + slope * (image_seq_len - base_len)
    return math.exp(mu)


# --------------------------------------------------------------------------------- prompt cache


class PromptCache:
    """Per-prompt conditioning rows, keyed by the prompt string: each distinct prompt is encoded once.

    Rows are stored without their batch dimension on ``device`` (host memory by default) and stacked
    back into batch-first tensors on request; ``hits`` / ``misses`` count prompts served / encoded.
    """

    def __init__(self, enabled: bool = True, device: torch.device | str = "cpu") -> None:
        self.enabled = enabled
        self.device = torch.device(device)
        self.rows: dict[str, dict[str, torch.Tensor]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, prompts: Sequence[str], encode: Callable[[list[str]], Conditioning]) -> Conditioning:
        """Batch-first conditioning ``{key: [B, ...]}`` for ``prompts``; ``encode`` sees only new prompts."""
        prompts = list(prompts)
        if not prompts:
            raise ValueError("encode_prompts needs at least one prompt")
        if not self.enabled:
            self.misses += len(prompts)
            return encode(prompts)
        missing = [p for p in dict.fromkeys(prompts) if p not in self.rows]
        if missing:
            out = encode(missing)  # {key: [len(missing), ...]}
            for i, prompt in enumerate(missing):
                self.rows[prompt] = {k: v[i].to(self.device, copy=True) for k, v in out.items()}
        self.misses += len(missing)
        self.hits += len(prompts) - len(missing)
        keys = self.rows[prompts[0]].keys()
        return {k: torch.stack([self.rows[p][k] for p in prompts]) for k in keys}


# ------------------------------------------------------------------------------------ the adapter


class DiffusersFlowAdapter:
    """A diffusers text-to-image rectified-flow pipeline as a vgrpo ``Adapter``.

    Latents are the VAE's, unpacked ``[C, H/f, W/f]`` (``f`` = the VAE's downsampling), already scaled
    (``(x - shift_factor) * scaling_factor``). Only the transformer (``denoiser``) is trained; VAE and
    text encoders are frozen. Subclasses set ``pipeline_class`` and ``lora_target_modules`` and implement
    ``_encode`` (uncached prompts -> batch-first tensors), ``_transformer`` (one network call) and
    ``_check_resolution``; they may override ``_rollout_velocity`` (e.g. with CFG).
    """

    modality = "image"
    pipeline_class: type
    lora_target_modules: Sequence[str] = ()

    def __init__(
        self,
        pipe: Any,
        *,
        resolution: int,
        device: torch.device | str = "cpu",
        shift: float | None = None,
        max_sequence_length: int = 256,
        decode_chunk_size: int = 4,
        cache_text_embeddings: bool = True,
        text_cache_device: str = "cpu",
        offload_text_encoders: bool = False,
    ) -> None:
        self.pipe = pipe
        self.device = torch.device(device)
        self.denoiser = pipe.transformer.to(self.device)
        self.dtype = self.denoiser.dtype
        self.vae = pipe.vae.requires_grad_(False).eval().to(self.device)
        self.text_encoders = [
            m
            for name in ("text_encoder", "text_encoder_2", "text_encoder_3")
            if (m := getattr(pipe, name, None)) is not None
        ]
        self.offload_text_encoders = offload_text_encoders
        for encoder in self.text_encoders:
            encoder.requires_grad_(False).eval().to("cpu" if offload_text_encoders else self.device)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self._check_resolution(resolution)
        self.resolution = resolution
        self.latent_side = resolution // self.vae_scale_factor
        self.max_sequence_length = max_sequence_length
        self.decode_chunk_size = decode_chunk_size
        shift = shift if shift is not None else static_shift(pipe.scheduler.config, self.image_seq_len())
        self.schedule = RectifiedFlowSchedule(shift)
        cache_device = self.device if text_cache_device == "device" else torch.device("cpu")
        self.prompt_cache = PromptCache(cache_text_embeddings, cache_device)

    # -------------------------------------------------------------------------- construction helpers
    @classmethod
    def from_config(cls, config: Any, context: BuildContext) -> DiffusersFlowAdapter:
        """The factory's work: resolve the model and dtype, load the pipeline, wrap it."""
        device = torch.device(context.device)
        dtype = resolve_dtype(config.dtype, device, context.dtype)
        model = resolve_model(config.model, context.recipe_dir)
        pipe = load_pipeline(cls.pipeline_class, model, revision=config.revision, dtype=dtype)
        return cls(pipe, device=device, **cls.options_from_config(config))

    @staticmethod
    def options_from_config(config: Any) -> dict[str, Any]:
        """Constructor keywords from a config (subclasses add their own)."""
        return dict(
            resolution=config.resolution,
            shift=config.shift,
            max_sequence_length=config.max_sequence_length,
            decode_chunk_size=config.decode_chunk_size,
            cache_text_embeddings=config.cache_text_embeddings,
            text_cache_device=config.text_cache_device,
            offload_text_encoders=config.offload_text_encoders,
        )

    # ------------------------------------------------------------------------------- model specifics
    def _check_resolution(self, resolution: int) -> None:
        raise NotImplementedError

    def image_seq_len(self) -> int:
        """Image tokens the transformer sees (what FLUX's dynamic shift is a function of)."""
        raise NotImplementedError

    def _encode(self, prompts: list[str]) -> Conditioning:
        raise NotImplementedError

    def _transformer(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        raise NotImplementedError

    # --------------------------------------------------------------------------------- the protocol
    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.vae.config.latent_channels), self.latent_side, self.latent_side)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Batch-first conditioning on the adapter's device; cached per prompt string."""
        cond = self.prompt_cache.get(prompts, self._encode_on_device)
        return {k: v.to(self.device) for k, v in cond.items()}

    def _encode_on_device(self, prompts: list[str]) -> Conditioning:
        if not self.offload_text_encoders:
            return self._encode(prompts)
        for encoder in self.text_encoders:
            encoder.to(self.device)
        try:
            return self._encode(prompts)
        finally:
            for encoder in self.text_encoders:
                encoder.to("cpu")

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Velocity ``v ~ eps - x0`` at latents ``z_t`` ``[B, C, h, w]``, ``t`` ``[B]`` in ``[0, 1]``."""
        t = t.to(device=z_t.device, dtype=torch.float32).expand(z_t.shape[0])  # [B]
        return self._transformer(z_t, t, cond).to(z_t.dtype)

    def _rollout_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.predict(z, t, cond)

    def sample(self, noise: torch.Tensor, cond: Conditioning, sampler: SamplerSpec) -> torch.Tensor:
        """Clean latents ``[B, C, h, w]`` from noise at t=1, without gradient."""
        with torch.no_grad():
            return solve_flow_ode(
                lambda z, t: self._rollout_velocity(z, t, cond), noise, sampler, shift=self.schedule.shift
            )

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, C, h, w]`` -> images ``[B, 3, H, W]`` float32 in ``[0, 1]``, in chunks."""
        cfg = self.vae.config
        shift = cfg.shift_factor if getattr(cfg, "shift_factor", None) is not None else 0.0
        images = []
        for part in latents.split(self.decode_chunk_size):
            x = part.to(self.device, self.vae.dtype) / cfg.scaling_factor + shift
            images.append(self.vae.decode(x, return_dict=False)[0].float())  # [b, 3, H, W] in ~[-1, 1]
        return Samples("image", ((torch.cat(images) + 1) / 2).clamp(0, 1))

    # -------------------------------------------------------------------------------------- export
    def export_trained(self, out_dir: str | Path) -> None:
        """LoRA: ``pytorch_lora_weights.safetensors`` that ``pipe.load_lora_weights(out_dir)`` reads (rank and
        alpha in its metadata). Full fine-tuning: ``out_dir/transformer`` via ``save_pretrained``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        base = getattr(self.pipe, "name_or_path", None) or "<base model>"
        if uses_lora(self.denoiser):
            from peft.utils import get_peft_model_state_dict

            state = {
                k: v.detach().to("cpu").contiguous()
                for k, v in get_peft_model_state_dict(self.denoiser).items()
            }
            peft_config = getattr(self.denoiser, "peft_config", {}).get("default")
            self.pipeline_class.save_lora_weights(
                out,
                transformer_lora_layers=state,
                transformer_lora_adapter_metadata=peft_config.to_dict() if peft_config is not None else None,
            )
            info = {
                "kind": "lora",
                "load": f"{self.pipeline_class.__name__}.from_pretrained('{base}')"
                f".load_lora_weights('{out}')",
            }
        else:
            self.denoiser.save_pretrained(out / "transformer")
            info = {
                "kind": "full",
                "load": f"{type(self.denoiser).__name__}.from_pretrained('{out / 'transformer'}')"
                " then pass transformer=... to the pipeline's from_pretrained",
            }
        info.update(base_model=base, resolution=self.resolution, shift=self.schedule.shift)
        (out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")


class TrueCFGMixin:
    """True classifier-free guidance, shared by the adapters that offer it (SD3, Wan, LongCat audio).

    Rollouts are guided when ``cfg_scale > 1``; the policy's own predictions (what the surrogate
    trains) only when ``cfg_in_training`` is set too. Subclasses say what the unconditional branch
    sees in ``null_conditioning``. Put the mixin before ``DiffusersFlowAdapter`` in the bases.
    """

    cfg_scale: float
    cfg_in_training: bool

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale > 1.0

    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """The unconditional branch's conditioning, batch-first ``[batch, ...]`` like ``cond``."""
        raise NotImplementedError

    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """``v_null + s (v_cond - v_null)`` from one network call on the doubled batch ``[2B, ...]``."""
        batch = z.shape[0]
        null = self.null_conditioning(cond, batch)
        both = {k: torch.cat([null[k].to(self.device), cond[k].to(self.device)]) for k in cond}
        t = t.to(device=z.device, dtype=torch.float32).expand(batch)
        v_null, v_cond = self._transformer(torch.cat([z, z]), torch.cat([t, t]), both).chunk(2)
        return (v_null + self.cfg_scale * (v_cond - v_null)).to(z.dtype)

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        if self.uses_cfg and self.cfg_in_training:
            return self.guided_velocity(z_t, t, cond)
        return super().predict(z_t, t, cond)

    def _rollout_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        if self.uses_cfg:
            return self.guided_velocity(z, t, cond)
        return super().predict(z, t, cond)
