"""Architectures of the embedded model, as plain diffusers / transformers configs.

Sizes were chosen by timing training steps on the project's 2-core CPU (one thread):
- VAE f4 (64x64x3 -> 16x16x4), 16/32/64 channels: 0.9 s per batch of 32.
- UNet 64/128/128 channels, cross-attention only at 8x8 and 4x4: 1.2 s per batch of 64 and
  63 ms per inference call at batch 8. Cross-attention at 16x16 cost 2.3x more for no
  benefit in a world of centred single shapes.
- `addition_embed_type="text"` adds an attention-pooled text embedding to the timestep
  embedding, so every ResNet block is conditioned on the prompt (colors are global facts
  of the image; plain cross-attention learned them slowly in the planning prototype).
- Scheduler: cosine betas, v-prediction and "trailing" timesteps, so that sampling starts
  from (almost) pure noise; SD's scaled-linear schedule leaks the mean color at t=T, which
  hurts exactly the background-color accuracy we care about.
"""

from __future__ import annotations

from diffusers import AutoencoderKL, DDPMScheduler, DPMSolverMultistepScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

LATENT_CHANNELS = 4
LATENT_SIZE = 16
TEXT_HIDDEN = 64
MAX_TOKENS = 16


def make_vae() -> AutoencoderKL:
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 64),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=8,
        sample_size=64,
    )


def make_unet() -> UNet2DConditionModel:
    return UNet2DConditionModel(
        sample_size=LATENT_SIZE,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        layers_per_block=1,
        block_out_channels=(64, 128, 128),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=TEXT_HIDDEN,
        attention_head_dim=4,
        norm_num_groups=16,
        addition_embed_type="text",
        addition_embed_type_num_heads=4,
    )


def make_text_encoder(vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> CLIPTextModel:
    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=TEXT_HIDDEN,
        intermediate_size=4 * TEXT_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_TOKENS,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        projection_dim=TEXT_HIDDEN,
    )
    return CLIPTextModel(config)


SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    beta_schedule="squaredcos_cap_v2",
    prediction_type="v_prediction",
    timestep_spacing="trailing",
    steps_offset=1,
)


def make_train_scheduler() -> DDPMScheduler:
    return DDPMScheduler(**SCHEDULER_CONFIG)


def make_sample_scheduler() -> DPMSolverMultistepScheduler:
    return DPMSolverMultistepScheduler(**SCHEDULER_CONFIG, algorithm_type="dpmsolver++", solver_order=2)
