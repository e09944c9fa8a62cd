"""What the diffusers-backed flow adapters share, whatever they generate (image, video, audio).

Loading a pipeline by hub id or folder with a clear error, dtype and timestep-shift resolution, the
per-prompt text-embedding cache, text-encoder offload, the
construction from a config, and (``_diffusers_export``) writing the trained weights in the format
diffusers loads back. ``DiffusersFlowAdapter`` holds the modality-independent part, ``DiffusersImageAdapter``
the image part; ``_diffusers_video`` and the audio adapter add theirs. Model-specific parts (prompt
encoding, the transformer call, latent packing) live in each adapter's ``impl.py``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from vgrpo_adapters._diffusers_export import EXPORT_INFO as EXPORT_INFO  # re-exported: its old home
from vgrpo_adapters._diffusers_export import TransformerExport
from vgrpo_adapters._weights import ModelWeightsError as ModelWeightsError  # re-exported: its old home
from vgrpo_adapters._weights import weight_loading_kwargs

from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import BuildContext, Conditioning, Samples

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")
JOINT_ATTENTION = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
)
"""LoRA targets of an MMDiT's joint attention, image and text streams (FLUX, SD3, HunyuanVideo layouts);
the text stream's output projection ``attn.to_add_out`` is left to each adapter (some drop it)."""
"""The pipeline attributes that may hold a (frozen) text encoder."""


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


def load_pipeline(
    pipeline_class: type,
    model: str,
    *,
    revision: str | None,
    dtype: torch.dtype,
    allow_pickle_weights: bool = False,
) -> Any:
    """``pipeline_class.from_pretrained`` with one actionable error when the weights are not there (or
    are pickles the recipe does not trust: ``_weights``)."""
    safe = weight_loading_kwargs(
        model, allow_pickle=allow_pickle_weights, key="adapter.options.allow_pickle_weights"
    )
    try:
        with warnings.catch_warnings():  # diffusers >= 0.36 renames torch_dtype to dtype; older ones lack it
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            return pipeline_class.from_pretrained(model, revision=revision, torch_dtype=dtype, **safe)
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


def resized_source(image: torch.Tensor, height: int, width: int, device: torch.device) -> torch.Tensor:
    """``[3, h, w]`` in ``[0, 1]`` -> ``[3, height, width]`` float32 in ``[-1, 1]`` (bicubic, antialiased,
    when the size differs; the pipelines resize with PIL, so only a source of the output's size is
    pixel-identical to theirs)."""
    x = image.to(device, torch.float32)[None]
    if x.shape[-2:] != (height, width):
        x = torch.nn.functional.interpolate(x, size=(height, width), mode="bicubic", antialias=True)
    return x[0].clamp(0, 1) * 2 - 1


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


# ------------------------------------------------------------------------------- small helpers


def latent_stats(vae_config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel ``latents_mean`` and ``latents_std`` ``[1, C, 1, 1, 1]`` of a video VAE (Wan, Qwen-Image)
    that normalises its latents, as the pipelines sample them: ``(x - mean) / std``."""
    shape = (1, vae_config.z_dim, 1, 1, 1)
    return torch.tensor(vae_config.latents_mean).view(shape), torch.tensor(vae_config.latents_std).view(shape)


def lora_targets_but_last_block(
    shared: Sequence[str], text_output: Sequence[str], blocks: int
) -> tuple[str, ...]:
    """LoRA targets with the text-stream outputs named block by block, the last block left out: the model
    discards that block's text states, so LoRA there would never get a gradient."""
    per_block = (f"transformer_blocks.{i}.{name}" for i in range(blocks - 1) for name in text_output)
    return (*shared, *per_block)


def constructor_keywords(cls: type) -> set[str]:
    """The keyword-only parameters an adapter's constructor accepts: those of each ``__init__`` along the
    MRO while they pass ``**kwargs`` on, and those of ``_init_modality`` (where the base sends the rest)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    params = inspect.signature(cls._init_modality).parameters.values()
    return names | {p.name for p in params if p.kind is p.KEYWORD_ONLY}


# ------------------------------------------------------------------------------------ the adapters


class DiffusersFlowAdapter(CoreCalledAdapter, TransformerExport):
    """A diffusers text-conditioned rectified-flow pipeline as a vgrpo ``Adapter``, any modality.

    Only the transformer (``denoiser``) is trained; VAE and text encoders are frozen. A modality's
    subclass implements ``_init_modality`` (its size options, after the models are on the device),
    ``default_shift``, ``latent_shape`` and ``decode``; a model's subclass sets ``pipeline_class`` and
    ``lora_target_modules`` and implements ``_encode`` (uncached prompts -> batch-first tensors),
    ``denoiser_inputs`` and, where the output is packed, ``denoiser_output``: the core makes the call
    (``vgrpo_platform.network``) and gives ``predict`` and ``sample``; CFG overrides the velocities.
    Constructor keywords are named after the config's fields, so one ``options_from_config`` serves all.
    """

    modality: str
    pipeline_class: type
    lora_target_modules: Sequence[str] = ()

    def __init__(
        self,
        pipe: Any,
        *,
        device: torch.device | str = "cpu",
        shift: float | None = None,
        max_sequence_length: int = 256,
        decode_chunk_size: int = 4,
        cache_text_embeddings: bool = True,
        text_cache_device: str = "cpu",
        offload_text_encoders: bool = False,
        **modality_options: Any,
    ) -> None:
        self.pipe = pipe
        self.device = torch.device(device)
        self.denoiser = self._load_denoiser(pipe)
        self.dtype = self.denoiser.dtype
        self.vae = pipe.vae.requires_grad_(False).eval().to(self.device)
        self.text_encoders = [m for name in TEXT_ENCODERS if (m := getattr(pipe, name, None)) is not None]
        self.offload_text_encoders = offload_text_encoders
        for encoder in self.text_encoders:
            encoder.requires_grad_(False).eval().to("cpu" if offload_text_encoders else self.device)
        self._init_modality(**modality_options)
        self.max_sequence_length = max_sequence_length
        self.decode_chunk_size = decode_chunk_size
        self.schedule = RectifiedFlowSchedule(shift if shift is not None else self.default_shift())
        cache_device = self.device if text_cache_device == "device" else torch.device("cpu")
        self.prompt_cache = PromptCache(cache_text_embeddings, cache_device)

    # -------------------------------------------------------------------------- construction helpers
    @classmethod
    def from_config(cls, config: Any, context: BuildContext) -> DiffusersFlowAdapter:
        """The factory's work: resolve the model and dtype, load the pipeline, wrap it."""
        device = torch.device(context.device)
        dtype = resolve_dtype(config.dtype, device, context.dtype)
        model = resolve_model(config.model, context.recipe_dir)
        pipe = load_pipeline(
            cls.pipeline_class,
            model,
            revision=config.revision,
            dtype=dtype,
            allow_pickle_weights=config.allow_pickle_weights,
        )
        return cls(pipe, device=device, **cls.options_from_config(config))

    @classmethod
    def options_from_config(cls, config: Any) -> dict[str, Any]:
        """Constructor keywords from the config: each one the config has a field of the same name for."""
        return {
            name: getattr(config, name) for name in sorted(constructor_keywords(cls)) if hasattr(config, name)
        }

    def _load_denoiser(self, pipe: Any) -> Any:
        """The trained network, on the device (Wan 2.2 wraps its two experts here)."""
        return pipe.transformer.to(self.device)

    # ------------------------------------------------------------------------------- model specifics
    def _init_modality(self) -> None:
        """Set the modality's size attributes (and check them); runs once the models are on the device."""
        raise NotImplementedError

    def default_shift(self) -> float:
        """The model's own timestep shift, used when the config leaves ``shift`` null."""
        raise NotImplementedError

    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> Samples:
        raise NotImplementedError

    def _encode(self, prompts: list[str]) -> Conditioning:
        raise NotImplementedError

    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """The transformer's keyword inputs (one network call, made by the core's ``DenoiserCall``)."""
        raise NotImplementedError

    # --------------------------------------------------------------------------------- the protocol
    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Batch-first conditioning on the adapter's device; cached per prompt string."""
        cond = self.prompt_cache.get(prompts, self._encode_on_device)
        return {k: v.to(self.device) for k, v in cond.items()}

    def _encode_on_device(self, prompts: list[str]) -> Conditioning:
        with self.text_encoders_on_device():
            return self._encode(prompts)

    @contextlib.contextmanager
    def text_encoders_on_device(self) -> Iterator[None]:
        """Inside, the text encoders are on the device (``offload_text_encoders`` keeps them in host
        memory otherwise)."""
        if not self.offload_text_encoders:
            yield
            return
        for encoder in self.text_encoders:
            encoder.to(self.device)
        try:
            yield
        finally:
            for encoder in self.text_encoders:
                encoder.to("cpu")


class DiffusersImageAdapter(DiffusersFlowAdapter):
    """A text-to-image pipeline: square images of ``resolution`` pixels.

    Latents are the VAE's, unpacked ``[C, H/f, W/f]`` (``f`` = the VAE's downsampling), already scaled
    (``(x - shift_factor) * scaling_factor``) unless a subclass's ``_vae_decode`` says otherwise. The
    transformer sees ``patch x patch`` latent pixels per token (2 for the 2x2 packing of FLUX-like models).
    """

    modality = "image"
    display_name: str = "this model"
    patch_label: str = "2"
    """How ``_check_resolution``'s message names the patch side (``patch`` where the config sets it)."""

    def _init_modality(self, *, resolution: int) -> None:
        self.vae_scale_factor = self._vae_scale_factor()
        self._check_resolution(resolution)
        self.resolution = resolution
        self.latent_side = resolution // self.vae_scale_factor

    def _vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def _patch(self) -> int:
        """Latent pixels per transformer token side."""
        return 2

    def _check_resolution(self, resolution: int) -> None:
        step = self.vae_scale_factor * self._patch()
        if resolution % step:
            raise ValueError(
                f"{self.display_name} needs a resolution divisible by {step} (VAE factor x "
                f"{self.patch_label}), got {resolution}"
            )

    def image_seq_len(self) -> int:
        """Image tokens the transformer sees (what FLUX's dynamic shift is a function of)."""
        return (self.latent_side // self._patch()) ** 2

    def default_shift(self) -> float:
        return static_shift(self.pipe.scheduler.config, self.image_seq_len())

    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.vae.config.latent_channels), self.latent_side, self.latent_side)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, *L]`` -> images ``[B, 3, H, W]`` float32 in ``[0, 1]``, in chunks."""
        images = [self._vae_decode(part) for part in latents.split(self.decode_chunk_size)]
        return Samples("image", ((torch.cat(images) + 1) / 2).clamp(0, 1))

    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        """A chunk of latents -> images ``[b, 3, H, W]`` float32 in ``~[-1, 1]``."""
        cfg = self.vae.config
        x = part.to(self.device, self.vae.dtype) / cfg.scaling_factor + self._vae_shift()
        return self.vae.decode(x, return_dict=False)[0].float()

    def _vae_shift(self) -> float:
        cfg = self.vae.config
        return cfg.shift_factor if getattr(cfg, "shift_factor", None) is not None else 0.0

    @torch.no_grad()
    def encode_images(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Images ``[3, h, w]`` in ``[0, 1]`` (any size: resized to the resolution) -> latents
        ``[N, *latent_shape]`` float32 on the CPU, what ``decode`` inverts: ``[train.data_anchor]``'s data."""
        side = self.resolution
        x = torch.stack([resized_source(im, side, side, self.device) for im in images])  # [N, 3, H, W]
        return torch.cat([self._vae_encode(part).float().cpu() for part in x.split(self.decode_chunk_size)])

    def _vae_encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[b, 3, H, W]`` in ``[-1, 1]`` -> scaled latents ``[b, C, h, w]``: the VAE posterior's
        mode, then ``(x - shift_factor) * scaling_factor``, the inverse of ``_vae_decode`` (as the img2img
        and Kontext pipelines encode with ``sample_mode="argmax"``). A subclass that decodes its own way
        encodes its own way too (FLUX.2), or refuses in one line (Qwen-Image 2.x)."""
        latents = self.vae.encode(images.to(self.vae.dtype)).latent_dist.mode()
        return ((latents - self._vae_shift()) * self.vae.config.scaling_factor).to(self.dtype)
