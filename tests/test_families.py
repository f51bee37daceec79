"""Every model family users run, through the public API only (ImagePipeline, GenerationRequest,
DeviceManager), on tiny offline copies built once per session (tests/families.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.schema.errors import UnsupportedTaskError
from tests import families

NAMES = families.params(families.FAMILIES)
EDIT = families.params(n for n, f in families.FAMILIES.items() if f.edit)
TEXT = [n for n, f in families.FAMILIES.items() if f.text_to_image]
# The size step a user must respect: VAE factor 8 x 2 for packed (Flux, Qwen) or patch-2 (SD3,
# PixArt, HiDream) latents; Sana's DC-AE is 32; UNet families 8.
SIZE_STEP = {
    "sd15": 8,
    "sdxl": 8,
    "instruct-pix2pix": 8,
    "sd3": 16,
    "flux": 16,
    "flux-kontext": 16,
    "pixart-sigma": 16,
    "sana": 32,
    "hidream-i1": 16,
    "qwen-image": 16,
    "qwen-image-edit": 16,
}
GUIDANCE = {"flux": "distilled", "flux-kontext": "distilled", "qwen-image": "true_cfg", "qwen-image-edit": "true_cfg"}
FUSED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn")


_LOADED: dict[tuple, ImagePipeline] = {}


def load(root, name: str, attention: str = "sdpa", **options) -> ImagePipeline:
    """One loaded pipeline per (family, attention, options) for the session: loading is the slow part."""
    key = (name, attention, tuple(sorted(options.items())))
    if key not in _LOADED:
        path = families.build(name, root / name)
        options.setdefault("memory_mode", "off")
        dm = DeviceManager("cpu", attention=attention)
        _LOADED[key] = ImagePipeline.from_pretrained(path, device_manager=dm, **options)
    return _LOADED[key]


def size_of(name: str) -> tuple[int, int]:
    """A non-square size on the family's step: catches width/height swaps and packing errors."""
    step = SIZE_STEP[name]
    return math.ceil(80 / step) * step, math.ceil(48 / step) * step


def request(name: str, **kw) -> GenerationRequest:
    width, height = size_of(name)
    kw.setdefault("prompt", "a red circle on a blue background")
    if families.FAMILIES[name].edit and "init_images" not in kw:
        kw["init_images"] = [Image.new("RGB", (40, 56), "green")]
    for key, value in dict(steps=2, seed=7, width=width, height=height, guidance_scale=3.0).items():
        kw.setdefault(key, value)
    return GenerationRequest(**kw)


class Ops(TorchDispatchMode):
    """Every aten op that runs: the truth about which attention kernel was used."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))

    @property
    def fused(self) -> set[str]:
        return {op for op in self.ops if any(f in op for f in FUSED)}


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float32)


# --------------------------------------------------------------------------- attention
@pytest.mark.parametrize("name", NAMES)
def test_vanilla_runs_no_fused_kernel_and_matches_sdpa(family_root, name):
    results = {}
    for attention in ("sdpa", "vanilla"):
        pipe = load(family_root, name, attention)
        with Ops() as ops:
            results[attention] = pipe.generate(request(name))
        if attention == "vanilla":
            assert not ops.fused, f"fused SDPA ran under vanilla: {ops.fused}"
        else:
            assert ops.fused, "sdpa should run the fused kernel somewhere"
        assert results[attention].attention == attention
        assert results[attention].metadata[0]["attention"] == attention
    a, b = (pixels(results[k].images[0]) for k in ("sdpa", "vanilla"))
    assert np.abs(a - b).max() <= 3, "vanilla and sdpa should give the same image"


@pytest.mark.parametrize("name", NAMES)
def test_attention_report_names_every_component(family_root, name):
    pipe = load(family_root, name, "vanilla")
    applied = pipe.attention_applied
    denoiser = "unet" if "unet" in pipe.diffusers_pipeline.components else "transformer"
    assert denoiser in applied and "vae" in applied
    assert "text_encoder" in applied
    for component, what in applied.items():
        assert "2_0" not in what or "math kernel" in what, f"{component}: {what}"
    assert pipe.model_info().attention == applied


@pytest.mark.parametrize("name", ["sd15", "sdxl", "pixart-sigma", "sd3"])
@pytest.mark.parametrize("attention", ["vanilla", "sdpa"])
@pytest.mark.parametrize("level", ["off", "balanced", "max"])
def test_memory_modes_keep_the_chosen_attention(family_root, name, attention, level):
    pipe = load(family_root, name, attention, memory_mode=level)
    kinds = {
        type(p).__name__
        for c in pipe.diffusers_pipeline.components.values()
        for p in (getattr(c, "attn_processors", None) or {}).values()
    }
    classic = kinds & {"AttnProcessor", "AttnProcessor2_0", "SlicedAttnProcessor"}
    if attention == "sdpa":
        assert classic <= {"AttnProcessor2_0"}, kinds
    else:
        assert classic <= {"AttnProcessor", "SlicedAttnProcessor"}, kinds
    assert ("SlicedAttnProcessor" in kinds) == ("attention_slicing" in pipe.memory_savers)
    reported = " ".join(pipe.attention_applied.values())
    for kind in classic:
        assert kind in reported


# --------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("name", NAMES)
def test_size_step_and_output_size(family_root, name):
    pipe = load(family_root, name)
    assert pipe.model_info().size_multiple == SIZE_STEP[name]
    result = pipe.generate(request(name))
    width, height = size_of(name)
    image = result.images[0]
    meta = result.metadata[0]
    assert (meta["width"], meta["height"]) == image.size
    if image.size != (width, height):
        assert any("instead of the requested" in w for w in result.warnings), result.warnings
    else:
        assert not any("instead of the requested" in w for w in result.warnings)
    if name != "hidream-i1":  # HiDream rescales every request to its own area (warned above)
        assert image.size == (width, height)
    with pytest.raises(ValueError, match="size step"):
        pipe.generate(request(name, width=width + SIZE_STEP[name] // 2))


# --------------------------------------------------------------------------- progress and cancel
@pytest.mark.parametrize("name", NAMES)
def test_progress_ends_at_total_and_cancel_stops(family_root, name):
    pipe = load(family_root, name)
    seen: list[tuple[int, int]] = []
    result = pipe.generate(request(name, num_images=2), progress=lambda d, t, i: seen.append((d, t)))
    assert len(result.images) == 2
    assert seen and seen[-1][0] == seen[-1][1], seen
    assert all(d <= t for d, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 1  # after the first step

    stopped = pipe.generate(request(name, num_images=2), should_cancel=cancel)
    assert stopped.cancelled and stopped.images == []


# --------------------------------------------------------------------------- tasks
@pytest.mark.parametrize("name", EDIT)
def test_edit_only_refuses_text_to_image(family_root, name):
    pipe = load(family_root, name)
    info = pipe.model_info()
    assert (info.text_to_image, info.edit) == (False, True)
    with pytest.raises(UnsupportedTaskError, match="needs an input image"):
        pipe.generate(GenerationRequest(prompt="a cat", steps=2, seed=1))


@pytest.mark.parametrize("name", NAMES)
def test_image_inputs_edit_or_image_to_image_or_clear_refusal(family_root, name):
    pipe = load(family_root, name)
    images = [Image.new("RGB", (64, 40), "red"), Image.new("RGB", (40, 64), "blue")]
    info = pipe.model_info()
    req = request(name, init_images=images)
    if not (info.edit or info.image_to_image):
        with pytest.raises(UnsupportedTaskError, match="text-to-image only"):
            pipe.generate(req)
        return
    result = pipe.generate(req)
    assert len(result.images) == 2 and result.inputs == images
    assert result.images[0].size == size_of(name) or name == "hidream-i1"



@pytest.mark.parametrize("name", ["sd15", "sdxl", "flux"])
def test_image_to_image_with_steps_times_strength_below_one_runs_one_step(family_root, name):
    """diffusers' SD/SDXL keep int(steps x strength) of the schedule: 3 steps at 0.2 kept none and crashed
    (SDXL: "zip() argument 2 is shorter"). A1111 runs one step at the strength's noise level."""
    pipe = load(family_root, name)
    start = Image.new("RGB", size_of(name), "red")
    denoiser = getattr(pipe.diffusers_pipeline, "unet", None) or pipe.diffusers_pipeline.transformer
    calls: list[int] = []
    hook = denoiser.register_forward_pre_hook(lambda *_: calls.append(1))
    per_request = []
    try:  # (2, 0.5) keeps one step in diffusers itself: the reference for "one step"
        for steps, strength in ((2, 0.5), (3, 0.2), (1, 0.5)):
            calls.clear()
            result = pipe.generate(request(name, init_images=[start], steps=steps, strength=strength))
            assert result.images[0].size == size_of(name)
            per_request.append(len(calls))
    finally:
        hook.remove()
    assert per_request[0] > 0 and per_request == [per_request[0]] * 3, per_request


# --------------------------------------------------------------------------- guidance
@pytest.mark.parametrize("name", NAMES)
def test_guidance_drives_the_models_real_argument(family_root, name):
    pipe = load(family_root, name)
    info = pipe.model_info()
    kind = GUIDANCE.get(name, "cfg")
    assert pipe.traits.guidance == kind and info.guidance_label.lower().startswith(
        {"cfg": "cfg", "distilled": "distilled", "true_cfg": "true cfg"}[kind]
    )
    low = pipe.generate(request(name, guidance_scale=1.0)).images[0]
    high = pipe.generate(request(name, guidance_scale=6.0)).images[0]
    assert np.abs(pixels(low) - pixels(high)).max() > 0, "the guidance slider changed nothing"


# --------------------------------------------------------------------------- seeds and batches
@pytest.mark.parametrize("name", NAMES)
def test_each_image_has_its_own_seed(family_root, name):
    pipe = load(family_root, name)
    batch = pipe.generate(request(name, num_images=2))
    assert batch.seeds == [7, 8]
    alone = pipe.generate(_seeded(name, 8))
    assert np.abs(pixels(batch.images[1]) - pixels(alone.images[0])).max() <= 3
    assert np.abs(pixels(batch.images[0]) - pixels(batch.images[1])).max() > 3


def _seeded(name: str, seed: int) -> GenerationRequest:
    return request(name).replace(seed=seed)


# --------------------------------------------------------------------------- prompts
# Their CLIPs take a prompt of any length in windows, and A1111's weights (pipelines.prompts.weights).
CHUNKED = {"sd15": "clip", "sdxl": "clip2", "instruct-pix2pix": "clip", "sd3": "sd3"}


@pytest.mark.parametrize("name", NAMES)
def test_a1111_weights_apply_on_clip_families_and_are_removed_with_a_warning_elsewhere(family_root, name):
    """A weight of 1 is the plain prompt's image bit for bit on every family (with a negative prompt: the
    padding and SDXL's zeroed empty negative agree with diffusers'); a real weight changes the CLIP
    families' image, and the others run the words with a warning, never the brackets as text."""
    pipe = load(family_root, name)
    plain = pipe.generate(request(name, negative_prompt="blurry"))
    same = pipe.generate(request(name, prompt="a (red:1.0) circle on a blue background", negative_prompt="(blurry)"))
    weighted = pipe.generate(request(name, prompt="a (red:1.8) circle on a [blue] background"))
    if name in CHUNKED:
        assert not np.array_equal(pixels(plain.images[0]), pixels(weighted.images[0]))
        same_negative = pipe.generate(
            request(name, prompt="a (red:1.0) circle on a blue background", negative_prompt="blurry")
        )
        assert np.array_equal(pixels(plain.images[0]), pixels(same_negative.images[0]))
        assert not any("plain text" in w for w in weighted.warnings)
        no_negative = pipe.generate(request(name, prompt="a (red:1.0) circle on a blue background"))
        assert np.array_equal(pixels(pipe.generate(request(name)).images[0]), pixels(no_negative.images[0]))
        return
    assert any("sent as plain text: 'a red circle on a blue background'" in w for w in same.warnings), same.warnings
    plain_words = pipe.generate(request(name, negative_prompt="blurry"))
    assert np.array_equal(pixels(plain_words.images[0]), pixels(same.images[0]))


@pytest.mark.parametrize("name", NAMES)
def test_prompt_editing_switches_on_clip_families_and_runs_the_first_text_elsewhere(family_root, name):
    """`[red:blue:0.5]`: red, then blue (neither plain image) where the step loop takes new embeddings;
    elsewhere the first step's text ("red"), with a warning."""
    pipe = load(family_root, name)
    edited = pipe.generate(request(name, prompt="a [red:blue:0.5] circle on a yellow background", steps=4))
    red = pipe.generate(request(name, prompt="a red circle on a yellow background", steps=4))
    blue = pipe.generate(request(name, prompt="a blue circle on a yellow background", steps=4))
    if name in CHUNKED:
        assert not any("between steps" in w for w in edited.warnings), edited.warnings
        assert not np.array_equal(pixels(edited.images[0]), pixels(red.images[0]))
        assert not np.array_equal(pixels(edited.images[0]), pixels(blue.images[0]))
        return
    assert any("cannot change its prompt between steps" in w for w in edited.warnings), edited.warnings
    assert np.array_equal(pixels(edited.images[0]), pixels(red.images[0]))


@pytest.mark.parametrize("name", NAMES)
def test_long_prompt_is_reported_cut(family_root, name):
    """Every family but the CLIP ones cuts a prompt past its window, and says so; the CLIP ones keep it whole."""
    pipe = load(family_root, name)
    assert pipe.prompt_weighting == CHUNKED.get(name, "")
    words = " ".join(["red circle on blue"] * 300)  # 1,200 words: past every encoder's window
    result = pipe.generate(request(name, prompt=words))
    cuts = [w for w in result.warnings if w.startswith("prompt cut by")]
    if name in CHUNKED:  # SD3's T5 still cuts at its own window, and says so
        assert all("(tokenizer_3)" in w for w in cuts) and result.metadata[0]["prompt"] == words, result.warnings
        assert all(c.limit >= c.count > 1000 for c in pipe.count_tokens(words) if c.label == "CLIP")
        return
    assert cuts and all(" after " in w and " tokens: dropped " in w for w in cuts), result.warnings
    assert result.metadata[0]["prompt"] == words  # the metadata keeps what the user wrote
    counts = pipe.count_tokens(words)
    assert counts and all(c.count > c.limit for c in counts)
    assert len(cuts) == len(counts)  # one warning per encoder that cut it
    short = pipe.generate(request(name))
    assert not any("cut" in w for w in short.warnings)


# --------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("name", NAMES)
def test_lora_on_the_denoiser_or_clear_refusal(family_root, tmp_path_factory, name):
    folder = tmp_path_factory.mktemp(f"lora-{name}")
    pipe = load(family_root, name, lora_dir=str(folder))
    if not families.FAMILIES[name].lora:
        assert not pipe.model_info().lora_supported
        with pytest.raises(UnsupportedTaskError, match="no LoRA loader"):
            pipe.generate(request(name, loras={"style": 1.0}))
        return
    base = pipe.generate(request(name)).images[0]
    families.save_denoiser_lora(pipe.diffusers_pipeline, folder, "style")
    styled = pipe.generate(request(name, loras={"style": 1.0}))
    assert styled.metadata[0]["loras"] == {"style": 1.0}
    assert np.abs(pixels(styled.images[0]) - pixels(base)).max() > 1, "the LoRA changed nothing"
    again = pipe.generate(request(name)).images[0]
    assert np.abs(pixels(again) - pixels(base)).max() <= 1, "the LoRA stayed on after it was dropped"


# --------------------------------------------------------------------------- the UI per family
def _ui(pipe):
    from engine import Engine
    from engine.settings import AppSettings
    from ui.demo import create_demo

    config = create_demo(Engine(pipe), AppSettings()).get_config_file()
    by_id = {c["props"].get("elem_id"): c for c in config["components"] if c["props"].get("elem_id")}
    tabs = [c for c in config["components"] if c["type"] == "tabs"]
    return by_id, tabs[0]["props"].get("selected")


@pytest.mark.parametrize("name", ["instruct-pix2pix", "pixart-sigma", "qwen-image"])
def test_ui_offers_only_what_the_model_can_do(family_root, name):
    pipe = load(family_root, name)
    by_id, selected = _ui(pipe)
    info = pipe.model_info()
    assert by_id["generate-btn"]["props"]["interactive"] is info.text_to_image
    assert by_id["generate-unavailable"]["props"]["visible"] is (not info.text_to_image)
    assert selected == ("generate" if info.text_to_image else "edit")
    assert by_id["edit-btn"]["props"]["interactive"] is (info.edit or info.image_to_image)
    assert by_id["edit-image-guidance"]["props"]["visible"] is (name == "instruct-pix2pix")
    assert by_id["guidance"]["props"]["info"] == info.guidance_label
    assert by_id["step-cache"]["props"]["interactive"] is info.step_cache is (name == "qwen-image")  # step_cache.py


@pytest.mark.parametrize("name", ["sd15", "sd3", "qwen-image"])
def test_token_counter_uses_the_models_tokenizers(family_root, name):
    from engine import Engine
    from engine.settings import AppSettings
    from ui.studio import Studio

    studio = Studio(Engine(load(family_root, name)), AppSettings())
    short = studio.token_count("a red circle")
    labels = [c.label for c in load(family_root, name).count_tokens("a red circle")]
    assert labels and all(label in short for label in labels) and "cut" not in short
    long = studio.token_count(" ".join(["red circle"] * 700))
    whole = CHUNKED.get(name) in ("clip", "clip2")  # SD takes it whole ("CLIP 1400/1425"); SD3's T5 still cuts
    assert ("⚠️ cut" in long) is not whole, long
    assert studio.token_count("") == ""


# --------------------------------------------------------------------------- inpainting
# The families diffusers has an inpainting pipeline for (pipelines.run.traits.inpaint_twin): checked by
# name, so a change in what the detection finds cannot pass unnoticed.
INPAINTS = {"sd15", "sdxl", "sd3", "flux", "flux-kontext", "qwen-image", "qwen-image-edit"}


def _scene(name: str) -> tuple[Image.Image, Image.Image]:
    """A picture at the family's size (vertical stripes) and a mask over a box in its middle."""
    width, height = size_of(name)
    x = np.arange(width)[None, :, None]
    stripes = np.broadcast_to(np.where(x % 16 < 8, 40, 210), (height, width, 3)).astype(np.uint8)
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, (width // 4, height // 4, 3 * width // 4, 3 * height // 4))
    return Image.fromarray(stripes.copy()), mask


@pytest.mark.parametrize("name", NAMES)
def test_inpaint_keeps_every_unmasked_pixel_or_refuses_clearly(family_root, name):
    from pipelines.schema.inpaint import Inpaint

    pipe = load(family_root, name)
    image, mask = _scene(name)
    req = request(name, init_images=[image], strength=1.0, num_images=2, inpaint=Inpaint(mask=mask))
    assert pipe.model_info().inpaint == (name in INPAINTS)
    if name not in INPAINTS:
        with pytest.raises(UnsupportedTaskError, match=r"cannot inpaint.*Families that inpaint"):
            pipe.generate(req)
        return
    result = pipe.generate(req)
    assert result.seeds == [7, 8] and [im.size for im in result.images] == [image.size] * 2
    outside = np.asarray(mask) == 0
    for out in result.images:
        diff = np.abs(pixels(out) - pixels(image))
        assert diff[outside].max() == 0, "a pixel outside the mask changed"
        assert diff[~outside].max() > 10, "the masked area was not repainted"
    assert result.metadata[0]["mask_blur"] == 4 and result.metadata[0]["strength"] == 1.0
    alone = pipe.generate(request(name, init_images=[image], strength=1.0, seed=8, inpaint=Inpaint(mask=mask)))
    assert np.abs(pixels(alone.images[0]) - pixels(result.images[1])).max() <= 3  # seed 8 = image 2
