"""Bad values, sent as an attacker or a broken client would, get a 4xx naming the field, from both HTTP APIs.

The battery is derived from the request schema: every field of a text-to-image request gets the
bad values of its kind (digits Python's int() would take but a number is not written with, numbers
too long to convert, NaN, booleans, wrong types, out-of-range values, control characters, lone
surrogates), sent to A1111's txt2img under A1111's name for the field and to OpenAI's generations
under OpenAI's (a hires fix field with hires fix on: off, A1111 reads none of them). Each must be
refused with 422 / 400 naming that field, with no traceback. Bodies
that are not what a route reads (deeply nested JSON, not JSON, not an object, too large) get a
4xx too, and A1111's echo of a request carries only A1111's own fields.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.fields import Choice, Range, Seed, Spec
from pipelines.schema.request import fields, spec
from tests.app_server import embedded_model_available, running_app

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="needs the embedded model")
PROMPT = "a red circle on a blue background"
SMALL = {"steps": 2, "width": 64, "height": 64}


def bad_values(item: Spec) -> list[Any]:
    """What a field of this kind must refuse, as a client could send it."""
    value = item.value
    wrong_type = [{"$gt": 1}, [1, 2]]
    if isinstance(value, Seed):
        return ["²", "١٢", "9" * 5000, 1.5, True, str(2**64), *wrong_type]
    if isinstance(value, Range):
        common = ["²", "١٢", "٣.٥", "9" * 5000, "nan", "Infinity", True, "", *wrong_type]
        out = [value.high + 1, value.low - 1, *common]
        return [*out, 1.5] if value.integer else out
    if isinstance(value, Choice):
        return ["bogus", 5, *wrong_type]
    return {
        "text": [123, ["x"], "a\x00b", "a\ud800b"],
        "prompt": ["", "   ", 123, {"a": 1}, "a\x07b", "a\ud800b"],
        "flag": ["maybe", 7],
        "scales": ["outline", [1], {"outline": "²"}, {"outline": 99}, {"outline": "nan"}],
        # an unknown name: a warning (tests/test_styles.py); one name more than the field takes
        "names": [5, {"a": 1}, [""], ["a\x00b"], [1], ["x"] * (getattr(value, "most", 32) + 1)],
    }.get(item.kind, [])


# Each part a switch turns on: its switch field and the value that turns it on.
SWITCHES = {"hires": ("hires_fix", True), "regions": ("regional_prompts", True), "detailer": ("ad_model", "shapes-segformer"),
            "detailer_2nd": ("ad_model_2nd", "shapes-segformer")}  # fmt: skip


def switched_on(field: str, names: dict[str, str]) -> dict[str, Any]:
    """The switch of the part `field` belongs to, on (hires fix: a hires field is read only with
    `enable_hr`, as A1111 reads it; a detailer pass only with a detector); {} for a field of no such part."""
    part = spec(field).path[0]
    if part not in SWITCHES or SWITCHES[part][0] == field:
        return {}
    switch, on = SWITCHES[part]
    return {names[switch]: on}


def cases(api: str) -> list[tuple[str, Any]]:
    """(field, bad value) for every text-to-image field the API names in a JSON body."""
    skip = {"openai": {"width", "height", "sampler"}, "a1111": {"loras", "sampler"}}[api]
    return [(item.name, bad) for item in fields("txt2img") if item.name not in skip for bad in bad_values(item)]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with (
        running_app(DEFAULT_MODEL, tmp_path_factory.mktemp("out")) as (demo, _),
        httpx.Client(base_url=demo.local_url.rstrip("/"), timeout=120) as client,
    ):
        yield client


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` as JSON, escaping what UTF-8 cannot carry (a lone surrogate) as JSON does."""
    return client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def no_traceback(response: httpx.Response) -> None:
    assert "Traceback" not in response.text and 'File "' not in response.text and "Error:" not in response.text


@pytest.mark.parametrize(("field", "bad"), cases("a1111"), ids=lambda v: repr(v)[:30])
def test_a1111_refuses_each_bad_value_naming_the_field(app, field, bad):
    from webapi.a1111_request import NAMES

    key = NAMES[field]
    response = post(app, "/sdapi/v1/txt2img", {"prompt": PROMPT, **SMALL, **switched_on(field, NAMES), key: bad})
    assert response.status_code == 422, (field, bad, response.text[:300])
    (error,) = response.json()["detail"]
    assert error["loc"][:2] == ["body", key], (field, bad, error)
    no_traceback(response)


@pytest.mark.parametrize(("field", "bad"), cases("openai"), ids=lambda v: repr(v)[:30])
def test_openai_refuses_each_bad_value_naming_the_field(app, field, bad):
    from webapi.openai_params import NAMES

    key = NAMES[field]
    body = {"prompt": PROMPT, "size": "64x64", "steps": 2, **switched_on(field, NAMES), key: bad}
    response = post(app, "/v1/images/generations", body)
    assert response.status_code == 400, (field, bad, response.text[:300])
    assert response.json()["error"]["param"] == key, (field, bad, response.json())
    no_traceback(response)


@pytest.mark.parametrize(
    ("path", "key", "bad"),
    [
        ("/sdapi/v1/txt2img", "sampler_name", 5), ("/sdapi/v1/txt2img", "sampler_name", "Nope"),
        ("/sdapi/v1/txt2img", "scheduler", []), ("/sdapi/v1/txt2img", "n_iter", "²"),
        ("/sdapi/v1/txt2img", "n_iter", 10_000), ("/sdapi/v1/txt2img", "batch_size", 10_000),
        ("/sdapi/v1/txt2img", "override_settings", "x"), ("/sdapi/v1/txt2img", "prompt", PROMPT + " <lora:nope:1>"),
        ("/sdapi/v1/txt2img", "prompt", PROMPT + " <lora:outline:²>"), ("/sdapi/v1/txt2img", "steps", 1),
        ("/v1/images/generations", "size", "²x64"), ("/v1/images/generations", "size", "64"),
        ("/v1/images/generations", "size", "0x0"), ("/v1/images/generations", "size", "65x64"),
        ("/v1/images/generations", "size", "64x99999999"), ("/v1/images/generations", "sampler", "Nope"),
        ("/v1/images/generations", "response_format", 1), ("/v1/images/generations", "output_compression", "²"),
        ("/v1/images/generations", "stream", True), ("/v1/images/generations", "prompt", ["a", "b"]),
    ],
)  # fmt: skip
def test_the_apis_own_fields_are_refused_by_name(app, path, key, bad):
    """Fields each API has of its own (A1111's n_iter, OpenAI's size) and the model's own checks."""
    body = {"prompt": PROMPT, **SMALL} if path.startswith("/sdapi") else {"prompt": PROMPT, "steps": 2}
    if key == "steps":
        body["sampler_name"] = "PLMS"  # PLMS runs its 4-step warm-up on this model: 1 step is too few
    response = post(app, path, {**body, key: bad})
    if path.startswith("/sdapi"):
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][1] == key, response.text[:300]
    else:
        assert response.status_code == 400 and response.json()["error"]["param"] == key, response.text[:300]
    no_traceback(response)


@pytest.mark.parametrize("route", ["/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/sdapi/v1/options", "/v1/images/generations"])
@pytest.mark.parametrize(
    "body",
    [b"[" * 50_000 + b"]" * 50_000, b"{not json", b"\xff\xfe\x00bad", b"[1, 2]", b'"a string"', b"1e999999"],
    ids=["nested", "not-json", "not-utf8", "a-list", "a-string", "a-number"],
)
def test_a_body_that_is_not_a_request_is_a_4xx(app, route, body):
    response = app.post(route, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, (route, response.status_code, response.text[:300])
    no_traceback(response)


def test_a_large_body_is_refused_and_the_echo_holds_only_a1111s_fields(app):
    big = app.post("/sdapi/v1/txt2img", json={"prompt": PROMPT, **SMALL, "junk": "x" * 10_000_000})
    assert big.status_code == 422 and "larger than" in big.json()["detail"][0]["msg"]
    assert app.post("/v1/images/generations", json={"prompt": PROMPT, "junk": "x" * 10_000_000}).status_code == 413
    answer = app.post("/sdapi/v1/txt2img", json={"prompt": PROMPT, **SMALL, "seed": 3, "auth": "alice:secret",
                                                 "url": "http://10.0.0.1:7860", "junk": "x" * 50_000})  # fmt: skip
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["parameters"] == {"prompt": PROMPT, **SMALL, "seed": 3}  # SillyTavern's auth is not sent back
