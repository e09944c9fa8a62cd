"""Sample grids: labelled, near-square evaluation pages and the before/after picture a run leaves behind."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.observe.grids import (
    PAGE_WIDTH,
    RIGHT,
    WRONG,
    GridSpec,
    read_layout,
    save_before_after,
    save_grid,
    save_side_by_side,
    verdict_key,
)


def _grid(tmp_path, name, n_prompts, group, value, verdicts=None, spec=GridSpec()):
    samples = Samples("image", torch.full((n_prompts * group, 3, 8, 8), float(value)))
    details = {"shapes/correct": verdicts} if verdicts is not None else None
    prompts = [f"prompt number {i}" for i in range(n_prompts)]
    return save_grid(samples, tmp_path / name, group_size=group, prompts=prompts, details=details, spec=spec)


def test_a_large_evaluation_is_wrapped_near_square_and_capped(tmp_path):
    path = _grid(tmp_path, "eval.png", n_prompts=189, group=4, value=0.5, spec=GridSpec(max_tiles=48))
    image = Image.open(path)
    assert 0.5 < image.width / image.height < 2.0  # was one column 6,426 px tall
    assert max(image.size) <= 2048
    layout = read_layout(path)
    assert len(layout["tiles"]) == 48 and layout["prompts_total"] == 189
    assert [t["prompt"] for t in layout["tiles"][:2]] == ["prompt number 0", "prompt number 1"]
    # every frame box holds the enlarged sample (grey 0.5 -> 128), inside its border
    pixels = np.asarray(image.convert("RGB"))
    for tile in layout["tiles"]:
        assert len(tile["frames"]) == 4
        for x, y, w, h in tile["frames"]:
            assert w == h == 64 + 4
            assert (pixels[y + 2 : y + h - 2, x + 2 : x + w - 2] == 128).all()


def test_frames_are_bordered_by_the_rewards_verdict(tmp_path):
    verdicts = [1.0, 0.0, 0.0, 1.0]
    path = _grid(tmp_path, "eval.png", n_prompts=2, group=2, value=0.0, verdicts=verdicts)
    layout = read_layout(path)
    assert layout["verdict_key"] == "shapes/correct"
    pixels = np.asarray(Image.open(path).convert("RGB"))
    seen = []
    for tile in layout["tiles"]:
        for x, y, _, _ in tile["frames"]:
            seen.append(tuple(int(c) for c in pixels[y, x]))
    assert seen == [RIGHT, WRONG, WRONG, RIGHT]
    assert [v for t in layout["tiles"] for v in t["verdicts"]] == verdicts


def test_verdict_key_is_a_correct_detail_or_none():
    assert verdict_key({"shapes/color": [1.0], "shapes/correct": [0.0]}) == "shapes/correct"
    assert verdict_key({"correct": [1.0]}) == "correct"
    assert verdict_key({"ocr/edit_distance": [0.3]}) is None


def test_before_after_pairs_each_prompts_samples_and_counts_the_correct_ones(tmp_path):
    before = _grid(tmp_path, "a.png", n_prompts=10, group=2, value=0.0, verdicts=[0.0] * 20)
    after = _grid(tmp_path, "b.png", n_prompts=10, group=2, value=1.0, verdicts=[1.0, 0.0] * 10)
    out = save_before_after(before, after, tmp_path / "ba.png", keep=10)
    image = np.asarray(Image.open(out).convert("RGB"))
    assert 0.4 < image.shape[1] / image.shape[0] < 3.0  # two columns of pairs for 10 prompts
    # the dark "before" frames sit left of the bright "after" ones on every pair row
    dark = np.argwhere((image == 0).all(axis=-1))
    bright = np.argwhere((image == 255).all(axis=-1) & (np.arange(image.shape[1])[None, :] > 0))
    assert dark.size and bright.size
    red = np.argwhere((image == WRONG).all(axis=-1))
    green = np.argwhere((image == RIGHT).all(axis=-1))
    assert red.size > green.size > 0  # 20 wrong frames before + 10 after, 10 right ones after


def test_before_after_needs_both_grids_with_the_same_prompts(tmp_path):
    a = _grid(tmp_path, "a.png", n_prompts=3, group=1, value=0.2)
    assert save_before_after(a, tmp_path / "none.png", tmp_path / "x.png") is None
    samples = Samples("image", torch.zeros(3, 3, 8, 8))
    other = save_grid(samples, tmp_path / "c.png", group_size=1, prompts=["x", "y", "z"])
    assert save_before_after(a, other, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_side_by_side_puts_each_grids_panel_in_order_and_counts_each(tmp_path):
    """Three runs' grids of the same prompts: panels left to right in the order given (dark, grey,
    light frames), one row per prompt, and the page fits."""
    grids = [
        _grid(tmp_path, f"{name}.png", n_prompts=3, group=8, value=value, verdicts=verdicts)
        for name, value, verdicts in (
            ("base", 0.2, [0.0] * 24),
            ("shipped", 0.5, [1.0] * 24),
            ("kept", 0.8, [1.0, 0.0] * 12),
        )
    ]
    out = save_side_by_side(grids, tmp_path / "three.png", labels=["base", "shipped", "kept"])
    image = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert image.shape[1] <= PAGE_WIDTH
    columns = {}
    for value, tone in ((0.2, 51), (0.5, 128), (0.8, 204)):  # none is the page's white or ink
        hits = np.argwhere((np.abs(image - tone) <= 1).all(axis=-1))
        frame_rows = hits[hits[:, 0] > 30]  # below the header
        columns[value] = np.median(frame_rows[:, 1])
    assert columns[0.2] < columns[0.5] < columns[0.8]
    assert save_side_by_side(grids[:1], tmp_path / "one.png") is None  # nothing to compare


def test_samples_without_a_picture_make_no_grid(tmp_path):
    other = Samples("molecule", torch.zeros(2, 5, 3))  # audio and video have pictures: test_media_grids.py
    assert save_grid(other, tmp_path / "a.png", group_size=1) is None
    assert not (tmp_path / "a.png").exists()


def test_grids_fit_the_reports_page_at_their_own_size_and_wrap_long_groups(tmp_path):
    # 48 prompts of 8 samples (the quickstart's evaluation): near-square would be 3 tiles of 558 px
    wide = read_layout(path := _grid(tmp_path, "wide.png", n_prompts=48, group=8, value=0.5))
    assert Image.open(path).width <= PAGE_WIDTH
    assert len({t["frames"][0][0] for t in wide["tiles"]}) == 2  # two columns of tiles, not three
    # 32 samples of one prompt do not fit one line: they wrap, frames keep their 64 px
    long = read_layout(path := _grid(tmp_path, "long.png", n_prompts=2, group=32, value=0.5))
    assert Image.open(path).width <= PAGE_WIDTH
    frames = long["tiles"][0]["frames"]
    assert len(frames) == 32 and all(w == h == 68 for _, _, w, h in frames)
    assert len({y for _, y, _, _ in frames}) == 2  # two lines of frames
    boxes = [(x, y) for x, y, _, _ in frames]
    assert len(set(boxes)) == 32  # none on top of another
    before = _grid(tmp_path, "a.png", n_prompts=16, group=8, value=0.0)
    after = _grid(tmp_path, "b.png", n_prompts=16, group=8, value=1.0)
    out = save_before_after(before, after, tmp_path / "ba.png")
    assert Image.open(out).width <= PAGE_WIDTH  # one column of pairs: two would not fit


def test_a_long_prompt_is_cut_to_its_tiles_width(tmp_path):
    from vgrpo_platform.training.observe.grids import _fit, _font

    font = _font()
    text = "a very long prompt " * 5
    cut = _fit(text, font, 100)
    assert cut.endswith("…") and font.getlength(cut) <= 100 < font.getlength(text)
    assert _fit("short", font, 100) == "short"
