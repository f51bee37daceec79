"""The values that flow along a ComfyUI graph's links, one class per ComfyUI type.

ComfyUI moves tensors between nodes; here a link carries a description, and the engine runs a
request only when pixels are needed. MODEL, CLIP and VAE name the model the engine serves (with the
LoRAs a LoraLoader added); CONDITIONING is a prompt in our prompt language; a LATENT is what its
pixels will be — an empty canvas, encoded pictures, or a sampler's request not yet run (`Sampled`),
possibly to be enlarged — so that a second sampler on an enlarged latent runs as our hires fix, in
one engine job, exactly as the UI's. IMAGE is a batch of pictures, MASK one greyscale picture
(white: redraw). A video latent carries its frames (and its first frame, for image-to-video): a
sampler on it is one video request, and its IMAGE is every frame of its clips. The custom-sampling
family's NOISE, SAMPLER, SIGMAS and GUIDER are the parts of a KSampler's inputs, put together again
by SamplerCustom(Advanced). Nothing here runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from PIL import Image

from pipelines import GenerationRequest

# ComfyUI's resize method names -> Pillow's filters: ImageScale's choices, and what a LatentUpscale(By)
# that cannot become our hires fix resizes its pictures with ("bislerp" has no Pillow twin: bilinear)
RESAMPLE = {
    "nearest-exact": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR, "area": Image.Resampling.BOX,
    "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS, "bislerp": Image.Resampling.BILINEAR,
}  # fmt: skip


@dataclass(frozen=True)
class Model:
    name: str  # the model the engine serves
    loras: tuple[tuple[str, float], ...] = ()  # (name, strength) in the order LoraLoaders added them

    def with_lora(self, name: str, strength: float) -> Model:
        return replace(self, loras=(*[lo for lo in self.loras if lo[0] != name], (name, strength)))


@dataclass(frozen=True)
class Clip:
    name: str
    loras: tuple[tuple[str, float], ...] = ()
    last_layer: int = -1  # CLIPSetLastLayer: -2 is A1111's Clip skip 2 (the request's clip_skip)


@dataclass(frozen=True)
class Vae:
    name: str


@dataclass(frozen=True)
class Control:
    """A ControlNet applied to a conditioning (ControlNetApply / ControlNetApplyAdvanced)."""

    name: str  # one of the model's ControlNets
    image: Image.Image  # the control image as given (a preprocessor node, or a ready map)
    strength: float = 1.0
    start: float = 0.0
    end: float = 1.0


@dataclass(frozen=True)
class Conditioning:
    text: str
    clip: Clip
    controls: tuple[Control, ...] = ()


@dataclass(frozen=True)
class Sampled:
    """A sampler's request, run when its pixels are needed (once, however many nodes read it)."""

    node: str  # the sampler node's id (progress and previews name it)
    request: GenerationRequest
    outcome: list[Any] = field(default_factory=list, compare=False)  # [Pictures] once run


@dataclass(frozen=True)
class Pictures:
    """IMAGE: a batch of RGB pictures, with our metadata for each when a sampler made them."""

    images: tuple[Image.Image, ...]
    metadata: tuple[dict[str, Any], ...] = ()
    seeds: tuple[int, ...] = ()


@dataclass(frozen=True)
class Mask:
    image: Image.Image  # "L": white (255) is redrawn


@dataclass(frozen=True)
class Latent:
    width: int  # in pixels, as ComfyUI's nodes show them
    height: int
    batch: int = 1
    sampled: Sampled | None = None  # a sampler's output, not yet run
    pixels: Pictures | None = None  # encoded pictures (VAEEncode)
    mask: Mask | None = None  # SetLatentNoiseMask / VAEEncodeForInpaint
    upscale_method: str | None = None  # LatentUpscale(By): enlarged to width x height by this method
    frames: int | None = None  # a video latent (EmptyHunyuanLatentVideo, WanImageToVideo, ...): a clip's frames
    start: Image.Image | None = None  # a video latent's first frame (image-to-video), at the latent's size

    @property
    def empty(self) -> bool:
        return self.sampled is None and self.pixels is None


@dataclass(frozen=True)
class Video:
    """VIDEO (CreateVideo): frames and the rate they play at."""

    pictures: Pictures
    fps: float


@dataclass(frozen=True)
class ClipVision:
    """CLIP_VISION / CLIP_VISION_OUTPUT: the video model's own image encoder (it reads the start image itself)."""

    name: str


@dataclass(frozen=True)
class Noise:
    seed: int


@dataclass(frozen=True)
class Sigmas:
    """BasicScheduler's schedule, kept as what it was asked for (our samplers make the sigmas)."""

    scheduler: str
    steps: int
    denoise: float = 1.0


@dataclass(frozen=True)
class Guider:
    model: Model
    positive: Conditioning
    negative: Conditioning
    cfg: float
