"""The X/Y/Z plot grid (pipelines/imaging/grid.py): layout, labels where a reader expects them, cells pasted
unchanged, missing cells, the Nothing axis and Z joining. Pure PIL, no model."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipelines.imaging.grid import Grid, draw_grid, join_grids

RNG_SEED = 1234


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    """A random RGB image: any misplaced or resampled pixel changes its bytes."""
    rng = np.random.default_rng(RNG_SEED + seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), "RGB")


def cells_of(cols: int, rows: int, width: int = 48, height: int = 40) -> list[list[Image.Image]]:
    return [[noise(width, height, seed=y * cols + x) for x in range(cols)] for y in range(rows)]


def centre(box: tuple[int, int, int, int]) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def crop_equals(grid_image: Image.Image, box, cell: Image.Image) -> bool:
    return grid_image.crop(box).tobytes() == cell.convert("RGB").tobytes()


def stray_ink(grid: Grid, zs: int = 1) -> int:
    """Non-white pixels that are neither in a cell nor in any label's box (should be none)."""
    ink = np.asarray(grid.image).min(axis=2) < 255
    for z in range(zs):
        for left, top, right, bottom in grid.boxes_of(z).values():
            ink[top:bottom, left:right] = False
    for label in grid.labels:
        left, top, right, bottom = label.box
        ink[max(top, 0) : bottom, max(left, 0) : right] = False
    return int(ink.sum())


def test_3x2_grid_with_legend_and_margin_has_bands_tiles_and_margins():
    margin = 6
    grid = draw_grid(cells_of(3, 2), ["a", "b", "c"], ["one", "two"], margin=margin)
    assert grid.image.mode == "RGB"
    assert sorted(grid.cell_boxes) == [(x, y) for x in range(3) for y in range(2)]
    band_left, band_top = grid.cell_boxes[(0, 0)][:2]
    assert band_left > 0 and band_top > 0  # room for the Y and X labels
    assert grid.image.size == (band_left + 3 * 48 + 2 * margin, band_top + 2 * 40 + margin)
    assert grid.cell_boxes[(1, 0)][0] - grid.cell_boxes[(0, 0)][2] == margin
    assert grid.cell_boxes[(0, 1)][1] - grid.cell_boxes[(0, 0)][3] == margin
    assert [(label.axis, label.index, label.text) for label in grid.labels] == [
        ("x", 0, "a"), ("x", 1, "b"), ("x", 2, "c"), ("y", 0, "one"), ("y", 1, "two"),
    ]  # fmt: skip


def test_x_labels_sit_over_their_columns_and_y_labels_beside_their_rows():
    grid = draw_grid(cells_of(3, 2), ["cfg 3", "cfg 7", "cfg 12"], ["euler", "dpm++ 2m"], margin=4)
    tiles_left, tiles_top = grid.cell_boxes[(0, 0)][:2]
    for label in grid.labels:
        cx, cy = centre(label.box)
        if label.axis == "x":
            left, _, right, _ = grid.cell_boxes[(label.index, 0)]
            assert left <= cx <= right, label
            assert label.box[3] <= tiles_top and label.box[1] >= 0, label
        else:
            _, top, _, bottom = grid.cell_boxes[(0, label.index)]
            assert top <= cy <= bottom, label
            assert abs(cy - (top + bottom) / 2) <= 2, label  # vertically centred on the row
            assert label.box[2] <= tiles_left and label.box[0] >= 0, label


def test_cells_are_pasted_unchanged_and_smaller_ones_centred_in_their_tile():
    sizes = [[(40, 30), (20, 10)], [(30, 30), (40, 21)]]  # tile: 40 x 30, set by the largest width and height
    cells = [[noise(w, h, seed=10 * y + x) for x, (w, h) in enumerate(row)] for y, row in enumerate(sizes)]
    margin = 3
    grid = draw_grid(cells, ["512", "256"], ["a", "b"], margin=margin)
    origin_x, origin_y = grid.cell_boxes[(0, 0)][:2]  # cell (0, 0) fills its tile
    for y, row in enumerate(cells):
        for x, cell in enumerate(row):
            box = grid.cell_boxes[(x, y)]
            assert (box[2] - box[0], box[3] - box[1]) == cell.size
            assert crop_equals(grid.image, box, cell), (x, y)
            tile_cx = origin_x + x * (40 + margin) + 40 / 2
            tile_cy = origin_y + y * (30 + margin) + 30 / 2
            cx, cy = centre(box)
            assert abs(cx - tile_cx) <= 0.5 and abs(cy - tile_cy) <= 0.5, (x, y)


def test_a_missing_cell_is_a_grey_tile_and_the_layout_is_kept():
    full = draw_grid(cells_of(3, 2), ["a", "b", "c"], ["1", "2"], margin=2)
    cells = cells_of(3, 2)
    cells[1][2] = None  # the plot was stopped before the last cell
    partial = draw_grid(cells, ["a", "b", "c"], ["1", "2"], margin=2)
    assert partial.image.size == full.image.size
    assert partial.cell_boxes == full.cell_boxes
    grey = np.asarray(partial.image.crop(partial.cell_boxes[(2, 1)]))
    assert grey.shape == (40, 48, 3) and (grey == 128).all()
    assert crop_equals(partial.image, partial.cell_boxes[(0, 0)], cells[0][0])


def test_without_legend_the_image_is_just_the_tiles_and_margins():
    margin = 5
    cells = cells_of(3, 2)
    grid = draw_grid(cells, ["a", "b", "c"], ["1", "2"], legend=False, margin=margin)
    assert grid.labels == []
    assert grid.image.size == (3 * 48 + 2 * margin, 2 * 40 + margin)
    assert grid.cell_boxes[(0, 0)] == (0, 0, 48, 40)
    assert crop_equals(grid.image, grid.cell_boxes[(2, 1)], cells[1][2])
    assert stray_ink(grid) == 0  # the margins are plain white


def test_a_long_label_wraps_and_stays_inside_its_column_and_band():
    long_x = "a long prompt about a lighthouse on a cliff at sunset, dramatic sky, oil painting"
    long_y = "checkpoint-with-a-very-long-file-name-v1.5-pruned-emaonly.safetensors"
    grid = draw_grid(cells_of(3, 2, 64, 64), ["short", long_x, "x"], ["1", long_y], margin=4)
    boxes = {(label.axis, label.index): label.box for label in grid.labels}
    left, _, right, _ = grid.cell_boxes[(1, 0)]
    wrapped = boxes[("x", 1)]
    assert left <= wrapped[0] and wrapped[2] <= right  # the whole label within its column
    assert wrapped[3] - wrapped[1] > 2 * (boxes[("x", 0)][3] - boxes[("x", 0)][1])  # several lines
    assert wrapped[3] <= grid.cell_boxes[(0, 0)][1]  # the band above is tall enough
    y_box = boxes[("y", 1)]
    assert y_box[0] >= 0 and y_box[2] <= grid.cell_boxes[(0, 0)][0]  # inside the left band
    assert stray_ink(grid) == 0


def test_the_nothing_axis_draws_no_labels_and_no_band():
    cells = cells_of(3, 1)
    only_x = draw_grid(cells, ["a", "b", "c"], [""])
    assert {label.axis for label in only_x.labels} == {"x"}
    assert only_x.cell_boxes[(0, 0)][0] == 0  # no left band
    only_y = draw_grid([[cell] for cell in cells[0]], [""], ["1", "2", "3"])
    assert {label.axis for label in only_y.labels} == {"y"}
    assert only_y.cell_boxes[(0, 0)][1] == 0  # no top band
    neither = draw_grid([[cells[0][0]]], [""], [""])
    assert neither.labels == [] and neither.image.size == (48, 40)


def test_join_grids_puts_z_labels_above_sub_grids_and_finds_their_cells():
    first_cells = cells_of(2, 2)
    second_cells = [[noise(48, 40, seed=100 + x) for x in range(2)]]
    first = draw_grid(first_cells, ["a", "b"], ["1", "2"])
    second = draw_grid(second_cells, ["a", "b"], ["1"])  # shorter: top-aligned
    margin = 8
    joined = join_grids([first, second], ["seed 1", "seed 2"], margin=margin)
    assert joined.image.size[0] == first.image.width + margin + second.image.width
    z_labels = [label for label in joined.labels if label.axis == "z"]
    assert [(label.index, label.text) for label in z_labels] == [(0, "seed 1"), (1, "seed 2")]
    band = joined.image.height - first.image.height
    assert band > 0
    spans = [(0, first.image.width), (first.image.width + margin, joined.image.width)]
    for label, (left, right) in zip(z_labels, spans, strict=True):
        assert left <= centre(label.box)[0] <= right and label.box[3] <= band
    assert joined.boxes_of(0) == joined.cell_boxes
    for z, cells in enumerate([first_cells, second_cells]):
        boxes = joined.boxes_of(z)
        for y, row in enumerate(cells):
            for x, cell in enumerate(row):
                assert crop_equals(joined.image, boxes[(x, y)], cell), (z, x, y)
    assert joined.boxes_of(1)[(0, 0)][1] == joined.boxes_of(0)[(0, 0)][1]  # top-aligned
    sub_x = [label for label in joined.labels if label.axis == "x"]
    assert len(sub_x) == 4  # both sub-grids' labels, moved along
    for label in sub_x[2:]:
        left, _, right, _ = joined.boxes_of(1)[(label.index, 0)]
        assert left <= centre(label.box)[0] <= right
    assert stray_ink(joined, zs=2) == 0
    with pytest.raises(IndexError):
        joined.boxes_of(2)


def test_join_grids_without_z_labels_and_a_single_grid_has_only_z_0():
    grid = draw_grid(cells_of(2, 1), ["a", "b"], [""])
    assert grid.boxes_of(0) == grid.cell_boxes
    with pytest.raises(IndexError):
        grid.boxes_of(1)
    joined = join_grids([grid], [""])
    assert joined.image.size == grid.image.size
    assert [label.axis for label in joined.labels] == ["x", "x"]


def test_cells_that_do_not_match_the_axes_raise():
    with pytest.raises(ValueError):
        draw_grid(cells_of(3, 2), ["a", "b", "c"], ["1", "2", "3"])  # too few rows
    ragged = cells_of(3, 2)
    ragged[1].pop()
    with pytest.raises(ValueError):
        draw_grid(ragged, ["a", "b", "c"], ["1", "2"])
    with pytest.raises(ValueError):
        draw_grid([[None, None]], ["a", "b"], ["1"])  # nothing to size the tiles by
    grid = draw_grid(cells_of(1, 1), ["a"], ["1"])
    with pytest.raises(ValueError):
        join_grids([grid, grid], ["only one"])


def test_label_ink_lies_inside_the_label_boxes():
    grid = draw_grid(
        cells_of(3, 2, 32, 32), ["Hg jy|", "Wide WWW label, wrapped", "é_,;"], ["QqgjyÅ", "tall\nlabel"], margin=2
    )
    assert grid.labels and stray_ink(grid) == 0
    ink = np.asarray(grid.image).min(axis=2) < 255
    for label in grid.labels:  # every box has some of the text's ink
        left, top, right, bottom = label.box
        assert ink[top:bottom, left:right].any(), label
