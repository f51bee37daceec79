"""The labelled image grid of an X/Y/Z plot, like AUTOMATIC1111's `image_grid` + `draw_grid_annotations`.

Pure PIL, so the plot can be drawn (and tested) without a model, torch or the UI. Besides the image,
every drawn label and every cell's box is returned: callers (the UI, the API, tests) can then find a
cell or a label without re-deriving the layout.

Layout of one grid: an optional band of X labels above the tiles, an optional band of Y labels left of
them, then `len(ys)` rows of `len(xs)` tiles, `margin` px apart. `join_grids` puts several such grids
(one per Z value) side by side under a band of Z labels, as A1111 does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont

Box = tuple[int, int, int, int]
MIN_FONT_SIZE = 14  # below this the default font runs letters together ("Euler a" reads "Eulera" at 10)
MISSING_CELL = (128, 128, 128)  # a cell a stopped plot never made: flat grey, so the layout stays
BACKGROUND = (255, 255, 255)
INK = (0, 0, 0)


@dataclass(frozen=True)
class Label:
    """One drawn label; `box` is where its (possibly wrapped) lines were drawn, so tests and callers can
    find it without OCR."""

    text: str
    axis: str
    index: int
    box: Box


@dataclass
class Grid:
    """A drawn grid with the positions of what is in it.

    `cell_boxes` maps (x, y) to the box its cell was pasted into (for a joined grid: the first sub-grid's);
    `boxes_of(z)` gives any sub-grid's. The private fields keep each sub-grid's own boxes and where it was
    placed, so a joined grid can answer for every Z value without the caller tracking offsets.
    """

    image: Image.Image
    labels: list[Label]
    cell_boxes: dict[tuple[int, int], Box]
    _z_offsets: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _z_boxes: list[dict[tuple[int, int], Box]] = field(default_factory=list, repr=False)
    _font_size: int = field(default=MIN_FONT_SIZE, repr=False)

    def __post_init__(self) -> None:
        if not self._z_offsets:  # a single grid is its own only sub-grid, at (0, 0)
            self._z_offsets = [(0, 0)]
            self._z_boxes = [dict(self.cell_boxes)]

    def boxes_of(self, z: int) -> dict[tuple[int, int], Box]:
        """The z-th sub-grid's cell boxes, in this image's coordinates (a single grid has only z == 0)."""
        if not 0 <= z < len(self._z_offsets):
            raise IndexError(f"z={z} but this grid has {len(self._z_offsets)} sub-grid(s)")
        dx, dy = self._z_offsets[z]
        return {key: _shift(box, dx, dy) for key, box in self._z_boxes[z].items()}


@dataclass(frozen=True)
class _Block:
    """A label wrapped into lines, with its ink box relative to its anchor (centre top of the first line)."""

    text: str
    lines: tuple[str, ...]
    rel: tuple[float, float, float, float]

    @property
    def width(self) -> int:
        return math.ceil(self.rel[2] - self.rel[0])

    @property
    def height(self) -> int:
        return math.ceil(self.rel[3] - self.rel[1])


def _shift(box: Box, dx: int, dy: int) -> Box:
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def _labelled(values: Sequence[str]) -> bool:
    """Whether an axis gets labels: A1111 draws none for the "Nothing" axis (one value, empty text)."""
    return any(values)


def _font(tile_w: int, tile_h: int) -> ImageFont.FreeTypeFont:
    """A1111's size, (w + h) // 25, so labels scale with the images; floored so small tiles stay readable."""
    return ImageFont.load_default(size=max(MIN_FONT_SIZE, (tile_w + tile_h) // 25))


def _spacing(font: ImageFont.FreeTypeFont) -> int:
    return max(2, int(font.size) // 4)


def _break_word(word: str, font: ImageFont.FreeTypeFont, limit: float) -> list[str]:
    """A word wider than the limit (a long seed list, a model path) cut by characters, so it still fits."""
    pieces, current = [], ""
    for char in word:
        if current and font.getlength(current + char) > limit:
            pieces.append(current)
            current = char
        else:
            current += char
    return [*pieces, current] if current else pieces


def _wrap(text: str, font: ImageFont.FreeTypeFont, limit: float) -> list[str]:
    """Greedy wrap by words (as A1111 does) to `limit` px; over-long words are broken by characters."""
    lines: list[str] = []
    for paragraph in text.splitlines():
        current = ""
        for word in paragraph.split():
            candidate = f"{current} {word}" if current else word
            if font.getlength(candidate) <= limit:
                current = candidate
                continue
            if current:
                lines.append(current)
            *full, current = _break_word(word, font, limit)
            lines.extend(full)
        if current:
            lines.append(current)
    return lines


def _block(text: str, font: ImageFont.FreeTypeFont, limit: float) -> _Block:
    lines = tuple(_wrap(text, font, limit))
    if not lines:
        return _Block(text, lines, (0.0, 0.0, 0.0, 0.0))
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    rel = scratch.multiline_textbbox(
        (0, 0), "\n".join(lines), font=font, anchor="ma", align="center", spacing=_spacing(font)
    )
    return _Block(text, lines, tuple(float(v) for v in rel))


def _y_blocks(ys: Sequence[str], font: ImageFont.FreeTypeFont, tile_w: int, tile_h: int) -> list[_Block]:
    """Y labels wrapped to A1111's band (3/4 of a tile wide, but never narrower than a few characters),
    widened step by step while a label is taller than its row, so it does not run into the next row."""
    natural = max((font.getlength(line) for text in ys for line in text.splitlines()), default=0.0)
    limit = max(tile_w * 3 / 4, 4.0 * font.size)
    while True:
        blocks = [_block(text, font, limit) for text in ys]
        if limit >= natural or all(block.height <= tile_h for block in blocks):
            return blocks
        limit *= 1.25


def _draw_block(draw: ImageDraw.ImageDraw, block: _Block, centre: tuple[float, float], axis: str, index: int,
                font: ImageFont.FreeTypeFont) -> Label | None:  # fmt: skip
    """Draws `block` with its ink box centred on `centre`; returns the Label with the box actually drawn."""
    if not block.lines:
        return None
    left, top, right, bottom = block.rel
    anchor = (round(centre[0] - (left + right) / 2), round(centre[1] - (top + bottom) / 2))
    text, spacing = "\n".join(block.lines), _spacing(font)
    draw.multiline_text(anchor, text, font=font, fill=INK, anchor="ma", align="center", spacing=spacing)
    drawn = draw.multiline_textbbox(anchor, text, font=font, anchor="ma", align="center", spacing=spacing)
    box = (math.floor(drawn[0]), math.floor(drawn[1]), math.ceil(drawn[2]), math.ceil(drawn[3]))
    return Label(block.text, axis, index, box)


def _validate(cells: Sequence[Sequence[Image.Image | None]], xs: Sequence[str], ys: Sequence[str]) -> None:
    if not xs or not ys:
        raise ValueError(f"a grid needs at least one X and one Y value (got {len(xs)} x {len(ys)})")
    if len(cells) != len(ys):
        raise ValueError(f"{len(cells)} rows of cells for {len(ys)} Y values")
    for y, row in enumerate(cells):
        if len(row) != len(xs):
            raise ValueError(f"row {y} has {len(row)} cells for {len(xs)} X values")
    if all(cell is None for row in cells for cell in row):
        raise ValueError("a grid needs at least one image (every cell is None)")


def _tile_size(cells: Sequence[Sequence[Image.Image | None]]) -> tuple[int, int]:
    """The largest width x the largest height, so cells of any size (a Size axis) fit in equal tiles."""
    images = [cell for row in cells for cell in row if cell is not None]
    return max(image.width for image in images), max(image.height for image in images)


def _paste_cells(image: Image.Image, cells: Sequence[Sequence[Image.Image | None]], origin: tuple[int, int],
                 tile: tuple[int, int], margin: int) -> dict[tuple[int, int], Box]:  # fmt: skip
    """Pastes every cell centred in its tile (a grey tile for a missing one); returns the pasted boxes."""
    boxes: dict[tuple[int, int], Box] = {}
    for y, row in enumerate(cells):
        for x, cell in enumerate(row):
            left = origin[0] + x * (tile[0] + margin)
            top = origin[1] + y * (tile[1] + margin)
            if cell is None:
                boxes[(x, y)] = (left, top, left + tile[0], top + tile[1])
                image.paste(MISSING_CELL, boxes[(x, y)])
                continue
            left += (tile[0] - cell.width) // 2
            top += (tile[1] - cell.height) // 2
            image.paste(cell.convert("RGB"), (left, top))
            boxes[(x, y)] = (left, top, left + cell.width, top + cell.height)
    return boxes


def draw_grid(cells: Sequence[Sequence[Image.Image | None]], xs: Sequence[str], ys: Sequence[str], *,
              legend: bool = True, margin: int = 0) -> Grid:  # fmt: skip
    """One X/Y grid: `cells[y][x]` in equal tiles, X labels centred above columns, Y labels left of rows.

    Raises ValueError when the cells do not match the axes or there is no image at all (nothing to size
    the tiles by).
    """
    _validate(cells, xs, ys)
    tile_w, tile_h = _tile_size(cells)
    font = _font(tile_w, tile_h)
    pad = int(font.size) // 2
    x_blocks = [_block(text, font, tile_w) for text in xs] if legend and _labelled(xs) else []
    y_blocks = _y_blocks(ys, font, tile_w, tile_h) if legend and _labelled(ys) else []
    band_top = max(block.height for block in x_blocks) + 2 * pad if x_blocks else 0
    band_left = max(block.width for block in y_blocks) + 2 * pad if y_blocks else 0
    width = band_left + len(xs) * tile_w + (len(xs) - 1) * margin
    height = band_top + len(ys) * tile_h + (len(ys) - 1) * margin
    image = Image.new("RGB", (width, height), BACKGROUND)
    cell_boxes = _paste_cells(image, cells, (band_left, band_top), (tile_w, tile_h), margin)
    draw = ImageDraw.Draw(image)
    labels = [
        _draw_block(draw, block, (band_left + x * (tile_w + margin) + tile_w / 2, band_top / 2), "x", x, font)
        for x, block in enumerate(x_blocks)
    ]
    labels += [
        _draw_block(draw, block, (band_left / 2, band_top + y * (tile_h + margin) + tile_h / 2), "y", y, font)
        for y, block in enumerate(y_blocks)
    ]
    return Grid(image, [label for label in labels if label], cell_boxes, _font_size=int(font.size))


def join_grids(grids: Sequence[Grid], zs: Sequence[str], *, legend: bool = True, margin: int = 0) -> Grid:
    """The Z axis: sub-grids left to right (as A1111 joins them), top-aligned, each under its Z label.

    The result's labels are the Z labels and every sub-grid's labels moved to where they now are;
    `boxes_of(z)` finds the z-th sub-grid's cells.
    """
    if not grids or len(grids) != len(zs):
        raise ValueError(f"{len(grids)} grids for {len(zs)} Z values (need one per value, at least one)")
    font = ImageFont.load_default(size=max(grid._font_size for grid in grids))
    labelled = legend and _labelled(zs)
    blocks = [_block(text, font, grid.image.width) for grid, text in zip(grids, zs, strict=True)]
    band_top = max(block.height for block in blocks) + 2 * (int(font.size) // 2) if labelled else 0
    width = sum(grid.image.width for grid in grids) + (len(grids) - 1) * margin
    height = band_top + max(grid.image.height for grid in grids)
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    labels: list[Label] = []
    offsets: list[tuple[int, int]] = []
    left = 0
    for z, grid in enumerate(grids):
        image.paste(grid.image.convert("RGB"), (left, band_top))
        offsets.append((left, band_top))
        centre = (left + grid.image.width / 2, band_top / 2)
        label = _draw_block(draw, blocks[z], centre, "z", z, font) if labelled else None
        labels += [label] if label else []
        labels += [Label(sub.text, sub.axis, sub.index, _shift(sub.box, left, band_top)) for sub in grid.labels]
        left += grid.image.width + margin
    sub_boxes = [dict(grid.cell_boxes) for grid in grids]
    first = {key: _shift(box, *offsets[0]) for key, box in sub_boxes[0].items()}
    return Grid(image, labels, first, _z_offsets=offsets, _z_boxes=sub_boxes, _font_size=int(font.size))
