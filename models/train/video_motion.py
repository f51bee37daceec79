"""Train a motion-module refiner for the embedded video model: diffusers' `MotionAdapter` (AnimateDiff) inserted
into tiny-shapes' UNet (`UNetMotionModel.from_unet2d`), trained on the moving-shapes world
(models.train.video_world). Alone it draws crisp shapes and keeps them from frame to frame, but it does not move
them the asked way: its temporal attention has no text input, and the direction did not reach it through the
spatial cross-attention in 1600 steps (10 % of clips right). Run as video-to-video over tiny-shapes-video's clips
(`pipelines.video.refine`, named by its vocabulary), it keeps their motion and redraws their shapes (docs/video.md).

    python -m models.train.train video-motion [--steps N]     # motion modules + the image model tuned (1600, 61 min)
    python -m models.train.train video-motion-export          # models/refiners/tiny-shapes-motion (AnimateDiff)

- The image model's text encoder learns the video world's words ("moving", "left", ...): the tokenizer is
  the image one's words and these; each token's embedding row starts as the image model's row of the same
  text (a new word's as the mean row).
- The motion modules train at MOTION_LR; the image UNet and the text encoder are tuned at TUNE_LR (the
  direction could only enter through the prompt's cross-attention, which a frozen UNet cannot learn to read).
- The loss is the image model's own (v-prediction, min-SNR-5, one timestep per clip for all its frames).
- `UNetMotionModel` has no `addition_embed_type="text"` (the image UNet's pooled-text embedding): it is
  dropped; the image model without it still draws 97 % of scenes right (models.eval on a copy).
Seeded and resumable like the other stages.
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

from .common import (
    EMA,
    MODEL_OUT,
    MODELS_DIR,
    RUNS,
    SEED,
    load_checkpoint,
    lr_at,
    min_snr_loss,
    noised,
    progress,
    save_checkpoint,
)
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

REFINER_OUT = MODELS_DIR / "refiners" / "tiny-shapes-motion"  # nested: not a model of its own in the picker
RUN = RUNS / "video-motion"
DATASET = 3000  # clips encoded once
BATCH = 4  # clips a step (x NUM_FRAMES frames through the UNet)
MOTION_LR = 1e-3
TUNE_LR = 1e-4
CFG_DROPOUT = 0.1
MOTION = {  # MotionAdapter beside tiny-shapes' UNet (64/128/128 channels, one layer a block, 16 groups)
    "block_out_channels": (64, 128, 128), "motion_layers_per_block": 1, "motion_num_attention_heads": 4,
    "motion_norm_num_groups": 16, "motion_max_seq_length": 48, "use_motion_mid_block": True,
}  # fmt: skip


def tokenizer():
    """The image tokenizer's words and the video world's."""
    return build_tokenizer((*IMAGE_WORDS, *WORDS))


def make_models(tok) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(UNetMotionModel over tiny-shapes' UNet with a fresh MotionAdapter, tiny-shapes' text encoder grown to `tok`)."""
    from diffusers import MotionAdapter, UNet2DConditionModel, UNetMotionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    unet = UNetMotionModel.from_unet2d(UNet2DConditionModel.from_pretrained(MODEL_OUT / "unet"), MotionAdapter(**MOTION))
    encoder = CLIPTextModel.from_pretrained(MODEL_OUT / "text_encoder")
    image_vocab = CLIPTokenizer.from_pretrained(MODEL_OUT / "tokenizer").get_vocab()
    image_table = encoder.get_input_embeddings().weight.detach().clone()
    encoder.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():  # each token's row by its text: BOS and EOS come after the words, so their ids moved
        table = encoder.get_input_embeddings().weight
        for token, index in tok.get_vocab().items():
            table[index] = image_table[image_vocab[token]] if token in image_vocab else image_table.mean(0)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    encoder.config.update(ids)
    return unet, encoder


def make_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(MODEL_OUT / "vae").eval().requires_grad_(False)


@torch.no_grad()
def encode_dataset(vae, n: int = DATASET) -> dict:
    """DATASET clips through the image VAE frame by frame once: (n, 4, frames, 16, 16) scaled latents, fp16."""
    path = RUN / "latents.pt"
    if (cached := load_checkpoint(path)) is not None:
        return cached
    rng = random.Random(f"{SEED}-video-data")  # the Wan model's clips, drawn the same way
    latents, prompts = [], []
    bar = progress(n, 0, "encode clips")
    for _ in range(0, n, 16):
        clips = [random_clip(rng) for _ in range(16)]
        frames = np.concatenate([render_clip(c) for c in clips])  # 16 x F, H, W, 3
        pixels = torch.from_numpy(frames).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        z = vae.encode(pixels).latent_dist.mode() * vae.config.scaling_factor
        latents.append(z.view(len(clips), NUM_FRAMES, *z.shape[1:]).transpose(1, 2).half())
        prompts += [c.prompt for c in clips]
        bar.update(len(clips))
    bar.close()
    data = {"latents": torch.cat(latents)[:n], "prompts": prompts[:n]}
    save_checkpoint(path, **data)
    return data


def param_groups(unet, encoder) -> tuple[list, list]:
    """(the motion modules' parameters, the tuned image model's): in this order the EMA is kept and exported."""
    motion = [p for n, p in unet.named_parameters() if "motion_modules" in n]
    return motion, [p for n, p in unet.named_parameters() if "motion_modules" not in n] + list(encoder.parameters())


def clip_loss(unet, encoder, scheduler, latents: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The image model's v-prediction loss over whole clips: one timestep a clip, every frame noised."""
    b, c, f, h, w = latents.shape
    flat = latents.transpose(1, 2).reshape(b, f * c, h, w)  # one noise draw per clip, one timestep for its frames
    noisy, t, target = noised(scheduler, flat, gen)
    as_clip = lambda x: x.view(b, f, c, h, w).transpose(1, 2)  # noqa: E731
    text = encoder(ids)[0].repeat_interleave(f, dim=0)
    pred = unet(as_clip(noisy), t, encoder_hidden_states=text).sample
    return min_snr_loss(pred.transpose(1, 2).reshape(b, f * c, h, w), target, scheduler, t)


def train_video_motion(steps: int) -> None:
    from diffusers import DDPMScheduler

    from .common import tokenize

    data = encode_dataset(make_vae())
    tok = tokenizer()
    ids_all = tokenize(tok, data["prompts"])
    empty = tokenize(tok, [""])[0]
    unet, encoder = make_models(tok)
    scheduler = DDPMScheduler.from_pretrained(MODEL_OUT / "scheduler")
    motion, tuned = param_groups(unet, encoder)
    opt = torch.optim.AdamW([{"params": motion, "lr": MOTION_LR}, {"params": tuned, "lr": TUNE_LR}], weight_decay=0.01)
    params = motion + tuned
    ema = EMA(params, decay=0.995)
    start = 0
    if ckpt := load_checkpoint(RUN / "ckpt.pt"):
        unet.load_state_dict(ckpt["unet"])
        encoder.load_state_dict(ckpt["encoder"])
        opt.load_state_dict(ckpt["opt"])
        ema.shadow, start = ckpt["ema"], ckpt["step"]
    unet.train()
    bar = progress(steps, start, "video-motion")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED + step)
        index = torch.randint(0, len(ids_all), (BATCH,), generator=gen)
        ids = ids_all[index].clone()
        ids[torch.rand(BATCH, generator=gen) < CFG_DROPOUT] = empty
        for group, base in zip(opt.param_groups, (MOTION_LR, TUNE_LR), strict=True):
            group["lr"] = lr_at(step, steps, base)
        loss = clip_loss(unet, encoder, scheduler, data["latents"][index].float(), ids, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update(params, step)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 200 == 0 or step + 1 == steps:
            state = {"unet": unet.state_dict(), "encoder": encoder.state_dict()}
            save_checkpoint(RUN / "ckpt.pt", **state, opt=opt.state_dict(), ema=ema.shadow, step=step + 1)
    bar.close()


def export_video_motion(out: Path = REFINER_OUT) -> None:
    """The diffusers folder `out`: AnimateDiffPipeline (the motion UNet with the EMA weights, the image model's VAE
    and sampler, the grown tokenizer and text encoder), stored in float16 (load it with torch_dtype=float32 on a
    CPU), and its vocabulary.json."""
    from diffusers import AnimateDiffPipeline, DPMSolverMultistepScheduler

    tok = tokenizer()
    unet, encoder = make_models(tok)
    ckpt = load_checkpoint(RUN / "ckpt.pt")
    motion, tuned = param_groups(unet, encoder)
    with torch.no_grad():
        for p, s in zip(motion + tuned, ckpt["ema"], strict=True):
            p.copy_(s)
    scheduler = DPMSolverMultistepScheduler.from_pretrained(MODEL_OUT / "scheduler")
    image_vocabulary = json.loads((MODEL_OUT / "vocabulary.json").read_text())
    pipe = AnimateDiffPipeline(
        vae=make_vae(), text_encoder=encoder.eval(), tokenizer=tok, unet=unet.eval(), motion_adapter=None, scheduler=scheduler
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        pipe.to(torch.float16).save_pretrained(tmp, safe_serialization=True)
        vocabulary = {
            "pattern": VIDEO_PROMPT, "colors": list(COLORS), "shapes": list(SHAPES), "directions": list(DIRECTIONS),
            "examples": [prompt_for("red", "circle", "blue", "left"), prompt_for("yellow", "triangle", "purple", "up"),
                         prompt_for("white", "square", "black", "right"), prompt_for("green", "circle", "orange")],
            "prompt_template": VIDEO_PROMPT, "default_steps": image_vocabulary.get("default_steps", 20),
            "default_guidance_scale": image_vocabulary.get("default_guidance_scale", 4.0),
            "default_num_frames": NUM_FRAMES, "default_fps": FPS, "max_num_frames": MOTION["motion_max_seq_length"],
            "default_width": FRAME_SIZE, "default_height": FRAME_SIZE,
            "notes": f"motion modules over tiny-shapes, trained at {FRAME_SIZE}x{FRAME_SIZE}, {NUM_FRAMES} frames, on a "
            "shape moving left, right, up or down, or still: it draws crisp shapes but does not follow the direction "
            "(its temporal attention has no text input); a refiner of tiny-shapes-video's clips (docs/video.md)",
        }  # fmt: skip
        Path(tmp, "vocabulary.json").write_text(json.dumps(vocabulary, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        Path(tmp).rename(out)
    log.info("exported %s", out)
