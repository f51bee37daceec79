"""Upscalers: what hires fix, the Upscale tab and A1111's extras endpoints enlarge images with.

Three kinds, under the names A1111 gives them (its clients send these names):

| kind | names | how |
|---|---|---|
| pixel, built in | `Lanczos`, `Nearest` | PIL's resampling |
| latent (hires fix only) | `Latent`, `Latent (antialiased)`, `Latent (bicubic)`, `Latent (bicubic antialiased)`, `Latent (nearest)`, `Latent (nearest-exact)` | the first pass's latent enlarged by `torch.nn.functional.interpolate` (pipelines.imaging.hires) |
| model | each file's stem in `UPSCALER_DIR` and `models/upscalers` | spandrel (ESRGAN, Real-ESRGAN, SwinIR, HAT, DAT, Compact, ...; detected from the weights) |

A model runs at its own scale (×2, ×4) as often as needed, then Lanczos takes the result to the
asked size, as A1111's `UpscalerData` does. Large inputs go through in overlapping tiles
(`TILE`, `OVERLAP` pixels of the input) so memory stays bounded by the tile, not the image; the
overlap is blended linearly so no seam shows. Models load on first use, on the `DeviceManager`'s
device and in its dtype where the architecture supports it (fp32 otherwise), and stay loaded.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

from devices.one_load import ONE_LOAD

log = logging.getLogger(__name__)

EMBEDDED_DIR = Path(__file__).resolve().parents[2] / "models" / "upscalers"
PIXEL = {"Lanczos": Image.Resampling.LANCZOS, "Nearest": Image.Resampling.NEAREST}
# A1111's latent upscale modes: (torch interpolate mode, antialias)
LATENT = {
    "Latent": ("bilinear", False),
    "Latent (antialiased)": ("bilinear", True),
    "Latent (bicubic)": ("bicubic", False),
    "Latent (bicubic antialiased)": ("bicubic", True),
    "Latent (nearest)": ("nearest", False),
    "Latent (nearest-exact)": ("nearest-exact", False),
}
MODEL_SUFFIXES = (".safetensors", ".pth", ".pt", ".ckpt")
TILE, OVERLAP = 256, 16  # input pixels per tile and of overlap between tiles


class UpscalerError(ValueError):
    """An upscaler that does not exist or cannot load; the message names the ones that do."""


@dataclass(frozen=True)
class UpscalerInfo:
    """One upscaler as the UI and A1111's `/upscalers` list it."""

    name: str
    kind: str  # "pixel" | "latent" | "model"
    scale: int  # the model's own factor (pixel and latent: any, listed as 4 as A1111 does)
    path: str | None = None


def latent_mode(name: str) -> tuple[str, bool] | None:
    """(interpolate mode, antialias) of a latent upscaler, None for any other name."""
    return LATENT.get(name)


class Upscalers:
    """The upscalers a server offers, models loaded on first use (one lock: a model loads once)."""

    def __init__(self, folders: list[Path], device_manager: Any):
        self.folders = [Path(f) for f in dict.fromkeys([*folders, EMBEDDED_DIR])]
        self.dm = device_manager
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def files(self) -> dict[str, Path]:
        """Upscaler model files by name (the file's stem; the first folder wins on a clash)."""
        out: dict[str, Path] = {}
        for folder in self.folders:
            if folder.is_dir():
                for path in sorted(folder.iterdir()):
                    if path.suffix in MODEL_SUFFIXES:
                        out.setdefault(path.stem, path)
        return out

    def list(self, latent: bool = True) -> list[UpscalerInfo]:
        """Every upscaler by name: the built-in pixel ones, the models, then (for hires fix) the latent modes."""
        out = [UpscalerInfo(name, "pixel", 4) for name in PIXEL]
        out += [
            UpscalerInfo(name, "model", self._scale_of(name, path), str(path)) for name, path in self.files().items()
        ]
        if latent:
            out += [UpscalerInfo(name, "latent", 4) for name in LATENT]
        return out

    def names(self, latent: bool = True) -> list[str]:
        return [u.name for u in self.list(latent)]

    def check(self, name: str, latent: bool = True) -> None:
        """UpscalerError unless `name` is offered (latent modes only where `latent`)."""
        if name in PIXEL or name in self.files() or (latent and name in LATENT):
            return
        where = "" if latent or name not in LATENT else " (latent modes upscale a first pass's latent: hires fix only)"
        raise UpscalerError(f"unknown upscaler {name!r}{where}; available: {', '.join(self.names(latent))}")

    def upscale(self, image: Image.Image, name: str, size: tuple[int, int]) -> Image.Image:
        """`image` enlarged (or shrunk) to `size` (width, height) by the upscaler `name` (not a latent mode)."""
        self.check(name, latent=False)
        image = image.convert("RGB")
        if name in PIXEL or image.size == size:
            return image.resize(size, PIXEL.get(name, Image.Resampling.LANCZOS))
        model = self._model(name)
        while image.width < size[0] or image.height < size[1]:
            image = self._run(model, image)
        return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)

    def cover(self, image: Image.Image, name: str, size: tuple[int, int]) -> Image.Image:
        """`image` enlarged by `name` to cover `size`, then centre-cropped to it (A1111's "crop and
        resize": hires fix's and Extras' resize to both a width and a height)."""
        scale = max(size[0] / image.width, size[1] / image.height)
        big = self.upscale(image, name, (round(image.width * scale), round(image.height * scale)))
        return big if big.size == size else ImageOps.fit(big, size, Image.Resampling.LANCZOS)

    # ------------------------------------------------------------------ models
    def _scale_of(self, name: str, path: Path) -> int:
        """A model's factor: the loaded model's, else the one its name states ("x2", "4x"; A1111's
        listing reads names too), else 4 (most upscalers); the list never loads a model."""
        loaded = self._loaded.get(name)
        if loaded is not None:
            return int(loaded.scale)
        for part in path.stem.lower().replace("-", "_").split("_"):
            if len(part) == 2 and "x" in part and part.replace("x", "").isdigit():
                return int(part.replace("x", ""))
        return 4

    def _model(self, name: str) -> Any:
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = self._load(self.files()[name])
            return self._loaded[name]

    def _load(self, path: Path) -> Any:
        """A spandrel model descriptor on the manager's device; the manager's dtype where the
        architecture runs in it (spandrel says), else fp32."""
        try:
            from spandrel import ModelLoader
        except ImportError as exc:  # pragma: no cover - spandrel is in requirements.txt
            raise UpscalerError("upscaler models need spandrel (pip install -r requirements.txt)") from exc
        try:
            with ONE_LOAD:  # built beside another thread's diffusers load, its weights would land on meta
                model = ModelLoader(device="cpu").load_from_file(str(path))
        except Exception as exc:  # spandrel raises many kinds for a file it cannot read or detect
            raise UpscalerError(
                f"{path.name}: not an upscaler spandrel can load ({type(exc).__name__}: {exc})"
            ) from exc
        dtype = self.dm.dtype
        supported = {torch.float16: model.supports_half, torch.bfloat16: model.supports_bfloat16}.get(dtype, True)
        model.to(self.dm.device).to(dtype if supported else torch.float32).eval()
        log.info("loaded upscaler %s (%s, x%d) on %s", path.name, model.architecture.name, model.scale, self.dm.device)
        return model

    @torch.inference_mode()
    def _run(self, model: Any, image: Image.Image) -> Image.Image:
        """One pass of `model` over `image`, tile by tile with a linear blend over the overlaps."""
        scale = int(model.scale)
        pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1).float().div(255)
        h, w = pixels.shape[1:]
        out = torch.zeros(3, h * scale, w * scale)
        weight = torch.zeros(1, h * scale, w * scale)
        dtype = next(model.model.parameters()).dtype
        for top, left, th, tw in tiles(h, w, TILE, OVERLAP):
            tile = pixels[:, top : top + th, left : left + tw][None].to(self.dm.device, dtype)
            result = model(tile)[0].float().cpu().clamp(0, 1)
            ramp = blend_ramp(th * scale, tw * scale, OVERLAP * scale, top > 0, left > 0, top + th < h, left + tw < w)
            out[:, top * scale : (top + th) * scale, left * scale : (left + tw) * scale] += result * ramp
            weight[:, top * scale : (top + th) * scale, left * scale : (left + tw) * scale] += ramp
        out = (out / weight.clamp_min(1e-6)).mul(255).round().byte()
        return Image.fromarray(out.permute(1, 2, 0).numpy())


def tiles(h: int, w: int, tile: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """(top, left, height, width) of tiles covering an h x w image, neighbours overlapping by `overlap`."""

    def starts(n: int) -> list[int]:
        if n <= tile:
            return [0]
        step = tile - overlap
        out = list(range(0, n - tile, step))
        return [*out, n - tile]

    return [(t, s, min(tile, h), min(tile, w)) for t in starts(h) for s in starts(w)]


def blend_ramp(h: int, w: int, overlap: int, top: bool, left: bool, bottom: bool, right: bool) -> torch.Tensor:
    """A tile's blending weight: 1 inside, rising linearly over the overlap on sides that have a neighbour."""
    ys, xs = torch.ones(h), torch.ones(w)
    ramp = torch.linspace(0, 1, overlap + 2)[1:-1] if overlap else torch.ones(0)
    n = len(ramp)
    if top and n:
        ys[:n] = torch.minimum(ys[:n], ramp)
    if bottom and n:
        ys[-n:] = torch.minimum(ys[-n:], ramp.flip(0))
    if left and n:
        xs[:n] = torch.minimum(xs[:n], ramp)
    if right and n:
        xs[-n:] = torch.minimum(xs[-n:], ramp.flip(0))
    return (ys[:, None] * xs[None, :])[None]


MAX_FACTOR = 8.0  # the Upscale tab's and A1111 extras' largest factor
MAX_OUTPUT_PIXELS = 8192 * 8192  # an upscaled image's most pixels: a bound on one request's memory and time
NONE = "None"  # A1111's "no model": its UpscalerNone returns the image, which A1111 then resizes with Lanczos


def extras_size(image: Image.Image, factor: float | None, size: tuple[int, int] | None) -> tuple[int, int]:
    """An upscale's output size: `size` (A1111's "scale to"), else the image's times `factor`
    (A1111's "scale by"); UpscalerError beyond MAX_FACTOR or MAX_OUTPUT_PIXELS."""
    if size is not None:
        width, height = size
    else:
        factor = 2.0 if factor is None else float(factor)
        if not 1.0 <= factor <= MAX_FACTOR:
            raise UpscalerError(f"the factor {factor:g} is out of range 1..{MAX_FACTOR:g}")
        width, height = round(image.width * factor), round(image.height * factor)
    if width < 1 or height < 1 or width * height > MAX_OUTPUT_PIXELS:
        raise UpscalerError(f"{width}x{height} is out of range: at most {MAX_OUTPUT_PIXELS} pixels")
    return width, height


def extras(
    upscalers: Upscalers,
    image: Image.Image,
    size: tuple[int, int],
    first: str,
    second: str | None = None,
    visibility: float = 0.0,
) -> Image.Image:
    """A1111's Extras upscale: `image` at `size` by `first`, blended with `second`'s at
    `visibility` (0: only the first); "None" is a plain Lanczos resize, as in A1111. Both given:
    the image covers `size` and is centre-cropped (A1111's "crop to fit")."""

    def one(name: str) -> Image.Image:
        return upscalers.cover(image, "Lanczos" if name in (NONE, "") else name, size)

    out = one(first)
    if second and second != NONE and visibility > 0:
        out = Image.blend(out, one(second), min(1.0, visibility))
    return out
