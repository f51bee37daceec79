"""The X/Y/Z plot (issue 44): axes as A1111 writes them, cells as single requests, the grid, Stop, the pool."""

from __future__ import annotations

import numpy as np
import pytest

from devices import DeviceManager
from engine import Caller, Engine
from engine.axes import axis_types, find_axis, parse_values, split_values
from engine.plots import Axis, PlotOptions, plot_cells, run_script
from pipelines import GenerationRequest, ImagePipeline, read_metadata
from pipelines.pnginfo.read import read_png_info
from pipelines.pnginfo.write import save_png
from pipelines.schema.fields import RequestError
from serving.pool import DevicePool
from tests.sync import AtOnce, HoldAtStep, in_thread

PROMPT = "a red circle on a blue background"
TXT = axis_types("txt2img")


def axis(name: str, values, mode: str = "txt2img", loras=()) -> Axis:
    return Axis.of(find_axis(axis_types(mode, loras), name), values)


def base(**kwargs) -> GenerationRequest:
    return GenerationRequest(**{"prompt": PROMPT, "steps": 2, "width": 32, "height": 32, "seed": 7, **kwargs})


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    return ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"))


# ---------------------------------------------------------------- axes and values
def test_a1111_clients_name_axes_by_a1111_index():
    """webuiapi and scripts send the axis as its index in A1111's list for txt2img or img2img."""
    img = axis_types("img2img")
    assert [TXT[i].name for i in (0, 1, 4, 6, 7, 9, 11)] == [
        "Nothing", "Seed", "Steps", "CFG Scale", "Prompt S/R", "Sampler", "Checkpoint name"]  # fmt: skip
    assert [img[i].name for i in (5, 6, 7, 9, 10)] == ["CFG Scale", "Image CFG Scale", "Prompt S/R", "Sampler", "Checkpoint name"]
    assert find_axis(TXT, "cfg scale") is TXT[6] and find_axis(TXT, "6") is TXT[6]
    names = [t.name for t in TXT]
    assert names.index("Size") < names.index("Guidance end")  # our own axes follow A1111's list
    assert axis_types("txt2img", ["paint"])[-1].name == "LoRA: paint"


def test_our_fields_without_an_a1111_axis_get_one_from_the_schema():
    names = [t.name for t in axis_types("txt2img")]
    assert {"Guidance end", "Step cache", "Step cache threshold"} <= set(names)
    assert "Strength" not in names  # A1111's "Denoising" is that field


@pytest.mark.parametrize(
    ("name", "text", "want"),
    [
        ("Steps", "1-5", [1, 2, 3, 4, 5]),
        ("Steps", "1-5 (+2)", [1, 3, 5]),
        ("Steps", "10-20 [3]", [10, 15, 20]),
        ("Steps", "5-1 (-2), 8", [5, 3, 1, 8]),
        ("CFG Scale", "1.5-3 (+0.5)", [1.5, 2.0, 2.5, 3.0]),
        ("CFG Scale", "0-1 [3], 7", [0.0, 0.5, 1.0, 7.0]),
        ("Size", "32x32, 64X32", [(32, 32), (64, 32)]),
        ("Seed", "-1, 5", [None, 5]),
        ("Prompt S/R", 'red, "blue, dark"', ["red", "blue, dark"]),
    ],
)
def test_values_are_read_as_a1111_writes_them(name, text, want):
    assert parse_values(find_axis(TXT, name), text) == want


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("Steps", "0-3", "Steps: '0-3': 0 is out of range 1..150"),
        ("CFG Scale", "abc", "CFG Scale: 'abc'"),
        ("Size", "32", "expected WIDTHxHEIGHT"),
        ("Hires steps", "-1", "Hires steps: '-1': -1 is out of range"),
        ("Steps", "", "Steps: no values"),
        ("Steps", "5-1", "Steps: no values in '5-1' (a range down needs a negative step"),
        ("Seed", "1-1000000000", "Seed: '1-1000000000': 1000000000 values, more than 100"),
        ("CFG Scale", "1-2 [100000000000]", "100000000000 values, more than 100"),
        ("Denoising", "1.5", "Denoising: '1.5': 1.5 is out of range"),  # txt2img: the hires fix's
        ("Var. seed", "1", "Var. seed cannot vary here: variation seeds are not offered here"),
    ],
)
def test_bad_values_are_refused_naming_the_axis(name, text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_values(find_axis(TXT, name), text)


def test_csv_quoting_keeps_a_comma_inside_a_value():
    assert split_values('a, "b, c",d') == ["a", "b, c", "d"]


# ---------------------------------------------------------------- cells
def test_cells_apply_each_axis_and_share_one_seed():
    cells, layout = plot_cells(base(seed=None), [axis("Steps", "2, 3"), axis("CFG Scale", "1, 4")], PlotOptions())
    assert [c.at for c in cells] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]  # X fastest
    assert [(c.request.steps, c.request.guidance_scale) for c in cells] == [(2, 1.0), (3, 1.0), (2, 4.0), (3, 4.0)]
    assert len({c.request.seed for c in cells}) == 1 and cells[0].request.seed is not None
    assert layout.xs == ["Steps: 2", "Steps: 3"] and layout.ys == ["CFG Scale: 1.0", "CFG Scale: 4.0"]  # A1111's
    assert layout.fields == [("Script", "X/Y/Z plot"), ("X Type", "Steps"), ("X Values", "2, 3"),
                             ("Y Type", "CFG Scale"), ("Y Values", "1, 4")]  # fmt: skip


def test_seed_options_follow_a1111():
    two = [axis("Steps", "2, 3"), axis("CFG Scale", "1, 4")]
    kept, _ = plot_cells(base(seed=None), two, PlotOptions(keep_random_seeds=True))
    assert {c.request.seed for c in kept} == {None}  # each cell draws its own at submit
    varied, _ = plot_cells(base(seed=100), two, PlotOptions(vary_seeds=(True, True, False)))
    assert [c.request.seed for c in varied] == [100, 101, 102, 103]
    seeds, layout = plot_cells(base(), [axis("Seed", "-1, 5")], PlotOptions())
    drawn = seeds[0].request.seed
    assert drawn is not None and seeds[1].request.seed == 5
    assert ("Fixed X Values", f"{drawn}, 5") in layout.fields  # the plot can be redone with the seeds it drew


def test_prompt_sr_replaces_in_prompt_and_negative_and_checks_the_search_term():
    cells, layout = plot_cells(base(negative_prompt="red blur"), [axis("Prompt S/R", "red, green")], PlotOptions())
    assert [c.request.prompt for c in cells] == [PROMPT, PROMPT.replace("red", "green")]
    assert cells[1].request.negative_prompt == "green blur"
    assert layout.xs == ["red", "green"]
    with pytest.raises(ValueError, match="did not find 'purple'"):
        plot_cells(base(), [axis("Prompt S/R", "purple, green")], PlotOptions())


def test_sampler_and_schedule_axes_make_our_sampler_name():
    cells, _ = plot_cells(base(), [axis("Sampler", "DPM++ 2M"), axis("Schedule type", "Karras, Uniform")], PlotOptions())
    assert [c.request.sampler for c in cells] == ["DPM++ 2M Karras", "DPM++ 2M"]
    with pytest.raises(ValueError, match="Schedule type: choose a sampler"):  # else every cell is the same image
        plot_cells(base(), [axis("Schedule type", "Karras, Uniform")], PlotOptions())
    with pytest.raises(ValueError, match="Schedule type: schedule Exponential"):
        plot_cells(base(sampler="Euler"), [axis("Schedule type", "Exponential")], PlotOptions())


def test_a_seed_axis_with_vary_seeds_adds_the_offset_after_the_axis():
    cells, _ = plot_cells(base(), [axis("Seed", "10, 20"), axis("Steps", "2, 3")], PlotOptions(vary_seeds=(False, True, False)))
    assert [c.request.seed for c in cells] == [10, 20, 11, 21]  # A1111's


def test_a_styles_axis_adds_to_the_requests_styles():
    cells, layout = plot_cells(base(styles=("night",)), [axis("Styles", "plain, a, b")], PlotOptions())
    assert [c.request.styles for c in cells] == [("night", "plain"), ("night", "a"), ("night", "b")]
    assert layout.xs == ["Styles: plain", "Styles: a", "Styles: b"]


def test_a_lora_axis_sets_that_loras_scale():
    cells, layout = plot_cells(base(), [axis("LoRA: paint", "0, 0.5 ", loras=["paint"])], PlotOptions())
    assert [c.request.loras for c in cells] == [{"paint": 0.0}, {"paint": 0.5}]
    assert layout.xs == ["LoRA: paint: 0.0", "LoRA: paint: 0.5"]


def test_hires_axes_vary_the_hires_fix_and_need_it_on():
    from pipelines.schema.hires import Hires

    on = base(hires=Hires(hires_fix=True, hires_scale=2.0, hires_steps=3))
    cells, layout = plot_cells(on, [axis("Hires steps", "2, 4"), axis("Denoising", "0.3, 0.5")], PlotOptions())
    assert [(c.request.hires.hires_steps, c.request.hires.hires_strength) for c in cells] == [
        (2, 0.3), (4, 0.3), (2, 0.5), (4, 0.5)]  # fmt: skip
    assert layout.xs == ["Hires steps: 2", "Hires steps: 4"] and layout.ys == ["Denoising: 0.3", "Denoising: 0.5"]
    cells, _ = plot_cells(on, [axis("Hires upscaler", "Latent, Lanczos"), axis("Hires sampler", "Euler, DDIM")], PlotOptions())
    assert [(c.request.hires.hires_upscaler, c.request.hires.hires_sampler) for c in cells][:2] == [
        ("Latent", "Euler"), ("Lanczos", "Euler")]  # fmt: skip
    with pytest.raises(ValueError, match="Hires steps: turn the hires fix on"):
        plot_cells(base(), [axis("Hires steps", "2, 4")], PlotOptions())


def test_unit_axes_set_the_first_controlnet_weight_and_image_prompt_scale():
    from PIL import Image

    from pipelines.schema.control import ControlUnit
    from pipelines.schema.image_prompt import ImagePrompt

    picture = Image.new("RGB", (8, 8))
    units = (ControlUnit(image=picture, model="a"), ControlUnit(image=picture, model="b", weight=0.7))
    request = base(controlnet=units, ip_adapter=(ImagePrompt(image=picture, model="c"),))
    cells, layout = plot_cells(request, [axis("[ControlNet] Weight", "0.5, 1.5"), axis("[IP-Adapter] Scale", "0, 1")], PlotOptions())
    assert [(c.request.controlnet[0].weight, c.request.controlnet[1].weight, c.request.ip_adapter[0].scale) for c in cells] == [
        (0.5, 0.7, 0.0), (1.5, 0.7, 0.0), (0.5, 0.7, 1.0), (1.5, 0.7, 1.0)]  # fmt: skip
    assert layout.xs == ["[ControlNet] Weight: 0.5", "[ControlNet] Weight: 1.5"]
    with pytest.raises(ValueError, match="enable a ControlNet unit"):
        plot_cells(base(), [axis("[ControlNet] Weight", "0.5")], PlotOptions())
    with pytest.raises(RequestError, match="weight"):
        plot_cells(request, [axis("[ControlNet] Weight", "3")], PlotOptions())


def test_a_clip_skip_axis_sets_clip_skip():
    cells, layout = plot_cells(base(), [axis("Clip skip", "1-2")], PlotOptions())
    assert [c.request.clip_skip for c in cells] == [1, 2] and layout.xs == ["Clip skip: 1", "Clip skip: 2"]


# ---------------------------------------------------------------- running on the engine
def test_each_cell_is_the_image_of_the_same_single_request(pipe, tmp_path):
    engine = Engine(pipe)
    cells, layout = plot_cells(base(), [axis("Steps", "1, 2"), axis("CFG Scale", "1, 5")], PlotOptions())
    seen: list[tuple[int, int]] = []
    result = run_script(engine, cells, layout, progress=lambda done, total: seen.append((done, total)))
    assert not result.cancelled and len(result.results) == 4 and seen[-1] == (4, 4)
    for cell in cells:
        single = pipe.generate(cell.request)
        assert result.results[cell.at].images[0].tobytes() == single.images[0].tobytes(), cell.at
    grid = result.grid
    for (ix, iy), box in grid.cell_boxes.items():
        want = result.results[(ix, iy, 0)].images[0]
        assert np.array_equal(np.asarray(grid.image.crop(box).convert("RGB")), np.asarray(want.convert("RGB")))
    x_labels = [lb for lb in grid.labels if lb.axis == "x"]
    assert [lb.text for lb in x_labels] == ["Steps: 1", "Steps: 2"]
    for label in x_labels:  # above its own column
        left, _, right, _ = grid.cell_boxes[(label.index, 0)]
        assert left <= (label.box[0] + label.box[2]) / 2 <= right
    path = save_png(grid.image, result.meta, tmp_path / "grid.png")
    extra = read_png_info(path)["parameters"]["extra"]  # what the PNG info tab reads
    assert read_metadata(path)["parameters"]["steps"] == 1  # the first cell's own fields
    assert (extra["Script"], extra["X Type"], extra["X Values"], extra["Y Values"]) == ("X/Y/Z plot", "Steps", "1, 2", "1, 5")


def test_an_axis_whose_values_make_the_same_images_is_warned_about(pipe):
    """Equal cells under different labels mislead: the plot says which axis changed nothing."""
    engine = Engine(pipe)
    same = run_script(engine, *plot_cells(base(steps=1), [axis("Seed", "5, 5"), axis("Steps", "1, 2")], PlotOptions()))
    assert [w for w in same.warnings if "axis" in w] == [
        "X axis (Seed): every value made the same image; this model or request does not use it"]  # fmt: skip
    varied = run_script(engine, *plot_cells(base(steps=1), [axis("Seed", "5, 6")], PlotOptions()))
    assert not [w for w in varied.warnings if "axis" in w]


def test_a_plot_runs_all_its_cells_when_the_caller_may_have_one_job(pipe):
    """QUEUE_PER_USER=1: each next cell is submitted as the last one ends, never refused as a second job."""
    from engine import Admission

    engine = Engine(pipe, Admission(per_caller=1))
    cells, layout = plot_cells(base(steps=1), [axis("Seed", "1-40")], PlotOptions())
    result = run_script(engine, cells, layout, Caller(session="s"))
    assert len(result.results) == 40 and not result.cancelled and not result.warnings


def test_a_bad_cell_is_refused_before_any_cell_runs(pipe, monkeypatch):
    engine = Engine(pipe)
    calls: list[GenerationRequest] = []
    monkeypatch.setattr(pipe, "generate", lambda request, *args: calls.append(request))
    cells, layout = plot_cells(base(), [axis("Sampler", "Euler, Not a sampler")], PlotOptions())
    with pytest.raises(ValueError, match="sampler"):
        run_script(engine, cells, layout)
    assert calls == []


def test_stop_returns_the_finished_cells_and_a_partial_grid(pipe, monkeypatch):
    """The second cell (2 steps) is held at its first step until Stop reaches it; the later cells
    never start."""
    engine = Engine(pipe)
    original = pipe.generate
    hold = HoldAtStep(original, step=1)
    calls: list[int] = []

    def generate(request, *args):
        calls.append(request.steps)
        return (hold if request.steps == 2 else original)(request, *args)

    monkeypatch.setattr(pipe, "generate", generate)
    caller = Caller(session="tab-1")
    cells, layout = plot_cells(base(), [axis("Steps", "1, 2, 3, 4")], PlotOptions())
    run = in_thread(run_script, engine, cells, layout, caller)
    assert hold.reached.wait(120)
    engine.stop("tab-1")
    result = run.result(timeout=120)
    assert hold.held_until == "cancel" and result.cancelled
    assert 3 not in calls and (0, 0, 0) in result.results and (2, 0, 0) not in result.results
    assert any("stopped: " in w for w in result.warnings)
    grey = result.grid.image.crop(result.grid.cell_boxes[(3, 0)])
    assert grey.getcolors() == [(grey.width * grey.height, (128, 128, 128))]


@pytest.mark.slow  # two replicas of the tiny model
def test_a_pool_of_two_runs_two_cells_at_once_with_the_same_images(tiny_model_dir, pipe):
    pool = DevicePool.from_pretrained(str(tiny_model_dir), devices="cpu,cpu")
    try:
        engine = Engine(pool)
        pool.generate = counted = AtOnce(pool.generate)
        cells, layout = plot_cells(base(steps=4), [axis("Seed", "1, 2, 3"), axis("CFG Scale", "1, 5, 9")], PlotOptions())
        result = run_script(engine, cells, layout)
        assert counted.most == 2
        for cell in cells:
            assert result.results[cell.at].images[0].tobytes() == pipe.generate(cell.request).images[0].tobytes()
    finally:
        pool.close()


@pytest.mark.slow  # three tiny models
def test_a_checkpoint_axis_loads_each_model_once_and_the_first_one_back(tmp_path):
    from engine.jobs import Switching
    from tests.tiny_model import save_tiny_pipeline

    models = tmp_path / "models"
    for name in ("tiny-a", "tiny-b", "tiny-c"):
        save_tiny_pipeline(models / name)
    pool = DevicePool.from_pretrained(str(models / "tiny-a"), devices="cpu")
    try:
        engine = Engine(pool, switching=Switching(allowed=True, models_dir=models))
        loads: list[str] = []
        load = pool.load_model
        pool.load_model = lambda source, progress=None: (loads.append(str(source)), load(source, progress))[1]
        before = engine.model_info().model_name
        cells, layout = plot_cells(base(), [axis("Checkpoint name", "tiny-b, tiny-c"), axis("CFG Scale", "1, 7")], PlotOptions())
        result = run_script(engine, cells, layout)
        assert [m["model"] for c in cells for m in result.results[c.at].metadata] == ["tiny-b", "tiny-c"] * 2
        assert len(loads) == 3 and result.models_loaded == 2  # b, c, then the model loaded before
        assert engine.model_info().model_name == before
        with pytest.raises(ValueError, match="tiny-x"):
            run_script(engine, *plot_cells(base(), [axis("Checkpoint name", "tiny-b, tiny-x")], PlotOptions()))
        assert len(loads) == 3  # refused before any switch
    finally:
        pool.close()


def test_the_axis_pickers_follow_the_model_loaded():
    """After a switch the X/Y/Z type pickers list the new model's LoRA axes, not the previous model's."""
    import gradio as gr

    from pipelines import ModelInfo
    from ui import plot_panel

    info = ModelInfo(model_name="m", default_width=64, default_height=64, size_multiple=8, max_side=256, max_pixels=16384,
                     max_batch=16, default_steps=20, default_guidance=4.0, scheduler="DPM++ 2M", loras=("paint",))  # fmt: skip
    with gr.Blocks():
        c = {f"xyz_{a}_type": gr.Dropdown(plot_panel.axis_names(info, "generate")) for a in "xyz"}
    other = ModelInfo(**{**info.__dict__, "loras": ("ink",)})
    for tab in ("generate", "edit"):
        choices = [u["choices"] for u in plot_panel.updates(other, c, tab).values()]
        assert all("LoRA: ink" in names and "LoRA: paint" not in names for names in choices), tab
        assert "Clip skip" in choices[0] and "[ControlNet] Weight" in choices[0]
