"""A video request's memory on its device, estimated before any model work, and what fits when it does not.

Read from the loaded model, never from a table of model names: the transformer's config (`patch_size`,
`num_attention_heads`, `attention_head_dim`, `ffn_dim`), the pipeline's (`expand_timesteps`), the VAE's packing
(`vae_scale_factor_temporal` / `_spatial`) and decoder (the channels into its last convolution, 2-D or 3-D), the
weights as loaded (bytes per component, quantized ones by their real storage), the memory plan (MEMORY_MODE) and
the attention path (DeviceManager.attention). pipelines.run.checks refuses a clip that does not fit the device's
free memory with the largest frame count and size that do, a tiled decode, a quantized transformer or offload.

The estimate, in bytes (b: the device dtype's element size; b_vae: the VAE's):

    latent frames    L = (F - 1) / t + 1;   tokens N = ceil(L / p_t) x (H / s / p_h) x (W / s / p_w)
    transformer      A_T = g x N x b x [max(11.25 D, 4.25 D + 2 ffn) + 13 D if per-token timesteps
                                         + 2.3 x heads x max(N, T) on the math attention path]
    a UNet's         A_U = g x F x (H / s) x (W / s) x b x 25.5 c0     (AnimateDiff: c0 its first level's channels)
    VAE decode       C   = f x P / u x b_vae x (65 + 12.75 c for a 3-D decoder, 5.9 c for a 2-D one);  O = F x H x W x 12
                     A_V = C + 1.3 O whole,  max(C + 1.3 O, 4.7 O) tiled (the tiles are blended after the last)
    needed           = max over the phases (text encoder, denoiser, VAE decode) of the weights the memory plan
                       moves onto the device for it + its activations (the weights that stay there are in use)

D = heads x head_dim; g = 2 where the pipeline batches the guidance pass with the prompt's (LTX, CogVideoX; Wan
and HunyuanVideo call the transformer again after, g = 1); T the prompt's tokens; f the frames the VAE decodes at
once (Wan's causal VAE one latent frame, t frames; the frame-packed VAE 8; AnimateDiff's image VAE its call's
`decode_chunk_size`, 16; others the whole clip), P their pixels (a tile's when tiled); c the channels into the
decoder's last convolution and u the output pixels each of its positions makes (its channels over RGB: 1, or
LTX's 4x4 patch 16, Wan 2.2's 2x2 4); 12: float32 RGB. SDPA and the fused kernels are linear in tokens; the math path (vanilla) holds the heads' score matrices, self- then cross-attention.
Left out: the text encoder's and the latents' own activations (a few MB at 512 tokens), the VAE's mid-block
attention; an image-to-video encode is taken to cost no more than the decode.

Calibrated on the 2-core CPU: peak RSS over the RSS before, one run per fresh process, glibc's mmap threshold fixed
at 64 KiB so freed blocks leave the resident set. Per phase: floats a token per unit of D, tiny Wan (D 24) 11.25,
the embedded model (D 128) 11.0, one Wan 2.1 1.3B block (D 1536, ffn 8960) 15.9 = 4.2 D + 2 ffn, per-token
timesteps +13.0 D; math path 2.2-2.36 x heads x N^2; decode floats a pixel a frame, tiny Wan VAE (3-D, c 3)
101-106, a Wan 2.1-size VAE (3-D, c 96) 1288, the frame-packed VAE (2-D, c 16) 94; the clip's output 1.06-1.3 x O
whole, 4.3-4.7 x O tiled. End to end (`ImagePipeline.generate`, one step with guidance), `needed` over the measured
peak: tiny Wan 0.94-1.06 at 5-33 frames, 96-512 px, whole and tiled, SDPA and math (18 clips), the embedded
model 0.86-1.03 (5 points); the low end is its 64 px clips, whose 14-16 MiB peaks carry a few MiB the estimate leaves
out. Not measured: LTX, HunyuanVideo and CogVideoX (no checkpoint here; the tiny LTX's VAE takes 26 s a clip), whose
decoders the constants are extrapolated to. On accelerators fused kernels keep less than the CPU's convolutions (CPU
conv3d unfolds its 27 taps), so there the estimate errs high: a refusal is then cautious, not wrong by a factor.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch

from devices.manager import OFFLOAD_SAVERS
from devices.memory import human_bytes, module_bytes
from pipelines.schema.fields import RequestError

TOKEN_ATTENTION = 11.25  # floats a token per unit of D in a block's attention half: q, k, v, their rotary copies, out
TOKEN_FFN = 4.25  # floats a token per unit of D beside the feed-forward's two hidden tensors (2 x ffn)
TOKEN_TIMESTEP = 13.0  # a per-token timestep (expand_timesteps): its embedding and six modulations a token
MATH_SCORES = 2.3  # score matrices alive at once per head on the math path (the scores and their softmax)
DECODE_3D = (65.0, 12.75)  # floats a pixel a frame in a 3-D decoder's chunk: fixed, per channel into its last conv
DECODE_2D = 5.9  # floats a pixel a frame per channel into a 2-D (frame by frame) decoder's last conv
# VAE class -> (its decoder's floats a pixel over the constants above, a short clip costs a whole chunk). CogVideoX's
# decoder keeps conv caches and re-normalises on the upsampled latent at every level: measured on the tiny copy
# (tests/families.py), 5-33 frames at 64-128 px, its peak is flat from 5 to 9 frames and 1.8x the 3-D constants';
# HunyuanVideo's, 1.5x
DECODERS = {"AutoencoderKLCogVideoX": (1.8, True), "AutoencoderKLHunyuanVideo": (1.5, False)}
OUTPUT_WHOLE, OUTPUT_TILED = 1.3, 4.7  # float32 RGB copies of the whole clip at the decode's end, whole / tiled
TEXT_TOKENS = 512  # the prompt's tokens where the model names none: Wan's max_sequence_length (LTX's is 128)
# pipelines whose guidance pass is batched with the prompt's (torch.cat([latents] * 2), diffusers 0.42.1); the
# others (Wan, HunyuanVideo) call the transformer a second time, after the first call's activations are freed
BATCHED_GUIDANCE = frozenset(
    {"LTXPipeline", "LTXImageToVideoPipeline", "CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "AnimateDiffPipeline"}
)
# a UNet's (AnimateDiff's UNetMotionModel) floats a latent pixel a frame per channel of its first level: 25.0-27.0
# measured on tiny-shapes' UNet with motion modules (models/refiners/tiny-shapes-motion's architecture, 64 channels),
# 5-33 frames at 64-128 px with guidance
UNET_FLOATS = 25.5
PHASES = {
    "text encoder": ("text_encoder", "image_encoder"),
    "denoiser": ("transformer", "transformer_2", "unet"),
    "VAE decode": ("vae",),
}


@dataclass(frozen=True)
class VideoShape:
    """A loaded video model as the estimate reads it: its configs and its decoder, nothing of a request."""

    frame_step: int  # frames per latent frame (vae_scale_factor_temporal)
    spatial: int  # pixels per latent, a side (vae_scale_factor_spatial)
    patch: tuple[int, int, int]  # the transformer's (frames, height, width) patch
    heads: int
    head_dim: int
    ffn_dim: int
    unet_channels: int  # a UNet denoiser's first level's channels (AnimateDiff); 0 for a transformer
    per_token_timesteps: bool  # the pipeline's expand_timesteps (Wan 2.2 TI2V): a timestep embedding a token
    guidance_batch: int  # 2 where the guidance pass runs in one batch with the prompt's
    text_tokens: int
    act_bytes: int  # the device dtype's element size
    vae_bytes: int  # the VAE's element size
    vae_channels: int  # channels into the decoder's last convolution
    vae_unpatch: int  # output pixels per position of that convolution: its channels over RGB (LTX's 4x4 patch: 16)
    vae_3d: bool  # the decoder's convolutions are 3-D (a causal video VAE)
    decode_frames: int | None  # frames decoded at once (None: the whole clip)
    decode_scale: float  # the decoder's floats a pixel against the 3-D or 2-D constants (DECODERS)
    decode_whole_chunk: bool  # a clip shorter than decode_frames still costs a whole chunk (DECODERS)
    tile: tuple[int, int] | None  # (height, width) of the VAE's tiles, where it tiles


@dataclass(frozen=True)
class Clip:
    """What a request asks of the device: its frames and size, a guidance pass, a tiled decode, the attention path."""

    frames: int
    width: int
    height: int
    guidance: bool = True
    tiled: bool = False
    math_attention: bool = False


@dataclass(frozen=True)
class Weights:
    """The weights per the memory plan: those on the device for good (`resident`, already in use), and those each
    phase moves onto it while it runs (`onload`, 0 where nothing is offloaded)."""

    resident: int
    onload: dict[str, int]
    plan: str  # "on device", "model offload", "group offload"


@dataclass(frozen=True)
class Estimate:
    """One request's memory: each phase's activations, and what the device needs beyond the weights already on it."""

    transformer: int
    decode: int
    weights: Weights

    def phases(self) -> dict[str, int]:
        """Bytes each phase needs beyond the resident weights: what it moves on plus its activations."""
        acts = {"text encoder": 0, "denoiser": self.transformer, "VAE decode": self.decode}
        return {name: self.weights.onload.get(name, 0) + acts[name] for name in PHASES}

    @property
    def needed(self) -> int:
        return max(self.phases().values())

    @property
    def peak(self) -> int:
        """The device's peak for this request: the resident weights and the largest phase."""
        return self.weights.resident + self.needed


def _denoiser(pipe: Any) -> tuple[tuple[int, int, int], int, int, int, int]:
    """(patch, heads, head_dim, ffn_dim, unet_channels) of the pipeline's transformer, or of its UNet (AnimateDiff's
    UNetMotionModel: a token is a latent pixel of a frame, its first level's channels)."""
    if getattr(pipe, "transformer", None) is None:
        config = pipe.unet.config
        return (1, 1, 1), 1, 1, 0, int(config.block_out_channels[0])
    config = pipe.transformer.config
    patch = config.patch_size
    if isinstance(patch, int):  # LTX, CogVideoX, HunyuanVideo: a spatial patch and patch_size_t
        patch = (int(config.get("patch_size_t") or 1), patch, patch)
    heads, head_dim = int(config.num_attention_heads), int(config.attention_head_dim)
    ffn = config.get("ffn_dim") or int(config.get("mlp_ratio") or 4) * heads * head_dim  # diffusers' FeedForward: 4 x D
    return tuple(int(p) for p in patch), heads, head_dim, int(ffn), 0


def read_shape(pipe: Any, frame_step: int, spatial: int, text_tokens: int | None, dtype: torch.dtype) -> VideoShape:
    """`pipe`'s shape for the estimate: its denoiser's config, its VAE's decoder; `dtype`: what activations run in."""
    patch, heads, head_dim, ffn, unet_channels = _denoiser(pipe)
    vae = pipe.vae
    conv = _last_conv(vae)
    tile = getattr(vae, "tile_sample_min_height", None)  # the video VAEs' tile (Wan, LTX); none on the frame-packed VAE
    decoder = DECODERS.get(type(vae).__name__, (1.0, False))
    return VideoShape(
        frame_step=frame_step,
        spatial=spatial,
        patch=patch,
        heads=heads,
        head_dim=head_dim,
        ffn_dim=ffn,
        unet_channels=unet_channels,
        per_token_timesteps=bool(pipe.config.get("expand_timesteps")),
        guidance_batch=2 if type(pipe).__name__ in BATCHED_GUIDANCE else 1,
        text_tokens=text_tokens or TEXT_TOKENS,
        act_bytes=dtype.itemsize,
        vae_bytes=vae.dtype.itemsize,
        vae_channels=conv.in_channels,
        vae_unpatch=max(1, conv.out_channels // 3),
        vae_3d=isinstance(conv, torch.nn.Conv3d),
        decode_frames=_decode_frames(pipe, frame_step),
        decode_scale=decoder[0],
        decode_whole_chunk=decoder[1],
        tile=(tile, vae.tile_sample_min_width) if tile else None,
    )


def _last_conv(vae: Any) -> torch.nn.Conv2d | torch.nn.Conv3d:
    """The decoder's last convolution (its `conv_out`: AutoencoderKL's, Wan's, LTX's; the frame-packed VAE's image
    VAE's): the channels of the full-size stage."""
    decoder = next(module for name, module in vae.named_modules() if name.rsplit(".", 1)[-1] == "decoder")
    convs = [m for m in decoder.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))]
    return convs[-1]


def _decode_frames(pipe: Any, frame_step: int) -> int | None:
    """Frames the VAE decodes at once: Wan's causal VAE loops over latent frames (AutoencoderKLWan._decode),
    CogVideoX's over `num_latent_frames_batch_size` of them (2, the first chunk one more: 9 frames), HunyuanVideo's
    over tiles of `tile_sample_min_num_frames` + 1 (its framewise decoding, on by default), the frame-packed VAE
    decodes DECODE_FRAMES at a time, a pipeline whose call takes `decode_chunk_size` (AnimateDiff's image VAE) that
    many; the rest take the whole clip."""
    from diffusers import AutoencoderKLCogVideoX, AutoencoderKLHunyuanVideo, AutoencoderKLWan

    from pipelines.video import packed_vae  # diffusers at import: here, not when the settings are checked (app.py)

    vae = pipe.vae
    chunk = inspect.signature(pipe.__call__).parameters.get("decode_chunk_size")
    if chunk is not None and isinstance(chunk.default, int):
        return chunk.default

    if isinstance(vae, packed_vae.FramePackedVAE):
        return packed_vae.DECODE_FRAMES
    if isinstance(vae, AutoencoderKLCogVideoX):
        return vae.num_latent_frames_batch_size * frame_step + 1
    if isinstance(vae, AutoencoderKLHunyuanVideo) and vae.use_framewise_decoding:
        return vae.tile_sample_min_num_frames + 1
    return frame_step if isinstance(vae, AutoencoderKLWan) else None


def plan_weights(pipe: Any, component_bytes: dict[str, int], savers: list[str]) -> Weights:
    """The weights per the memory plan (`savers`: what MEMORY_MODE turned on at load, devices.manager): all resident;
    model offload moving each phase's components on in turn; group offload one block (and the next) at a time."""
    if "model_cpu_offload" in savers:
        onload = {phase: max((component_bytes.get(c, 0) for c in names), default=0) for phase, names in PHASES.items()}
        return Weights(0, onload, "model offload")
    group = [s for s in savers if s.startswith("group_offload")]
    if group:
        leaf = group[0] == "group_offload_leaf"
        onload = {
            phase: max((_group_share(pipe.components.get(c), leaf) * component_bytes.get(c, 0) for c in names), default=0)
            for phase, names in PHASES.items()
        }
        return Weights(0, {phase: int(value) for phase, value in onload.items()}, "group offload")
    return Weights(sum(component_bytes.values()), {}, "on device")


def _group_share(module: Any, leaf: bool) -> float:
    """The share of `module`'s weights on the device at once under diffusers' group offload: by block, the modules
    outside its block lists and two blocks (one running, the next copied); by leaf, two of its largest leaves."""
    if not isinstance(module, torch.nn.Module):
        return 0.0
    total = module_bytes(module) or 1
    if leaf:
        leaves = [m for m in module.modules() if not list(m.children())]
        return min(1.0, 2 * max(map(module_bytes, leaves), default=0) / total)
    blocks = [b for child in module.children() if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)) for b in child]
    if not blocks:
        return 1.0  # no block list (a text encoder's stack is one module): diffusers moves it whole
    sizes = [module_bytes(block) for block in blocks]
    return min(1.0, (total - sum(sizes) + 2 * max(sizes)) / total)


def tokens(shape: VideoShape, clip: Clip) -> int:
    """The transformer's tokens for one clip: latent frames x latent pixels, over the patch."""
    latent_frames = (clip.frames - 1) // shape.frame_step + 1
    pt, ph, pw = shape.patch
    return math.ceil(latent_frames / pt) * (clip.height // shape.spatial // ph) * (clip.width // shape.spatial // pw)


def transformer_bytes(shape: VideoShape, clip: Clip) -> int:
    """One denoiser call's activations: linear in tokens, plus the score matrices on the math path; a UNet's, linear
    in its tokens (latent pixels of every frame) and its first level's channels."""
    n, d = tokens(shape, clip), shape.heads * shape.head_dim
    batch = shape.guidance_batch if clip.guidance else 1
    if shape.unet_channels:
        return int(batch * n * UNET_FLOATS * shape.unet_channels * shape.act_bytes)
    floats = max(TOKEN_ATTENTION * d, TOKEN_FFN * d + 2 * shape.ffn_dim)
    if shape.per_token_timesteps:
        floats += TOKEN_TIMESTEP * d
    if clip.math_attention:
        floats += MATH_SCORES * shape.heads * max(n, shape.text_tokens)  # self- then cross-attention, one at a time
    return int(batch * n * floats * shape.act_bytes)


def decode_bytes(shape: VideoShape, clip: Clip) -> int:
    """The VAE decode: the chunk it decodes at once (its frames, a tile's pixels when tiled), and the clip's output."""
    whole_chunk = shape.decode_whole_chunk and shape.decode_frames
    frames = shape.decode_frames if whole_chunk else min(clip.frames, shape.decode_frames or clip.frames)
    tiled = clip.tiled and shape.tile is not None
    height, width = (min(clip.height, shape.tile[0]), min(clip.width, shape.tile[1])) if tiled else (clip.height, clip.width)
    fixed, per_channel = DECODE_3D if shape.vae_3d else (0.0, DECODE_2D)
    positions = frames * height * width / shape.vae_unpatch  # where the last stage runs below the output's size
    chunk = positions * shape.vae_bytes * (fixed + per_channel * shape.vae_channels) * shape.decode_scale
    output = clip.frames * clip.width * clip.height * 12  # float32 RGB
    if tiled:  # the tiles' outputs are blended after the last tile's decode is freed
        return int(max(chunk + OUTPUT_WHOLE * output, OUTPUT_TILED * output))
    return int(chunk + OUTPUT_WHOLE * output)


def estimate(shape: VideoShape, weights: Weights, clip: Clip) -> Estimate:
    return Estimate(transformer_bytes(shape, clip), decode_bytes(shape, clip), weights)


@dataclass(frozen=True)
class Device:
    """Where the request runs: its name, its free memory, whether MEMORY_MODE can move weights off it (not the CPU's)."""

    name: str
    free: int
    can_offload: bool


def alternatives(pipe: Any, component_bytes: dict[str, int], savers: list[str], quantized: bool, device: Device) -> list[tuple[str, Weights]]:
    """Other plans that could be loaded instead, with their weights: the transformer in int8 (one byte a weight)
    where it is not quantized yet; model and group offload where nothing is offloaded and the device is not the CPU."""
    out = []
    if not quantized:
        int8 = dict(component_bytes)
        for name in PHASES["denoiser"]:
            module = pipe.components.get(name)
            if isinstance(module, torch.nn.Module):
                int8[name] = sum(p.numel() for p in module.parameters())
        if int8 != component_bytes:
            name = "unet" if "unet" in pipe.components else "transformer"
            out.append((f"a quantized {name} (QUANTIZATION={name}=torchao-int8wo)", plan_weights(pipe, int8, savers)))
    if device.can_offload and not set(OFFLOAD_SAVERS) & set(savers):
        out.append(("MEMORY_MODE=max (model offload)", plan_weights(pipe, component_bytes, ["model_cpu_offload"])))
        out.append(("MEMORY_MODE=group (group offload)", plan_weights(pipe, component_bytes, ["group_offload_block"])))
    return out


def largest_frames(shape: VideoShape, weights: Weights, clip: Clip, budget: int) -> int | None:
    """The most frames on the model's step (k x step + 1, fewer than asked) that fit `budget` at this size."""
    for k in range((clip.frames - 1) // shape.frame_step - 1, -1, -1):
        frames = k * shape.frame_step + 1
        if estimate(shape, weights, dataclasses.replace(clip, frames=frames)).needed <= budget:
            return frames
    return None


def largest_size(shape: VideoShape, weights: Weights, clip: Clip, budget: int, step: int) -> tuple[int, int] | None:
    """The largest (width, height) on the size step, at the clip's aspect ratio and frames, that fits `budget`."""
    for width in range(clip.width - step, step - 1, -step):
        height = max(step, round(clip.height * width / clip.width / step) * step)
        if estimate(shape, weights, dataclasses.replace(clip, width=width, height=height)).needed <= budget:
            return width, height
    return None


def refusal(shape: VideoShape, weights: Weights, clip: Clip, device: Device, step: int,
            others: list[tuple[str, Weights]] = ()) -> RequestError:  # fmt: skip
    """Why `clip` does not fit the device's free memory, naming the field (num_frames, or width where no frame count
    fits), the estimate, what is free and what would fit: fewer frames, a smaller size, a tiled decode where the VAE
    tiles, another memory plan (`others`, from `alternatives`)."""
    found, h = estimate(shape, weights, clip), human_bytes
    frames = largest_frames(shape, weights, clip, device.free)
    size = largest_size(shape, weights, clip, device.free, step)
    fits = [f"{frames} frame{'s' if frames > 1 else ' (a still picture)'} at {clip.width}x{clip.height}"] if frames else []
    fits += [f"{clip.frames} frames at {size[0]}x{size[1]}"] if size else []
    tiled = dataclasses.replace(clip, tiled=True)
    if shape.tile is not None and not clip.tiled and estimate(shape, weights, tiled).needed <= device.free:
        fits.append(f"the VAE decoding in tiles (TILED_VAE_PIXELS below {clip.width * clip.height})")
    for label, other in others:
        budget = device.free + weights.resident - other.resident  # the weights it would not keep on the device
        if estimate(shape, other, clip).needed <= budget:
            fits.append(f"{label}, about {h(estimate(shape, other, clip).peak)} at its peak")
    parts = ", ".join(f"{name} {h(value)}" for name, value in found.phases().items() if value)
    detail = (
        f"{clip.frames} frames at {clip.width}x{clip.height} need about {h(found.needed)} of {device.name} memory "
        f"beyond the loaded weights (weights {weights.plan}; by phase: {parts}) and {h(device.free)} is free. "
        f"What would fit: {'; or '.join(fits) if fits else 'nothing smaller on this device'}"
    )
    return RequestError("num_frames" if frames or not size else "width", detail)
