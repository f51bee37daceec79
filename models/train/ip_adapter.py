"""Train the embedded IP-Adapter for tiny-shapes: a reference image's shape colour carries over.

    python -m models.train.train ip-adapter [--steps N]     # writes models/ip_adapters/shapes-colour/

An IP-Adapter (Ye et al. 2023) adds, beside each cross-attention of the frozen UNet, a second
key/value projection over a few "image tokens" made from an image encoder's embedding. Ours has
the layout diffusers' `load_ip_adapter` reads: `ip_adapter.safetensors` (`image_proj.*`: the
embedding → 4 tokens projection; `ip_adapter.N.to_k_ip/to_v_ip`: the new projections, started from
the text's own `to_k`/`to_v` as in the paper) and `image_encoder/` (a CLIP vision model with
projection, 64 px, 2 layers, trained with the adapter: no pretrained CLIP is reachable offline).

Each sample is a scene and a reference picture of another scene with the same shape colour (other
shape, place and size). The prompt never names the shape's colour: half say "a circle on a blue
background" (the background from the text), half only "a circle" (the reference also gives the
background). As in the paper, 5 % drop the image (a zero embedding, what diffusers sends as the
unconditional side), 5 % the text and 5 % both (the pair classifier-free guidance subtracts). A
linear colour probe on the image embedding (weight 0.1, not shipped) points the small encoder at
colour from the first steps; the diffusion loss does the rest.

The loss is the plain v-prediction error, not the base model's min-SNR weighting: a shape's colour
is settled in the noisiest steps, which min-SNR weighs near zero. With it (600 and 1400 steps) the
adapter moved the colour only under guidance (17 % right at CFG 1, 50 % at the default 4).
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from . import configs
from .common import (
    MODEL_OUT,
    MODELS_DIR,
    RUNS,
    SEED,
    load_checkpoint,
    lr_at,
    noised,
    progress,
    save_checkpoint,
    to_tensor,
    tokenize,
)
from .control import offcentre_scene
from .world import COLORS, Scene, draw, random_scene

log = logging.getLogger(__name__)

IP_ADAPTER_OUT = MODELS_DIR / "ip_adapters" / "shapes-colour"
BATCH, LR, ENCODER_LR = 16, 3e-4, 1e-3
DROPOUT, PROBE_WEIGHT = 0.05, 0.1  # each of: the image, the text, both
EMBED_DIM, TOKENS = 64, 4
COLOR_NAMES = list(COLORS)


def colourless_prompt(scene: Scene, with_background: bool) -> str:
    """The prompt the adapter learns with: the shape, maybe the background, never the shape's colour."""
    return f"a {scene.shape} on a {scene.background} background" if with_background else f"a {scene.shape}"


def reference_for(scene: Scene, rng: random.Random, same_background: bool) -> Scene:
    """Another scene with the same shape colour: the colour is what the picture has to give."""
    other = offcentre_scene(rng) if rng.random() < 0.5 else random_scene(rng)
    background = scene.background if same_background else rng.choice([c for c in COLORS if c != scene.color])
    return replace(other, color=scene.color, background=background)


def make_batch(step: int) -> tuple[list[Scene], list[Scene], list[str]]:
    rng = random.Random(f"{SEED}-ip-adapter-{step}")
    scenes = [offcentre_scene(rng) if rng.random() < 0.5 else random_scene(rng) for _ in range(BATCH)]
    with_background = [rng.random() < 0.5 for _ in scenes]
    references = [reference_for(s, rng, not wb) for s, wb in zip(scenes, with_background, strict=True)]
    prompts = [colourless_prompt(s, wb) for s, wb in zip(scenes, with_background, strict=True)]
    return scenes, references, prompts


def build_encoder():
    """The image encoder and the processor that feeds it (what `load_ip_adapter` rebuilds from its config)."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        image_size=64, patch_size=8, projection_dim=EMBED_DIM,
    )  # fmt: skip
    size = config.image_size
    return CLIPVisionModelWithProjection(config), CLIPImageProcessor(size=size, crop_size=size)


def initial_adapter(unet, generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    """diffusers' IP-Adapter state dict: a small random projection, and each cross-attention's
    image key/value started from its text key/value (numbered 1, 3, 5... as diffusers reads them)."""
    dim = unet.config.cross_attention_dim
    image_proj = {
        "proj.weight": torch.randn(TOKENS * dim, EMBED_DIM, generator=generator) * 0.02,
        "proj.bias": torch.zeros(TOKENS * dim),
        "norm.weight": torch.ones(dim),
        "norm.bias": torch.zeros(dim),
    }
    layers, key = {}, 1
    for name in unet.attn_processors:
        if name.endswith("attn2.processor"):
            attn = unet.get_submodule(name.removesuffix(".processor"))
            layers[f"{key}.to_k_ip.weight"] = attn.to_k.weight.detach().clone()
            layers[f"{key}.to_v_ip.weight"] = attn.to_v.weight.detach().clone()
            key += 2
    return {"image_proj": image_proj, "ip_adapter": layers}


def write_adapter(folder: Path, state: dict[str, dict[str, torch.Tensor]], encoder) -> None:
    """An adapter folder as the app reads it: `ip_adapter.safetensors` (flat `image_proj.*` and
    `ip_adapter.*` keys) beside `image_encoder/`."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    flat = {f"{part}.{key}": value.detach().contiguous() for part, values in state.items() for key, value in values.items()}
    save_file(flat, str(folder / "ip_adapter.safetensors"))
    encoder.eval().save_pretrained(folder / "image_encoder", safe_serialization=True)


def adapter_state(unet) -> dict[str, dict[str, torch.Tensor]]:
    """The trained adapter back in the layout `load_ip_adapter` reads."""
    proj = unet.encoder_hid_proj.image_projection_layers[0]
    image_proj = {"proj.weight": proj.image_embeds.weight, "proj.bias": proj.image_embeds.bias,
                  "norm.weight": proj.norm.weight, "norm.bias": proj.norm.bias}  # fmt: skip
    layers, key = {}, 1
    for name, processor in unet.attn_processors.items():
        if name.endswith("attn2.processor"):
            layers[f"{key}.to_k_ip.weight"] = processor.to_k_ip[0].weight
            layers[f"{key}.to_v_ip.weight"] = processor.to_v_ip[0].weight
            key += 2
    return {"image_proj": image_proj, "ip_adapter": layers}


class Trainee(torch.nn.Module):
    """What trains: the image encoder, the colour probe, and (inside the UNet) the adapter."""

    def __init__(self, encoder, unet):
        super().__init__()
        self.encoder, self.probe = encoder, torch.nn.Linear(EMBED_DIM, len(COLOR_NAMES))
        ip = [p for p in unet.attn_processors.values() if isinstance(p, torch.nn.Module)]  # the IP ones
        self.adapter = torch.nn.ModuleList([unet.encoder_hid_proj, *ip])


def ip_loss(trainee, pipe, scheduler, batch, generator) -> tuple[torch.Tensor, torch.Tensor]:
    latents, ids, pixels, keep_image, colours = batch
    noisy, t, target = noised(scheduler, latents, generator)
    with torch.no_grad():
        hidden = pipe.text_encoder(ids)[0]
    embeds = trainee.encoder(pixel_values=pixels).image_embeds
    probe = torch.nn.functional.cross_entropy(trainee.probe(embeds), colours)
    embeds = embeds * keep_image[:, None]  # a dropped image is diffusers' unconditional zero embedding
    pred = pipe.unet(noisy, t, hidden, added_cond_kwargs={"image_embeds": [embeds[:, None, :]]}).sample
    return torch.nn.functional.mse_loss(pred, target), probe


def _batch(step: int, pipe, processor, empty: torch.Tensor, gen: torch.Generator):
    scenes, references, prompts = make_batch(step)
    with torch.no_grad():
        images = np.stack([np.asarray(draw(s)) for s in scenes])
        latents = pipe.vae.encode(to_tensor(images)).latent_dist.sample(gen) * pipe.vae.config.scaling_factor
    ids = tokenize(pipe.tokenizer, prompts)
    drop = torch.rand(len(ids), generator=gen)  # [0, .05): the image, [.05, .1): the text, [.1, .15): both
    ids[(drop >= DROPOUT) & (drop < 3 * DROPOUT)] = empty
    pixels = processor([draw(r) for r in references], return_tensors="pt").pixel_values
    keep = ((drop >= DROPOUT) & ((drop < 2 * DROPOUT) | (drop >= 3 * DROPOUT))).float()
    colours = torch.tensor([COLOR_NAMES.index(s.color) for s in scenes])
    return latents, ids, pixels, keep, colours


def train_ip_adapter(steps: int) -> None:
    from diffusers import StableDiffusionPipeline

    out = RUNS / "ip-adapter"
    pipe = StableDiffusionPipeline.from_pretrained(MODEL_OUT)
    for module in (pipe.unet, pipe.text_encoder, pipe.vae):
        module.requires_grad_(False)
    gen0 = torch.Generator().manual_seed(SEED + 41)
    pipe.unet._load_ip_adapter_weights([initial_adapter(pipe.unet, gen0)], low_cpu_mem_usage=False)
    encoder, processor = build_encoder()
    trainee = Trainee(encoder, pipe.unet)
    trainee.adapter.requires_grad_(True)
    groups = [{"params": [*trainee.encoder.parameters(), *trainee.probe.parameters()], "base": ENCODER_LR},
              {"params": list(trainee.adapter.parameters()), "base": LR}]  # fmt: skip
    opt = torch.optim.AdamW([{**g, "lr": g["base"]} for g in groups], weight_decay=0.0)
    empty, scheduler, start = tokenize(pipe.tokenizer, [""])[0], configs.make_train_scheduler(), 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        trainee.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"]
        log.info("ip-adapter: resuming at step %d", start)
    trainee.train()
    bar = progress(steps, start, "ip-adapter")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 410_000 + step)
        batch = _batch(step, pipe, processor, empty, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, group["base"], warmup=50)
        loss, probe = ip_loss(trainee, pipe, scheduler, batch, gen)
        opt.zero_grad(set_to_none=True)
        (loss + PROBE_WEIGHT * probe).backward()
        torch.nn.utils.clip_grad_norm_(trainee.parameters(), 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}", probe=f"{probe.item():.3f}")
        if (step + 1) % 50 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", model=trainee.state_dict(), opt=opt.state_dict(), step=step + 1)
    bar.close()
    write_adapter(IP_ADAPTER_OUT, adapter_state(pipe.unet), trainee.encoder)
    log.info("ip-adapter: wrote %s", IP_ADAPTER_OUT)
