"""Conditioned prompts: JSONL fields become each prompt's reward metadata, ``"image"`` its condition image,
carried through the prompt sampler, the adapter's encoder, the rewards, the grids and the reward wire."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from PIL import Image

from vgrpo_platform import reward_wire
from vgrpo_platform.conditions import (
    Prompt,
    condition_images,
    encode_conditioned,
    reward_metadata,
)
from vgrpo_platform.config.recipe import load_prompts, validate_components
from vgrpo_platform.config.schema import PromptsSection, Recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import Samples
from vgrpo_platform.registry import Component, PluginConfig
from vgrpo_platform.training.iteration.prompts import PromptSampler
from vgrpo_platform.training.iteration.scoring import WeightedReward, score_all
from vgrpo_platform.training.observe.grids import read_layout, save_before_after, save_grid

RED, BLUE = (255, 0, 0), (0, 0, 255)


def prompt_set(tmp_path: Path) -> Path:
    """``sub/edits.jsonl`` with two edits (images in ``sub/img``) and GenEval-style metadata."""
    (tmp_path / "sub" / "img").mkdir(parents=True)
    Image.new("RGB", (6, 4), RED).save(tmp_path / "sub" / "img" / "red.png")
    Image.new("RGB", (5, 5), BLUE).save(tmp_path / "sub" / "img" / "blue.png")
    lines = [
        {"prompt": "make it blue", "image": "img/red.png", "tag": "colors"},
        {"prompt": "make it red", "image": ["img/blue.png", "img/red.png"], "include": [{"class": "cat"}]},
    ]
    path = tmp_path / "sub" / "edits.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_jsonl_fields_become_metadata_and_image_paths_resolve_against_the_file(tmp_path) -> None:
    prompt_set(tmp_path)
    train, _ = load_prompts(PromptsSection(train_file="sub/edits.jsonl"), tmp_path)
    first, second = train
    assert first == "make it blue" and isinstance(first, Prompt)
    assert first.metadata == {"image": "img/red.png", "tag": "colors"}
    assert first.images == (tmp_path / "sub" / "img" / "red.png",)
    assert len(second.images) == 2
    image = condition_images(first)[0]
    assert image.shape == (3, 4, 6) and image.dtype == torch.float32
    assert torch.equal(image[:, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    plain, _ = load_prompts(PromptsSection(train=["a cat"]), tmp_path)
    assert reward_metadata(plain) == [{}]


def test_a_missing_or_malformed_image_names_the_line_and_the_fix(tmp_path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "image": "gone.png"}\n')
    with pytest.raises(RecipeError, match=r"p.jsonl:1: condition image .*gone.png' not found .*relative to"):
        load_prompts(PromptsSection(train_file="p.jsonl"), tmp_path)
    (tmp_path / "q.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "image": 3}\n')
    with pytest.raises(RecipeError, match=r'q.jsonl:2: "image" must be a path'):
        load_prompts(PromptsSection(train_file="q.jsonl"), tmp_path)


class TextConfig(PluginConfig):
    modality: ClassVar[str] = "image"


class EditConfig(PluginConfig):
    modality: ClassVar[str] = "image"
    takes_condition_image: ClassVar[bool] = True


class Plugin:
    @hookimpl
    def register_components(self) -> list[Component]:
        return [
            Component("adapter", "text_only", lambda c, ctx: c, TextConfig),
            Component("adapter", "editor", lambda c, ctx: c, EditConfig),
            Component("surrogate", "vgrpo", lambda c, ctx: c, PluginConfig),
            Component("reward", "any", lambda c, ctx: c, PluginConfig),
        ]


def resolve(tmp_path: Path, adapter: str, **prompts: object) -> object:
    registry = collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=[Plugin()]))
    data = {"adapter": {"name": adapter}, "rewards": [{"name": "any"}], "prompts": prompts}
    recipe = Recipe.model_validate(data)
    return validate_components(recipe, registry, recipe_dir=tmp_path, source="r.toml")


def test_adapters_refuse_prompt_sets_they_cannot_take_in_one_line(tmp_path) -> None:
    prompt_set(tmp_path)
    resolved = resolve(tmp_path, "editor", train_file="sub/edits.jsonl")
    assert resolved.train_prompts[0].images  # type: ignore[attr-defined]
    with pytest.raises(RecipeError) as info:
        resolve(tmp_path, "text_only", train_file="sub/edits.jsonl")
    msg = str(info.value)
    assert msg.startswith("r.toml: adapter text_only takes no condition image but the train prompts carry")
    assert "use an editing adapter such as flux_kontext" in msg
    with pytest.raises(RecipeError, match="adapter editor edits a condition image but the eval prompts"):
        resolve(tmp_path, "editor", train_file="sub/edits.jsonl", eval=["a cat"])
    assert resolve(tmp_path, "text_only", train=["a cat"]).train_prompts == ["a cat"]  # type: ignore[attr-defined]


class Editor:
    takes_condition_image = True

    def encode_conditions(self, prompts, images):
        return {"mean": torch.stack([torch.stack([im.mean() for im in ims]).mean() for ims in images])}


class TextOnly:
    def encode_prompts(self, prompts):
        return {"length": torch.tensor([float(len(p)) for p in prompts])}


def test_the_core_encodes_through_encode_conditions_only_for_an_editing_adapter(tmp_path) -> None:
    prompt_set(tmp_path)
    train, _ = load_prompts(PromptsSection(train_file="sub/edits.jsonl"), tmp_path)
    cond = encode_conditioned(Editor(), train)
    torch.testing.assert_close(cond["mean"], torch.tensor([1 / 3, 1 / 3]))  # red; blue and red
    assert encode_conditioned(TextOnly(), ["ab"])["length"].tolist() == [2.0]
    with pytest.raises(RecipeError, match="TextOnly takes no condition image"):
        encode_conditioned(TextOnly(), train)
    with pytest.raises(
        RecipeError, match="Editor edits a condition image but the prompts include 'ab' without one"
    ):
        encode_conditioned(Editor(), ["ab"])


class Recorder:
    modalities = frozenset({"image"})

    def __init__(self) -> None:
        self.seen: list = []

    def score(self, samples, prompts, metadata):
        self.seen = list(metadata)
        return torch.zeros(len(samples))


def test_rewards_receive_each_rows_metadata_and_condition_image(tmp_path) -> None:
    prompt_set(tmp_path)
    train, _ = load_prompts(PromptsSection(train_file="sub/edits.jsonl"), tmp_path)
    rows = [p for p in train for _ in range(2)]  # two samples per prompt
    reward = Recorder()
    score_all([WeightedReward("r", reward, 1.0)], Samples("image", torch.zeros(4, 3, 2, 2)), rows)
    assert [m["tag"] for m in reward.seen[:2]] == ["colors", "colors"] and "tag" not in reward.seen[2]
    img = tmp_path / "sub" / "img"
    assert reward.seen[3]["include"] == [{"class": "cat"}] and reward.seen[3]["image"][0] == str(
        img / "blue.png"
    )
    assert reward.seen[0]["condition_image"].shape == (3, 4, 6)
    assert [im.shape for im in reward.seen[2]["condition_images"]] == [(3, 5, 5), (3, 4, 6)]
    torch.testing.assert_close(reward.seen[2]["condition_image"][2], torch.ones(5, 5))  # blue first
    frame = reward_wire.encode_frame(Samples("image", torch.zeros(4, 3, 2, 2)), rows, reward.seen)
    body = b"".join(bytes(chunk) for chunk in frame.chunks)
    header = json.loads(body[8 : 8 + int.from_bytes(body[:8], "little")])
    assert header["metadata"][0] == {"image": str(img / "red.png"), "tag": "colors"}  # tensors stay behind


def test_sampler_state_resumes_to_the_same_conditioned_prompts_and_pickling_keeps_them(tmp_path) -> None:
    prompt_set(tmp_path)
    train, _ = load_prompts(PromptsSection(train_file="sub/edits.jsonl"), tmp_path)
    train = train + [Prompt("make it blue", {"image": "x"}, train[0].images)]  # equal text, other metadata
    first = PromptSampler(train, seed=3)
    first.next(2)
    resumed = PromptSampler(train, seed=3)
    resumed.load_state_dict(first.state_dict())
    a, b = first.next(4), resumed.next(4)
    assert [(p, p.metadata, p.images) for p in a] == [(p, p.metadata, p.images) for p in b]
    back = pickle.loads(pickle.dumps(a))
    assert [(p, p.metadata, p.images) for p in back] == [(p, p.metadata, p.images) for p in a]
    assert json.dumps(a[0]) == json.dumps(str(a[0]))  # logs and records see the text


def test_grids_show_each_source_before_its_results_and_before_after_keeps_it(tmp_path) -> None:
    samples = Samples("image", torch.zeros(4, 3, 8, 8))  # two prompts, two black results each
    sources = [torch.ones(3, 8, 8), None]  # a white source for the first prompt only
    path = save_grid(samples, tmp_path / "g.png", group_size=2, prompts=["a", "b"], sources=sources)
    layout = read_layout(path)
    first, second = layout["tiles"]
    assert "source" not in second and len(first["frames"]) == 2
    x, y, w, h = first["source"]
    assert first["frames"][0][0] > x  # the source comes first, the results after it
    grid = Image.open(path).convert("RGB")
    assert grid.getpixel((x + w // 2, y + h // 2)) == (255, 255, 255)
    fx, fy, fw, fh = first["frames"][0]
    assert grid.getpixel((fx + fw // 2, fy + fh // 2)) == (0, 0, 0)
    pair = save_before_after(path, path, tmp_path / "ba.png")
    assert pair is not None and (255, 255, 255) in {
        c for _, c in Image.open(pair).convert("RGB").getcolors(1 << 16)
    }
