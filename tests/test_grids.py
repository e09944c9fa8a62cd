"""Sample grids: the before/after picture a run leaves behind."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from vgrpo_platform.grids import save_before_after, save_grid
from vgrpo_platform.protocols import Samples


def test_before_after_puts_the_same_rows_of_two_grids_side_by_side(tmp_path):
    rows, columns, side = 5, 2, 8
    dark = Samples("image", torch.zeros(rows * columns, 3, side, side))
    bright = Samples("image", torch.ones(rows * columns, 3, side, side))
    save_grid(dark, tmp_path / "a.png", columns=columns)
    save_grid(bright, tmp_path / "b.png", columns=columns)
    out = save_before_after(tmp_path / "a.png", tmp_path / "b.png", tmp_path / "ba.png", rows=rows,
                            keep_rows=3, pair_columns=2, min_height=1)
    image = np.asarray(Image.open(out))
    grid_w, row_h = columns * (side + 2), side + 2
    pair_w = 2 * grid_w + 4
    assert image.shape[1] == 2 * pair_w + 12  # two (before | after) pairs across
    assert image.shape[0] == 12 + 2 * row_h  # label strip + 3 prompt rows on 2 lines
    for x0, y0 in ((0, 12), (pair_w + 12, 12), (0, 12 + row_h)):  # each pair: dark before, bright after
        before = image[y0 + 1 : y0 + 1 + side, x0 + 1 : x0 + 1 + side]
        after = image[y0 + 1 : y0 + 1 + side, x0 + grid_w + 4 + 1 : x0 + grid_w + 4 + 1 + side]
        assert before.max() == 0 and after.min() == 255


def test_before_after_enlarges_small_grids_and_skips_missing_ones(tmp_path):
    tiny = Samples("image", torch.rand(2, 3, 4, 4))
    save_grid(tiny, tmp_path / "a.png", columns=1)
    save_grid(tiny, tmp_path / "b.png", columns=1)
    out = save_before_after(tmp_path / "a.png", tmp_path / "b.png", tmp_path / "ba.png", rows=2)
    assert Image.open(out).height >= 512
    assert save_before_after(tmp_path / "a.png", tmp_path / "none.png", tmp_path / "x.png", rows=2) is None
