"""The public Gradio endpoints' parameters, derived from the request schema.

`/generate`, `/edit` and `/inpaint` (and `/outpaint`, which is `/inpaint` on a grown canvas) each
take every field of their tab (`ui.form.tab_fields`: the schema's fields of the tab's task, less
what the tab says it does not take). Each keeps the order it was published in (a positional
caller sends values in that order: `PUBLISHED`), and a field added to the schema since is appended
in the schema's order. Named calls (gradio_client, `POST /gradio_api/call/v2/<name>` with a JSON
object) may leave any parameter out: its default is the tab's first value, or "" for "the model's".
"""

from __future__ import annotations

from ui.form import tab_fields

# What each endpoint published first, in order; never reordered (positional callers depend on it).
PUBLISHED = {
    "generate": ("prompt", "negative_prompt", "num_images", "steps", "guidance_scale", "width", "height", "seed",
                 "loras", "sampler", "guidance_end", "step_cache", "step_cache_threshold"),
    "edit": ("prompt", "strength", "num_images", "steps", "guidance_scale", "seed", "random_seed", "sampler",
             "image_guidance_scale", "guidance_end", "step_cache", "step_cache_threshold"),
    "inpaint": ("prompt", "negative_prompt", "strength", "mask_blur", "masked_content", "inpaint_area", "padding",
                "invert_mask", "num_images", "steps", "guidance_scale", "seed", "sampler", "guidance_end",
                "step_cache", "step_cache_threshold"),
    "video": ("prompt", "negative_prompt", "num_frames", "fps", "width", "height", "steps", "guidance_scale", "seed",
              "num_images", "sampler", "guidance_scale_2", "guidance_end", "step_cache", "step_cache_threshold"),
}  # fmt: skip
# Parameters published under another name than the field's: callers keep using them.
RENAMED = {"edit": {"guidance_scale": "guidance", "image_guidance_scale": "image_guidance"}}
OUTPAINT_SIDES = ("left", "up", "right", "down")  # /outpaint's own parameters, before /inpaint's
FORM_ONLY = {"random_seed"}  # a tab's switch, not a request field (the Edit tab's /edit published it)
# The inputs each endpoint takes before its fields: its files (and /outpaint's sides).
LEADING = {"generate": (), "edit": ("files",), "inpaint": ("image", "mask"), "outpaint": ("image", *OUTPAINT_SIDES),
           "video": ("image", "format")}  # fmt: skip


def parameters(endpoint: str) -> tuple[str, ...]:
    """The endpoint's fields, in its order: the published ones, then the schema's new ones."""
    taken = [item.name for item in tab_fields(endpoint)]
    published = PUBLISHED[endpoint]
    return (*published, *(name for name in taken if name not in published))


def api_name(endpoint: str, field: str) -> str:
    """The parameter name `field` has in `endpoint`."""
    return RENAMED.get(endpoint, {}).get(field, field)


def call_order(endpoint: str) -> tuple[str, ...]:
    """Every parameter of `endpoint` by its published name, in the order a positional caller sends them."""
    tab = "inpaint" if endpoint == "outpaint" else endpoint
    return (*LEADING[endpoint], *(api_name(tab, field) for field in parameters(tab)))
