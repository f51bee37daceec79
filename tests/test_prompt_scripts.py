"""A1111's Prompt matrix and Prompts from file or textbox as script cells (no model: cells only)."""

from __future__ import annotations

import pytest

from engine.prompt_scripts import prompt_matrix_cells, prompts_from_text_cells
from pipelines import GenerationRequest
from pipelines.sampling.samplers import from_any


def base(**kwargs) -> GenerationRequest:
    return GenerationRequest(**{"prompt": "a cat | hat | scarf", "steps": 2, "seed": 7, **kwargs})


# ---------------------------------------------------------------- Prompt matrix
def test_matrix_combines_parts_in_a1111_order_on_its_grid():
    cells, layout = prompt_matrix_cells(base(num_images=3))
    assert [c.request.prompt for c in cells] == ["a cat", "a cat, hat", "a cat, scarf", "a cat, hat, scarf"]
    assert [c.at for c in cells] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert {c.request.seed for c in cells} == {7}
    assert {c.request.num_images for c in cells} == {1}
    assert (layout.xs, layout.ys, layout.zs) == (["-", "+hat"], ["-", "+scarf"], [""])
    assert layout.fields == [("Script", "Prompt matrix"), ("Prompt matrix", "a cat | hat | scarf")]


def test_matrix_of_three_parts_has_four_columns_and_two_rows():
    cells, layout = prompt_matrix_cells(base(prompt="x | a | b | c"), margin=4)
    assert len(cells) == 8 and layout.margin == 4
    assert layout.xs == ["-", "+a", "+b", "+a +b"] and layout.ys == ["-", "+c"]
    assert cells[5].at == (1, 1, 0) and cells[5].request.prompt == "x, a, c"


def test_matrix_put_at_start_and_space_delimiter():
    cells, _ = prompt_matrix_cells(base(), put_at_start=True, delimiter="space")
    assert [c.request.prompt for c in cells] == ["a cat", "hat a cat", "scarf a cat", "hat scarf a cat"]


def test_matrix_of_the_negative_prompt_keeps_the_positive():
    cells, _ = prompt_matrix_cells(base(prompt="a cat", negative_prompt="blur | noise,"), prompt_type="negative")
    assert [c.request.negative_prompt for c in cells] == ["blur", "blur, noise"]
    assert {c.request.prompt for c in cells} == {"a cat"}


def test_matrix_different_seeds_and_a_drawn_seed():
    cells, _ = prompt_matrix_cells(base(), different_seeds=True)
    assert [c.request.seed for c in cells] == [7, 8, 9, 10]
    cells, _ = prompt_matrix_cells(base(seed=None))
    assert cells[0].request.seed is not None and len({c.request.seed for c in cells}) == 1


def test_matrix_refusals():
    with pytest.raises(ValueError, match=r"no \| parts"):
        prompt_matrix_cells(base(prompt="a cat"))
    with pytest.raises(ValueError, match="256"):
        prompt_matrix_cells(base(prompt="a" + " | x" * 9))
    with pytest.raises(ValueError, match="prompt_type"):
        prompt_matrix_cells(base(), prompt_type="both")
    with pytest.raises(ValueError, match="delimiter"):
        prompt_matrix_cells(base(), delimiter="tab")


# ---------------------------------------------------------------- Prompts from file or textbox
def test_plain_lines_are_prompts_blank_lines_dropped():
    cells, layout = prompts_from_text_cells(base(prompt="x"), "a dog\n\n  a fox  \n", position="end")
    assert [c.request.prompt for c in cells] == ["x a dog", "x a fox"]
    assert [c.at for c in cells] == [(0, 0, 0), (1, 0, 0)]
    assert layout.xs == ["1", "2"] and layout.legend is False
    assert layout.fields == [("Script", "Prompts from file or textbox")]


def test_a1111_options_set_the_request():
    line = '--prompt "a dog" --steps 3 --cfg_scale 2.5 --sampler_name "DPM++ 2M" --batch_size 2 --n_iter 2'
    (cell,), _ = prompts_from_text_cells(base(prompt="x"), line)
    request = cell.request
    assert request.prompt == "a dog x"
    assert (request.steps, request.guidance_scale, request.num_images) == (3, 2.5, 4)
    assert request.sampler == from_any("DPM++ 2M").sampler


def test_prompt_option_takes_words_up_to_the_next_option_and_negatives_join():
    line = "--prompt a red dog --negative_prompt dull --styles 'one, two' --seed 5 --tiling true"
    (cell,), _ = prompts_from_text_cells(base(prompt="photo", negative_prompt="blur"), line, position="end")
    assert cell.request.prompt == "photo a red dog" and cell.request.negative_prompt == "blur dull"
    assert cell.request.styles == ("one", "two") and cell.request.seed == 5


def test_a_line_that_does_not_parse_is_the_prompt():
    text = "a cat -- in a hat\n--prompt dog --unknown 3\n--steps x"
    cells, _ = prompts_from_text_cells(base(prompt="x"), text)
    assert [c.request.prompt for c in cells] == ["a cat -- in a hat x", "--prompt dog --unknown 3 x", "--steps x x"]
    assert {c.request.steps for c in cells} == {2}


def test_iterate_seed_adds_the_base_count_per_line_and_a_line_seed_wins():
    cells, _ = prompts_from_text_cells(base(seed=10), "a\nb\nc", iterate_seed=True)
    assert [c.request.seed for c in cells] == [10, 11, 12]
    cells, _ = prompts_from_text_cells(base(seed=10, num_images=2), "a\n--prompt b --seed 3\nc", iterate_seed=True)
    assert [c.request.seed for c in cells] == [10, 3, 14]
    cells, _ = prompts_from_text_cells(base(seed=None), "a\nb", same_seed=True)
    assert cells[0].request.seed is not None and cells[0].request.seed == cells[1].request.seed
    cells, _ = prompts_from_text_cells(base(seed=None), "a\nb")
    assert {c.request.seed for c in cells} == {None}  # each line draws its own when it runs


def test_refusals_name_the_line():
    with pytest.raises(ValueError, match=r"^line 2: steps"):
        prompts_from_text_cells(base(), "a\n--prompt b --steps 999")
    with pytest.raises(ValueError, match="no prompts"):
        prompts_from_text_cells(base(), " \n\n")
    with pytest.raises(ValueError, match="1000"):
        prompts_from_text_cells(base(), "a\n" * 1001)
    with pytest.raises(ValueError, match="position"):
        prompts_from_text_cells(base(), "a", position="middle")
