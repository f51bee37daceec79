"""The text-to-video evaluation's scorer (models/eval_video.py, issue 56): right on the world's own clips,
and it catches a wrong direction, a shape that changes, a wrong colour, and a model that does not move."""

from __future__ import annotations

import random

import numpy as np
from PIL import Image

from models import eval_video
from models.eval_video import Ask, draw_asks, evaluate, parse_prompt, read_direction, score_clip, self_check
from models.train.video_world import DIRECTIONS, SIZE_RANGE, STILL, Clip, render_clip
from models.train.world import Scene


def clip_for(ask: Ask, seed: int = 0, direction: str | None = None, size: float | None = None) -> Clip:
    rng = random.Random(seed)
    rotation = rng.uniform(-10, 10) if ask.shape == "triangle" else 0.0
    size = size if size is not None else rng.uniform(*SIZE_RANGE)
    scene = Scene(ask.color, ask.shape, ask.background, size, 0.5, 0.5, rotation)
    return Clip(scene, ask.direction if direction is None else direction)


def ground_truth(prompt: str, seed: int) -> list[Image.Image]:
    return [Image.fromarray(frame) for frame in render_clip(clip_for(parse_prompt(prompt), seed))]


def never_moves(prompt: str, seed: int) -> np.ndarray:
    return render_clip(clip_for(parse_prompt(prompt), seed, direction=STILL))


def test_the_scorer_is_right_on_the_worlds_own_clips():
    assert self_check(n=40) == 1.0


def test_directions_are_read_with_the_thresholds():
    assert read_direction(0.44, 0.0) == "right" and read_direction(-0.16, 0.05) == "left"
    assert read_direction(0.02, -0.3) == "up" and read_direction(0.0, 0.2) == "down"
    assert read_direction(0.05, -0.04) == STILL  # a wobble under STILL_MAX
    assert read_direction(0.1, 0.0) == eval_video.UNCLEAR  # too far for still, too short for a move
    assert eval_video.STILL_MAX < eval_video.MOVE_MIN < 0.44 / 2


def test_a_clip_moving_the_wrong_way_is_scored_wrong():
    left = Ask("red", "circle", "blue", "left")
    frames = render_clip(clip_for(left))
    assert score_clip(frames, left).direction_right
    judged = score_clip(frames, left._replace(direction="right"))
    assert not judged.direction_right and judged.seen_direction == "left"
    assert judged.frames_right == judged.frames and judged.consistency == 1.0  # only the direction is wrong
    assert not score_clip(frames, left._replace(direction=STILL)).direction_right
    dx, dy = judged.displacement
    assert dx < -0.4 and abs(dy) < 0.01


def test_a_shape_that_changes_mid_clip_is_inconsistent():
    circle, square = Ask("yellow", "circle", "black", "right"), Ask("yellow", "square", "black", "right")
    frames = np.concatenate([render_clip(clip_for(circle))[:8], render_clip(clip_for(square))[8:]])
    judged = score_clip(frames, circle)
    assert (judged.pairs, judged.pairs_kept) == (16, 15) and judged.consistency < 1.0
    assert judged.wrong_frames == list(range(8, 17))
    # the same shape jumping in size (0.26 -> 0.36 of the side: 1.9x the area) is not kept either
    small, big = render_clip(clip_for(circle, size=0.26)), render_clip(clip_for(circle, size=0.36))
    assert score_clip(np.concatenate([small[:8], big[8:]]), circle).pairs_kept == 15


def test_a_wrong_colour_is_counted():
    drawn = Ask("red", "triangle", "white", "down")
    judged = score_clip(render_clip(clip_for(drawn)), drawn._replace(color="green"))
    assert judged.frames_right == 0 and judged.color_right == 0 and judged.frame_share == 0.0
    assert judged.background_right == judged.shape_right == judged.frames == 17
    assert judged.direction_right and judged.consistency == 1.0


def test_the_asks_are_seeded_and_cover_every_direction_and_still():
    asks = draw_asks(60, seed=0)
    assert asks == draw_asks(60, seed=0) and asks != draw_asks(60, seed=1)
    counts = {d: sum(a.direction == d for a, _ in asks) for d in [*DIRECTIONS, STILL]}
    assert counts[STILL] == 9 and all(12 <= counts[d] <= 13 for d in DIRECTIONS)
    assert all(parse_prompt(a.prompt) == a for a, _ in asks)
    assert len({s for _, s in asks}) == 60


def test_the_ground_truth_meets_every_goal(tmp_path):
    report = evaluate(ground_truth, n=50, seed=3)
    assert report["n"] == 50 and report["goals_met"]
    assert (report["frames"], report["direction"], report["consistency"]) == (1.0, 1.0, 1.0)
    assert set(report["per_direction"]) == {"left", "right", "up", "down", "still"}
    eval_video.save_sheet(report.pop("_clips"), report["rows"], tmp_path / "sheet.png", count=2)
    with Image.open(tmp_path / "sheet.png") as sheet:
        assert sheet.size == (9 * 128, 2 * (128 + 14))  # every other frame of 17, 2x, a label line each


def test_a_model_that_never_moves_fails_the_direction_goal():
    report = evaluate(never_moves, n=20, seed=3)
    still = report["per_direction"]["still"]["n"]
    assert report["direction"] == still / 20 < eval_video.GOALS["direction"]
    assert not report["goals"]["direction"]["met"] and not report["goals_met"]
    assert report["goals"]["frames"]["met"] and report["goals"]["consistency"]["met"]
    assert report["per_direction"]["left"]["direction"] == 0.0 and report["per_direction"]["still"]["direction"] == 1.0


def test_models_eval_dispatches_video_to_this_module():
    from models.eval import build_parser, special_evaluation

    assert special_evaluation(build_parser().parse_args(["--video"])) is eval_video.run_video
