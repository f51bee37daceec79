"""The Detailer accordion: ADetailer's two passes, each in its own tab, and the wildcard chips under the prompt."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines.schema.detailer import SECOND, Detailer

FIELDS = tuple(Detailer.model_fields)


def build(form: Any, section: bool = False) -> None:
    """The two passes' tabs in an accordion (`section`: a column, for a section tab)."""
    box = gr.Column(elem_id="detailer-section") if section else gr.Accordion("Detailer", open=False, elem_id="detailer-accordion")
    with box, gr.Tabs():
        for number, suffix in enumerate(("", SECOND)):
            with gr.Tab(("1st", "2nd")[number]):
                form.add("ad_model" + suffix)
                form.add("ad_prompt" + suffix, placeholder="empty: the image's prompt ([PROMPT] stands for it)")
                form.add("ad_negative_prompt" + suffix, placeholder="empty: the image's negative prompt")
                with gr.Row():
                    form.add("ad_confidence" + suffix)
                    form.add("ad_denoising_strength" + suffix)
                with gr.Row():
                    form.add("ad_dilate_erode" + suffix)
                    form.add("ad_mask_blur" + suffix)
                with gr.Row():
                    form.add("ad_inpaint_only_masked" + suffix)
                    form.add("ad_inpaint_only_masked_padding" + suffix)
                form.add("ad_mask_k_largest" + suffix)


def wildcard_chips(names: tuple[str, ...], c: dict[str, Any]) -> None:
    """The server's wildcards as chips under the prompt: a click adds `__name__` to the prompt."""
    c["wildcards_list"] = gr.Dataset(
        components=[gr.Textbox(visible=False)], samples=[[f"__{n}__"] for n in names], label="Wildcards (click to add)",
        elem_id="wildcard-chips", visible=bool(names), samples_per_page=40,
    )  # fmt: skip


def wire_chips(c: dict[str, Any]) -> None:
    def add(chosen: list[str], prompt: str) -> str:
        return f"{prompt.rstrip()} {chosen[0]}".strip()

    c["wildcards_list"].click(add, [c["wildcards_list"], c["prompt"]], c["prompt"], api_visibility="private", queue=False)
