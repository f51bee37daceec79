"""The form's fields, named once: the tabs, Send to Generate / Edit, PNG info and the public API are
built from these lists, so a field cannot be on a tab and missing from the API (or the reverse).
"""

from __future__ import annotations

# The public `/generate` API's parameters, in their order. The first ten are the signature callers
# have used positionally since it was published; a field added later is appended with a default
# (None: the model's), so a caller sending the ten values still works.
API_FIELDS = (
    "prompt", "negative_prompt", "num_images", "steps", "guidance_scale", "width", "height", "seed", "loras",
    "sampler", "guidance_end", "step_cache", "step_cache_threshold",
)  # fmt: skip

# The sampling fields both tabs show (Advanced), with the model's defaults and bounds.
SAMPLING = ("sampler", "steps", "guidance_scale", "guidance_end")

# The step cache (pipelines.step_cache): in each tab's Advanced and in /generate, /edit, /inpaint;
# Send to Generate / Edit / Inpaint set the one the image ran with (ui.send), as a seed reproduces
# an image only with it. Where the model has none the control is disabled, with the reason.
STEP_CACHE = ("step_cache", "step_cache_threshold")

# The Generate tab's fields (its LoRA choice is `loras` plus one scale slider per LoRA).
GENERATE = ("prompt", "negative_prompt", "num_images", "seed", "random_seed", *SAMPLING, "width", "height", "loras")

# The Edit tab's fields: no size (each edit keeps its input's aspect ratio at the model's area).
EDIT = ("prompt", "strength", "image_guidance_scale", "num_images", "seed", "random_seed", *SAMPLING, *STEP_CACHE)

# What a PNG's parameters fill (Send to Generate / Edit): everything but the number of images.
SENT_TO_GENERATE = (*(f for f in GENERATE if f != "num_images"), *STEP_CACHE)
SENT_TO_EDIT = tuple(f for f in EDIT if f != "num_images")

# The public `/edit` API's parameters after `files`, in order, and the field each fills: two were
# published under shorter names, which callers keep using.
EDIT_API = (
    ("prompt", "prompt"), ("strength", "strength"), ("num_images", "num_images"), ("steps", "steps"),
    ("guidance", "guidance_scale"), ("seed", "seed"), ("random_seed", "random_seed"), ("sampler", "sampler"),
    ("image_guidance", "image_guidance_scale"), ("guidance_end", "guidance_end"),
    ("step_cache", "step_cache"), ("step_cache_threshold", "step_cache_threshold"),
)  # fmt: skip

# The Inpaint tab's fields (its image and mask come from the editor; an outpaint adds four sides).
INPAINT = (
    "prompt", "negative_prompt", "strength", "mask_blur", "masked_content", "inpaint_area", "padding", "invert_mask",
    "num_images", "seed", "random_seed", *SAMPLING, *STEP_CACHE,
)  # fmt: skip
SENT_TO_INPAINT = tuple(f for f in INPAINT if f != "num_images")

# The public `/inpaint` API's parameters after `image` and `mask` (`/outpaint`: after `image`, `left`,
# `up`, `right`, `down`), in order. As /generate: seed < 0 means random.
INPAINT_API = (
    "prompt", "negative_prompt", "strength", "mask_blur", "masked_content", "inpaint_area", "padding", "invert_mask",
    "num_images", "steps", "guidance_scale", "seed", "sampler", "guidance_end", *STEP_CACHE,
)  # fmt: skip
OUTPAINT_SIDES = ("left", "up", "right", "down")
