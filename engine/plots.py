"""Scripts that make many requests from one: the X/Y/Z plot, the prompt matrix, prompts from a file.

A script is a list of cells, each an ordinary request (`Cell`), laid out on a grid. `run_script`
submits the cells to the engine like any other job — so QUEUE_PER_USER, the model's limits, the
time budget and Stop apply to each — keeping as many in flight as the backend runs at once (a
pool of N replicas or a Ray deployment runs N cells together). Each cell's image is the image the
same single request makes, bit for bit, with its own metadata. Cells that vary the model are
grouped by model so each model loads once; the model loaded before the plot is loaded back after.

Stop (the engine's, for the caller's session) ends the script: the running cells return what
they finished, the cells not started are dropped, and the grid is drawn with what came back
(a grey tile for each missing cell).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines import GenerationRequest, GenerationResult, Grid, draw_grid, from_any, join_grids
from pipelines.schema.request import RANDOM_SEED_SPACE, spec

from .axes import AxisType, axis_types, find_axis, parse_values
from .jobs import Caller, CancelledBeforeStart, Engine, Job, QueueFull, TooManyJobs

log = logging.getLogger(__name__)
MAX_CELLS = 1000  # one script's requests: a mistyped range should not queue a day of work
MAX_MARGIN = 500  # px between a grid's tiles (A1111's slider)
MAX_GRID_PIXELS = 200 * 10**6  # A1111's default grid limit (img_max_size_mp): the grid is one image in memory
NOTHING = AxisType("Nothing", "nothing")


@dataclass(frozen=True)
class Axis:
    """An axis as asked: its type, its values, and the values as the caller wrote them (the infotext's)."""

    type: AxisType
    values: tuple[Any, ...]
    text: str = ""

    @classmethod
    def of(cls, axis_type: AxisType, values: str | Sequence[Any]) -> Axis:
        text = values if isinstance(values, str) else ", ".join(str(v) for v in values)
        return cls(axis_type, tuple(parse_values(axis_type, values)), text)

    @property
    def labels(self) -> list[str]:
        return [self.type.label(v) for v in self.values]


@dataclass(frozen=True)
class Cell:
    """One request of a script, at (x, y, z) of its grid; `model` switches the checkpoint first."""

    at: tuple[int, int, int]
    request: GenerationRequest
    model: str | None = None


@dataclass(frozen=True)
class Layout:
    """How the cells are drawn: column, row and sub-grid labels, and the script's infotext fields."""

    xs: list[str]
    ys: list[str]
    zs: list[str]
    fields: list[tuple[str, str]]  # ("Script", "X/Y/Z plot"), ("X Type", "Steps"), ... (the grid PNG's text)
    legend: bool = True
    margin: int = 0


@dataclass
class ScriptResult:
    """What a script made: the grid (sub-grids joined), each cell's result, and how it ended."""

    grid: Grid | None
    sub_grids: list[Grid]
    cells: list[Cell]
    results: dict[tuple[int, int, int], GenerationResult]
    meta: dict[str, Any]  # the grid PNG's metadata: the first cell's, with the script's fields
    warnings: list[str] = field(default_factory=list)
    cancelled: bool = False
    models_loaded: int = 0

    def as_result(self, grid: bool = True, sub_grids: bool = False, lone_images: bool = True) -> GenerationResult:
        """The script's images as one result, in A1111's order: the grid, the sub-grids (one per Z
        value), then every cell's images; each with its metadata (the grids': the first cell's, with
        the script's fields). Without a grid (prompts from a file) the cells' images only."""
        images, metadata, seeds = [], [], []
        finished = [self.results[c.at] for c in self.cells if c.at in self.results]
        if grid and self.grid is not None:
            grids = [self.grid, *(self.sub_grids if sub_grids else [])]
            images += [g.image for g in grids]
            metadata += [self.meta] * len(grids)
            seeds += [next((r.seeds[0] for r in finished if r.seeds), 0)] * len(grids)
        if lone_images or not grid:
            for result in finished:
                images, metadata, seeds = images + result.images, metadata + result.metadata, seeds + result.seeds
        first = finished[0] if finished else _EMPTY
        return GenerationResult(images, seeds, metadata, {}, None, first.device, first.dtype, first.attention,
                                warnings=self.warnings, cancelled=self.cancelled)  # fmt: skip


_EMPTY = GenerationResult([], [], [], {}, None, "", "", "")


# ---------------------------------------------------------------- the X/Y/Z plot
@dataclass(frozen=True)
class PlotOptions:
    """A1111's X/Y/Z plot options, by its names."""

    legend: bool = True  # draw legend
    margin: int = 0  # grid margins (px)
    keep_random_seeds: bool = False  # "Keep -1 for seeds": every cell its own random seed
    vary_seeds: tuple[bool, bool, bool] = (False, False, False)  # "Vary seeds for X/Y/Z"
    include_lone_images: bool = False
    include_sub_grids: bool = False


PLOT_PARAMETERS = ("x_type", "x_values", "y_type", "y_values", "z_type", "z_values", "legend", "margin",
                   "keep_random_seeds", "vary_seeds", "include_lone_images", "include_sub_grids")  # fmt: skip


def named_plot(
    base: GenerationRequest, mode: str, loras: Sequence[str], values: Mapping[str, Any]
) -> tuple[list[Cell], Layout, PlotOptions]:
    """The plot a front end's named values ask for (`PLOT_PARAMETERS`, the one list every front end
    takes): `x_type` a label or A1111's index (engine.axes; empty: Nothing), `x_values` A1111's text
    or a list (a picker's), the same for y and z; PlotOptions' fields by name. ValueError naming the
    axis or the option."""
    types = axis_types(mode, loras)
    axes = []
    for letter in "xyz":
        kind, text = values.get(f"{letter}_type"), values.get(f"{letter}_values")
        try:
            axis_type = NOTHING if kind in (None, "") else find_axis(types, kind)
            axes.append(Axis(NOTHING, (None,)) if axis_type.kind == "nothing" else Axis.of(axis_type, text or ""))
        except ValueError as exc:
            raise ValueError(f"{letter.upper()} axis: {exc}") from None
    options = _options(values)
    cells, layout = plot_cells(base, axes, options)
    return cells, layout, options


def _options(values: Mapping[str, Any]) -> PlotOptions:
    """PlotOptions from named values: flags as JSON booleans, the margin 0..MAX_MARGIN px, vary_seeds three flags."""
    out: dict[str, Any] = {}
    for name in ("legend", "keep_random_seeds", "include_lone_images", "include_sub_grids"):
        if values.get(name) is not None:
            out[name] = _flag(values[name], name)
    if values.get("margin") not in (None, ""):
        margin = values["margin"]
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin <= MAX_MARGIN:
            raise ValueError(f"margin: {str(margin)[:40]!r} is not a number of pixels 0..{MAX_MARGIN}")
        out["margin"] = int(margin)
    vary = values.get("vary_seeds")
    if vary is not None:
        if not isinstance(vary, list | tuple) or len(vary) != 3:
            raise ValueError("vary_seeds: three flags, for X, Y and Z")
        out["vary_seeds"] = tuple(_flag(v, "vary_seeds") for v in vary)
    return PlotOptions(**out)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: {str(value)[:40]!r} is not true or false")
    return value


def plot_cells(base: GenerationRequest, axes: Sequence[Axis], options: PlotOptions) -> tuple[list[Cell], Layout]:
    """The cells of an X/Y/Z plot of `base` over `axes` (X, Y, Z; fewer are Nothing), Z outermost.

    Seeds as A1111: the request's -1 and a Seed axis's -1 are drawn once for the whole plot (every
    cell the same noise) unless `keep_random_seeds`; "vary seeds" adds the cell's index along that
    axis. RequestError (a cell's value out of a field's range) or ValueError (S/R not found) at once,
    before any cell runs."""
    x, y, z = (*axes, Axis(NOTHING, (None,)), Axis(NOTHING, (None,)))[:3]
    keep = options.keep_random_seeds
    seed = base.seed if base.seed is not None or keep else secrets.randbelow(RANDOM_SEED_SPACE)
    x, y, z = (_fixed_seeds(a, keep) for a in (x, y, z))
    for axis in (x, y, z):
        if axis.type.kind == "replace":
            _check_search(base, axis)
    count = len(x.values) * len(y.values) * len(z.values)
    if count > MAX_CELLS:
        raise ValueError(f"{count} cells, more than {MAX_CELLS}: use fewer values")
    cells, start = [], base.replace(seed=seed)
    for iz, vz in enumerate(z.values):
        for iy, vy in enumerate(y.values):
            for ix, vx in enumerate(x.values):
                cell = _cell(start, (ix, iy, iz), ((x, vx), (y, vy), (z, vz)))
                offset = _seed_offset((ix, iy, iz), (x, y), options.vary_seeds)  # after the axes, as A1111
                if offset and cell.request.seed is not None:
                    cell = Cell(cell.at, cell.request.replace(seed=cell.request.seed + offset), cell.model)
                cells.append(cell)
    used = [(name, a) for name, a in zip("XYZ", (x, y, z), strict=True) if a.type.kind != "nothing"]
    fields = [("Script", "X/Y/Z plot")]
    for name, a in used:
        fields += [(f"{name} Type", a.type.name), (f"{name} Values", a.text)]
        if a.type.field == "seed" and not keep:  # the seeds -1 became, so the plot can be redone
            fields.append((f"Fixed {name} Values", ", ".join(str(v) for v in a.values)))
    return cells, Layout(x.labels, y.labels, z.labels, fields, options.legend, options.margin)


def _seed_offset(at: tuple[int, int, int], xy: tuple[Axis, Axis], vary: tuple[bool, bool, bool]) -> int:
    """A1111's "vary seeds": + ix, + iy x (X's length where X varies too), + iz x (the same for X, Y)."""
    xdim = len(xy[0].values) if vary[0] else 1
    ydim = len(xy[1].values) if vary[1] else 1
    return at[0] * vary[0] + at[1] * xdim * vary[1] + at[2] * xdim * ydim * vary[2]


def _fixed_seeds(axis: Axis, keep: bool) -> Axis:
    """A Seed axis with its -1 values drawn once (A1111's `fix_axis_seeds`), unless kept random."""
    if axis.type.field != "seed" or keep:
        return axis
    values = tuple(secrets.randbelow(RANDOM_SEED_SPACE) if v is None else v for v in axis.values)
    return Axis(axis.type, values, axis.text)


def _check_search(base: GenerationRequest, axis: Axis) -> None:
    search = axis.values[0]
    texts = [*base.prompts, base.negative_prompt or ""]
    if not any(search in text for text in texts):
        raise ValueError(f"Prompt S/R did not find {search!r} in the prompt or negative prompt")


def _cell(request: GenerationRequest, at: tuple[int, int, int], settings: Sequence[tuple[Axis, Any]]) -> Cell:
    """`request` with each axis's value applied, X first (A1111's order)."""
    changes: dict[str, Any] = {}
    model, schedule = None, None
    for axis, value in settings:
        kind = axis.type.kind
        if kind == "nothing":
            continue
        if kind == "replace":
            search = axis.values[0]
            prompt = changes.get("prompt", request.prompt)
            negative = changes.get("negative_prompt", request.negative_prompt)
            changes["prompt"] = prompt.replace(search, value) if isinstance(prompt, str) else [p.replace(search, value) for p in prompt]
            changes["negative_prompt"] = negative.replace(search, value) if negative else negative
        elif kind == "size":
            changes["width"], changes["height"] = value
        elif kind == "model":
            model = value
        elif kind == "schedule":
            schedule = value
        elif kind == "sampler":
            changes["sampler"] = value
        elif kind == "lora":
            changes["loras"] = {**changes.get("loras", request.loras), axis.type.lora: value}
        elif kind == "names":  # A1111 adds the value's styles to the request's own
            added = tuple(name.strip() for name in value.split(",") if name.strip())
            changes[axis.type.field] = (*changes.get(axis.type.field, request.styles), *added)
        elif kind == "unit":
            changes[axis.type.field] = _first_unit(axis.type, changes.get(axis.type.field, getattr(request, axis.type.field)), value)
        elif spec(axis.type.field).path[0] == "hires":
            changes["hires"] = _hires(axis.type, changes.get("hires", request.hires), value)
        else:
            changes[axis.type.field] = value
    if schedule is not None or "sampler" in changes:
        changes["sampler"] = _sampler(changes.get("sampler", request.sampler), schedule)
    return Cell(at, request.replace(**changes), model)


def _first_unit(axis: AxisType, units: tuple[Any, ...], value: float) -> tuple[Any, ...]:
    """The request's ControlNet units (or image prompts) with the first one's `axis.unit` set to `value`."""
    if not units:
        what = "ControlNet unit" if axis.field == "controlnet" else "image prompt"
        raise ValueError(f"{axis.name}: enable a {what} for this axis to change the cells")
    return ({**dict(units[0]), axis.unit: value}, *units[1:])  # checked as the request is made (RequestError)


def _hires(axis: AxisType, hires: Any, value: Any) -> Any:
    """The request's hires fix with one of its fields (`axis.field`, "hires_steps") set to `value`."""
    if hires is None:
        raise ValueError(f"{axis.name}: turn the hires fix on for this axis to change the cells")
    return {**dict(hires), axis.field: value}  # checked as the request is made (RequestError)


def _sampler(sampler: str | None, schedule: str | None) -> str | None:
    """Our sampler for a (sampler, schedule) pair of the axes; a schedule needs a sampler to apply to,
    and one our sampler cannot run is refused (a plot would otherwise label cells that do not differ)."""
    if schedule is not None and not sampler:
        raise ValueError("Schedule type: choose a sampler (in the form or on another axis) for the schedule to apply to")
    resolved = from_any(sampler, schedule)
    if resolved.note:
        raise ValueError(f"Schedule type: {resolved.note}")
    return resolved.sampler or None


# ---------------------------------------------------------------- running
class ScriptStop:
    """Stops one script from outside, as a job's cancel does (an HTTP caller that went away): the
    cells not started are not submitted, the running ones stop after their step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[Job, Engine] = {}
        self.stopped = False

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            running = list(self._jobs.items())
        for job, engine in running:
            engine.cancel(job)

    def submit(self, engine: Engine, cell: Cell, caller: Caller, since: float) -> Job | None:
        """The cell's job, unless stopped already (then None); CancelledBeforeStart when the caller
        pressed Stop after `since`."""
        with self._lock:
            if self.stopped:
                return None
            job = engine.submit(cell.request, caller, unless_stopped_since=since)
            self._jobs[job] = engine
            return job

    def done(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job, None)


def run_script(
    engine: Engine,
    cells: Sequence[Cell],
    layout: Layout,
    caller: Caller | None = None,
    progress: Callable[[int, int], None] | None = None,
    stop: ScriptStop | None = None,
) -> ScriptResult:
    """Run every cell through `engine` (as many at once as it runs), then draw the grid.

    Each cell is checked against the model serving it before any runs, so a bad value is refused
    at once, naming the field. A cell's failure ends the script with that error."""
    caller = caller or Caller()
    if any(c.model for c in cells) and not engine.can_switch:
        raise ValueError(f"a Checkpoint name axis switches models: {engine.switch_off_reason}")
    model = engine.model_info()
    for name in {c.model for c in cells if c.model}:
        engine.find_model(name)  # every model can load here: RequestError naming the model and what can
    for cell in cells:
        if cell.model is None:
            model.serving(cell.request).accept(cell.request)
    pixels = sum((c.request.width or model.default_width) * (c.request.height or model.default_height) for c in cells)
    if pixels > MAX_GRID_PIXELS:
        raise ValueError(f"the grid would have {pixels / 1e6:.0f} megapixels, more than {MAX_GRID_PIXELS // 10**6}: "
                         "use fewer values or a smaller size")  # fmt: skip
    run = _Run(engine, caller, len(cells), progress, stop or ScriptStop())
    loaded_before = model.model_name
    try:
        for name, group in _by_model(cells):
            if run.stopped:
                break
            if name is not None and name != engine.model_info().model_name:
                engine.load_model(name)
                run.models_loaded += 1
            run.all(group)
    finally:
        _load_back(engine, loaded_before, run)
    return _finish(cells, layout, run)


def _load_back(engine: Engine, name: str, run: _Run) -> None:
    """The model loaded before the plot, loaded again (A1111 restores the checkpoint too); one that is
    not in the catalog (a MODEL_ID outside MODELS_DIR and the recipes) cannot be named: said, not hidden."""
    if not run.models_loaded or engine.model_info().model_name == name:
        return
    try:
        engine.find_model(name)
    except ValueError:
        run.warnings.append(f"{engine.model_info().model_name} stays loaded: {name}, loaded before the plot, "
                            "is not one of the models that can be loaded by name")  # fmt: skip
        return
    engine.load_model(name)


def _by_model(cells: Sequence[Cell]) -> list[tuple[str | None, list[Cell]]]:
    """Cells grouped by the model they need, in the order each model first appears."""
    groups: dict[str | None, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.model, []).append(cell)
    return list(groups.items())


class _Run:
    """The cells in flight: at most as many as the engine runs at once and the caller may have; Stop
    seen between cells too (a Stop after the script started ends it; a cell that ran out of its time
    budget does not)."""

    def __init__(self, engine: Engine, caller: Caller, total: int, progress: Callable[[int, int], None] | None,
                 stop: ScriptStop):  # fmt: skip
        self.engine, self.caller, self.total, self.progress, self.stop = engine, caller, total, progress, stop
        self.results: dict[tuple[int, int, int], GenerationResult] = {}
        self.models_loaded = 0
        self.warnings: list[str] = []
        self.stopped = False
        self.since = time.monotonic()
        self._lock = threading.Lock()

    def all(self, cells: Sequence[Cell]) -> None:
        mine = sum(job.caller.key == self.caller.key for job in self.engine.jobs())
        room = self.engine.admission.per_caller - mine  # the caller's other jobs keep their places
        width = max(1, min(self.engine.backend.concurrency, room))
        with ThreadPoolExecutor(width, thread_name_prefix="plot-cell") as pool:  # each cell in the caller's context
            for future in [pool.submit(contextvars.copy_context().run, self.one, cell) for cell in cells]:
                future.result()  # a cell's error ends the script, raised here

    def one(self, cell: Cell) -> None:
        if self.stopped:
            return
        try:
            job = self.stop.submit(self.engine, cell, self.caller, self.since)
        except CancelledBeforeStart:  # a Stop since the script started
            self.stopped = True
            return
        except (TooManyJobs, QueueFull) as exc:  # the server is busy: keep what finished, say why it ended
            self._refused(exc)
            return
        if job is None:
            self.stopped = True
            return
        try:
            result = job.result()
        except CancelledBeforeStart:
            self.stopped = True
            return
        except BaseException:
            self.stopped = True  # the cells not started yet are not submitted
            raise
        finally:
            self.stop.done(job)
        with self._lock:
            self.results[cell.at] = result
            self.stopped = self.stopped or (result.cancelled and not job.timed_out)
            done = len(self.results)
        if self.progress is not None:
            self.progress(done, self.total)

    def _refused(self, exc: Exception) -> None:
        with self._lock:
            self.stopped = True
            if not self.results:
                raise exc  # nothing made: the refusal is the answer
            self.warnings.append(f"ended early: {exc}")


def _idle_axes(layout: Layout, digests: Mapping[tuple[int, int, int], bytes]) -> list[str]:
    """A warning per axis whose values made the same pixels (`digests`: each finished cell's first image's)
    in every row, column or sub-grid it spans: the model ignored it (an instruction editor's Denoising,
    Clip skip on a model without CLIP), so the plot shows equal cells under different labels."""
    names = dict(layout.fields)
    sizes = (len(layout.xs), len(layout.ys), len(layout.zs))
    out = []
    for k, letter in enumerate("XYZ"):
        if sizes[k] < 2 or f"{letter} Type" not in names:
            continue
        lines: dict[tuple[int, ...], list[bytes]] = {}
        for at, digest in digests.items():
            lines.setdefault(at[:k] + at[k + 1 :], []).append(digest)
        if lines and all(len(line) == sizes[k] and len(set(line)) == 1 for line in lines.values()):
            out.append(f"{letter} axis ({names[f'{letter} Type']}): every value made the same image; "
                       "this model or request does not use it")  # fmt: skip
    return out


def _finish(cells: Sequence[Cell], layout: Layout, run: _Run) -> ScriptResult:
    """The grid of what came back (a grey tile for a cell that did not), and the grid's metadata."""
    firsts = {at: r.images[0] for at, r in run.results.items() if r.images}
    sub_grids = [
        draw_grid(
            [[firsts.get((ix, iy, iz)) for ix in range(len(layout.xs))] for iy in range(len(layout.ys))],
            layout.xs, layout.ys, legend=layout.legend, margin=layout.margin,
        )
        for iz in range(len(layout.zs))
    ] if firsts else []  # fmt: skip
    grid = None
    if sub_grids:
        grid = sub_grids[0] if len(sub_grids) == 1 else join_grids(sub_grids, layout.zs, legend=layout.legend, margin=layout.margin)
    first = next((run.results[c.at].metadata[0] for c in cells if c.at in run.results and run.results[c.at].metadata), {})
    meta = {**first, "script": layout.fields} if first else {}
    whole = {at: hashlib.sha1(r.images[0].tobytes()).digest() for at, r in run.results.items() if r.images and not r.cancelled}
    warnings = sorted({w for r in run.results.values() for w in r.warnings}) + run.warnings + _idle_axes(layout, whole)
    if run.stopped and len(run.results) < len(cells):
        warnings.append(f"stopped: {len(run.results)} of {len(cells)} cell(s) finished")
    return ScriptResult(grid, sub_grids, list(cells), run.results, meta, warnings, run.stopped, run.models_loaded)
