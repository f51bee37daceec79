"""A1111's prompt language (pipelines.prompts.syntax) and its weighted, chunked encoding for CLIP
pipelines (pipelines.prompts.weights). Expected values are written out by hand from A1111's wiki
("Features": attention/emphasis, BREAK, infinite prompt length)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.prompts.plan import PromptPlan
from pipelines.prompts.syntax import parse
from pipelines.prompts.weights import Encoder, call_embeds, chunks, emphasized, kind_of

EMBEDDED = Path(__file__).resolve().parent.parent / "models" / "tiny-shapes"


def pieces(prompt: str) -> list[tuple[str | None, float]]:
    return [(p.text, round(p.weight, 6)) for p in parse(prompt).pieces]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a red circle", [("a red circle", 1.0)]),
        ("a (red) circle", [("a ", 1.0), ("red", 1.1), (" circle", 1.0)]),
        ("((red))", [("red", 1.21)]),
        ("[red]", [("red", round(1 / 1.1, 6))]),
        ("[[red]]", [("red", round(1 / 1.21, 6))]),
        ("(red:1.5)", [("red", 1.5)]),
        ("(red: 0.5 )", [("red", 0.5)]),
        ("(red:0)", [("red", 0.0)]),
        ("(a (b:2) c)", [("a ", 1.1), ("b", 2.2), (" c", 1.1)]),
        ("(a [b] c)", [("a ", 1.1), ("b", 1.0), (" c", 1.1)]),
        (r"\(red\) \[x\] a\\b", [("(red) [x] a\\b", 1.0)]),
        ("a BREAK b", [("a", 1.0), (None, -1.0), ("b", 1.0)]),
        ("a BREAKING b", [("a BREAKING b", 1.0)]),  # BREAK is a word, in capitals
        ("(a b", [("a b", 1.1)]),  # unclosed: to the end
        ("a) b] c:1.5)", [("a) b] c:1.5)", 1.0)]),  # nothing open: plain text
        ("a (red:1.0) circle", [("a red circle", 1.0)]),  # merged: same weight
        ("", [("", 1.0)]),
    ],
)
def test_a1111_attention_syntax(prompt, expected):
    assert pieces(prompt) == expected


def test_plain_is_only_a_prompt_without_syntax():
    assert parse("a red circle, on blue").plain
    assert not parse("a (red:1.0) circle").plain  # same words, but written with syntax
    assert parse("a (red:1.0) circle").text == "a red circle"
    assert not parse("a BREAK b").plain and parse("a BREAK b").text == "a b"


@pytest.fixture(scope="module")
def sd():
    """The embedded model's diffusers pipeline: one CLIP of a 16-token window (14 between BOS and EOS)."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(EMBEDDED)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def test_chunks_fill_the_window_pad_after_break_and_move_a_phrase_after_its_comma(sd):
    tok = sd.tokenizer
    bos, eos, pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    assert tok.model_max_length == 16 and len(ids(tok, "red circle blue")) == 3  # one token a word here
    words = ["red", "blue", "yellow", "circle", "square", "on", "a"] * 3  # 21 tokens: 14 + 7
    got = chunks(parse(" ".join(words)), tok)
    w = [ids(tok, word)[0] for word in words]
    assert [c.ids for c in got] == [(bos, *w[:14], eos), (bos, *w[14:], eos, *[pad] * 7)]
    assert [c.used for c in got] == [16, 9]
    # BREAK: the chunk ends where it is written and is padded to the window
    got = chunks(parse("red BREAK blue"), tok)
    assert [c.ids for c in got] == [(bos, w[0], eos, *[pad] * 13), (bos, w[1], eos, *[pad] * 13)]
    # a full chunk whose last comma is near its end moves the words after the comma on
    comma = ids(tok, ",")[0]
    text = "red blue yellow circle square on a red blue yellow, circle square on a red"  # comma: the 11th token
    got = chunks(parse(text), tok)
    first = ids(tok, "red blue yellow circle square on a red blue yellow ,")
    assert got[0].ids == (bos, *first, eos, *[pad] * 3) and first[-1] == comma
    assert got[1].ids[1:6] == tuple(ids(tok, "circle square on a red"))
    # ... but a comma that is itself the token past a full window just starts the next one
    text = "red blue, yellow circle square on a red blue yellow circle square on, red"  # 15th token: ","
    got = chunks(parse(text), tok)
    assert got[0].ids == (
        bos,
        *ids(tok, "red blue , yellow circle square on a red blue yellow circle square on"),
        eos,
    )
    assert got[1].ids[1:3] == (comma, w[0])
    # weights follow their tokens; BOS, EOS and padding keep 1
    got = chunks(parse("a (red:1.5) circle"), tok)
    assert got[0].weights[:5] == (1.0, 1.0, 1.5, 1.0, 1.0) and set(got[0].weights[5:]) == {1.0}
    assert chunks(parse(""), tok)[0].ids == (bos, eos, *[pad] * 14)


def test_emphasis_multiplies_each_token_then_restores_the_mean():
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = emphasized(z, torch.tensor([1.0, 2.0]))
    # weighted [[1, 2], [6, 8]] has mean 4.25; the original mean is 2.5: all times 2.5 / 4.25
    expected = torch.tensor([[1.0, 2.0], [6.0, 8.0]]) * (2.5 / 4.25)
    assert torch.allclose(out, expected) and torch.isclose(out.mean(), z.mean())
    assert emphasized(z, torch.ones(2)) is z  # unweighted: untouched


def test_weights_of_one_give_the_pipelines_own_embeddings_bit_for_bit(sd):
    assert kind_of(sd, frozenset(inspect.signature(sd.__call__).parameters)) == "clip"
    encoder = Encoder(sd, "clip")
    plain, empty = sd.encode_prompt("a red circle", "cpu", 1, True, "")
    assert torch.equal(encoder.encode("a (red:1.0) circle").embeds, plain)
    assert torch.equal(encoder.encode("").embeds, empty)
    weighted = encoder.encode("a (red:1.5) circle").embeds
    assert not torch.equal(weighted, plain) and weighted.shape == plain.shape


def test_long_prompts_are_encoded_whole_and_the_negative_padded_to_match(sd):
    encoder = Encoder(sd, "clip")
    long = "a red circle on a blue background " * 3  # 21 tokens: two windows
    assert encoder.encode(long).embeds.shape == (1, 32, 64)
    out = call_embeds(encoder, [long, "a green square"], "blue", zero_negative=False)
    assert out["prompt_embeds"].shape == out["negative_prompt_embeds"].shape == (2, 32, 64)
    empty_chunk = encoder.encode("").embeds[0]
    assert torch.equal(out["prompt_embeds"][1, 16:], empty_chunk)  # the short prompt's padding: an empty chunk
    assert torch.equal(out["negative_prompt_embeds"][0, :16], encoder.encode("blue").embeds[0])


def test_a_plain_prompt_that_fits_goes_to_the_pipeline_untouched(sd):
    plan = PromptPlan(sd, frozenset(inspect.signature(sd.__call__).parameters), steps=20)
    plain = {"prompt": ["a red circle"], "negative_prompt": ["blue"]}
    assert plan.apply(dict(plain)) == (plain, None)
    weighted, switch = plan.apply({"prompt": ["a (red:1.2) circle"], "negative_prompt": ["blue"]})
    assert set(weighted) == {"prompt_embeds", "negative_prompt_embeds"} and switch is None
    long, _ = plan.apply({"prompt": ["a red circle on a blue background " * 3]})
    assert long["prompt_embeds"].shape[1] == 32
    assert plan.warnings(["a (red:1.2) circle " * 5], "") == []  # nothing is cut, nothing ignored


def test_clip_skip_takes_an_earlier_layer_normalised_as_a1111_does(sd):
    """A1111's Clip skip N (CLIP_stop_at_last_layers): hidden state -N through the final layer norm, for the
    prompt and the negative; 1 is the pipeline's own encoding, untouched."""
    params = frozenset(inspect.signature(sd.__call__).parameters)
    tok = sd.tokenizer
    with torch.no_grad():
        states = sd.text_encoder(tok(["a red circle", "blue"], padding="max_length", return_tensors="pt").input_ids,
                                 output_hidden_states=True).hidden_states  # fmt: skip
        expected = sd.text_encoder.final_layer_norm(states[-2])
    plain = {"prompt": ["a red circle"], "negative_prompt": ["blue"]}
    assert PromptPlan(sd, params, 20, clip_skip=1).apply(dict(plain)) == (plain, None)
    skipped, _ = PromptPlan(sd, params, 20, clip_skip=2).apply(dict(plain))
    assert torch.allclose(skipped["prompt_embeds"][0], expected[0], atol=1e-6)
    assert torch.allclose(skipped["negative_prompt_embeds"][0], expected[1], atol=1e-6)


def test_clip_skip_reaches_the_image_and_its_infotext(embedded):
    from pipelines.pnginfo.read import parse_a1111
    from pipelines.pnginfo.write import a1111_parameters
    from pipelines.schema.request import GenerationRequest

    def run(clip_skip):
        return embedded.generate(GenerationRequest(prompt="a red circle on a blue background", steps=4, seed=2,
                                                   clip_skip=clip_skip))  # fmt: skip

    plain, one, two = run(None), run(1), run(2)
    assert np.array_equal(np.asarray(plain.images[0]), np.asarray(one.images[0]))
    assert not np.array_equal(np.asarray(plain.images[0]), np.asarray(two.images[0]))
    assert "Clip skip" not in a1111_parameters(one.metadata[0])  # A1111 writes it only above 1
    text = a1111_parameters(two.metadata[0])
    assert "Clip skip: 2" in text and parse_a1111(text)["clip_skip"] == 2
    deep = run(12)  # the embedded CLIP has 2 layers: its embeddings are the furthest (Clip skip 3), said
    assert np.array_equal(np.asarray(deep.images[0]), np.asarray(run(3).images[0]))
    assert any("text encoder has 2 layers; Clip skip 3" in w for w in deep.warnings), deep.warnings


@pytest.fixture(scope="module")
def embedded():
    from devices import DeviceManager
    from pipelines.run.image_pipeline import ImagePipeline

    return ImagePipeline.from_pretrained(EMBEDDED, device_manager=DeviceManager("cpu"), memory_mode="off")


def test_weights_and_long_prompts_reach_the_image(embedded):
    """Through ImagePipeline, as every front end calls it: a weight of 1 is the plain image bit for bit,
    another weight changes it, and the words past the window are not dropped."""
    from pipelines.schema.request import GenerationRequest

    pipe = embedded
    assert pipe.prompt_weighting == "clip"

    def image(prompt: str):
        result = pipe.generate(GenerationRequest(prompt=prompt, steps=3, seed=11, width=64, height=64))
        return np.asarray(result.images[0]), result

    plain, _ = image("a red circle on a blue background")
    same, result = image("a (red:1.0) circle on a blue background")
    assert np.array_equal(plain, same)
    assert result.metadata[0]["prompt"] == "a (red:1.0) circle on a blue background"  # as written
    heavier, _ = image("a (red:1.6) circle on a blue background")
    assert not np.array_equal(plain, heavier)
    filler = "a circle on a blue background, " * 2  # 14 tokens: the whole window
    long_red, result = image(filler + "red")
    long_yellow, _ = image(filler + "yellow")
    assert not any("cut" in w for w in result.warnings), result.warnings
    assert not np.array_equal(long_red, long_yellow)  # the word past the window was encoded
    counts = pipe.count_tokens(filler + "(red:1.3)")
    assert counts[0].count == 15 and counts[0].limit == 28 and not counts[0].cut


# --------------------------------------------------------------------------- editing and alternation
@pytest.mark.parametrize(
    ("prompt", "steps", "expected"),
    [
        ("a [red:blue:0.5] circle", 10, [(5, "a red circle"), (10, "a blue circle")]),
        ("a [red:blue:3] circle", 10, [(3, "a red circle"), (10, "a blue circle")]),
        ("a [blue:0.2] x", 10, [(2, "a  x"), (10, "a blue x")]),  # [to:when]: added after
        ("a [red::4] x", 10, [(4, "a red x"), (10, "a  x")]),  # [from::when]: removed after
        ("[red|blue] x", 4, [(1, "red x"), (2, "blue x"), (3, "red x"), (4, "blue x")]),
        ("[a:b:40]", 10, [(10, "a")]),  # capped at the steps
        ("[(red:1.5):blue:2]", 4, [(2, "(red:1.5)"), (4, "blue")]),  # weights inside, read afterwards
        ("[[a:b:0.5]]", 4, [(2, "[a]"), (4, "[b]")]),  # de-emphasis around an edit
        ("a [red:[blue|yellow]:0.5]", 4, [(2, "a red"), (3, "a blue"), (4, "a yellow")]),  # step 3: the first option
        ("[blurry] [a:b] [a:b:c:2] \\[a:b:2\\] [a|b", 10, [(10, "[blurry] [a:b] [a:b:c:2] \\[a:b:2\\] [a|b")]),
        ("a [cat [fluffy]:dog:0.5]", 4, [(2, "a cat [fluffy]"), (4, "a dog")]),  # de-emphasis inside an edit
        ("[[cat]|dog]", 2, [(1, "[cat]"), (2, "dog")]),
        ("[a:b:-1] [c:d:inf] [e:f:1e400]", 2, [(2, "b [c:d:inf] [e:f:1e400]")]),  # A1111's numbers only
    ],
)
def test_prompt_editing_and_alternation_schedules(prompt, steps, expected):
    from pipelines.prompts.schedule import schedule

    assert schedule(prompt, steps) == expected


@pytest.mark.parametrize("prompt", ["x [ " * 2000, "[" * 4000, "[[" * 1000 + "a" + "]]" * 1000, "[a|" * 1000])
def test_a_prompt_of_brackets_is_read_at_once(prompt):
    """Unclosed or deeply nested brackets are text: no exponential scan, no recursion error. Counted in
    operations, not seconds: the brackets a parse looks inside stay linear in the prompt's length."""
    from pipelines.prompts import schedule as prompt_schedule

    calls = []
    original = prompt_schedule._Parser._bracket
    prompt_schedule._Parser._bracket = lambda self, *a: calls.append(1) or original(self, *a)
    try:
        prompt_schedule.parse.__wrapped__(prompt)
    finally:
        prompt_schedule._Parser._bracket = original
    assert len(calls) <= len(prompt)


def _denoiser_inputs(pipe):
    """The text embeddings the UNet gets at each call (one per step): a forward pre-hook."""
    seen = []
    hook = pipe.diffusers_pipeline.unet.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(kwargs.get("encoder_hidden_states", args[2] if len(args) > 2 else None)),
        with_kwargs=True,
    )
    return seen, hook


@pytest.mark.parametrize("guidance_end", [1.0, 0.5])
def test_edited_and_alternating_prompts_change_the_embeddings_at_their_steps(embedded, sd, guidance_end):
    from pipelines.schema.request import GenerationRequest

    encoder = Encoder(sd, "clip")
    red, blue = encoder.encode("a red circle").embeds, encoder.encode("a blue circle").embeds
    for prompt, expected in (
        ("a [red:blue:0.5] circle", [red, red, blue, blue]),
        ("a [red|blue] circle", [red, blue, red, blue]),
    ):
        seen, hook = _denoiser_inputs(embedded)
        try:
            request = GenerationRequest(
                prompt=prompt, steps=4, seed=3, width=64, height=64, guidance_scale=5.0, guidance_end=guidance_end
            )
            result = embedded.generate(request)
        finally:
            hook.remove()
        assert len(seen) == 4 and not result.warnings, result.warnings
        conditional = [states[-1:] for states in seen]  # [negative, prompt] while guided; the prompt after
        assert all(torch.equal(got, want) for got, want in zip(conditional, expected, strict=True)), prompt
        assert [len(states) for states in seen] == ([2, 2, 2, 2] if guidance_end == 1.0 else [2, 2, 1, 1])


def test_an_edited_prompt_draws_neither_plain_prompt(embedded):
    from pipelines.schema.request import GenerationRequest

    def image(prompt: str) -> np.ndarray:
        request = GenerationRequest(prompt=prompt, steps=6, seed=5, width=64, height=64)
        return np.asarray(embedded.generate(request).images[0])

    edited = image("a [red:blue:0.5] circle on a yellow background")
    assert not np.array_equal(edited, image("a red circle on a yellow background"))
    assert not np.array_equal(edited, image("a blue circle on a yellow background"))


# --------------------------------------------------------------------------- textual-inversion embeddings
class _Code:
    """Something a weights-only unpickler must refuse: a pickle that names a class."""


@pytest.fixture(scope="module")
def embeddings_dir(tmp_path_factory):
    """Embeddings in the shapes A1111 and its trainers write, for the embedded model's 64-wide CLIP."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("embeddings")
    generator = torch.Generator().manual_seed(0)
    save_file({"emb_params": torch.randn(2, 64, generator=generator) * 2}, folder / "shiny.safetensors")
    torch.save(
        {"string_to_param": {"*": torch.randn(1, 64, generator=generator)}, "name": "old", "step": 9}, folder / "old.pt"
    )
    save_file({"emb_params": torch.randn(1, 32, generator=generator)}, folder / "narrow.safetensors")
    save_file({"clip_l": torch.randn(1, 64), "clip_g": torch.randn(1, 80)}, folder / "xl.safetensors")
    torch.save({"string_to_param": {"*": _Code()}}, folder / "code.pt")
    return folder


@pytest.fixture(scope="module")
def with_embeddings(embeddings_dir):
    from devices import DeviceManager
    from pipelines.run.image_pipeline import ImagePipeline

    return ImagePipeline.from_pretrained(
        EMBEDDED, device_manager=DeviceManager("cpu"), memory_mode="off", embeddings_dir=embeddings_dir
    )


def test_embeddings_load_by_file_name_and_the_rest_are_skipped_with_the_reason(with_embeddings):
    info = with_embeddings.model_info()
    assert info.embeddings == {"old": {"vectors": 1, "shape": 64}, "shiny": {"vectors": 2, "shape": 64}}
    skipped = info.embeddings_skipped
    assert set(skipped) == {"narrow", "xl", "code"}
    assert "32 wide; this text encoder takes 64" in skipped["narrow"] and "SDXL embedding" in skipped["xl"]
    assert "code.pt" in skipped["code"]  # refused by the weights-only loader, not run
    from ui.text import embeddings_markdown

    listed = embeddings_markdown(info)  # under the Generate tab's prompt
    assert "`old` (1 vector), `shiny` (2 vectors)" in listed and "not for this model: `code`, `narrow`, `xl`" in listed


def test_an_embedding_word_changes_the_image_on_every_path_and_its_hash_is_recorded(with_embeddings, embeddings_dir):
    import hashlib

    from pipelines.pnginfo.write import a1111_parameters
    from pipelines.schema.request import GenerationRequest

    def run(prompt: str):
        result = with_embeddings.generate(GenerationRequest(prompt=prompt, steps=3, seed=2, width=64, height=64))
        return np.asarray(result.images[0]), result.metadata[0]

    plain, meta = run("a shiny circle on a blue background")
    without, _ = run("a circle on a blue background")
    assert not np.array_equal(plain, without)
    comfy, _ = run("a embedding:shiny circle on a blue background")  # ComfyUI's way of naming it
    weighted_one, _ = run("a (shiny:1.0) circle on a blue background")  # our encoder: both vectors, as diffusers
    assert np.array_equal(plain, comfy) and np.array_equal(plain, weighted_one)
    sha = hashlib.sha256((embeddings_dir / "shiny.safetensors").read_bytes()).hexdigest()[:12]
    assert meta["ti_hashes"] == {"shiny": sha}
    assert f'TI hashes: "shiny: {sha}"' in a1111_parameters(meta)
    _, meta = run("a red circle on a blue background")
    assert "ti_hashes" not in meta


# --------------------------------------------------------------------------- other tools' PNGs, through the app
WEIGHTED = "a (red:1.6) circle on a [blue] background"


def _weighted_copies(folder: Path) -> dict[str, Path]:
    """The A1111, Forge and ComfyUI fixtures (tests/fixtures/pnginfo) in their own containers, their
    prompt replaced by a weighted one in the embedded model's words."""
    import json

    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    fixtures = Path(__file__).resolve().parent / "fixtures" / "pnginfo"
    out = {}
    for name in ("a1111.png", "forge_exponential.png"):
        text = Image.open(fixtures / name).text["parameters"]
        chunk = PngInfo()
        chunk.add_text("parameters", WEIGHTED + "\n" + text.split("\n", 1)[1])
        Image.new("RGB", (8, 8)).save(folder / name, pnginfo=chunk)
        out[name] = folder / name
    graph = json.loads(Image.open(fixtures / "comfyui_links.png").text["prompt"])
    graph["31"]["inputs"]["value"], graph["32"]["inputs"]["value"] = "a (red:1.6) circle", "on a [blue] background"
    chunk = PngInfo()
    chunk.add_text("prompt", json.dumps(graph))
    Image.new("RGB", (8, 8)).save(folder / "comfyui_links.png", pnginfo=chunk)
    out["comfyui_links.png"] = folder / "comfyui_links.png"
    return out


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from pipelines.run.options import DEFAULT_MODEL
    from tests.app_server import running_app

    with running_app(DEFAULT_MODEL, tmp_path_factory.mktemp("outputs")) as (demo, _):
        yield demo


@pytest.mark.parametrize("name", ["a1111.png", "forge_exponential.png", "comfyui_links.png"])
def test_another_tools_png_sent_to_generate_runs_with_its_weights(app, tmp_path, name):
    """PNG info -> Send to Generate (the button's own function) -> /generate: the form keeps the prompt
    as written, the weights reach the image (not the brackets as words), and the image records it."""
    from gradio_client import Client

    from pipelines import read_metadata
    from pipelines.pnginfo.read import read_png_info
    from ui.send import generate_updates

    form = app.tabs["generate"]["form"]
    params = read_png_info(_weighted_copies(tmp_path)[name])["parameters"]
    values = form.values_of(generate_updates(params, app.studio.info, form))
    assert "(red:1.6)" in values["prompt"] and "[blue]" in values["prompt"], values["prompt"]
    values.update(steps=6, width=64, height=64, num_images=1, seed="8", random_seed=False)
    client = Client(app.local_url, verbose=False)

    def run(prompt: str):
        call = {k: v for k, v in values.items() if k not in ("random_seed", "loras")}  # form-only shapes
        images, info = client.predict(**{**call, "prompt": prompt}, api_name="/generate")
        return np.asarray(Image.open(images[0]["image"])), info, images[0]["image"]

    weighted, info, path = run(values["prompt"])
    assert not any("plain text" in w for w in info["warnings"]), info["warnings"]
    assert read_metadata(path)["parameters"]["prompt"] == values["prompt"]  # the prompt as written
    literal, _, _ = run(parse(values["prompt"]).text)  # the same words without weights
    assert not np.array_equal(weighted, literal)
