"""A1111's styles (pipelines.prompts.styles): the file as A1111 writes it, the merge rules of its wiki, the
request field on the pipeline and in the Generate tab."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.prompts import styles
from pipelines.schema.request import GenerationRequest

EMBEDDED = Path(__file__).resolve().parent.parent / "models" / "tiny-shapes"
CSV = (
    "\ufeffname,prompt,negative_prompt\n"  # A1111 on Windows writes a byte-order mark
    'night,"{prompt}, on a black background, (dark:1.2)",blurry\n'
    'frame,"framed, old","text, watermark"\n'
    ",ignored,ignored\n"
)


@pytest.fixture(scope="module")
def styles_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("styles") / "styles.csv"
    path.write_text(CSV, encoding="utf-8")
    return path


def test_the_file_is_read_as_a1111_writes_it(styles_file, tmp_path):
    read = styles.read(styles_file)
    assert list(read) == ["night", "frame"]  # a row without a name is skipped
    assert (
        read["night"].prompt == "{prompt}, on a black background, (dark:1.2)"
        and read["frame"].negative_prompt == "text, watermark"
    )
    assert styles.read(tmp_path / "absent.csv") == {}
    spaced = tmp_path / "spaced.csv"  # spaces after the commas, and A1111's first `text` column
    spaced.write_text('name, text, negative_prompt\nold, "{prompt}, old", bad\n', encoding="utf-8")
    assert styles.read(spaced)["old"] == styles.Style("old", "{prompt}, old", "bad")


@pytest.mark.parametrize(
    ("style", "text", "expected"),
    [
        ("{prompt}, at night", "a cat", "a cat, at night"),  # the prompt in its place
        ("best quality, {prompt}", "", "best quality, "),
        ("framed", "a cat", "a cat, framed"),  # appended with ", "
        ("framed", "", "framed"),  # an empty side left out
        ("", "a cat", "a cat"),
        (" hd ", "a cat ", "a cat, hd"),  # stripped, as A1111 does
        ("hd", "  ", "hd"),
    ],
)
def test_merge_follows_a1111s_rules(style, text, expected):
    assert styles.merge(style, text) == expected


def test_styles_apply_in_order_to_prompt_and_negative(styles_file):
    read = styles.read(styles_file)
    assert styles.apply(read, ("night", "frame"), "a cat", "ugly") == (
        "a cat, on a black background, (dark:1.2), framed, old",
        "ugly, blurry, text, watermark",
    )


@pytest.fixture(scope="module")
def pipe(styles_file):
    from devices import DeviceManager
    from pipelines.run.image_pipeline import ImagePipeline

    return ImagePipeline.from_pretrained(
        EMBEDDED, device_manager=DeviceManager("cpu"), memory_mode="off", styles_file=styles_file
    )


def test_the_pipeline_runs_the_styled_prompt_and_records_it(pipe):
    info = pipe.model_info()
    assert info.styles["frame"] == {"prompt": "framed, old", "negative_prompt": "text, watermark"}
    asked = GenerationRequest(prompt="a red circle", negative_prompt="ugly", styles=["night"], steps=2, seed=4)
    result = pipe.generate(info.accept(asked))
    meta = result.metadata[0]
    assert (
        meta["prompt"] == "a red circle, on a black background, (dark:1.2)"
        and meta["negative_prompt"] == "ugly, blurry"
    )
    written = pipe.generate(GenerationRequest(prompt=meta["prompt"], negative_prompt="ugly, blurry", steps=2, seed=4))
    assert written.images[0].tobytes() == result.images[0].tobytes()  # the record reproduces the image
    # a name the file lacks (a client's preset from its own A1111) is left out, as A1111 does, and said
    other = pipe.generate(info.accept(GenerationRequest(prompt="x", styles=["frame", "noir"], steps=1)))
    assert other.metadata[0]["prompt"] == "x, framed, old"
    assert other.warnings == [
        "style(s) 'noir' not in this server's styles (STYLES_FILE): ignored; styles: night, frame"
    ]


def test_the_generate_tab_offers_the_styles_and_sends_the_chosen_ones(pipe):
    from engine import Engine
    from engine.settings import AppSettings
    from ui.demo import create_demo

    demo = create_demo(Engine(pipe), AppSettings())
    form = demo.tabs["generate"]["form"]
    control = form.c["styles"]
    assert control.multiselect and control.visible and [c[0] for c in control.choices] == ["night", "frame"]
    assert form.read({**dict.fromkeys(form.inputs), control: ["frame"]})["styles"] == ["frame"]
    assert demo.tabs["generate"]["embeddings"].visible is False  # no EMBEDDINGS_DIR here: nothing to list
