"""The image prompt's part of a request (`ImagePrompt`): a reference picture, an IP-Adapter, a scale.

What loads and runs the adapters: pipelines.control.ip_adapter.
"""

from __future__ import annotations

from typing import Annotated

from PIL import Image
from pydantic import Field

from pipelines.schema.control import model_name
from pipelines.schema.fields import About, Picture, Range, Schema, Text


class ImagePrompt(Schema):
    """One reference picture for an IP-Adapter, with how strongly it steers."""

    image: Annotated[Image.Image, Picture(), About("Reference image", a1111="image")] = Field(
        description="the picture whose look (here: the shape's colour) the result takes"
    )
    model: Annotated[str, Text(required=True), About("Adapter", a1111="model")] = Field(
        description="an IP-Adapter of the server's (IPADAPTER_DIR, models/ip_adapters); A1111's \" [hash]\" suffix is ignored"
    )
    scale: Annotated[float, Range(0.0, 2.0), About("Image prompt weight", a1111="weight", step=0.05)] = Field(
        1.0, description="how strongly the picture steers (0: not at all, the image of no image prompt)"
    )

    @property
    def model_name(self) -> str:
        return model_name(self.model)
