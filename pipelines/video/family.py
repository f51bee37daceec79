"""What a video pipeline can do, read from the pipeline itself: frames, their step, fps, image-to-video.

A diffusers pipeline makes clips when its `__call__` takes `num_frames` (Wan, LTX, HunyuanVideo, CogVideoX;
AnimateDiff: an image UNet with motion modules, as many frames as their positional table). Its frame step is its
VAE's temporal packing (`vae_scale_factor_temporal`: Wan and LTX pack 4 and 8 frames per latent frame, so a clip
has k x step + 1 frames; 1 for an image VAE); its default frames, size and frame rate are its signature's (LTX's
`frame_rate`), else a model's vocabulary's (the embedded model's).

Image-to-video runs on the family's own twin built over the same components (`from_pipe`):
- `WanPipeline` whose config has `expand_timesteps` (Wan 2.2 TI2V-5B, the embedded tiny-shapes-video):
  `WanImageToVideoPipeline` with the first latent frame given, no image encoder;
- `LTXPipeline`: `LTXImageToVideoPipeline`;
- a pipeline that itself takes `image` (`WanImageToVideoPipeline`, Wan 2.1 I2V-14B) needs one;
- `AnimateDiffPipeline` (no image input): itself, its first latent frame kept on the image's path
  (pipelines.video.first_frame).
Wan 2.1's text-to-video checkpoints have no image-to-video twin (their I2V model is another checkpoint).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from pipelines.schema.request import DECODE_KNOBS, GenerationRequest, RequestError
from pipelines.video.first_frame import KEEPS_FIRST_FRAME

# text-to-video class -> its image-to-video twin (built with from_pipe), where diffusers 0.42.1 has one that
# takes the same components
I2V_TWINS = {"WanPipeline": "WanImageToVideoPipeline", "LTXPipeline": "LTXImageToVideoPipeline"}
FALLBACK_FPS = 16.0  # Wan's (its signature names none); LTX says its own (frame_rate=25)
FALLBACK_FRAMES = 33


@dataclass(frozen=True)
class VideoAbilities:
    """One video model's clips: its frames (k x frame_step + 1), fps, image-to-video and second expert."""

    default_frames: int
    frame_step: int
    max_frames: int
    default_fps: float
    text_to_video: bool = True  # runs from a prompt alone
    image_to_video: str = ""  # the pipeline class that takes a first frame: this one, its twin, or ""
    two_experts: bool = False  # Wan 2.2 A14B: a low-noise expert with its own guidance (guidance_scale_2)
    fps_conditioned: bool = False  # the model is told the frame rate (LTX's frame_rate)
    default_guidance_2: float | None = None  # a second expert's guidance where a request names none (a recipe's)
    text_length: int | None = None  # the prompt length it was trained at, where not the pipeline's default
    # (the vocabulary's max_sequence_length: the embedded model's 16, not WanPipeline's 512 zero-padded tokens)
    # its VAE decodes at a timestep from noised latents (DECODE_KNOBS: LTX-Video 0.9.1+, the VAE config's
    # timestep_conditioning); LTXPipeline takes both arguments whatever its VAE, and 0.9.0's decodes as if none were given
    timestep_decode: bool = False

    def accept(self, request: GenerationRequest) -> GenerationRequest:
        """`request` as this model takes it: frames on its step and within its most, a first frame only where it
        has image-to-video, the second guidance only with a second expert, the decode knobs only with a timestep-aware
        VAE; RequestError naming the field."""
        frames = request.num_frames
        if frames is not None and frames > 1 and (frames - 1) % self.frame_step:
            low = (frames - 1) // self.frame_step * self.frame_step + 1
            raise RequestError(
                "num_frames", f"{frames} is not k x {self.frame_step} + 1 (this model packs {self.frame_step} frames "
                f"per latent frame): {low} or {low + self.frame_step}"
            )  # fmt: skip
        if frames is not None and frames > self.max_frames:
            raise RequestError("num_frames", f"{frames} is more than this model's {self.max_frames}")
        if request.init_images and not self.image_to_video:
            raise RequestError("init_images", "this video model has no image-to-video (a TI2V or I2V model has)")
        if not request.init_images and not self.text_to_video:
            raise RequestError("init_images", "this video model is image-to-video: it needs the first frame")
        if request.guidance_scale_2 is not None and not self.two_experts:
            raise RequestError("guidance_scale_2", "this model has one expert (Wan 2.2 A14B has two)")
        for name in DECODE_KNOBS:
            if getattr(request, name) is not None and not self.timestep_decode:
                raise RequestError(name, "this model's VAE decodes without a timestep (LTX-Video 0.9.1 and later take one)")
        changes: dict[str, Any] = {} if request.fps is not None else {"fps": self.default_fps}
        if self.two_experts and request.guidance_scale_2 is None and self.default_guidance_2 is not None:
            changes["guidance_scale_2"] = self.default_guidance_2
        return request.model_copy(update=changes) if changes else request


def import_components() -> None:
    """Import the room's component classes a model folder may name by module (the embedded model's
    `pipelines.video.packed_vae.FramePackedVAE`): diffusers loads a component only from a module already imported."""
    import pipelines.video.packed_vae  # noqa: F401


def makes_clips(pipe: Any) -> bool:
    """A pipeline whose call takes `num_frames` makes clips."""
    return "num_frames" in inspect.signature(pipe.__call__).parameters


def _default(params: dict[str, inspect.Parameter], name: str) -> Any:
    value = params[name].default if name in params else None
    return None if value is inspect.Parameter.empty else value


def abilities(pipe: Any, vocabulary: dict[str, Any]) -> VideoAbilities:
    """The clips `pipe` makes (`makes_clips(pipe)` holds), the vocabulary's defaults over the signature's."""
    params = dict(inspect.signature(pipe.__call__).parameters)
    step = int(getattr(pipe, "vae_scale_factor_temporal", None) or getattr(pipe, "vae_temporal_compression_ratio", None) or 1)
    frames = int(vocabulary.get("default_num_frames") or _default(params, "num_frames") or FALLBACK_FRAMES)
    fps = float(vocabulary.get("default_fps") or _default(params, "frame_rate") or FALLBACK_FPS)
    name = type(pipe).__name__
    takes_image = "image" in params
    twin = I2V_TWINS.get(name, "")
    if name == "WanPipeline" and not getattr(pipe.config, "expand_timesteps", False):
        twin = ""  # Wan 2.1 T2V: its image-to-video is another checkpoint
    config = getattr(pipe, "config", None)
    return VideoAbilities(
        default_frames=frames,
        frame_step=step,
        max_frames=int(vocabulary.get("max_num_frames") or _motion_frames(pipe) or 257),
        default_fps=fps,
        text_to_video=not takes_image,
        image_to_video=name if takes_image or name in KEEPS_FIRST_FRAME else twin,
        two_experts=getattr(pipe, "transformer_2", None) is not None and getattr(config, "boundary_ratio", None) is not None,
        fps_conditioned="frame_rate" in params,
        default_guidance_2=vocabulary.get("default_guidance_scale_2"),
        text_length=vocabulary.get("max_sequence_length"),
        timestep_decode="decode_timestep" in params and _timestep_vae(pipe),
    )


def _motion_frames(pipe: Any) -> int | None:
    """The most frames a UNet with motion modules attends across (AnimateDiff's `motion_max_seq_length`: their
    positional table's length), or None."""
    unet = getattr(pipe, "unet", None)
    return getattr(getattr(unet, "config", None), "motion_max_seq_length", None)


def _timestep_vae(pipe: Any) -> bool:
    """The pipeline's VAE decodes at a timestep (its config's `timestep_conditioning`: LTX-Video 0.9.1 and later)."""
    vae = getattr(pipe, "vae", None)
    return bool(getattr(getattr(vae, "config", None), "timestep_conditioning", False))


def video_twin(pipe: Any, abilities: VideoAbilities) -> Any:
    """The image-to-video pipeline over `pipe`'s components (no weight loaded twice)."""
    import diffusers

    twin_class = getattr(diffusers, abilities.image_to_video)
    extra = {"image_encoder": None, "image_processor": None} if abilities.image_to_video.startswith("Wan") else {}
    # every component passed by name: from_pipe keeps only those of the classes the twin's signature names, and
    # would drop another VAE class (the embedded model's FramePackedVAE)
    expected = inspect.signature(twin_class.__init__).parameters
    shared = {name: module for name, module in pipe.components.items() if name in expected}
    twin = twin_class.from_pipe(pipe, **{**shared, **extra})
    twin.set_progress_bar_config(disable=True)
    return twin


def call_kwargs(
    params: frozenset[str], request: GenerationRequest, images: list[Any] | None, clips: VideoAbilities | None = None
) -> dict[str, Any]:
    """A video request's own arguments of one diffusers call (those the pipeline names); `images`: the call's
    first frames (one clip per call: the image-to-video pipelines take one image); `clips`: the model's."""
    kwargs: dict[str, Any] = {"num_frames": request.num_frames, "frame_rate": request.fps}
    if clips is not None and clips.text_length:
        kwargs["max_sequence_length"] = clips.text_length
    if images:
        kwargs["image"] = images[0]
    kwargs.update(own_knobs(request))
    return {k: v for k, v in kwargs.items() if k in params}


def own_knobs(request: GenerationRequest) -> dict[str, Any]:
    """The families' own knobs a request names (a second expert's guidance, a timestep-aware VAE's decode):
    as arguments of the call, and in each clip's metadata (its parameters)."""
    names = ("guidance_scale_2", *DECODE_KNOBS)
    return {name: getattr(request, name) for name in names if getattr(request, name) is not None}
