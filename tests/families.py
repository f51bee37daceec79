"""Tiny offline copies of the diffusers model families our users run.

Built from small configs, as diffusers' own tests do in `get_dummy_components`, but with every
tokenizer written locally (diffusers' tests download theirs; the Hub is unreachable here).
The architecture of each family is real: the same pipeline class, transformer/UNet class,
VAE class, text encoders, latent packing and attention processors as the full model, only
with a handful of channels. VAEs have the full model's scale factor (8, or 32 for Sana's
DC-AE), so sizes, size steps and packing behave as on the real model.

`build(name, path)` writes a diffusers folder that `DiffusionPipeline.from_pretrained` loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.train.tokenizer import build_tokenizer

# A small vocabulary: enough for test prompts to be words, not unknown tokens.
WORDS = ["a", "photo", "of", "cat", "dog", "red", "blue", "green", "circle", "square", "triangle", "background", "white", "black", "make", "the", "it", "turn", "into", "on", "in", "with", "and", "sky", "tree", "house", "car", "long", "prompt", "word", "painting"]


# --------------------------------------------------------------------------- tokenizers
def clip_tokenizer():
    """A real CLIPTokenizer (BPE written locally) with CLIP's 77-token window."""
    return build_tokenizer(words=tuple(WORDS), max_length=77)


LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789.,'-"


def t5_tokenizer():
    """A T5TokenizerFast (Unigram, as T5's): pad 0, eos 1, unk 2; appends </s> like the real one."""
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + w, -1.0) for w in WORDS] + [(c, -5.0) for c in LETTERS]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def gemma_tokenizer():
    """A GemmaTokenizerFast (Sana's text encoder is Gemma 2), character-level: BPE with no merges."""
    from transformers import GemmaTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "▁"])}
    for c in LETTERS + LETTERS.upper() + ":;!?()":
        vocab.setdefault(c, len(vocab))
    return GemmaTokenizerFast(vocab=vocab, merges=[], model_max_length=8192)


# --------------------------------------------------------------------------- encoders and VAEs
def clip_config(projection_dim: int = 32, positions: int = 77):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(clip_tokenizer()), hidden_size=32, intermediate_size=37, num_attention_heads=4,
        num_hidden_layers=2, max_position_embeddings=positions, projection_dim=projection_dim, hidden_act="gelu",
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )


def clip_tokens_fixed(encoder):
    """CLIP configs want the tokenizer's bos/eos ids, which our BPE vocabulary puts at the end."""
    tok = clip_tokenizer()
    encoder.config.bos_token_id, encoder.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    encoder.config.pad_token_id = tok.pad_token_id
    return encoder


def t5_encoder(d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=64, d_model=d_model, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    return T5EncoderModel(config).eval()


def vae_f8(latent_channels: int = 4, **extra):
    """AutoencoderKL with 4 blocks: the real scale factor 8 with 4 channels per block."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=latent_channels, block_out_channels=(4, 4, 4, 4),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=2, sample_size=64, **extra,
    ).eval()


# --------------------------------------------------------------------------- families
def sd15(path: Path, edit: bool = False) -> None:
    """Stable Diffusion 1.5 (PNDM, its real default scheduler); `edit`: InstructPix2Pix (8-channel UNet)."""
    from diffusers import (
        PNDMScheduler,
        StableDiffusionInstructPix2PixPipeline,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextModel

    unet = UNet2DConditionModel(
        sample_size=8, in_channels=8 if edit else 4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32, attention_head_dim=4,
        norm_num_groups=8,
    ).eval()
    scheduler = PNDMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True, steps_offset=1
    )
    parts = dict(
        vae=vae_f8(), text_encoder=clip_tokens_fixed(CLIPTextModel(clip_config()).eval()),
        tokenizer=clip_tokenizer(), unet=unet, scheduler=scheduler, safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )
    cls = StableDiffusionInstructPix2PixPipeline if edit else StableDiffusionPipeline
    cls(**parts).save_pretrained(path, safe_serialization=True)


def sdxl(path: Path) -> None:
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=6 * 8 + 32,
        cross_attention_dim=64, norm_num_groups=4,
    ).eval()
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
        timestep_spacing="leading",
    )
    StableDiffusionXLPipeline(
        vae=vae_f8(), text_encoder=clip_tokens_fixed(CLIPTextModel(clip_config()).eval()),
        text_encoder_2=clip_tokens_fixed(CLIPTextModelWithProjection(clip_config()).eval()),
        tokenizer=clip_tokenizer(), tokenizer_2=clip_tokenizer(), unet=unet, scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
    ).save_pretrained(path, safe_serialization=True)


def sd3(path: Path) -> None:
    """SD3: two CLIPs (32 + 32 wide, padded to T5's 64) + T5; patch size 2, so the size step is 16;
    16 latent channels as the real model (its inpainting pipeline checks for them)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=1, attention_head_dim=8,
        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=64, pooled_projection_dim=64,
    ).eval()
    StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae_f8(16, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=clip_tokens_fixed(CLIPTextModelWithProjection(clip_config()).eval()),
        tokenizer=clip_tokenizer(),
        text_encoder_2=clip_tokens_fixed(CLIPTextModelWithProjection(clip_config()).eval()),
        tokenizer_2=clip_tokenizer(), text_encoder_3=t5_encoder(64), tokenizer_3=t5_tokenizer(),
    ).save_pretrained(path, safe_serialization=True)


def flux(path: Path, kontext: bool = False) -> None:
    """Flux-dev (guidance-distilled: guidance_embeds) or Flux Kontext; latents packed 2x2."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
        guidance_embeds=True,
    ).eval()
    cls = FluxKontextPipeline if kontext else FluxPipeline
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=16, max_image_seq_len=256, base_shift=0.5, max_shift=1.15, use_dynamic_shifting=True
    )
    pipe = cls(
        transformer=transformer, scheduler=scheduler,
        vae=vae_f8(shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=clip_tokens_fixed(CLIPTextModel(clip_config()).eval()), tokenizer=clip_tokenizer(),
        text_encoder_2=t5_encoder(32), tokenizer_2=t5_tokenizer(),
    )
    pipe.save_pretrained(path, safe_serialization=True)


def pixart_sigma(path: Path) -> None:
    """PixArt-Σ: T5 only, resolution binning (sample_size 32 -> the 256-px aspect-ratio bins)."""
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    transformer = PixArtTransformer2DModel(
        sample_size=32, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=2,
        caption_channels=32, in_channels=4, cross_attention_dim=16, out_channels=8, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6,
    ).eval()
    PixArtSigmaPipeline(
        transformer=transformer, vae=vae_f8(), scheduler=DPMSolverMultistepScheduler(),
        text_encoder=t5_encoder(32), tokenizer=t5_tokenizer(),
    ).save_pretrained(path, safe_serialization=True)


def sana(path: Path) -> None:
    """Sana: Gemma 2 text encoder, DC-AE with the real factor 32 (6 tiny blocks), linear attention."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    transformer = SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2, attention_head_dim=4,
        num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=16,
    ).eval()
    blocks = 6
    vae = AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock",) * (blocks - 1) + ("EfficientViTBlock",),
        decoder_block_types=("ResBlock",) * (blocks - 1) + ("EfficientViTBlock",),
        encoder_block_out_channels=(4,) * blocks, decoder_block_out_channels=(4,) * blocks,
        encoder_qkv_multiscales=((),) * (blocks - 1) + ((5,),),
        decoder_qkv_multiscales=((),) * (blocks - 1) + ((5,),),
        encoder_layers_per_block=(1,) * blocks, decoder_layers_per_block=(1,) * blocks,
        downsample_block_type="conv", upsample_block_type="interpolate", decoder_norm_types="rms_norm",
        decoder_act_fns="silu", scaling_factor=0.41407,
    ).eval()
    tokenizer = gemma_tokenizer()
    encoder = Gemma2Model(
        Gemma2Config(
            head_dim=16, hidden_size=8, intermediate_size=16, num_attention_heads=2, num_hidden_layers=1,
            num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=2048,
            pad_token_id=0, bos_token_id=2, eos_token_id=1,
        )
    ).eval()
    SanaPipeline(
        tokenizer=tokenizer, text_encoder=encoder, vae=vae, transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    ).save_pretrained(path, safe_serialization=True)


QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]


def qwen_tokenizer():
    """A Qwen2Tokenizer: byte-level BPE over the 256 byte symbols (no merges) + Qwen's special tokens."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    return Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIAL[1:], model_max_length=32768,
    )


def qwen_text_encoder(tok):
    """Qwen2.5-VL (text + a one-block vision tower), the ids of its special tokens taken from `tok`."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = dict(zip(QWEN_SPECIAL, tok.convert_tokens_to_ids(QWEN_SPECIAL), strict=True))
    text = {
        "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "rope_theta": 1000000.0, "vocab_size": len(tok),
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
        "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
    }
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16}
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, hidden_size=16, vocab_size=len(tok),
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        vision_token_id=ids["<|image_pad|>"], image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def qwen_image(path: Path, edit: bool = False) -> None:
    """Qwen-Image (true CFG, 2x2 packed latents, its own 3-D VAE with factor 8); `edit`: Qwen-Image-Edit,
    whose Qwen2-VL processor needs torchvision (its video processor has no PIL fallback)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPipeline,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    tok = qwen_tokenizer()
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
    ).eval()
    vae = AutoencoderKLQwenImage(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    ).eval()
    parts = dict(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=qwen_text_encoder(tok), tokenizer=tok,
    )
    if not edit:
        QwenImagePipeline(**parts).save_pretrained(path, safe_serialization=True)
        return
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16),
        tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
    )
    QwenImageEditPipeline(**parts, processor=processor).save_pretrained(path, safe_serialization=True)


def llama_tokenizer():
    """A Llama-3-style PreTrainedTokenizerFast (word level): <|begin_of_text|> prepended."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "<|begin_of_text|>", "<|end_of_text|>", *WORDS, *LETTERS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", unk_token="<unk>",
        pad_token="<|end_of_text|>", model_max_length=8192,
    )


def hidream_i1(path: Path) -> None:
    """HiDream-I1: two CLIPs (128 positions, as HiDream pads them), T5, Llama (hidden states of layers
    0 and 1), a mixture-of-experts transformer whose attention calls SDPA itself. It renders every
    request at its own area ((128 x VAE factor)^2): 4,096 tokens even for this tiny copy."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline, HiDreamImageTransformer2DModel
    from transformers import CLIPTextModelWithProjection, LlamaConfig, LlamaForCausalLM

    tok4 = llama_tokenizer()
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok4), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        )
    ).eval()
    transformer = HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=4, caption_channels=[32, 16], text_emb_dim=64, num_routed_experts=4,
        num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(128, 128), llama_layers=(0, 1),
    ).eval()
    clip = [clip_tokens_fixed(CLIPTextModelWithProjection(clip_config(positions=128)).eval()) for _ in range(2)]
    HiDreamImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae_f8(scaling_factor=0.3611, shift_factor=0.1159),
        text_encoder=clip[0], tokenizer=clip_tokenizer(), text_encoder_2=clip[1], tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5_encoder(32), tokenizer_3=t5_tokenizer(), text_encoder_4=llama, tokenizer_4=tok4,
        transformer=transformer,
    ).save_pretrained(path, safe_serialization=True)


@dataclass(frozen=True)
class Family:
    """One model family: how to build its tiny copy and what a user can do with it."""

    name: str
    pipeline_class: str
    build_fn: Callable[[Path], None]
    text_to_image: bool = True
    edit: bool = False  # an instruction-edit pipeline (takes an image and an instruction)
    lora: bool = True  # diffusers has a LoRA loader for this pipeline


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("sd15", "StableDiffusionPipeline", sd15),
        Family("sdxl", "StableDiffusionXLPipeline", sdxl),
        Family("sd3", "StableDiffusion3Pipeline", sd3),
        Family("flux", "FluxPipeline", flux),
        Family("flux-kontext", "FluxKontextPipeline", lambda p: flux(p, kontext=True), False, True),
        Family("pixart-sigma", "PixArtSigmaPipeline", pixart_sigma, lora=False),
        Family("sana", "SanaPipeline", sana),
        Family("hidream-i1", "HiDreamImagePipeline", hidream_i1),
        Family("qwen-image", "QwenImagePipeline", qwen_image),
        Family("qwen-image-edit", "QwenImageEditPipeline", lambda p: qwen_image(p, edit=True), False, True),
        Family(
            "instruct-pix2pix", "StableDiffusionInstructPix2PixPipeline", lambda p: sd15(p, edit=True), False, True
        ),
    )
}


# Qwen-Image-Edit's Qwen2.5-VL encoder makes each of its tests take 15-70 s on 2 cores: the slow tier.
SLOW_FAMILIES = {"qwen-image-edit"}


def save_denoiser_lora(raw: Any, folder: Path, name: str) -> None:
    """A non-zero peft LoRA on the denoiser's attention of `raw` (a diffusers pipeline), saved the way diffusers
    saves them (`folder`/`name`.safetensors); the pipeline is left as it was."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    kind = "unet" if "unet" in raw.components else "transformer"
    model = getattr(raw, kind)
    torch.manual_seed(0)
    model.add_adapter(
        LoraConfig(r=4, lora_alpha=16, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False),
        adapter_name="tmp",
    )
    layers = get_peft_model_state_dict(model, adapter_name="tmp")
    model.delete_adapters("tmp")
    type(raw).save_lora_weights(folder, **{f"{kind}_lora_layers": layers}, weight_name=f"{name}.safetensors")


def params(names) -> list:
    """Family names as pytest parameters, the slow families marked `slow` (left out of `-m "not slow"`)."""
    import pytest

    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_FAMILIES else name for name in names]


def build(name: str, path: Path, seed: int = 0) -> Path:
    """Write the tiny `name` model to `path` (seeded) and return it; a no-op when already there."""
    if (path / "model_index.json").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    FAMILIES[name].build_fn(path)
    index = json.loads((path / "model_index.json").read_text())
    assert index["_class_name"] == FAMILIES[name].pipeline_class, index["_class_name"]
    return path


# --------------------------------------------------------------------------- video families (pipelines.video)
def umt5_encoder(d_model: int = 32):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=64, d_model=d_model, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    return UMT5EncoderModel(config).eval()


def wan_transformer():
    """diffusers' tests/pipelines/wan config: 2 heads of 12, 2 layers, patch (1, 2, 2)."""
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )  # fmt: skip


def wan(path: Path, two_experts: bool = False, ti2v: bool = False) -> None:
    """Wan 2.1 text-to-video (UMT5, the causal 3-D VAE: 4 frames and 8x8 pixels per latent, flow matching);
    `two_experts`: Wan 2.2 A14B (a low-noise transformer_2 below boundary_ratio); `ti2v`: Wan 2.2 TI2V-5B
    (per-token timesteps, `expand_timesteps`: image-to-video with the same weights)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True])
    extra = {"transformer_2": wan_transformer(), "boundary_ratio": 0.875} if two_experts else {}
    WanPipeline(
        tokenizer=t5_tokenizer(), text_encoder=umt5_encoder(), vae=vae.eval(), transformer=wan_transformer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), expand_timesteps=ti2v, **extra,
    ).save_pretrained(path, safe_serialization=True)  # fmt: skip


def ltx(path: Path, timestep_decode: bool = False) -> None:
    """LTX-Video: T5, its video VAE (LTX-Video packs 32x32 pixels and 8 frames per latent; this tiny one 4 frames), frame-rate conditioned;
    `timestep_decode`: LTX-Video 0.9.1 and later (a timestep-aware VAE: decode_timestep, decode_noise_scale)."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32,
    )  # fmt: skip
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
        upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=timestep_decode, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False,
    )  # fmt: skip
    LTXPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae.eval(), text_encoder=t5_encoder(), tokenizer=t5_tokenizer(),
        transformer=transformer,
    ).save_pretrained(path, safe_serialization=True)  # fmt: skip


def cogvideox(path: Path) -> None:
    """CogVideoX (THUDM; diffusers' tests' config): T5 (226 tokens, as the real models), its 3-D VAE (4 frames and
    8x8 pixels per latent), a transformer over text and video tokens together, v-prediction DDIM."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline, CogVideoXTransformer3DModel

    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2, text_embed_dim=32,
        num_layers=1, sample_width=4, sample_height=4, sample_frames=9, patch_size=2, temporal_compression_ratio=4,
        max_text_seq_length=226,
    )  # fmt: skip
    vae = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
    )  # fmt: skip
    CogVideoXPipeline(
        tokenizer=t5_tokenizer(), text_encoder=t5_encoder(), vae=vae.eval(), transformer=transformer,
        scheduler=CogVideoXDDIMScheduler(prediction_type="v_prediction", timestep_spacing="trailing"),
    ).save_pretrained(path, safe_serialization=True)  # fmt: skip


def hunyuan_video(path: Path) -> None:
    """HunyuanVideo (diffusers' tests' config): a Llama (its hidden states two layers from the end, after a chat
    template cropped off) and a CLIP (pooled), guidance embedded (distilled), its 3-D VAE (4 frames and 8x8 pixels
    per latent), flow matching."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextModel, LlamaConfig, LlamaModel

    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1, num_single_layers=1,
        num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True, text_embed_dim=16,
        pooled_projection_dim=32, rope_axes_dim=(2, 4, 4),
    )  # fmt: skip
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
        temporal_compression_ratio=4, mid_block_add_attention=True,
    )  # fmt: skip
    llama = LlamaModel(LlamaConfig(
        hidden_size=16, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, vocab_size=len(llama_tokenizer()),
        hidden_act="gelu", bos_token_id=1, eos_token_id=2, pad_token_id=2,
    ))  # fmt: skip
    HunyuanVideoPipeline(
        text_encoder=llama.eval(), tokenizer=llama_tokenizer(), transformer=transformer, vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder_2=clip_tokens_fixed(CLIPTextModel(clip_config()).eval()), tokenizer_2=clip_tokenizer(),
    ).save_pretrained(path, safe_serialization=True)  # fmt: skip


def animatediff(path: Path) -> None:
    """AnimateDiff (diffusers' tests' config): an SD 1.5 UNet with a MotionAdapter's temporal attention between the
    frames (`UNetMotionModel`), its image VAE frame by frame, DDIM."""
    from diffusers import AnimateDiffPipeline, DDIMScheduler, MotionAdapter, UNet2DConditionModel
    from transformers import CLIPTextModel

    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=4, norm_num_groups=8,
    )  # fmt: skip
    adapter = MotionAdapter(
        block_out_channels=(16, 32), motion_layers_per_block=1, motion_norm_num_groups=8, motion_num_attention_heads=2,
        motion_max_seq_length=32,
    )  # fmt: skip
    AnimateDiffPipeline(
        vae=vae_f8(), text_encoder=clip_tokens_fixed(CLIPTextModel(clip_config()).eval()), tokenizer=clip_tokenizer(),
        unet=unet, motion_adapter=adapter, scheduler=DDIMScheduler(beta_schedule="linear", clip_sample=False),
    ).save_pretrained(path, safe_serialization=True)  # fmt: skip


VIDEO_FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("wan", "WanPipeline", wan),
        Family("wan2.2-a14b", "WanPipeline", lambda p: wan(p, two_experts=True)),
        Family("wan2.2-ti2v", "WanPipeline", lambda p: wan(p, ti2v=True)),
        Family("ltx", "LTXPipeline", ltx),
        Family("ltx-0.9.1", "LTXPipeline", lambda p: ltx(p, timestep_decode=True)),
        Family("cogvideox", "CogVideoXPipeline", cogvideox),
        Family("hunyuan-video", "HunyuanVideoPipeline", hunyuan_video),
        Family("animatediff", "AnimateDiffPipeline", animatediff),
    )
}


def build_video(name: str, path: Path, seed: int = 0) -> Path:
    """Write the tiny video family `name` to `path` (seeded); a no-op when already there."""
    if (path / "model_index.json").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    VIDEO_FAMILIES[name].build_fn(path)
    return path
