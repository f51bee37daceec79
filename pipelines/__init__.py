"""Pipeline layer: load a diffusers model (+ LoRA) through a DeviceManager and run batched requests."""

from .errors import LoraError, ModelLoadError, OutOfMemoryError, PipelineError
from .image_pipeline import ImagePipeline
from .metadata import save_images
from .options import PipelineOptions
from .pnginfo import read_metadata
from .request import GenerationRequest, GenerationResult

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "ImagePipeline",
    "LoraError",
    "ModelLoadError",
    "OutOfMemoryError",
    "PipelineError",
    "PipelineOptions",
    "read_metadata",
    "save_images",
]
