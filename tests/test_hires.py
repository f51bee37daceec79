"""Hires fix, the upscalers and tiled VAE on the embedded model (pipelines.imaging.hires, pipelines.imaging.upscalers,
pipelines.sampling.vae_tiling): what a user of A1111's Hires. fix and Extras sees, without the browser."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

from models.eval_hires import psnr
from models.train.upscale import HELD_OUT_SEED, OUT, scene_pair
from pipelines import GenerationRequest, ImagePipeline
from pipelines.imaging.hires import target_size
from pipelines.imaging.upscalers import Upscalers, tiles
from pipelines.pnginfo.read import parse_a1111
from pipelines.pnginfo.write import a1111_parameters
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.fields import RequestError
from pipelines.schema.hires import Hires
from pipelines.schema.request import nest
from tests.families import FAMILIES

PROMPT = "a red circle on a blue background"
EMBEDDED = OUT.stem  # the embedded x2 upscaler, models/upscalers/


@pytest.fixture(scope="module")
def pipeline():
    return ImagePipeline.from_pretrained(DEFAULT_MODEL)


def hires_request(**flat) -> GenerationRequest:
    return GenerationRequest.parse(nest({"prompt": PROMPT, "steps": 8, "seed": 11, "hires_fix": True, **flat}))


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(int)


def test_the_second_pass_size_follows_a1111():
    on = Hires(hires_fix=True)
    assert target_size(on, (64, 48), 8) == (128, 96)
    assert target_size(on.model_copy(update={"hires_scale": 1.5}), (64, 64), 8) == (96, 96)
    assert target_size(on.model_copy(update={"hires_width": 160}), (64, 48), 8) == (160, 120)  # aspect kept
    assert target_size(on.model_copy(update={"hires_height": 100}), (64, 64), 8) == (96, 96)  # rounded to the step
    assert target_size(on.model_copy(update={"hires_width": 128, "hires_height": 64}), (64, 64), 8) == (128, 64)


def test_hires_off_is_not_a_hires_request_and_on_is_text_to_image_only():
    assert GenerationRequest.parse(nest({"prompt": PROMPT, "hires_fix": False, "hires_scale": 3})).hires is None
    # what some A1111 clients send for "off" (A1111 ignores the hr_* fields then): not read
    off = {"prompt": PROMPT, "hires_fix": False, "hires_scale": 0, "hires_upscaler": "none", "hires_strength": None}
    assert GenerationRequest.parse(nest(off)).hires is None
    with pytest.raises(RequestError) as caught:
        GenerationRequest.parse(nest({"prompt": PROMPT, "hires_fix": True, "init_images": [Image.new("RGB", (64, 64))]}))
    assert caught.value.field == "hires"
    with pytest.raises(RequestError) as caught:
        GenerationRequest.parse(nest({"prompt": PROMPT, "hires_fix": True, "hires_scale": 9}))
    assert caught.value.field == "hires_scale" and "1..4" in caught.value.detail


def test_a_hires_image_is_larger_and_records_both_passes_as_a1111_does(pipeline):
    plain = pipeline.generate(GenerationRequest(PROMPT, steps=8, seed=11, num_images=2))
    result = pipeline.generate(hires_request(num_images=2, hires_upscaler=EMBEDDED, hires_strength=0.3))
    assert [im.size for im in result.images] == [(128, 128)] * 2
    assert result.seeds == plain.seeds  # the same seeds in both passes, image k with seed + k
    assert result.hires == f"64x64 -> 128x128, {EMBEDDED}, strength 0.3"
    text = a1111_parameters(result.metadata[0])
    assert "Size: 64x64" in text and "Hires upscale: 2.0" in text and f"Hires upscaler: {EMBEDDED}" in text
    assert "Denoising strength: 0.3" in text
    back = parse_a1111(text)
    assert (back["hires_fix"], back["hires_scale"], back["hires_upscaler"], back["hires_strength"]) == (
        True, 2.0, EMBEDDED, 0.3
    )  # fmt: skip
    # the second pass refines the enlarged first pass: close to it, not a new picture
    first_big = [im.resize((128, 128), Image.Resampling.LANCZOS) for im in plain.images]
    for refined, start in zip(result.images, first_big, strict=True):
        assert psnr(refined, start) > 20


def test_stop_between_the_passes_keeps_the_first_pass_images(pipeline, monkeypatch):
    plain = pipeline.generate(GenerationRequest(PROMPT, steps=8, seed=11, num_images=2))
    stopped: list[bool] = []
    enlarge = pipeline.upscalers.upscale

    def stop_once_enlarged(*args, **kwargs):  # Stop pressed while the first pass's images are enlarged
        stopped.append(True)
        return enlarge(*args, **kwargs)

    monkeypatch.setattr(pipeline.upscalers, "upscale", stop_once_enlarged)
    result = pipeline.generate(hires_request(num_images=2), should_cancel=lambda: bool(stopped))
    assert stopped and result.cancelled and [im.size for im in result.images] == [(64, 64)] * 2
    assert all((pixels(a) == pixels(b)).all() for a, b in zip(result.images, plain.images, strict=True))
    assert "2 first-pass image(s) returned as they were" in result.warnings[-1]
    assert all("hires_fix" not in meta for meta in result.metadata)  # they are what they are: first-pass images


def test_progress_runs_over_both_passes(pipeline):
    seen: list[tuple[int, int]] = []
    pipeline.generate(hires_request(hires_steps=10, hires_strength=0.5), progress=lambda s, t, i: seen.append((s, t)))
    steps = [s for s, _ in seen]
    assert steps == sorted(steps) and seen[-1][0] == seen[-1][1] == 8 + 5  # 8 first-pass steps, then 10 x 0.5
    assert all(total == 13 for _, total in seen)  # the share of the second pass is known from the start


def test_latent_modes_start_the_second_pass_from_the_latents(pipeline):
    nearest = pipeline.generate(hires_request(hires_upscaler="Latent (nearest)", hires_strength=0.5))
    bicubic = pipeline.generate(hires_request(hires_upscaler="Latent (bicubic)", hires_strength=0.5))
    assert nearest.images[0].size == bicubic.images[0].size == (128, 128) and not nearest.warnings
    assert not (pixels(nearest.images[0]) == pixels(bicubic.images[0])).all()  # the mode is used


def test_refusals_name_the_field(pipeline):
    for flat, field, words in (
        ({"hires_upscaler": "R-ESRGAN 4x+"}, "hires_upscaler", f"available: Lanczos, Nearest, {EMBEDDED}"),
        ({"hires_scale": 3, "width": 128, "height": 128}, "hires_scale", "384x384, beyond this model's limits"),
        ({"hires_sampler": "Heun++"}, "hires_sampler", "is not available"),
    ):
        with pytest.raises(RequestError) as caught:
            pipeline.generate(hires_request(**flat))
        assert caught.value.field == field and words in caught.value.detail, caught.value


def test_the_embedded_upscaler_beats_lanczos_on_held_out_scenes():
    upscalers = Upscalers([], _cpu())
    rng = random.Random(f"{HELD_OUT_SEED}-test")
    gains = []
    for _ in range(12):
        small, big = (Image.fromarray(p) for p in scene_pair(rng, degrade=False))
        ours = upscalers.upscale(small, EMBEDDED, (128, 128))
        gains.append(psnr(ours, big) - psnr(small.resize((128, 128), Image.Resampling.LANCZOS), big))
    assert np.mean(gains) > 1.0, gains


def test_tiles_cover_the_image_and_blend_without_seams(monkeypatch):
    import pipelines.imaging.upscalers as upscaling

    for h, w in ((300, 200), (64, 64), (257, 513)):
        covered = np.zeros((h, w), bool)
        for top, left, th, tw in tiles(h, w, 128, 16):
            covered[top : top + th, left : left + tw] = True
        assert covered.all()
    rng = random.Random(3)
    picture = Image.new("RGB", (200, 150))
    for x in range(0, 200, 50):
        for y in range(0, 150, 50):
            picture.paste(Image.fromarray(scene_pair(rng, degrade=False)[0]).resize((50, 50)), (x, y))
    upscalers = Upscalers([], _cpu())
    whole = upscalers.upscale(picture, EMBEDDED, (400, 300))
    monkeypatch.setattr(upscaling, "TILE", 48)
    tiled = upscalers.upscale(picture, EMBEDDED, (400, 300))
    diff = np.abs(pixels(whole) - pixels(tiled))
    assert diff.mean() < 0.5 and diff.max() <= 16, (diff.mean(), diff.max())


def test_large_images_decode_in_tiles_and_small_ones_whole(tmp_path):
    pipeline = ImagePipeline.from_pretrained(DEFAULT_MODEL, tiled_vae_pixels=100 * 100)
    small = pipeline.generate(GenerationRequest(PROMPT, steps=4, seed=2))
    large = pipeline.generate(GenerationRequest(PROMPT, steps=4, seed=2, width=128, height=128))
    assert not small.vae_tiling and large.vae_tiling and large.info()["vae_tiling"] is True
    assert not pipeline.pipe.vae.use_tiling  # on for that call only
    # the embedded model's own threshold (its vocabulary's: it decodes what is above 64x64 in tiles)
    assert ImagePipeline.from_pretrained(DEFAULT_MODEL).generate(GenerationRequest(PROMPT, steps=4, seed=2, width=128, height=64)).vae_tiling
    untiled = ImagePipeline.from_pretrained(DEFAULT_MODEL, tiled_vae_pixels=1 << 30).generate(
        GenerationRequest(PROMPT, steps=4, seed=2, width=128, height=128)
    )
    assert not untiled.vae_tiling and psnr(large.images[0], untiled.images[0]) > 25  # the same picture


def _cpu():
    from devices import DeviceManager

    return DeviceManager("cpu")


def test_a_pool_of_two_replicas_gives_the_same_hires_images(pipeline):
    from serving.pool import DevicePool

    pool = DevicePool.from_pretrained(str(DEFAULT_MODEL), devices="cpu,cpu", micro_batch=1)
    try:
        request = hires_request(num_images=3, hires_upscaler=EMBEDDED)
        split = pool.generate(request)
        whole = pipeline.generate(request)
        assert split.seeds == whole.seeds and len(split.images) == 3
        for a, b in zip(split.images, whole.images, strict=True):
            assert a.size == (128, 128) and np.abs(pixels(a) - pixels(b)).max() <= 2  # the same images
    finally:
        pool.close()


TEXT_TO_IMAGE = [name for name, family in FAMILIES.items() if family.text_to_image and not family.edit]


@pytest.mark.parametrize("name", TEXT_TO_IMAGE)
def test_every_family_runs_hires_fix_or_refuses_naming_why(name, family_root):
    from tests import families

    model = ImagePipeline.from_pretrained(families.build(name, family_root / name))
    w, h = model.default_size
    request = GenerationRequest.parse(nest({"prompt": "a red circle", "steps": 2, "seed": 4, "hires_fix": True,
                                            "hires_scale": 1.5, "hires_upscaler": "Latent"}))  # fmt: skip
    if not model.model_info().image_to_image:
        with pytest.raises(RequestError, match="no image-to-image pipeline"):
            model.generate(request)
        return
    result = model.generate(request)
    step = model.size_multiple
    assert result.images[0].size == (round(w * 1.5 / step) * step, round(h * 1.5 / step) * step)
    fell_back = [w for w in result.warnings if "Lanczos used" in w]
    assert bool(fell_back) == (model.traits.class_name not in ("StableDiffusionPipeline", "StableDiffusionXLPipeline"))
