"""IP-Adapter image prompts: reference pictures that steer a generation beside the prompt.

An image prompt names an adapter the server has and a scale. Each adapter is a folder in
IPADAPTER_DIR (or the embedded `models/ip_adapters`) in the layout diffusers' `load_ip_adapter`
reads: the adapter's weights file (`ip_adapter.safetensors`, or the one `.safetensors`/`.bin`
there is) and its image encoder in `image_encoder/`. h94/IP-Adapter's files fit once the encoder
folder sits beside them.

Several image prompts run as several adapters (one adapter per image, each with its own scale,
as A1111's and Forge's IP-Adapter units do): the same adapter named twice is loaded twice. The
adapters are loaded into the model's UNet when a request asks for them and unloaded when one does
not, so a request without image prompts runs exactly as before (the attention is then set again:
diffusers' unload puts its own processors back). Every task's pipeline (image-to-image, inpaint,
ControlNet twins) shares that UNet; each gets the image encoder before its call.

Families, by what diffusers' loaders support with the same call (`ip_adapter_image`, a scale per
adapter): Stable Diffusion 1.x/2.x and SDXL (into the UNet), and Flux (XLabs' layout, into the
transformer; its CLIP encoder is read from the first adapter's folder, so the adapters of one request
share it), and SD3 (InstantX's SD3.5 layout and its SigLIP encoder, into the transformer: diffusers
loads one adapter there, so one image prompt per request).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from devices.one_load import ONE_LOAD
from pipelines.schema.control import model_name
from pipelines.schema.image_prompt import ImagePrompt

log = logging.getLogger(__name__)

EMBEDDED_DIR = Path(__file__).resolve().parents[2] / "models" / "ip_adapters"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
ENCODER_FOLDER = "image_encoder"
# Family -> why it takes image prompts here (diffusers' loader and call for it).
FAMILIES = {
    "StableDiffusionPipeline": "IPAdapterMixin on the UNet; `ip_adapter_image` in every task's pipeline",
    "StableDiffusionXLPipeline": "IPAdapterMixin on the UNet; `ip_adapter_image` in every task's pipeline",
    "FluxPipeline": "FluxIPAdapterMixin on the transformer (XLabs' keys); `ip_adapter_image` in text-to-image, "
    "image-to-image, inpaint and ControlNet text-to-image (not Flux's ControlNet img2img/inpaint)",
    "StableDiffusion3Pipeline": "SD3IPAdapterMixin on the transformer (InstantX's keys, a SigLIP encoder); one "
    "adapter at a time in diffusers; `ip_adapter_image` in text-to-image and image-to-image",
}
MOST = {"StableDiffusion3Pipeline": 1}  # image prompts per request, where diffusers loads fewer than the schema's
MODULE = "ip-adapter"  # the preprocessor name A1111 clients send for an IP-Adapter unit (a prefix)


class IpAdapterError(ValueError):
    """An image prompt this model cannot run (family, adapter); the message says what can."""




class IpAdapters:
    """The adapters a server has (each folder with weights and an `image_encoder/`), by name."""

    def __init__(self, folders: list[Path | str | None]):
        self.folders = list(dict.fromkeys([Path(f) for f in folders if f] + [EMBEDDED_DIR]))

    def files(self) -> dict[str, Path]:
        """Name -> weights file."""
        found: dict[str, Path] = {}
        for folder in self.folders:
            if not folder.is_dir():
                continue
            for path in sorted(p for p in folder.iterdir() if (p / ENCODER_FOLDER).is_dir()):
                weights = _weights_file(path)
                if weights is not None:
                    found.setdefault(path.name, weights)
        return found

    def names(self) -> list[str]:
        return sorted(self.files())

    def check(self, name: str) -> Path:
        path = self.files().get(model_name(name))
        if path is None:
            raise IpAdapterError(
                f"no IP-Adapter named {name!r}; this server has: {', '.join(self.names()) or 'none'} (IPADAPTER_DIR)"
            )
        return path


def _weights_file(folder: Path) -> Path | None:
    """`ip_adapter.safetensors` if there, else the folder's one weights file; None if not exactly one."""
    preferred = folder / "ip_adapter.safetensors"
    if preferred.is_file():
        return preferred
    files = [p for p in sorted(folder.iterdir()) if p.suffix in WEIGHT_SUFFIXES and p.is_file()]
    return files[0] if len(files) == 1 else None


def families() -> str:
    return ", ".join(name.removesuffix("Pipeline") for name in FAMILIES)


def check_family(family: str, count: int = 1) -> None:
    """IpAdapterError unless `family` takes `count` image prompts at once, saying what it takes."""
    if family not in FAMILIES:
        raise IpAdapterError(f"{family} takes no image prompts here; families with IP-Adapter: {families()}")
    if count > MOST.get(family, count):
        raise IpAdapterError(f"{family} takes {MOST[family]} image prompt at a time (diffusers loads one IP-Adapter into it)")


class Loaded:
    """The adapters in one model's UNet: loads the ones a request names, unloads when none is named.

    `reset_attention(slicing)` sets the device's attention on every processor: unsliced before a load
    (diffusers re-creates each processor's class without arguments), sliced as the memory mode wants
    after an unload (diffusers puts its own default back)."""

    def __init__(self, pipe: Any, adapters: IpAdapters, reset_attention: Any, family: str = ""):
        self.pipe, self.adapters, self._reset, self.family = pipe, adapters, reset_attention, family
        self.names: tuple[str, ...] = ()
        self._lent: list[Any] = []  # twins given the encoder, to take it back on unload
        # The model's own feature extractor (a safety checker's; mostly none). diffusers' unload keeps
        # the one its load made where the pipeline has a safety_checker slot, and its next load would
        # feed another adapter's encoder pictures of the first one's size: put the model's back.
        self._own_extractor = getattr(pipe, "feature_extractor", None)

    def use(self, prompts: tuple[ImagePrompt, ...]) -> None:
        names = tuple(p.model_name for p in prompts)
        if names != self.names:
            self.clear()
            if names:
                files = [self.adapters.check(name) for name in names]
                self._reset(False)
                with ONE_LOAD:  # builds the adapter's processors and the encoder (devices.one_load)
                    self._load(files)
                self.names = names
                log.info("IP-Adapter %s loaded", ", ".join(names))
        if names:
            scales = [p.scale for p in prompts]
            self.pipe.set_ip_adapter_scale(scales[0] if self.family in MOST else scales)  # SD3's takes one number

    def _load(self, files: list[Path]) -> None:
        """diffusers' loader for this family: the UNet's reads the encoder from a folder beside each
        adapter; Flux's from one path, in a dtype it is told (float16 unless told: the model's here)."""
        common = {"subfolder": [""] * len(files), "weight_name": [f.name for f in files]}
        folders = [str(f.parent) for f in files]
        encoder = str(files[0].parent / ENCODER_FOLDER)
        if self.family == "FluxPipeline":
            dtype = self.pipe.transformer.dtype
            self.pipe.load_ip_adapter(folders, **common, image_encoder_pretrained_model_name_or_path=encoder,
                                      image_encoder_dtype=dtype)  # fmt: skip
        elif self.family == "StableDiffusion3Pipeline":  # one adapter; its encoder by path (a bare name is read from the cwd)
            self.pipe.load_ip_adapter(folders[0], weight_name=files[0].name, subfolder="", image_encoder_folder=encoder)
        else:
            self.pipe.load_ip_adapter(folders, **common, image_encoder_folder=ENCODER_FOLDER)

    def key(self, prompts: tuple[ImagePrompt, ...]) -> str:
        """What the UNet runs with these prompts, as the OpenVINO runtime keys its graphs: each adapter's
        file (name, size, time) and scale; "" for none."""
        parts = []
        for p in prompts:
            stat = self.adapters.check(p.model).stat()
            parts.append(f"{p.model_name}:{stat.st_size}:{stat.st_mtime_ns}@{p.scale:g}")
        return ";".join(parts)

    def clear(self) -> None:
        if self.names:
            self.pipe.unload_ip_adapter()
            self.pipe.register_modules(feature_extractor=self._own_extractor)
            for twin in self._lent:
                twin.register_modules(image_encoder=None, feature_extractor=self._own_extractor)
            self._lent.clear()
            self._reset(True)
            log.info("IP-Adapter %s unloaded", ", ".join(self.names))
            self.names = ()

    def lend(self, twin: Any) -> None:
        """Give a task's pipeline (built over the same UNet) the image encoder this model has now."""
        if twin is not self.pipe:
            twin.register_modules(image_encoder=self.pipe.image_encoder, feature_extractor=self.pipe.feature_extractor)
            if all(t is not twin for t in self._lent):
                self._lent.append(twin)


def call_kwargs(prompts: tuple[ImagePrompt, ...]) -> dict[str, Any]:
    """The pipeline call's arguments: one picture per adapter (diffusers repeats it per image)."""
    return {"ip_adapter_image": [p.image.convert("RGB") for p in prompts]} if prompts else {}


# ------------------------------------------------------------------ metadata and PNG info
def describe(prompt: ImagePrompt) -> dict[str, Any]:
    """An image prompt's settings without its picture (what metadata and history keep)."""
    return {"model": prompt.model_name, "scale": prompt.scale}


def infotext_units(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The image prompts as sd-webui-controlnet writes IP-Adapter units (`ControlNet N` lines after
    the ControlNet units): module "ip-adapter", the model, the weight."""
    return [{"module": MODULE, "model": p["model"], "weight": p["scale"]} for p in meta.get("ip_adapter") or []]


def is_ip_unit(unit: dict[str, Any]) -> bool:
    """Whether an A1111 unit (from a client or a `ControlNet N` line) is an IP-Adapter's."""
    return str(unit.get("module") or "").lower().startswith(MODULE)


def from_unit(unit: dict[str, Any]) -> dict[str, Any]:
    """An A1111 IP-Adapter unit's fields (a client's, or a `ControlNet N` line's text) as an image
    prompt's: its weight is the scale, read by the field's own rules; a malformed one is left out
    (the field's default, or the form's value, stays)."""
    out = {key: unit[key] for key in ("model", "image") if key in unit}
    if unit.get("weight") is not None:
        try:
            out["scale"] = ImagePrompt.model_fields["scale"].metadata[0].parse(unit["weight"])
        except ValueError:
            log.debug("IP-Adapter unit weight %r left out", unit["weight"])
    return out
