"""Pictures in and out of a graph without files: the nodes scripts and painting plugins use.

- ETN_LoadImageBase64 / ETN_LoadMaskBase64 (comfyui-tooling-nodes, what Krita AI Diffusion and
  other plugins send their canvas with): a base64 picture in the prompt itself.
- ETN_SendImageWebSocket (the same package) and SaveImageWebsocket (ComfyUI's
  `websocket_image_save` example): each picture sent to the prompt's client as a binary frame,
  event 1 and format 2 (PNG) — the frame clients take as a result, where previews are JPEG.
- ETN_ApplyMaskToImage: a mask as the pictures' alpha.
Registered in `registry.NODES` on import.
"""

from __future__ import annotations

import struct
from typing import Any

from PIL import Image, ImageOps

from ..images import from_base64, open_bytes
from ..running import png_bytes
from .registry import In, combo, link, node
from .values import Mask, Pictures

BASE64 = In("STRING", "", max_chars=3 << 20)  # within the prompt body's 2 MiB anyway
MAX_BYTES = BASE64.max_chars * 3 // 4
RESULT_EVENT, PNG = 1, 2


def _decoded(ctx: Any, text: str, name: str) -> Image.Image:
    """A base64 picture (plain or a data URL) read as the HTTP APIs read one (`webapi.images`: the
    header checked against the model's largest picture before any pixel is decoded); ValueError
    (WireError) saying why not."""
    data = from_base64(text, (name,), MAX_BYTES)
    picture = open_bytes(data, (name,), ctx.max_pixels(), MAX_BYTES, mode=None)
    ctx.check_size(*picture.size)
    return picture


@node("ETN_LoadImageBase64", "external_tooling", {"image": BASE64}, ("IMAGE", "MASK"))
def load_image_base64(ctx: Any, image: str) -> tuple:
    """A base64 picture in the prompt, and the mask of its transparent pixels."""
    picture = _decoded(ctx, image, "image")
    alpha = picture.getchannel("A") if "A" in picture.getbands() else Image.new("L", picture.size, 255)
    return Pictures((picture.convert("RGB"),)), Mask(ImageOps.invert(alpha))


@node("ETN_LoadMaskBase64", "external_tooling", {"mask": BASE64}, ("MASK",))
def load_mask_base64(ctx: Any, mask: str) -> tuple:
    """A base64 mask (its red channel where it has colour; white is redrawn)."""
    picture = _decoded(ctx, mask, "mask")
    return (Mask(picture.getchannel("R") if picture.mode in ("RGB", "RGBA") else picture.convert("L")),)


@node("ETN_ApplyMaskToImage", "external_tooling", {"image": link("IMAGE"), "mask": link("MASK")}, ("IMAGE",))
def apply_mask_to_image(ctx: Any, image: Pictures, mask: Mask) -> tuple:
    """The mask as the pictures' alpha (white: opaque)."""
    out = []
    for picture in image.images:
        if mask.image.size != picture.size:
            raise ValueError(f"the mask is {mask.image.size}, the picture {picture.size}")
        rgba = picture.convert("RGBA")
        rgba.putalpha(mask.image)
        out.append(rgba)
    return (Pictures(tuple(out), image.metadata, image.seeds),)


def _send(ctx: Any, pictures: Pictures) -> list[dict[str, str]]:
    for picture in pictures.images:
        ctx.send(struct.pack(">II", RESULT_EVENT, PNG) + png_bytes(picture))
    return [{"source": "websocket", "content-type": "image/png", "type": "output"} for _ in pictures.images]


@node("ETN_SendImageWebSocket", "external_tooling", {"images": link("IMAGE"), "format": combo(lambda c: ("PNG",), "PNG")},
      output_node=True)  # fmt: skip
def send_image_websocket(ctx: Any, images: Pictures, format: str) -> tuple:
    """Each picture to the prompt's client as a binary PNG frame (nothing written on the server)."""
    return ({"images": _send(ctx, images)},)


@node("SaveImageWebsocket", "api node", {"images": link("IMAGE")}, output_node=True)
def save_image_websocket(ctx: Any, images: Pictures) -> tuple:
    """Each picture to the prompt's client as a binary PNG frame (ComfyUI's websocket example node)."""
    _send(ctx, images)
    return ({},)
