"""A tiny random Stable Diffusion pipeline built locally: no download, loads in ~0.1 s.

The tokenizer is a real CLIPTokenizer built from a vocab.json/merges.txt we write
(`models.train.tokenizer`), since diffusers' own tests download theirs and we cannot.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    DPMSolverMultistepScheduler,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel

from models.train.tokenizer import build_tokenizer

TINY_SIZE = 32  # pixels; VAE factor 2


def build_tiny_pipeline(seed: int = 0, unet_in_channels: int = 4) -> StableDiffusionPipeline:
    """`unet_in_channels=8` gives the UNet of an InstructPix2Pix pipeline (latents + image latents)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(max_length=16)
    unet = UNet2DConditionModel(
        sample_size=TINY_SIZE // 2,
        in_channels=unet_in_channels,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=16,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=TINY_SIZE,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            max_position_embeddings=16,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    scheduler = DPMSolverMultistepScheduler(
        beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction", timestep_spacing="trailing", steps_offset=1
    )
    return StableDiffusionPipeline(
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        unet=unet.eval(),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def save_tiny_pipeline(path: Path, seed: int = 0) -> Path:
    build_tiny_pipeline(seed).save_pretrained(path, safe_serialization=True)
    return path


def save_tiny_pix2pix(path: Path, seed: int = 0) -> Path:
    """A tiny instruction-edit (InstructPix2Pix) pipeline folder."""
    from diffusers import StableDiffusionInstructPix2PixPipeline

    parts = build_tiny_pipeline(seed, unet_in_channels=8).components
    StableDiffusionInstructPix2PixPipeline(**parts).save_pretrained(path, safe_serialization=True)
    return path
