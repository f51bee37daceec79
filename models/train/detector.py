"""The embedded detector for the detailer pass: a tiny SegFormer that finds the shapes of the shapes world.

    python -m models.train.train detector [--steps N]      # writes models/detectors/shapes-segformer

A `transformers` semantic-segmentation model (labels: background, shape) in its standard folder
format, so the detailer loads it exactly as it loads a user's segmentation model from DETECTOR_DIR
(pipelines.imaging.detailer). Trained from scratch on canvases of 64-128 px with one to three shapes
of every size the world draws and smaller (6-60 % of the side), some of them blobs (an ellipse of any
aspect: what a model draws when it draws a shape wrong), softened and noised like generated pictures.
A third of the canvases have a second background panel (half a picture of another colour, as regional
prompts draw): a panel is background, not a shape. The target is the shapes' silhouette; a region's
confidence is its mean shape probability.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFilter

from .common import MODELS_DIR, RUNS, SEED, load_checkpoint, lr_at, progress, save_checkpoint
from .world import COLORS, SHAPES, Scene, draw

log = logging.getLogger(__name__)

DETECTOR_OUT = MODELS_DIR / "detectors" / "shapes-segformer"
BATCH, LR = 16, 2e-3
SIZES = (64, 96, 128)
SHAPE_SIDE = (0.06, 0.6)  # fraction of the canvas side


def config():
    """A SegFormer of ~30 k parameters: two stages (1/4 and 1/8 of the input), one block each."""
    from transformers import SegformerConfig

    return SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=32, num_labels=2, id2label={0: "background", 1: "shape"},
        label2id={"background": 0, "shape": 1}, semantic_loss_ignore_index=255,
    )  # fmt: skip


def _silhouette(rng: random.Random, side: int) -> np.ndarray:
    """One shape's coverage (0..1) on a `side` canvas: a world shape anywhere, or a blob."""
    size = rng.uniform(*SHAPE_SIDE)
    cx, cy = (rng.uniform(size / 2, 1 - size / 2) for _ in range(2))
    if rng.random() < 0.25:  # a blob: an ellipse of any aspect
        big = side * 4
        canvas = Image.new("L", (big, big), 0)
        rx, ry = size * big / 2 * rng.uniform(0.5, 1.0), size * big / 2 * rng.uniform(0.5, 1.0)
        ImageDraw.Draw(canvas).ellipse([cx * big - rx, cy * big - ry, cx * big + rx, cy * big + ry], fill=255)
        return np.asarray(canvas.resize((side, side), Image.Resampling.BOX), dtype=np.float32) / 255
    scene = Scene("white", rng.choice(SHAPES), "black", size, cx, cy, rng.uniform(-15, 15))
    return np.asarray(draw(replace(scene), side).convert("L"), dtype=np.float32) / 255


def sample(rng: random.Random, side: int) -> tuple[np.ndarray, np.ndarray]:
    """A canvas (uint8 HxWx3) and its silhouette labels (0/1)."""
    background = rng.choice(list(COLORS))
    image = np.empty((side, side, 3), np.float32)
    image[:] = COLORS[background]
    if rng.random() < 0.3:  # panels of other backgrounds (regional prompts' pictures): not shapes
        cut = rng.randrange(side // 4, side - side // 4)
        panel = np.array(COLORS[rng.choice([c for c in COLORS if c != background])], np.float32)
        if rng.random() < 0.5:
            image[:, cut:] = panel
        else:
            image[cut:, :] = panel
    label = np.zeros((side, side), bool)
    for _ in range(rng.choice((1, 1, 2, 3))):
        cover = _silhouette(rng, side)[..., None]
        colour = np.array(COLORS[rng.choice([c for c in COLORS if c != background])], np.float32)
        colour = np.clip(colour + rng.uniform(-25, 25), 0, 255)  # generated colours are near, not exact
        image = image * (1 - cover) + colour * cover
        label |= cover[..., 0] > 0.5
    picture = Image.fromarray(image.round().astype(np.uint8))
    if rng.random() < 0.5:
        picture = picture.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.5)))
    out = np.asarray(picture, np.float32)
    if rng.random() < 0.5:
        out = out + np.random.default_rng(rng.randrange(2**32)).normal(0, rng.uniform(1, 8), out.shape)
    return np.clip(out, 0, 255).astype(np.uint8), label


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = random.Random(f"{SEED}-detector-{step}")
    side = SIZES[step % len(SIZES)]
    pairs = [sample(rng, side) for _ in range(BATCH)]
    images = torch.from_numpy(np.stack([p[0] for p in pairs])).permute(0, 3, 1, 2).float() / 255
    labels = torch.from_numpy(np.stack([p[1] for p in pairs])).long()
    return normalise(images), labels


def normalise(images: torch.Tensor) -> torch.Tensor:
    """What the shipped image processor does (mean/std 0.5): the training sees the same numbers."""
    return (images - 0.5) / 0.5


def train_detector(steps: int) -> Path:
    from transformers import SegformerForSemanticSegmentation

    out = RUNS / "detector"
    model = SegformerForSemanticSegmentation(config())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"]
    model.train()
    bar = progress(steps, start, "detector")
    for step in range(start, steps):
        images, labels = batch(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR, warmup=50)
        logits = model(pixel_values=images).logits  # 1/4 of the input
        logits = F.interpolate(logits, size=labels.shape[-2:], mode="bilinear", align_corners=False)
        loss = F.cross_entropy(logits, labels, weight=torch.tensor([1.0, 2.0]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 200 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", model=model.state_dict(), opt=opt.state_dict(), step=step + 1)
    return export(model)


def export(model) -> Path:
    from transformers import SegformerImageProcessor

    model.eval()
    DETECTOR_OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(DETECTOR_OUT)
    processor = SegformerImageProcessor(do_resize=False, do_rescale=True, do_normalize=True,
                                        image_mean=[0.5] * 3, image_std=[0.5] * 3, do_reduce_labels=False)  # fmt: skip
    processor.save_pretrained(DETECTOR_OUT)
    log.info("detector: wrote %s", DETECTOR_OUT)
    return DETECTOR_OUT
