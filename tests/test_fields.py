"""Every front end takes every field of the request schema, or says why not.

The schema (`pipelines.schema.request.fields`) is the one list of what a request is. For each front end,
this sets each field of the tasks it serves to a value (a sample unlike the default) the way that
front end's callers send it, and checks the request it makes carries that value; a field it does
not take must be declared, with the reason, in that front end's own `NOT_TAKEN`, and a declared
field must really be left out (a stale declaration fails too). A field added to the schema is so
checked in every front end without a change here (the samples are derived from its declaration).

Front ends: the Gradio tabs and their endpoints (/generate, /edit, /inpaint, /outpaint), the A1111
API (txt2img, img2img), the OpenAI API (generations, edits), `python -m engine`,
`python -m pipelines`, `python -m pipelines.batch`, the Ray wire and the ZeroGPU call.
"""

from __future__ import annotations

import base64
import io
import pickle
from typing import Any

import pytest
from PIL import Image

from engine.inputs import Limits, read
from pipelines.run.backend import ModelInfo
from pipelines.schema.fields import TASKS, Choice, Range, Seed, Spec
from pipelines.schema.image_prompt import ImagePrompt
from pipelines.schema.request import GenerationRequest, fields, nest, spec

SIZE = (64, 64)
MODEL = ModelInfo(
    "m", 64, 64, 8, 256, 256 * 256, 16, 20, 4.0, "Euler", samplers=("Euler", "Euler a", "DDIM"), loras=("outline",),
    image_guidance=True, edit=False, inpaint=True, step_cache=True,
    styles={"cinematic": {"prompt": "{prompt}, film grain", "negative_prompt": "cartoon"}},
    detectors=("shapes-segformer",),
)  # fmt: skip
LIMITS = Limits(MODEL, 2000, 16, 4096 * 4096)
# Samples where a field's declaration alone does not give one this test's model takes (its
# samplers, its LoRAs, its size step, its batch cap); any other field's sample is derived.
SAMPLES: dict[str, Any] = {"sampler": "Euler a", "hires_sampler": "DDIM", "hires_upscaler": "Nearest", "loras": {"outline": 0.5}, "width": 48, "height": 40, "num_images": 2,
           "region_ratios": "1,2", "ad_model": "shapes-segformer", "ad_model_2nd": "shapes-segformer"}  # fmt: skip


def unit_sample(item: Spec) -> list[dict[str, Any]]:
    """ControlNet units (pipelines.schema.control.ControlUnit) or image prompts (pipelines.schema.image_prompt.ImagePrompt),
    each field unlike its default."""
    image = Image.new("RGB", SIZE, "white")
    image.paste((0, 0, 0), (10, 10, 30, 50))
    if item.value.part is ImagePrompt:
        return [{"image": image, "model": "shapes-colour", "scale": 0.5}]
    return [{"image": image, "model": "shapes-silhouette", "module": "canny", "weight": 0.5, "guidance_start": 0.1,
             "guidance_end": 0.8, "control_mode": "ControlNet is more important", "resize_mode": "Just Resize",
             "processor_res": 64, "threshold_a": 50.0, "threshold_b": 150.0}]  # fmt: skip


def sample(item: Spec) -> Any:
    """A value of `item` unlike its default, as a caller means it."""
    if item.kind == "units":
        return unit_sample(item)
    if item.name in SAMPLES:
        return SAMPLES[item.name]
    value = item.value
    if isinstance(value, Seed):
        return 12345
    if isinstance(value, Range):
        picked = value.low + (value.high - value.low) / 3
        return int(picked) if value.integer else round(picked, 2)
    if isinstance(value, Choice):
        return next(o for o in reversed(value.options) if o != item.default)
    kind = item.kind
    if kind == "flag":
        return not item.default
    if kind == "image":
        mask = Image.new("L", SIZE, 0)
        mask.paste(255, (8, 8, 40, 40))
        return mask
    if kind == "images":
        return [Image.new("RGB", SIZE, "navy")]
    if kind == "names":
        return ["cinematic"]
    return f"sample {item.name}"  # text, prompt


def got(request: GenerationRequest, item: Spec) -> Any:
    value: Any = request
    for part in item.path:
        value = getattr(value, part)
    return value


def same(item: Spec, value: Any, expected: Any) -> bool:
    if item.kind in ("image", "images"):  # an image travels as pixels: the same size and pixels
        pairs = zip(value or [], expected, strict=True) if item.kind == "images" else [(value, expected)]
        return all(a.size == b.size and a.tobytes() == b.convert(a.mode).tobytes() for a, b in pairs)
    if item.kind == "names":  # a list of names is kept as a tuple
        return tuple(value) == tuple(expected)
    if item.kind == "units":  # each unit's fields, its image as pixels
        expected = [e if isinstance(e, dict) else e.model_dump() for e in expected]
        return len(value) == len(expected) and all(
            u.image.tobytes() == e["image"].convert("RGB").tobytes()
            and all(getattr(u, k) == v for k, v in e.items() if k != "image")
            for u, e in zip(value, expected, strict=True)
        )
    return value == expected


def task_of(item: Spec) -> str:
    """The narrowest task using `item` (an inpaint field needs an inpaint request)."""
    return next(t for t in reversed(TASKS) if t in item.about.tasks)


def base(task: str) -> dict[str, Any]:
    """Flat values of a minimal request of `task` (an image, and a mask for an inpaint)."""
    flat: dict[str, Any] = {"prompt": "a cat"}
    if task != "txt2img":
        flat["init_images"] = sample(spec("init_images"))
    if task == "inpaint":
        flat["mask"] = sample(spec("mask"))
    return flat


# A nested part that a switch turns on (hires fix: `hires_fix`, A1111's `enable_hr`): its fields
# are taken only with the switch on, as a caller sends them.
SWITCHES: dict[str, dict[str, Any]] = {
    "hires": {"hires_fix": True}, "regions": {"regional_prompts": True},
    "detailer": {"ad_model": "shapes-segformer"}, "detailer_2nd": {"ad_model_2nd": "shapes-segformer"},
}  # fmt: skip


def base_for(item: Spec) -> dict[str, Any]:
    """`base` of the task using `item`, with its part switched on."""
    return {**base(task_of(item)), **SWITCHES.get(item.path[0], {})}


def check(front_end: str, serves: tuple[str, ...], make, not_taken: dict[str, str]) -> None:
    """`make(item, value)` -> the request `front_end` makes when a caller sets `item` to `value`."""
    missing = []
    for item in fields():
        if not set(serves) & item.about.tasks:
            continue
        if item.name in not_taken:
            assert not_taken[item.name].strip(), f"{front_end}: {item.name} is declared without a reason"
            continue
        value = sample(item)
        request = make(item, value)
        if not same(item, got(request, item), value):
            missing.append(f"{item.name} (sent {value!r}, the request has {got(request, item)!r})")
    assert not missing, f"{front_end} does not take: " + "; ".join(missing)


# ---------------------------------------------------------------- the HTTP APIs
def b64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


# A1111's encodings that are not our values (webapi.a1111_request.CONVERTED and the fields read apart).
A1111_ENCODED = {
    "masked_content": lambda v: {"inpainting_fill": {"fill": 0, "original": 1}[v]},
    "inpaint_area": lambda v: {"inpaint_full_res": v == "only masked"},
    "loras": lambda v: {"prompt": "a cat " + " ".join(f"<lora:{n}:{s}>" for n, s in v.items())},
    "num_images": lambda v: {"batch_size": v},
    "init_images": lambda v: {"init_images": [b64(i) for i in v]},
    "mask": lambda v: {"mask": b64(v)},
    "controlnet": lambda v: {"alwayson_scripts": {"controlnet": {"args": [{**u, "image": b64(u["image"])} for u in v]}}},
    # an IP-Adapter is a ControlNet unit to A1111's extension: its module names it, its weight is the scale
    "ip_adapter": lambda v: {"alwayson_scripts": {"controlnet": {"args": [
        {"image": b64(u["image"]), "module": "ip-adapter_clip_sd15", "model": u["model"], "weight": u["scale"]} for u in v
    ]}}},
}


def a1111(item: Spec, value: Any) -> GenerationRequest:
    from webapi import a1111_request as parse

    task = task_of(item)
    body = {parse.NAMES[k]: v for k, v in base_for(item).items() if k not in ("init_images", "mask")}
    body.update(A1111_ENCODED["init_images"](base(task)["init_images"]) if task != "txt2img" else {})
    body.update(A1111_ENCODED["mask"](base(task)["mask"]) if task == "inpaint" else {})
    encode = A1111_ENCODED.get(item.name, lambda v: {parse.NAMES[item.name]: v})
    body.update(encode(value))
    if task == "txt2img":
        return parse.txt2img(body, LIMITS, 10**7).request
    return parse.img2img(body, LIMITS, 10**7).request


def test_the_a1111_api_takes_every_field():
    from webapi.a1111_request import NOT_TAKEN

    check("A1111 API", TASKS, a1111, NOT_TAKEN)


def openai(item: Spec, value: Any) -> GenerationRequest:
    from webapi import openai_params as parse

    task = task_of(item)
    flat = {**base_for(item), item.name: value}
    raw = {parse.NAMES[k]: v for k, v in flat.items() if k not in ("width", "height", "init_images", "mask")}
    if item.name in ("width", "height"):
        raw["size"] = f"{flat.get('width', MODEL.default_width)}x{flat.get('height', MODEL.default_height)}"
    if task == "txt2img":
        return parse.generation(raw, LIMITS).request
    return parse.edit(raw, LIMITS, flat["init_images"], flat.get("mask")).request


def test_the_openai_api_takes_every_field():
    from webapi.openai_params import NOT_TAKEN

    # OpenAI's size is "WxH" for text-to-image; an edit keeps its input's aspect ratio (docs/openai-api.md)
    check("OpenAI generations", ("txt2img",), openai, NOT_TAKEN)
    edits = {**NOT_TAKEN, "width": "an edit's size keeps the input's aspect", "height": "likewise"}
    check("OpenAI edits", ("img2img", "inpaint"), openai, edits)


# ---------------------------------------------------------------- the command lines
def command_line(parser_and_fields, tmp_path, finish=nest, first: tuple[str, ...] = ()):
    """`make` for a CLI: the field's flag and its value as text (images as files); `first`: the
    CLI's own required arguments."""
    from pipelines.schema.cli import FLAGS, request_values

    parser, added = parser_and_fields

    def make(item: Spec, value: Any) -> GenerationRequest:
        flat = {**base_for(item), item.name: value}
        argv = [*first, *([flat["prompt"]] if any(a.name == "prompt" for a in added) else [])]
        for name, given in flat.items():
            if name == "prompt" or not any(a.name == name for a in added):
                continue
            argv += arguments(FLAGS[name], spec(name), given, tmp_path)
        return GenerationRequest.parse(finish(request_values(parser.parse_args(argv), added)))

    return make


def arguments(flag: str, item: Spec, value: Any, tmp_path) -> list[str]:
    if item.kind == "flag":  # on by default: --no-NAME turns it off
        return [flag] if value else ([f"--no-{flag[2:]}"] if item.default is True else [])
    if item.kind in ("image", "images"):
        paths = []
        for i, image in enumerate(value if item.kind == "images" else [value]):
            path = tmp_path / f"{item.name}-{i}.png"
            image.save(path)
            paths += [flag, str(path)]
        return paths
    if item.kind == "scales":
        return [arg for name, scale in value.items() for arg in (flag, f"{name}:{scale}")]
    if item.kind == "names":  # the flag once per name
        return [arg for name in value for arg in (flag, name)]
    if item.kind == "units":  # --controlnet image=FILE,key=value,... once per unit
        out = []
        for i, unit in enumerate(value):
            path = tmp_path / f"{item.name}-{i}.png"
            unit["image"].save(path)
            out += [flag, ",".join([f"image={path}", *(f"{k}={v}" for k, v in unit.items() if k != "image")])]
        return out
    return [flag, str(value)]


def test_every_command_line_takes_every_field(tmp_path):
    import engine.__main__ as engine_cli
    import pipelines.__main__ as pipelines_cli
    import pipelines.batch as batch

    check("python -m engine", TASKS, command_line(engine_cli.build_parser(), tmp_path), {})
    check("python -m pipelines", TASKS, command_line(pipelines_cli.build_parser(), tmp_path), {})

    def job(flat: dict[str, Any]) -> dict[str, Any]:  # the prompts come from the --prompts file
        return nest({"prompt": ["a cat"], **flat})

    make = command_line(batch.build_parser(), tmp_path, job, ("--prompts", "p.txt", "--out", "o"))
    check("python -m pipelines.batch", batch.TASKS, make, batch.NOT_TAKEN)  # text-to-image and video jobs


# ---------------------------------------------------------------- the Ray wire and ZeroGPU
def every_field(task: str) -> GenerationRequest:
    flat = base(task)
    flat.update({item.name: sample(item) for item in fields(task) if item.name not in ("init_images", "mask")})
    return read(flat, LIMITS)


@pytest.mark.parametrize("task", TASKS)
def test_the_ray_wire_and_the_zerogpu_call_carry_every_field(task):
    from serving.wire import request_from_wire, request_to_wire

    sent = every_field(task)
    for name, back in (("Ray wire", request_from_wire(request_to_wire(sent))), ("ZeroGPU", pickle.loads(pickle.dumps(sent)))):
        lost = [item.name for item in fields(task) if not same(item, got(back, item), got(sent, item))]
        assert not lost, f"the {name} loses {lost}"


# ---------------------------------------------------------------- the Gradio tabs and endpoints
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from engine import AppSettings, Engine
    from tests.test_engine import _Gate
    from ui.demo import create_demo

    class Model(_Gate):
        def model_info(self):
            return MODEL

    return create_demo(Engine(Model()), AppSettings(output_dir=tmp_path_factory.mktemp("out")))


@pytest.mark.parametrize("tab", ["generate", "edit", "inpaint", "video"])
def test_every_tab_and_its_endpoint_take_every_field_of_their_task(demo, tab):
    """The tab's form has a control for each field of its task (or the tab declares why not), and its
    endpoints take each as a parameter, by the published name, after their files."""
    from ui.fields import OUTPAINT_SIDES, api_name, parameters
    from ui.form import FROM_WIDGETS, NOT_TAKEN, TASK

    api = demo.get_api_info()["named_endpoints"]
    taken = [api_name(tab, field) for field in parameters(tab)]
    expected = {
        "generate": {"/generate": taken},
        "edit": {"/edit": ["files", *taken]},
        "inpaint": {"/inpaint": ["image", "mask", *taken], "/outpaint": ["image", *OUTPAINT_SIDES, *taken]},
        "video": {"/video": ["image", "format", *taken]},
    }[tab]
    for endpoint, names in expected.items():
        assert [p["parameter_name"] for p in api[endpoint]["parameters"]] == names, endpoint
    form = demo.tabs[tab]["form"]
    for item in fields(TASK[tab]):
        declared = item.name in NOT_TAKEN[tab]
        taken_here = item.name in FROM_WIDGETS or (item.name in form.built and item.name in parameters(tab))
        assert taken_here != declared, f"{tab}: {item.name} is {'both taken and' if declared else 'neither taken nor'} declared"
        assert not declared or NOT_TAKEN[tab][item.name].strip()


# ---------------------------------------------------------------- the declarations themselves
def test_the_schemas_a1111_names_are_a1111s_and_the_fields_page_is_current():
    """An A1111 name the schema gives a field is a key of A1111's own request; docs/request-fields.md is
    what `python -m pipelines.schema.docs` writes (run it after changing the schema)."""
    from pipelines.schema import docs as schema_docs
    from webapi.a1111_request import A1111_FIELDS

    a1111 = A1111_FIELDS["txt2img"] | A1111_FIELDS["img2img"]
    assert [item.name for item in fields() if item.about.a1111 and item.about.a1111 not in a1111] == []
    page = schema_docs.PAGE.read_text(encoding="utf-8")
    assert page == schema_docs.page(page), "docs/request-fields.md is stale: run python -m pipelines.schema.docs"
