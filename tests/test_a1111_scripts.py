"""Scripts through the APIs (issue 44): A1111's X/Y/Z plot, prompt matrix and prompts from file, driven by
the real `webuiapi` client and raw HTTP, and the Gradio `/xyz_plot` endpoint through gradio_client,
against the app as `python app.py` builds it."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
from PIL import Image

from pipelines.pnginfo.read import parse_a1111
from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import embedded_model_available, main_pool, running_app

PROMPT = "a red circle on a blue background"
SMALL = {"width": 64, "height": 64, "steps": 6, "seed": 21}
# A1111 1.10's 18 X/Y/Z arguments: X = Sampler (txt2img index 9) from its picker list, Y = CFG Scale (6)
XYZ_ARGS = [9, "", ["Euler a", "Euler"], 6, "1, 7", None, 0, "", None,
            True, True, False, False, False, False, False, 0, False]  # fmt: skip


def seed_axis(values: str) -> list:
    """A1111's 18 X/Y/Z arguments for X = Seed (index 1) only, with the cell images after the grid."""
    return [1, values, None, 0, "", None, 0, "", None, True, True, False, False, False, False, False, 0, False]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    if not embedded_model_available():
        pytest.skip("needs the embedded model (models/tiny-shapes)")
    with running_app(DEFAULT_MODEL, tmp_path_factory.mktemp("outputs"), env={"ALLOW_MODEL_SWITCH": "0"}) as (demo, _):
        yield demo


@pytest.fixture(scope="module")
def http(app):
    with httpx.Client(base_url=app.local_url.rstrip("/") + "/sdapi/v1", timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def api(app):
    import webuiapi

    port = int(app.local_url.split(":")[2].split("/")[0])
    return webuiapi.WebUIApi(host="127.0.0.1", port=port, sampler="Euler a", steps=6)


def decoded(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def test_webuiapi_xyz_plot_of_sampler_by_cfg_returns_the_grid_then_each_cell(api):
    plot = api.txt2img(prompt=PROMPT, script_name="x/y/z plot", script_args=XYZ_ARGS, **SMALL)
    assert len(plot.images) == 1 + 4  # the grid, then the 4 cells ("Include Sub Images")
    grid = plot.images[0]
    assert grid.width > 2 * 64 and grid.height > 2 * 64  # two columns, two rows, and the legend
    extra = parse_a1111(grid.info["parameters"])["extra"]
    assert (extra["Script"], extra["X Type"], extra["Y Type"], extra["Y Values"]) == ("X/Y/Z plot", "Sampler", "CFG Scale", "1, 7")
    for k, (sampler, cfg) in enumerate([("Euler a", 1), ("Euler", 1), ("Euler a", 7), ("Euler", 7)]):
        single = api.txt2img(prompt=PROMPT, sampler_name=sampler, cfg_scale=cfg, **SMALL)
        assert plot.images[1 + k].tobytes() == single.image.tobytes(), (sampler, cfg)


def test_webuiapi_prompt_matrix_returns_the_grid_and_every_combination(api):
    matrix = api.txt2img(prompt="a red circle | on a blue background", script_name="Prompt matrix",
                         script_args=[False, False, "positive", "comma", 0], **SMALL)  # fmt: skip
    assert len(matrix.images) == 1 + 2
    prompts = [parse_a1111(i.info["parameters"])["prompt"] for i in matrix.images[1:]]
    assert prompts == ["a red circle", "a red circle, on a blue background"]
    info = matrix.info  # A1111's: the lists describe the images after the grid
    assert info["index_of_first_image"] == 1 and info["all_prompts"] == prompts and info["all_seeds"] == [21, 21]


def test_prompts_from_textbox_runs_each_line_with_its_options(http):
    lines = 'a green square on a white background\n--prompt "a red circle on a blue background" --steps 4 --cfg_scale 3'
    body = {"prompt": "", "script_name": "prompts from file or textbox", "script_args": [False, False, "start", lines], **SMALL}
    answer = http.post("/txt2img", json=body)
    assert answer.status_code == 200, answer.text
    params = [parse_a1111(decoded(b).info["parameters"]) for b in answer.json()["images"]]
    info = json.loads(answer.json()["info"])
    assert info["prompt"] == "a green square on a white background" and info["index_of_first_image"] == 0
    assert [(p["prompt"], p["steps"]) for p in params] == [
        ("a green square on a white background", 6), ("a red circle on a blue background", 4)]  # fmt: skip
    assert params[1]["guidance_scale"] == 3


def test_scripts_are_listed_with_a1111s_axis_indices(http):
    assert "x/y/z plot" in http.get("/scripts").json()["txt2img"]
    info = {(s["name"], s["is_img2img"]): s for s in http.get("/script-info").json()}
    choices = info[("x/y/z plot", False)]["args"][0]["choices"]
    assert choices.index("Sampler") == 9 and choices.index("CFG Scale") == 6 and choices.index("Size") == 41
    assert info[("x/y/z plot", True)]["args"][0]["choices"].index("Image CFG Scale") == 6


@pytest.mark.parametrize(
    ("name", "args", "loc", "message"),
    [
        ("no such script", [], "script_name", "Script 'no such script' not found"),
        ("x/y/z plot", [2, "10"], "script_args", "X axis: Var. seed cannot vary here"),
        ("x/y/z plot", [5, "10"], "script_args", "Hires steps: turn the hires fix on"),
        ("x/y/z plot", [4, "2, 500"], "script_args", "Steps: '500': 500 is out of range 1..150"),
    ],
)
def test_a_wrong_script_is_refused_naming_what(http, name, args, loc, message):
    answer = http.post("/txt2img", json={"prompt": PROMPT, "script_name": name, "script_args": args, **SMALL})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", loc] and message in detail["msg"]


def test_img2img_xyz_plot_varies_the_image_guidance(http):
    """The img2img tab's own axes: Image CFG Scale is index 6 there (the embedded editor takes it)."""
    from models.train.world import draw, random_scene

    picture = io.BytesIO()
    draw(random_scene(__import__("random").Random(3))).save(picture, format="PNG")
    args = [6, "1.5, 3", None, 0, "", None, 0, "", None, True, True, False, False, False, False, False, 0, False]
    body = {"init_images": [base64.b64encode(picture.getvalue()).decode()], "prompt": PROMPT,
            "script_name": "x/y/z plot", "script_args": args, **SMALL}  # fmt: skip
    answer = http.post("/img2img", json=body)
    assert answer.status_code == 200, answer.text
    images = [decoded(b) for b in answer.json()["images"]]
    assert len(images) == 1 + 2
    assert [parse_a1111(i.info["parameters"])["image_guidance_scale"] for i in images[1:]] == [1.5, 3.0]
    assert parse_a1111(images[0].info["parameters"])["extra"]["X Type"] == "Image CFG Scale"
    assert images[1].tobytes() != images[2].tobytes()


def test_gradio_xyz_plot_endpoint_gives_the_grid_and_the_images_of_generate(app):
    from gradio_client import Client

    client = Client(app.local_url, verbose=False)
    request = dict(prompt=PROMPT, num_images=1, width=64, height=64, seed=5)
    grid, cells, info = client.predict(**request, steps=4, x_type="Steps", x_values="2, 4", y_type="CFG Scale",
                                       y_values="1, 7", api_name="/xyz_plot")  # fmt: skip
    assert (info["cells"], info["finished"], info["cancelled"], info["seeds"]) == (4, 4, False, [5] * 4)
    assert "X/Y/Z plot" in Image.open(grid).text["parameters"]
    for k, (steps, cfg) in enumerate([(2, 1), (4, 1), (2, 7), (4, 7)]):
        single, _ = client.predict(**request, steps=steps, guidance_scale=cfg, api_name="/generate")
        assert Image.open(cells[k]["image"]).tobytes() == Image.open(single[0]["image"]).tobytes(), (steps, cfg)
    with pytest.raises(Exception, match="Steps: '0': 0 is out of range"):
        client.predict(**request, x_type="Steps", x_values="0, 4", api_name="/xyz_plot")


def test_a_client_that_goes_away_stops_its_plot(app, http, monkeypatch):
    """The first cell is held at its second step until it is cancelled: leaving must stop it there and
    start no further cell (without the stop the hold runs out, then every cell runs)."""
    from tests.sync import HoldAtStep, send_and_leave, until

    backend = app.studio.engine.backend
    hold = HoldAtStep(backend.generate, step=2)
    started: list[int] = []

    def generate(request, *args):
        started.append(request.seed)
        return hold(request, *args)

    monkeypatch.setattr(backend, "generate", generate)
    body = {"prompt": PROMPT, "script_name": "x/y/z plot", "script_args": seed_axis("1-6"), **SMALL, "steps": 10}
    connection = send_and_leave(str(http.base_url).rstrip("/") + "/txt2img", body)
    assert hold.reached.wait(120), "the first cell never reached its second step"
    connection.close()
    assert hold.finished.wait(120) and hold.stopped_early(), hold
    assert until(lambda: http.get("/progress").json()["state"]["job_count"] == 0)
    assert len(started) < 6, started


def test_a_z_axis_gives_one_grid_per_value_joined_then_each_sub_grid(http):
    args = [4, "2, 4", None, 0, "", None, 6, "1, 7", None, True, False, True, False, False, False, False, 0, False]
    answer = http.post("/txt2img", json={"prompt": PROMPT, "script_name": "x/y/z plot", "script_args": args, **SMALL})
    assert answer.status_code == 200, answer.text
    joined, *subs = [decoded(b) for b in answer.json()["images"]]
    assert len(subs) == 2  # "Include Sub Grids", no cell images
    assert joined.width >= sum(s.width for s in subs) and joined.height > subs[0].height  # side by side, Z titles above
    extra = parse_a1111(joined.info["parameters"])["extra"]
    assert (extra["X Type"], extra["Z Type"], extra["Z Values"]) == ("Steps", "CFG Scale", "1, 7")


@pytest.mark.slow  # a second app, with two replicas
def test_a_plot_on_a_pool_of_two_replicas_runs_two_cells_at_once_with_the_single_request_images(tmp_path):
    """PREFERRED_DEVICE=cpu CPU_REPLICAS=2, as a user starts it: the cells run side by side."""
    import webuiapi

    from tests.sync import AtOnce

    env = {"PREFERRED_DEVICE": "cpu", "CPU_REPLICAS": "2", "ALLOW_MODEL_SWITCH": "0"}
    with running_app(DEFAULT_MODEL, tmp_path, env=env) as (demo, backend):
        pool = main_pool(backend)
        assert len(pool.replicas) == 2
        pool.generate = counted = AtOnce(pool.generate)
        api = webuiapi.WebUIApi(host="127.0.0.1", port=int(demo.local_url.split(":")[2].strip("/")), sampler="Euler a", steps=6)
        plot = api.txt2img(prompt=PROMPT, script_name="x/y/z plot", script_args=seed_axis("1-4"), **{**SMALL, "steps": 10})
        assert counted.most == 2 and len(plot.images) == 1 + 4
        for k, seed in enumerate(range(1, 5)):  # each cell kept its sampler while the other replica ran
            single = api.txt2img(prompt=PROMPT, **{**SMALL, "steps": 10, "seed": seed})
            assert parse_a1111(plot.images[1 + k].info["parameters"])["sampler"] == "Euler a"
            assert plot.images[1 + k].tobytes() == single.image.tobytes(), seed
