"""Train the embedded text-to-video model, `models/tiny-shapes-video/`: a Wan-architecture model
(diffusers' `WanPipeline`: a `WanTransformer3DModel` trained by flow matching, a UMT5 text encoder) on the
moving-shapes world (models.train.video_world), over the embedded image model's VAE with its latents packed
as a Wan VAE's, 4 frames and 8x8 pixels per latent (pipelines.video.packed_vae: no video VAE to train).

    python -m models.train.train video [--steps N]       # transformer + text encoder on the packed latents (10000)
    python -m models.train.train video-export            # the diffusers folder models/tiny-shapes-video/

It is a Wan 2.2 TI2V-style model (`expand_timesteps`): each latent token carries its own timestep,
and a share of the training clips keep their first latent frame clean (timestep 0), so the same
weights make text-to-video (`WanPipeline`) and image-to-video (`WanImageToVideoPipeline` with the
first frame given) without an image encoder. Seeded and resumable like the other stages.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .common import EMA, MODEL_OUT, MODELS_DIR, RUNS, SEED, load_checkpoint, lr_at, progress, save_checkpoint
from .tokenizer import WORDS as IMAGE_WORDS
from .tokenizer import build_tokenizer
from .video_world import (
    DIRECTIONS,
    FPS,
    FRAME_SIZE,
    NUM_FRAMES,
    VIDEO_PROMPT,
    WORDS,
    prompt_for,
    random_clip,
    render_clip,
)
from .world import COLORS, SHAPES

log = logging.getLogger(__name__)

VIDEO_OUT = MODELS_DIR / "tiny-shapes-video"
Z_DIM = 16  # the packed latents' channels: 4 frames x 4 image-latent channels (16x16 latents at 64 px)
TEXT_DIM = 32
MAX_SEQUENCE = 16  # the prompt length (the tokenizer's): the pipeline is called with max_sequence_length=16
# (vocabulary.json), not WanPipeline's 512, whose 500 zero tokens would take most of every cross-attention's weight
DATASET = 3000  # clips encoded once for the transformer's training
I2V_SHARE = 0.3  # training clips whose first latent frame is given (image-to-video)
CFG_DROPOUT = 0.1
BATCH = 16
LR = 1e-3
FLOW_SHIFT = 3.0  # the sampler's shift (UniPC flow sigmas), as Wan's 480p recipes


def make_vae():
    """The embedded image model's VAE, frame by frame, its latents packed as a Wan VAE's (pipelines.video.packed_vae)."""
    from diffusers import AutoencoderKL

    from pipelines.video.packed_vae import FramePackedVAE

    return FramePackedVAE.around(AutoencoderKL.from_pretrained(MODEL_OUT / "vae"), space=1).eval().requires_grad_(False)


def make_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=Z_DIM, out_channels=Z_DIM,
        text_dim=TEXT_DIM, freq_dim=64, ffn_dim=384, num_layers=6, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=64,
    )  # fmt: skip


def make_text_encoder(vocab_size: int):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=vocab_size, d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
    )  # fmt: skip
    return UMT5EncoderModel(config)


def tokenizer():
    return build_tokenizer((*IMAGE_WORDS, *WORDS))


def clips_tensor(rng: random.Random, n: int, frames: int = NUM_FRAMES) -> tuple[torch.Tensor, list[str]]:
    """n random clips as (n, 3, frames, H, W) in [-1, 1] and their prompts."""
    clips = [random_clip(rng) for _ in range(n)]
    video = np.stack([render_clip(c, frames) for c in clips])  # n, F, H, W, 3
    tensor = torch.from_numpy(video).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)
    return tensor, [c.prompt for c in clips]


@torch.no_grad()
def encode_dataset(vae, n: int = DATASET) -> dict:
    """DATASET clips through the VAE once (posterior means) with their prompts, and the latents' per-channel
    mean and std (what the pipeline normalises with: `latents_mean` / `latents_std`)."""
    path = RUNS / "video" / "latents-16.pt"
    if (cached := load_checkpoint(path)) is not None:
        return cached
    rng = random.Random(f"{SEED}-video-data")
    latents, prompts = [], []
    bar = progress(n, 0, "encode clips")
    for _ in range(0, n, 24):
        video, texts = clips_tensor(rng, 24)
        latents.append(vae.encode(video).latent_dist.mode())
        prompts += texts
        bar.update(len(texts))
    bar.close()
    latents = torch.cat(latents)[:n]
    mean = latents.mean(dim=(0, 2, 3, 4))
    std = latents.std(dim=(0, 2, 3, 4))
    data = {"latents": latents, "prompts": prompts[:n], "mean": mean, "std": std}
    save_checkpoint(path, **data)
    return data


def text_embeddings(encoder, tok, prompts: list[str]) -> torch.Tensor:
    """What WanPipeline._get_t5_prompt_embeds makes: the encoder's states of the prompt's tokens, zeros to MAX_SEQUENCE."""
    inputs = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt")
    states = encoder(inputs.input_ids, inputs.attention_mask).last_hidden_state
    states = states * inputs.attention_mask.unsqueeze(-1)
    return F.pad(states, (0, 0, 0, MAX_SEQUENCE - states.shape[1]))


def flow_step(transformer, latents: torch.Tensor, text: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One flow-matching loss: x_t = (1 - s) x0 + s noise, target noise - x0; per-token timesteps, the first
    latent frame clean (timestep 0, no loss) for I2V_SHARE of the clips."""
    b, _, f, h, w = latents.shape
    noise = torch.randn(latents.shape, generator=gen)
    u = torch.sigmoid(torch.randn(b, generator=gen))  # logit-normal, shifted as the sampler shifts (FLOW_SHIFT): without
    sigma = (FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)).view(b, 1, 1, 1, 1)  # the shift, sigma > 0.9 is 1 % of steps
    mask = torch.ones(b, 1, f, h, w)
    given = torch.rand(b, generator=gen) < I2V_SHARE
    mask[given, :, 0] = 0.0
    noisy = (1 - sigma) * latents + sigma * noise
    noisy = (1 - mask) * latents + mask * noisy
    timestep = (mask[:, 0, :, ::2, ::2] * sigma.view(b, 1, 1, 1) * 1000).flatten(1)
    pred = transformer(hidden_states=noisy, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
    err = (pred - (noise - latents)).pow(2) * mask
    return err.sum() / (mask.sum() * latents.shape[1])


def train_video(steps: int) -> None:
    out = RUNS / "video"
    data = encode_dataset(make_vae())
    latents = (data["latents"] - data["mean"].view(1, -1, 1, 1, 1)) / data["std"].view(1, -1, 1, 1, 1)
    tok = tokenizer()
    transformer, encoder = make_transformer(), make_text_encoder(len(tok))
    params = [*transformer.parameters(), *encoder.parameters()]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    ema = EMA(params, decay=0.998)
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        transformer.load_state_dict(ckpt["transformer"])
        encoder.load_state_dict(ckpt["encoder"])
        opt.load_state_dict(ckpt["opt"])
        ema.shadow = ckpt["ema"]
        start = ckpt["step"]
    bar = progress(steps, start, "video")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED + step)
        index = torch.randint(0, len(latents), (BATCH,), generator=gen)
        prompts = ["" if torch.rand(1, generator=gen).item() < CFG_DROPOUT else data["prompts"][i] for i in index]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR)
        loss = flow_step(transformer, latents[index], text_embeddings(encoder, tok, prompts), gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update(params, step)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 200 == 0 or step + 1 == steps:
            state = {"transformer": transformer.state_dict(), "encoder": encoder.state_dict()}
            save_checkpoint(out / "ckpt.pt", **state, opt=opt.state_dict(), ema=ema.shadow, step=step + 1)
    bar.close()


def export_video(_steps: int | None = None, out: Path = VIDEO_OUT) -> None:
    """The diffusers folder `out`: WanPipeline with the EMA weights, the VAE's latent statistics, UniPC flow sampling."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    data = encode_dataset(make_vae())
    vae = make_vae()
    vae.register_to_config(latents_mean=data["mean"].tolist(), latents_std=data["std"].tolist())
    tok = tokenizer()
    transformer, encoder = make_transformer(), make_text_encoder(len(tok))
    ckpt = load_checkpoint(RUNS / "video" / "ckpt.pt")
    params = [*transformer.parameters(), *encoder.parameters()]
    with torch.no_grad():
        for p, s in zip(params, ckpt["ema"], strict=True):
            p.copy_(s)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=FLOW_SHIFT)
    pipe = WanPipeline(tokenizer=tok, text_encoder=encoder, vae=vae, transformer=transformer, scheduler=scheduler, expand_timesteps=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        pipe.save_pretrained(tmp, safe_serialization=True)
        vocabulary = {
            "pattern": VIDEO_PROMPT, "colors": list(COLORS), "shapes": list(SHAPES), "directions": list(DIRECTIONS),
            "examples": [prompt_for("red", "circle", "blue", "left"), prompt_for("yellow", "triangle", "purple", "up"),
                         prompt_for("white", "square", "black", "right"), prompt_for("green", "circle", "orange")],
            "prompt_template": VIDEO_PROMPT, "default_steps": 20, "default_guidance_scale": 5.0,
            "default_num_frames": NUM_FRAMES, "default_fps": FPS, "max_num_frames": 33,
            "default_width": FRAME_SIZE, "default_height": FRAME_SIZE, "max_sequence_length": MAX_SEQUENCE,
            "refiner": {"folder": "../refiners/tiny-shapes-motion", "strength": 0.65, "guidance": 4.0},
            "notes": f"trained at {FRAME_SIZE}x{FRAME_SIZE}, {NUM_FRAMES} frames, on a shape moving left, right, up or down, "
            "or still; each clip is then redrawn by the motion-module refiner (models/refiners/tiny-shapes-motion), "
            "which keeps its motion and draws the shape's outline (docs/video.md)",
        }  # fmt: skip
        Path(tmp, "vocabulary.json").write_text(json.dumps(vocabulary, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        Path(tmp).rename(out)
    log.info("exported %s", out)
