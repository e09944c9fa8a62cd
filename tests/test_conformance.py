"""The conformance kit (``vgrpo_platform.testing``): every built-in adapter and reward passes it, and each
of its checks catches the defect it exists for (a tiny adapter and reward with one defect at a time)."""

from __future__ import annotations

import copy
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ConfigDict

from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import BuildContext, SamplerSpec, Samples
from vgrpo_platform.registry import PluginConfig
from vgrpo_platform.testing import (
    ADAPTER_CHECKS,
    REWARD_CHECKS,
    check_adapter,
    check_component,
    check_entry_module_cheap,
    check_reward,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_pipelines, tiny_clip

REGISTRY = default_registry()
# the kit checks adapters and rewards; surrogates and rollout backends have their own tests
BUILTINS = [
    (s.kind, s.name)
    for s in REGISTRY.specs()
    if s.distribution == "vgrpo" and s.kind in ("adapter", "reward")
]
SHAPES_PROMPTS = ["a red circle", "a blue square", "two green triangles", "a red circle above a blue square"]
MOVING_SHAPES_PROMPTS = [
    "a red square rises",
    "a blue circle moving left",
    "a red square falls while a blue circle rises",
]


def _tiny_diffusers(
    builder: str, sizes: Callable[[Any], dict[str, Any]] = lambda tp: {"resolution": tp.RESOLUTION}
) -> Callable[[Path], dict[str, Any]]:
    """Options of a tiny pipeline ``tiny_pipelines.<builder>`` writes; ``sizes(tiny_pipelines)`` match it."""

    def build(folder: Path) -> dict[str, Any]:
        import tiny_pipelines

        getattr(tiny_pipelines, builder)(folder)
        return {"model": str(folder), **sizes(tiny_pipelines)}

    return build


def _tiny_kontext(folder: Path) -> dict[str, Any]:
    """Options of the tiny FLUX.1 Kontext pipeline ``tiny_kontext`` writes."""
    import tiny_kontext

    tiny_kontext.build_tiny_flux_kontext(folder)
    return {"model": str(folder), "resolution": tiny_kontext.RESOLUTION}


def _edits() -> dict[str, Any]:
    """The kit's prompts for an editing adapter: two instructions, each with its source image."""
    import tempfile

    import tiny_kontext

    return {"prompts": tiny_kontext.edit_prompts(Path(tempfile.mkdtemp()), 2)}


def _tiny_wan_i2v(folder: Path) -> dict[str, Any]:
    """Options of the tiny Wan image-to-video pipeline (Wan 2.2 I2V layout) ``tiny_wan_i2v`` writes."""
    import tiny_pipelines as tp
    import tiny_wan_i2v

    tiny_wan_i2v.build_tiny_wan_i2v(folder)
    return {
        "model": str(folder),
        "resolution": tp.WAN_SIDE,
        "num_frames": tp.WAN_FRAMES,
        "max_sequence_length": tp.WAN_TOKENS,
    }


def _first_frames() -> dict[str, Any]:
    """The kit's prompts for an image-to-video adapter: two, each with a first frame of the clip's size."""
    import tempfile

    import tiny_kontext
    import tiny_pipelines as tp

    return {"prompts": tiny_kontext.edit_prompts(Path(tempfile.mkdtemp()), 2, side=tp.WAN_SIDE)}


def _tiny_qwen_edit(folder: Path) -> dict[str, Any]:
    """Options of the tiny Qwen-Image-Edit-Plus pipeline ``tiny_qwen_image_edit`` writes (small areas)."""
    import tiny_qwen_image_edit as tq

    tq.build_tiny_qwen_image_edit_plus(folder)
    return {
        "model": str(folder),
        "resolution": 32,
        "max_sequence_length": 256,
        "vae_image_area": tq.VAE_SIDE**2,
        "condition_image_area": tq.CONDITION_SIDE**2,
    }


def _tiny_flux2(builder: str, tokens: str) -> Callable[[Path], dict[str, Any]]:
    """Options of a tiny FLUX.2 pipeline ``tiny_flux2.<builder>`` writes; ``tokens`` names its text length."""

    def build(folder: Path) -> dict[str, Any]:
        import tiny_flux2

        getattr(tiny_flux2, builder)(folder)
        return {"model": str(folder), "resolution": 32, "max_sequence_length": getattr(tiny_flux2, tokens)}

    return build


def _tiny_clip(processor: bool) -> Callable[[Path], dict[str, Any]]:
    def options(folder: Path) -> dict[str, Any]:
        from tiny_clip import save_clip

        save_clip(folder)
        return {"model": str(folder), **({"processor": str(folder)} if processor else {})}

    return options


def _tiny_aesthetic(folder: Path) -> dict[str, Any]:
    from tiny_clip import save_aesthetic_head, save_clip

    save_clip(folder, projection_dim=16)
    return {"model": str(folder), "head": str(save_aesthetic_head(folder / "head.pth", in_dim=16))}


def _tiny_hpsv2(folder: Path) -> dict[str, Any]:
    from tiny_clip import TINY_OPEN_CLIP, save_open_clip_hps

    return {"model": str(save_open_clip_hps(folder)), "arch": TINY_OPEN_CLIP}


def _tiny_imagereward(folder: Path) -> dict[str, Any]:
    from tiny_clip import save_imagereward

    save_imagereward(folder)
    return {"model": str(folder), "tokenizer": str(folder / "tokenizer")}


def _tiny_clap(folder: Path) -> dict[str, Any]:
    from tiny_clip import save_clap

    return {"model": str(save_clap(folder))}


def _framewise_clipscore(folder: Path) -> dict[str, Any]:
    """Frame-wise CLIPScore: the inner reward's options travel through ``options``."""
    return {"reward": "clipscore", "options": _tiny_clip(False)(folder)}


def _reference_clip(folder: Path) -> dict[str, Any]:
    """A 32 px reference mp4 with a moving gradient (decord mis-reads very small frames)."""
    from vgrpo_platform.media import write_video

    folder.mkdir(parents=True, exist_ok=True)
    ramp = torch.linspace(0, 1, 32)
    clip = torch.stack([(ramp + f / 6).remainder(1).expand(3, 32, 32) for f in range(6)])  # [6, 3, 32, 32]
    return {"path": str(write_video(clip, folder / "reference.mp4", fps=8)), "pool": 8}


def _ocr_inputs() -> dict[str, Any]:
    """Rendered text that reads right and a blank sign, against the prompt's quoted target (either engine
    takes ~0.5 s an image and the kit reads each one 7 times: keep the batch at two)."""
    from tiny_clip import render_text

    images = [render_text(t) for t in ("open late", "")]
    data = torch.stack([torch.tensor(a).permute(2, 0, 1).float() / 255 for a in images])  # [2, 3, H, W]
    return {"samples": Samples("image", data), "prompts": ['a neon sign that says "open late"']}


def _served_brightness(folder: Path) -> dict[str, Any]:
    """The ``remote`` reward's options: ``brightness`` served on a free loopback port by a daemon
    thread for the rest of the session (``vgrpo serve-reward``'s application and server)."""
    import threading

    from vgrpo_platform.cli.reward_server import RewardApp, make_server

    server = make_server(
        RewardApp("brightness", REGISTRY.build("reward", "brightness", {}, None)), "127.0.0.1", 0
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return {"url": f"http://127.0.0.1:{server.server_port}", "reward": "brightness", "timeout_s": 30}


def _fake_judge(folder: Path) -> dict[str, Any]:
    """The ``vlm_judge`` reward's options: the fake OpenAI-compatible judge of ``fake_judge.py`` on a
    free loopback port, in a daemon thread for the rest of the session."""
    from fake_judge import MODEL, FakeJudge, serve_in_background

    return {"base_url": serve_in_background(FakeJudge()) + "/v1", "model": MODEL, "timeout_s": 30}


def _tiny_hunyuan_video15(folder: Path) -> dict[str, Any]:
    from tiny_hunyuan_video import HY_FRAMES, HY_SIDE, build_tiny_hunyuan_video15

    build_tiny_hunyuan_video15(folder)
    return {"model": str(folder), "resolution": HY_SIDE, "num_frames": HY_FRAMES, "max_sequence_length": 64}


def _tiny_zimage(folder: Path) -> dict[str, Any]:
    from tiny_pipelines import RESOLUTION
    from tiny_zimage import ZIMAGE_TOKENS, build_tiny_zimage

    build_tiny_zimage(folder)
    return {"model": str(folder), "resolution": RESOLUTION, "max_sequence_length": ZIMAGE_TOKENS}


def _tiny_moving_shapes(folder: Path) -> dict[str, Any]:
    from tiny_moving_shapes import build_tiny_moving_shapes

    return build_tiny_moving_shapes(folder)


def _tiny_ltx2(folder: Path) -> dict[str, Any]:
    import tiny_ltx2 as tl

    tl.build_tiny_ltx2(folder)
    sizes = {"resolution": tl.LTX2_SIDE, "num_frames": tl.LTX2_FRAMES, "fps": tl.LTX2_FPS}
    return {"model": str(folder), **sizes, "max_sequence_length": tl.LTX2_TOKENS}


def _tiny_geneval(folder: Path) -> dict[str, Any]:
    """GenEval with a tiny random Mask2Former, every detection kept, partial credit, the pixel colour rule."""
    from tiny_detectors import save_mask2former

    return {
        "model": str(save_mask2former(folder)),
        "color": "pixels",
        "objective": "graded",
        "threshold": 0.0,
        "counting_threshold": 0.0,
    }


def _geneval_inputs() -> dict[str, Any]:
    """Every COCO class asked once per image: the share found exactly once varies with the detections."""
    from vgrpo_rewards.geneval.classes import OBJECTS

    meta = {"tag": "two_object", "include": [{"class": c, "count": 1} for c in OBJECTS]}
    return {**_image_samples(6), "metadata": [meta] * 6}


def _edit_inputs() -> dict[str, Any]:
    """Six results and a source image per sample (the metadata an editing adapter hands the rewards)."""
    sources = torch.rand(6, 3, 24, 24, generator=torch.Generator().manual_seed(1))
    return {**_image_samples(6), "metadata": [{"condition_image": s} for s in sources]}


def _tiny_tones(folder: Path) -> dict[str, Any]:
    """A tiny tones model (LongCat DiT + CLIP), its output layer off LongCat's zero init."""
    from vgrpo_adapters.tones.build import ModelSize, build_tones_model
    from vgrpo_adapters.tones.impl import TonesAdapter

    size = ModelSize(dit_dim=32, dit_depth=1, dit_heads=2, text_dim=16, text_layers=1, text_heads=2)
    adapter = TonesAdapter.load(build_tones_model(folder, size))
    with torch.no_grad():
        adapter.denoiser.proj_out.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(0))
    adapter.denoiser.save_pretrained(folder / "transformer")
    return {"model_path": str(folder)}


def _tones_inputs() -> dict[str, Any]:
    """Synthesised tones-world clips (8 kHz, the reward's rate), right and wrong for their prompts."""
    from vgrpo_rewards.tones.world import SAMPLE_RATE, synthesise

    heard = ["a high beep", "a low beep", "three short clicks", "a rising tone then a mid beep"]
    waves = torch.stack([torch.from_numpy(synthesise(p, i)) for i, p in enumerate(heard)])[:, None]
    prompts = ["a high beep", "a high beep", "two short clicks", "a rising tone then a mid beep"]
    return {"samples": Samples("audio", waves, sample_rate=SAMPLE_RATE), "prompts": prompts}


def _image_samples(n: int = 4) -> dict[str, Any]:
    return {"samples": Samples("image", torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0)))}


# (kind, name) -> (options, or a function of a scratch folder that writes tiny weights and returns the
# options; keyword arguments of the kit, or a function that returns them)
TINY: dict[tuple[str, str], tuple[Any, Any]] = {
    ("adapter", "toy"): ({}, {}),
    ("adapter", "shapes"): ({"resolution": 16}, {}),  # the weights ship with vgrpo
    ("adapter", "moving_shapes"): (_tiny_moving_shapes, {}),
    ("adapter", "sd3"): (_tiny_diffusers("build_tiny_sd3"), {}),
    ("adapter", "flux"): (_tiny_diffusers("build_tiny_flux"), {}),
    ("adapter", "flux_kontext"): (_tiny_kontext, _edits),  # an editing adapter: prompts carry sources
    ("adapter", "wan_i2v"): (_tiny_wan_i2v, _first_frames),
    ("adapter", "qwen_image_edit_plus"): (_tiny_qwen_edit, _edits),
    ("adapter", "flux2"): (_tiny_flux2("build_tiny_flux2", "DEV_TOKENS"), {}),
    ("adapter", "flux2_klein"): (_tiny_flux2("build_tiny_flux2_klein", "KLEIN_TOKENS"), {}),
    ("adapter", "wan"): (
        _tiny_diffusers(
            "build_tiny_wan",
            lambda tp: {
                "resolution": tp.WAN_SIDE,
                "num_frames": tp.WAN_FRAMES,
                "max_sequence_length": tp.WAN_TOKENS,
            },
        ),
        {},
    ),
    ("adapter", "qwen_image"): (
        _tiny_diffusers(
            "build_tiny_qwen_image",
            lambda tp: {"resolution": tp.RESOLUTION, "max_sequence_length": tp.QWEN_TOKENS},
        ),
        {},
    ),
    ("adapter", "qwen_image21"): (
        lambda folder: __import__("tiny_qwen_image21").conformance_options(folder),
        {},
    ),
    ("adapter", "hunyuan_video15"): (_tiny_hunyuan_video15, {}),
    ("adapter", "longcat_audio"): (
        _tiny_diffusers(
            "build_tiny_longcat", lambda tp: {"duration_s": 0.5, "max_sequence_length": tp.AUDIO_TOKENS}
        ),
        {},
    ),
    ("adapter", "zimage"): (_tiny_zimage, {}),
    ("adapter", "tones"): (_tiny_tones, {}),
    ("adapter", "ltx2"): (_tiny_ltx2, {}),
    ("reward", "brightness"): ({}, {}),
    ("reward", "target_color"): ({}, {}),
    ("reward", "shapes"): ({}, {"prompts": SHAPES_PROMPTS * 2}),
    ("reward", "moving_shapes"): ({}, {"prompts": MOVING_SHAPES_PROMPTS * 2}),  # video samples: the default
    ("reward", "jpeg"): ({}, {}),
    ("reward", "diversity"): ({}, {}),  # a group reward: the kit hands it one prompt's group
    ("reward", "ocr"): ({}, _ocr_inputs),
    ("reward", "clipscore"): (_tiny_clip(False), {}),
    ("reward", "pickscore"): (_tiny_clip(True), {}),
    ("reward", "aesthetic"): (_tiny_aesthetic, {}),
    ("reward", "hpsv2"): (_tiny_hpsv2, {}),
    ("reward", "imagereward"): (_tiny_imagereward, {}),
    ("reward", "framewise"): (_framewise_clipscore, {}),  # video samples: the kit's default
    ("reward", "temporal_consistency"): ({}, {}),
    ("reward", "motion"): ({}, {}),
    ("reward", "reference_similarity"): (_reference_clip, {}),
    ("reward", "clap"): (_tiny_clap, {}),  # audio samples: the kit's default
    ("reward", "loudness"): ({}, {}),
    ("reward", "silence_ratio"): ({}, {}),
    ("reward", "spectral_flatness"): ({}, {}),
    ("reward", "tones"): ({}, _tones_inputs),
    ("reward", "remote"): (_served_brightness, _image_samples),  # serves image rewards here
    ("reward", "vlm_judge"): (_fake_judge, _image_samples),
    ("reward", "geneval"): (_tiny_geneval, _geneval_inputs),
    ("reward", "edit_clip"): (_tiny_clip(False), _edit_inputs),
}
SKIP: dict[tuple[str, str], str] = {}  # (kind, name) -> why the kit cannot apply; keep it empty


def test_the_builtins_are_found():
    assert ("adapter", "toy") in BUILTINS and ("reward", "brightness") in BUILTINS
    assert ("reward", "shapes") in BUILTINS and ("reward", "target_color") in BUILTINS


@pytest.mark.parametrize(("kind", "name"), BUILTINS, ids=[f"{k}-{n}" for k, n in BUILTINS])
def test_builtin_passes_the_conformance_kit(kind, name, tmp_path):
    if (kind, name) in SKIP:
        pytest.skip(SKIP[(kind, name)])
    options, kwargs = TINY.get((kind, name), ({}, {}))
    if callable(options):
        options = options(tmp_path / "weights")
    if callable(kwargs):
        kwargs = kwargs()
    context = BuildContext(device="cpu", seed=0, run_dir=None, recipe_dir=tmp_path)
    if (kind, name) not in TINY:  # a new built-in: try its defaults, and say how to cover it if they fail
        spec = REGISTRY.get(kind, name)
        try:
            spec.factory(REGISTRY.validate_options(kind, name, {}), context)
        except Exception as exc:
            pytest.fail(
                f"{kind} {name!r} does not build from its defaults here ({type(exc).__name__}: {exc}); "
                "add a tiny build of it to TINY in tests/test_conformance.py (every built-in passes the kit)"
            )
    report = check_component(kind, name, options, context, registry=REGISTRY, **kwargs)
    expected = ADAPTER_CHECKS if kind == "adapter" else REWARD_CHECKS
    assert sorted(report.passed) == sorted(expected), report.skipped


def test_ocr_tesseract_engine_passes_the_conformance_kit(tmp_path):
    """The ``ocr`` reward's optional engine (the default, rapidocr, runs in the test above)."""
    import shutil

    if shutil.which("tesseract") is None:
        pytest.skip("the tesseract binary is not installed (apt-get install tesseract-ocr)")
    context = BuildContext(device="cpu", seed=0, run_dir=None, recipe_dir=tmp_path)
    report = check_component(
        "reward", "ocr", {"engine": "tesseract"}, context, registry=REGISTRY, **_ocr_inputs()
    )
    assert sorted(report.passed) == sorted(REWARD_CHECKS), report.skipped


def test_wan_two_experts_passes_the_conformance_kit(tmp_path):
    """The ``wan`` adapter on a Wan 2.2 two-expert pipeline (the row above covers the one-expert layout).
    Boundary 0.5: the kit's draws of t (0.07 to 0.68) then fall on both sides, so both experts' LoRA and
    a batch mixing them are checked."""
    import tiny_pipelines as tp

    model = tp.build_tiny_wan22(tmp_path / "weights", boundary_ratio=0.5)
    options = {"model": str(model), "resolution": tp.WAN_SIDE}
    options |= {"num_frames": tp.WAN_FRAMES, "max_sequence_length": tp.WAN_TOKENS}
    context = BuildContext(device="cpu", seed=0, run_dir=None, recipe_dir=tmp_path)
    report = check_component("adapter", "wan", options, context, registry=REGISTRY)
    assert sorted(report.passed) == sorted(ADAPTER_CHECKS), report.skipped


# ------------------------------------------------------------------- a tiny adapter, one defect at a time


class TinyConfig(PluginConfig):
    side: int = 4


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 8)

    def forward(self, prompts: list[str]) -> torch.Tensor:
        return torch.stack([self.embed(torch.tensor(list(p.encode()))).mean(0) for p in prompts])  # [B, 8]


class Denoiser(torch.nn.Module):
    def __init__(self, n: int, defect: str | None) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(n + 1 + 8, 32)
        self.out = torch.nn.Linear(32, n)
        self.extra = {
            "dropout": torch.nn.Dropout(0.5),
        }.get(defect or "", torch.nn.Identity())

    def forward(self, z: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.extra(self.inp(torch.cat([z.flatten(1), t[:, None], c], 1))))
        return self.out(h).reshape(z.shape)


class TinyAdapter(CoreCalledAdapter):
    """A correct pixel-space adapter of ``[3, side, side]`` images unless ``defect`` names a bug."""

    modality = "image"
    lora_target_modules = ("inp", "out")

    def __init__(self, side: int = 4, defect: str | None = None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.side, self.defect = side, defect
        self.encoder = Encoder()
        if defect != "encoder_trainable":
            self.encoder.requires_grad_(False)
        self.denoiser = Denoiser(3 * side * side, defect)
        self.gain = torch.nn.Linear(1, 1)  # outside the denoiser: must stay frozen
        self.gain.requires_grad_(defect == "outside_param")
        self.schedule = RectifiedFlowSchedule()
        self._copy = copy.deepcopy(self.denoiser) if defect == "stale_copy" else None
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def latent_shape(self) -> tuple[int, ...]:
        return (3, self.side, self.side)

    def encode_prompts(self, prompts):
        if self.defect == "encoder_trainable":
            return {"c": self.encoder(list(prompts))}
        with torch.no_grad():
            c = self.encoder(list(prompts))
        if self.defect == "cond_not_batch_first":
            return {"c": c.unsqueeze(0).expand(2, *c.shape)}  # [2, B, 8]
        if self.defect == "cond_padded_to_batch":  # one column per prompt: a row's shape follows its batch
            return {"c": torch.nn.functional.pad(c, (0, len(prompts)))}
        if self.defect == "cond_mixes_batch":  # unmasked padding would do this: rows read their batch-mates
            return {"c": c + c.mean(0, keepdim=True)}
        return {"c": c}

    def denoiser_inputs(self, z_t, t, cond):
        return {"z": z_t, "t": t, "c": cond["c"]}

    def network_velocity(self, z_t, t, cond):
        if self._copy is not None:  # a copy outside the core's call: never trained
            return self._copy(**self.denoiser_inputs(z_t, t, cond))
        if self.defect == "calls_module_itself":  # around the core: no wrapper would reach it
            return self.denoiser(**self.denoiser_inputs(z_t, t, cond))
        return super().network_velocity(z_t, t, cond)

    def denoiser_output(self, output, z_t):
        if self.defect == "outside_param":
            output = output * self.gain.weight.squeeze()
        if self.defect == "predict_flat":
            output = output.flatten(1)
        if self.defect == "batch_mixing":
            output = output - 0.5 * output.mean(0, keepdim=True)
        return output

    def predict(self, z_t, t, cond):
        out = super().predict(z_t, t, cond)
        if self.defect == "memoized" and not torch.is_grad_enabled():  # stale results for a seen input
            return self._cache.setdefault((z_t.data_ptr(), *z_t.shape), out)
        return out

    def sample(self, noise, cond, sampler):
        from vgrpo_platform.ode_solvers import solve_flow_ode

        if self.defect == "ignores_noise":
            noise = torch.zeros_like(noise)
        if self.defect == "sample_grad":
            return solve_flow_ode(lambda z, t: self.predict(z, t, cond), noise, sampler)
        return super().sample(noise, cond, sampler)

    def decode(self, latents):
        if self.defect == "decode_range":
            return Samples("image", (latents + 1) / 2 * 3)
        if self.defect == "decode_modality":
            return Samples("video", ((latents + 1) / 2).clamp(0, 1))
        return Samples("image", ((latents + 1) / 2).clamp(0, 1))


def tiny_factory(defect: str | None = None) -> Callable[[TinyConfig, Any], TinyAdapter]:
    def factory(config: TinyConfig, context: Any) -> TinyAdapter:
        seed = context.seed if defect != "unseeded" else int(torch.randint(0, 10**6, ()).item())
        return TinyAdapter(config.side, defect, seed)

    return factory


KIT = dict(entry_module="vgrpo_platform.registry", sampler=SamplerSpec("euler", 3))


def test_a_correct_adapter_passes_every_check():
    report = check_adapter(tiny_factory(), TinyConfig(), **KIT)
    assert report.passed == list(ADAPTER_CHECKS) and not report.skipped


@pytest.mark.parametrize(
    ("defect", "check", "message"),
    [
        ("encoder_trainable", "encode_prompts", "requires grad"),
        ("cond_not_batch_first", "encode_prompts", "1 prompt.*has batch 2"),
        ("cond_padded_to_batch", "encode_prompts", "shape may not depend on its batch-mates"),
        ("cond_mixes_batch", "predict_batch_independent", "encoded alone"),
        ("predict_flat", "predict", "predict returned"),
        ("dropout", "predict_deterministic", "max abs difference"),
        ("batch_mixing", "predict_batch_independent", "one sample at a time"),
        ("calls_module_itself", "denoiser_call", "only 0 of them through adapter.network"),
        ("unseeded", "build_deterministic", "same config and context.seed"),
        ("sample_grad", "sample", "requires grad"),
        ("ignores_noise", "sample_deterministic", "ignores its noise"),
        ("decode_range", "decode", r"must lie in \[0.0, 1.0\]"),
        ("decode_modality", "decode", "declares 'image'"),
        ("outside_param", "gradients_full", "outside the denoiser got gradients"),
        ("stale_copy", "gradients_full", "no denoiser parameter gets a gradient"),
        ("memoized", "reference_frozen", "does not change predict"),
    ],
)
def test_each_adapter_check_catches_its_defect(defect, check, message):
    with pytest.raises(AssertionError, match=rf"\[{check}\] .*{message}") as info:
        check_adapter(tiny_factory(defect), TinyConfig(), **KIT)
    assert "passed: entry_module_cheap" in str(info.value)  # the other checks still ran


def test_a_built_adapter_is_checked_too_but_not_its_build():
    report = check_adapter(TinyAdapter(), TinyConfig(), **KIT)
    assert "build_deterministic" in report.skipped


def test_unused_lora_targets_are_reported():
    adapter = TinyAdapter()
    adapter.denoiser.unused = torch.nn.Linear(2, 2)
    adapter.lora_target_modules = ("inp", "out", "unused")
    with pytest.raises(AssertionError, match=r"\[gradients_lora\] LoRA layers predict never uses.*unused"):
        check_adapter(adapter, TinyConfig(), **KIT)


def test_config_must_forbid_unknown_keys():
    class Lenient(PluginConfig):
        model_config = ConfigDict(extra="ignore")
        side: int = 4

    with pytest.raises(AssertionError, match=r"\[config_rejects_unknown_keys\] Lenient accepted"):
        check_adapter(tiny_factory(), Lenient(), checks=["config_rejects_unknown_keys"])


def test_entry_module_must_not_import_torch(tmp_path, monkeypatch):
    (tmp_path / "heavy_entry.py").write_text("import torch.nn\n")
    (tmp_path / "cheap_entry.py").write_text("import json\nfrom vgrpo_platform.hookspecs import hookimpl\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    check_entry_module_cheap("cheap_entry")
    with pytest.raises(AssertionError, match="imports torch"):
        check_entry_module_cheap("heavy_entry")


def test_unknown_check_names_are_refused():
    with pytest.raises(ValueError, match="unknown adapter check"):
        check_adapter(tiny_factory(), TinyConfig(), checks=["predcit"])


# -------------------------------------------------------------------- a tiny reward, one defect at a time


class Mean:
    """Mean pixel value, correct unless ``defect`` names a bug."""

    def __init__(self, defect: str | None = None) -> None:
        self.defect = defect
        self.modalities = {"image"} if defect == "modalities_set" else frozenset({"image"})

    def score(self, samples, prompts, metadata):
        x = samples.data.flatten(1).mean(1)  # [B]
        match self.defect:
            case "batch_normalised":
                return x - x.mean()
            case "column":
                return x[:, None]
            case "constant":
                return torch.zeros_like(x)
            case "nan":
                return x / 0 * 0
            case "random":
                return x + torch.rand(x.shape)
            case "inplace":
                samples.data.mul_(0.5)
            case "bad_detail":
                return {"score": x, "detail": x[:1]}
        return {"score": x, "std": samples.data.flatten(1).std(1)}


@pytest.mark.parametrize(
    ("defect", "check", "message"),
    [
        ("modalities_set", "attributes", "frozenset"),
        ("column", "score", r"shape \(6, 1\)"),
        ("nan", "score", "non-finite"),
        ("bad_detail", "score", "diagnostic 'detail'"),
        ("random", "score_deterministic", "twice"),
        ("batch_normalised", "batch_consistent", "one by one"),
        ("constant", "responds_to_input", "same score"),
        ("inplace", "input_unchanged", "in place"),
    ],
)
def test_each_reward_check_catches_its_defect(defect, check, message):
    with pytest.raises(AssertionError, match=rf"\[{check}\] .*{message}"):
        check_reward(Mean(defect), TinyConfig(), entry_module="vgrpo_platform.registry")


def test_a_correct_reward_passes_and_other_modalities_need_samples():
    report = check_reward(Mean(), TinyConfig(), entry_module="vgrpo_platform.registry")
    assert report.passed == list(REWARD_CHECKS)
    signal = Mean()
    signal.modalities = frozenset({"signal"})
    report = check_reward(signal, TinyConfig(), entry_module="vgrpo_platform.registry")
    assert "score" in report.skipped and "pass samples=" in report.skipped["score"]
    data = Samples("signal", torch.linspace(-1, 1, 12).reshape(3, 1, 4))
    report = check_reward(signal, TinyConfig(), samples=data, entry_module="vgrpo_platform.registry")
    assert report.passed == list(REWARD_CHECKS)


class Centred(Mean):
    """A group reward: each sample's mean pixel value minus its group's, which depends on the group
    (so scoring rows one by one would differ) but not on the group's row order, unless ``defect``."""

    groups = True

    def score(self, samples, prompts, metadata):
        x = samples.data.flatten(1).mean(1)  # [G]
        if self.defect == "row_order":
            return x - x[0]
        return x - x.mean()


def test_a_group_reward_passes_the_kit_and_each_group_check_catches_its_defect():
    report = check_reward(Centred(), TinyConfig(), entry_module="vgrpo_platform.registry")
    assert report.passed == list(REWARD_CHECKS)
    with pytest.raises(AssertionError, match=r"\[batch_consistent\] .*another order"):
        check_reward(Centred("row_order"), TinyConfig(), entry_module="vgrpo_platform.registry")
    strange = Centred()
    strange.groups = "yes"
    with pytest.raises(AssertionError, match=r"\[attributes\] .*groups must be True"):
        check_reward(strange, TinyConfig(), entry_module="vgrpo_platform.registry")


def test_group_prompts_are_one_prompt():
    """The kit hands a group reward one prompt's group, as the core does."""
    seen = []

    class Recorder(Centred):
        def score(self, samples, prompts, metadata):
            seen.append(list(prompts))
            return super().score(samples, prompts, metadata)

    check_reward(Recorder(), TinyConfig(), entry_module="vgrpo_platform.registry")
    assert seen and all(len(set(p)) == 1 and len(p) == 6 for p in seen)


def test_failure_message_is_readable():
    with pytest.raises(AssertionError) as info:
        check_reward(Mean("constant"), TinyConfig(), entry_module="vgrpo_platform.registry", label="'mean'")
    text = str(info.value)
    assert text.startswith("reward 'mean' failed 1 conformance check(s):")
    assert textwrap.dedent(text).count("\n  [") == 1
