"""Evaluation of the embedded text-to-video model, `models/tiny-shapes-video/` (issue 56).

    python -m models.eval_video [--model models/tiny-shapes-video] [--n 60] [--steps 20] [--out DIR] [--json [PATH]]
    python -m models.eval --video --n 60          # the same, through the image evaluation's command line
    python -m models.eval_video --no-refine        # the model's drafts alone, without its refine pass
    python -m models.eval_video --refine models/refiners/tiny-shapes-motion --strength 0.5   # another refine strength

The model is evaluated as the app runs it: its clips through its refine pass where its vocabulary names one
(pipelines.video.refine: tiny-shapes-video's motion-module refiner). Prompts come from the moving-shapes world (models.train.video_world) with a seeded RNG: a random colour,
shape and background, the directions in equal shares and still clips as often as in training. Each
generated clip is judged without any learned model:

- frames: every frame through models.scoring's `classify`; a frame is right when its colour, shape and
  background are all the asked ones;
- direction: the shape's centroid (the foreground mask `classify` uses: pixels far from the frame's
  background colour) in the first and the last frame; the net displacement is read as a direction
  (`read_direction`, thresholds below) and must be the asked one;
- consistency: the share of consecutive frame pairs where the shape and colour classifications stay the
  same and the foreground area changes by less than 35 % (the same shape kept from frame to frame).

The same scorer on clips rendered by the world itself is 100 % right on all three (`self_check`), so
errors it reports are the model's. Goals (issue 56): frames >= 0.90, direction >= 0.80, consistency >= 0.90.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from models.scoring import Classification, classify, save_grid
from models.train.video_world import (
    DIRECTIONS,
    FRAME_SIZE,
    NUM_FRAMES,
    STILL,
    STILL_SHARE,
    TRAVEL,
    prompt_for,
    random_clip,
    render_clip,
)
from models.train.world import COLORS

VIDEO_DIR = Path(__file__).resolve().parent / "tiny-shapes-video"
OUT_DIR = Path(__file__).resolve().parent / "train" / "runs" / "eval-video"
GUIDANCE = 5.0
REFINE_GUIDANCE = 4.0  # the refiner's: the image model's own default
FOREGROUND_DISTANCE = 60.0  # RGB distance from the background colour that counts as the shape (as classify)
# The world moves the centre by TRAVEL = 0.44 of the side over a clip. A moving clip must go at least
# MOVE_MIN = 0.15 (about a third of TRAVEL) along the asked axis: a model that moves the shape the right
# way but too slowly still passes, while the centroid's wobble of a few pixels in a still or noisy clip
# (a 64-px frame: 0.15 is ~10 px) cannot fake a move. A still clip must drift less than STILL_MAX =
# 0.08 (under a fifth of TRAVEL, ~5 px) in all: room for a wobble, far from any move. Between the two
# a drift is neither ("unclear") and wrong for every ask.
MOVE_MIN = round(TRAVEL / 3, 2)  # 0.15
STILL_MAX = round(TRAVEL / 5.5, 2)  # 0.08
AREA_CHANGE_MAX = 0.35  # consecutive frames: the larger foreground at most 1.35 times the smaller
UNCLEAR, UNSEEN = "unclear", "none"  # read directions besides DIRECTIONS' and STILL
GOALS = {"frames": 0.90, "direction": 0.80, "consistency": 0.90}
PROMPT_PATTERN = re.compile(r"a (\w+) (\w+)(?: moving (\w+))? on a (\w+) background")

Frame = Image.Image | np.ndarray


class Ask(NamedTuple):
    """What a prompt asks for: direction is a key of DIRECTIONS, or STILL ("")."""

    color: str
    shape: str
    background: str
    direction: str = STILL

    @property
    def prompt(self) -> str:
        return prompt_for(self.color, self.shape, self.background, self.direction)


def parse_prompt(prompt: str) -> Ask:
    """The ask of a video-world prompt ("a red circle moving left on a blue background")."""
    match = PROMPT_PATTERN.fullmatch(prompt.strip())
    if match is None:
        raise ValueError(f"not a video-world prompt: {prompt!r}")
    color, shape, direction, background = match.groups()
    return Ask(color, shape, background, direction or STILL)


@dataclass
class ClipScore:
    """One clip judged against its ask (displacement: first to last frame, fractions of the side, y down)."""

    frames: int
    frames_right: int  # colour, shape and background all right
    color_right: int
    background_right: int
    shape_right: int
    wrong_frames: list[int]
    displacement: tuple[float, float] | None  # None: no shape in the first or the last frame
    seen_direction: str  # a key of DIRECTIONS, STILL, UNCLEAR or UNSEEN
    direction_right: bool
    pairs: int
    pairs_kept: int

    @property
    def frame_share(self) -> float:
        return self.frames_right / self.frames if self.frames else 0.0

    @property
    def consistency(self) -> float:
        return self.pairs_kept / self.pairs if self.pairs else 0.0

    @property
    def all_right(self) -> bool:
        return self.frames_right == self.frames and self.direction_right and self.pairs_kept == self.pairs


def _pixels(frame: Frame) -> np.ndarray:
    if isinstance(frame, Image.Image):
        frame = frame.convert("RGB")
    return np.asarray(frame)[..., :3]


def foreground(pixels: np.ndarray, background: str) -> np.ndarray:
    """The shape's mask: pixels far from the background colour."""
    distance = np.linalg.norm(pixels.astype(np.float32) - np.array(COLORS[background], dtype=np.float32), axis=-1)
    return distance > FOREGROUND_DISTANCE


def centroid(mask: np.ndarray) -> tuple[float, float] | None:
    """The mask's centre (x, y) in fractions of the side, or None for an empty mask."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return (float(xs.mean()) + 0.5) / mask.shape[1], (float(ys.mean()) + 0.5) / mask.shape[0]


def read_direction(dx: float, dy: float) -> str:
    """The direction a net displacement shows: STILL under STILL_MAX in all, a key of DIRECTIONS when its
    dominant axis moved at least MOVE_MIN (its sign the way), else UNCLEAR."""
    if math.hypot(dx, dy) < STILL_MAX:
        return STILL
    horizontal = abs(dx) >= abs(dy)
    along = dx if horizontal else dy
    if abs(along) < MOVE_MIN:
        return UNCLEAR
    sign = 1 if along > 0 else -1
    step = (sign, 0) if horizontal else (0, sign)
    return next(name for name, unit in DIRECTIONS.items() if unit == step)


def _kept(a: tuple[Classification, int], b: tuple[Classification, int]) -> bool:
    (first, area_a), (second, area_b) = a, b
    if min(area_a, area_b) == 0:
        return False
    same = (first.shape, first.color) == (second.shape, second.color)
    return same and max(area_a, area_b) / min(area_a, area_b) - 1 < AREA_CHANGE_MAX


def score_clip(frames: Sequence[Frame], ask: Ask) -> ClipScore:
    """Judge one generated clip (PIL images or uint8 arrays) against what was asked."""
    facts, centres = [], []
    for frame in frames:
        pixels = _pixels(frame)
        seen = classify(pixels)
        mask = foreground(pixels, seen.background)
        facts.append((seen, int(mask.sum())))
        centres.append(centroid(mask))
    right = [(c.color, c.shape, c.background) == (ask.color, ask.shape, ask.background) for c, _ in facts]
    displacement, seen_direction = None, UNSEEN
    if centres and centres[0] is not None and centres[-1] is not None:
        displacement = (centres[-1][0] - centres[0][0], centres[-1][1] - centres[0][1])
        seen_direction = read_direction(*displacement)
    return ClipScore(
        frames=len(facts),
        frames_right=sum(right),
        color_right=sum(c.color == ask.color for c, _ in facts),
        background_right=sum(c.background == ask.background for c, _ in facts),
        shape_right=sum(c.shape == ask.shape for c, _ in facts),
        wrong_frames=[i for i, ok in enumerate(right) if not ok],
        displacement=displacement,
        seen_direction=seen_direction,
        direction_right=seen_direction == ask.direction,
        pairs=max(0, len(facts) - 1),
        pairs_kept=sum(_kept(a, b) for a, b in itertools.pairwise(facts)),
    )


def self_check(n: int = 100, seed: int = 0) -> float:
    """Share of clips rendered by the world itself (`render_clip`) that the scorer judges entirely right
    (every frame, the direction, every pair kept); should be 1.0."""
    rng = random.Random(f"eval-video-self-check-{seed}")
    right = 0
    for _ in range(n):
        clip = random_clip(rng)
        s = clip.scene
        right += score_clip(render_clip(clip), Ask(s.color, s.shape, s.background, clip.direction)).all_right
    return right / n


def draw_asks(n: int, seed: int = 0) -> list[tuple[Ask, int]]:
    """`n` asks from the video world with a generation seed each: colour, shape and background as the world
    draws them, the directions in equal shares and STILL_SHARE of them still (at least one)."""
    rng = random.Random(f"eval-video-{seed}")
    stills = max(1, round(n * STILL_SHARE)) if n > 1 else 0
    directions = [list(DIRECTIONS)[i % len(DIRECTIONS)] for i in range(n - stills)] + [STILL] * stills
    rng.shuffle(directions)
    asks = []
    for direction in directions:
        s = random_clip(rng).scene
        asks.append((Ask(s.color, s.shape, s.background, direction), rng.randrange(2**31 - 1)))
    return asks


def direction_name(direction: str) -> str:
    return direction or "still"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The shares over scored rows: frames (all three, and each), direction, consistency, per direction,
    and which goals hold."""

    def shares(part: list[dict[str, Any]]) -> dict[str, float]:
        frames = sum(r["frames"] for r in part) or 1
        return {
            "frames": sum(r["frames_right"] for r in part) / frames,
            "direction": sum(r["direction_right"] for r in part) / len(part),
            "consistency": sum(r["pairs_kept"] for r in part) / (sum(r["pairs"] for r in part) or 1),
        }

    overall = shares(rows)
    frames = sum(r["frames"] for r in rows) or 1
    names = [*DIRECTIONS, STILL]
    per_direction = {
        direction_name(d): {"n": len(part), **shares(part)}
        for d in names
        if (part := [r for r in rows if r["want"]["direction"] == d])
    }
    goals = {key: {"value": overall[key], "goal": goal, "met": overall[key] >= goal} for key, goal in GOALS.items()}
    return {
        "n": len(rows),
        **overall,
        **{f"{key}_frames": sum(r[f"{key}_right"] for r in rows) / frames for key in ("color", "background", "shape")},
        "per_direction": per_direction,
        "goals": goals,
        "goals_met": all(g["met"] for g in goals.values()),
    }


def evaluate(generate: Callable[[str, int], Sequence[Frame]], n: int = 60, seed: int = 0) -> dict[str, Any]:
    """Generate `n` clips, `generate(prompt, seed) -> frames`, for seeded video-world asks and score them:
    the summary (`summarize`), seconds per clip, a row per clip and, under "_clips", the clips themselves."""
    rows, clips = [], []
    start = time.perf_counter()
    for ask, clip_seed in draw_asks(n, seed):
        frames = list(generate(ask.prompt, clip_seed))
        score = score_clip(frames, ask)
        rows.append(
            {
                "prompt": ask.prompt,
                "seed": clip_seed,
                "want": ask._asdict(),
                **asdict(score),
                "frame_share": score.frame_share,
                "consistency": score.consistency,
            }
        )
        clips.append(frames)
    seconds = time.perf_counter() - start
    return {**summarize(rows), "seconds_per_clip": seconds / max(1, n), "rows": rows, "_clips": clips}


def print_summary(report: dict[str, Any]) -> None:
    moving = sum(v["n"] for k, v in report["per_direction"].items() if k != "still")
    print(
        f"{report.get('model', 'model')}: {report['n']} clips ({moving} moving, {report['n'] - moving} still), "
        f"{NUM_FRAMES} frames {FRAME_SIZE}x{FRAME_SIZE}, {report.get('steps')} steps, CFG {report.get('guidance_scale')}, "
        f"{report['seconds_per_clip']:.2f} s/clip"
    )
    if "self_check" in report:
        print(f"scorer on rendered clips: {report['self_check']:.3f}")
    labels = {"frames": "frames right (all three)", "direction": "direction right", "consistency": "consistency"}
    for key, goal in report["goals"].items():
        verdict = "met" if goal["met"] else "NOT met"
        print(f"  {labels[key]:<25} {goal['value'] * 100:5.1f} %   goal >= {goal['goal'] * 100:.0f} %: {verdict}")
    for key in ("color", "background", "shape"):
        print(f"  {key + ' (frames)':<25} {report[key + '_frames'] * 100:5.1f} %")
    for name, part in report["per_direction"].items():
        print(f"  {name:<6} n={part['n']:<3} direction {part['direction'] * 100:5.1f} %  frames {part['frames'] * 100:5.1f} %  "
              f"consistency {part['consistency'] * 100:5.1f} %")  # fmt: skip
    failed = [key for key, goal in report["goals"].items() if not goal["met"]]
    print("goals (issue 56): " + ("all met" if not failed else "not met: " + ", ".join(failed)))


def save_sheet(clips: list[Sequence[Frame]], rows: list[dict[str, Any]], path: Path, count: int = 6, every: int = 2) -> None:
    """A contact sheet of the first `count` clips, a row each (every `every`-th frame), labelled with the ask
    and the verdicts; frames judged wrong are marked "x"."""
    images, labels = [], []
    for frames, row in zip(clips[:count], rows[:count], strict=False):
        want = row["want"]
        info = [
            f"{want['color']} {want['shape']}",
            f"{direction_name(want['direction'])} on {want['background']}",
            f"saw {direction_name(row['seen_direction'])}",
            f"frames {row['frame_share']:.0%} kept {row['consistency']:.0%}",
        ]
        for column, index in enumerate(range(0, len(frames), every)):
            frame = frames[index]
            images.append(frame.convert("RGB") if isinstance(frame, Image.Image) else Image.fromarray(_pixels(frame)))
            mark = " x" if index in row["wrong_frames"] else ""
            labels.append(info[column] if column < len(info) else f"t{index}{mark}")
    columns = len(range(0, NUM_FRAMES, every))
    save_grid(images, labels, path, columns=columns)


def load_generator(model: str | Path, steps: int, guidance: float = GUIDANCE) -> Callable[[str, int], list[Image.Image]]:
    """`generate(prompt, seed)` over the diffusers video folder `model` (the embedded AnimateDiffPipeline, the first
    model's WanPipeline; on the GPU when there is one)."""
    import torch
    from diffusers import DiffusionPipeline

    from pipelines.run.model_setup import read_vocabulary
    from pipelines.video.family import import_components

    import_components()  # the first model's VAE class, named by its module
    pipe = DiffusionPipeline.from_pretrained(str(model))
    vocabulary = read_vocabulary(str(model))
    text = {"max_sequence_length": vocabulary["max_sequence_length"]} if "max_sequence_length" in vocabulary else {}
    pipe.to("cuda" if torch.cuda.is_available() else "cpu")
    pipe.set_progress_bar_config(disable=True)

    def generate(prompt: str, seed: int) -> list[Image.Image]:
        return pipe(
            prompt, num_frames=NUM_FRAMES, height=FRAME_SIZE, width=FRAME_SIZE, num_inference_steps=steps,
            guidance_scale=guidance, generator=torch.Generator().manual_seed(seed), output_type="pil", **text,
        ).frames[0]  # fmt: skip

    return generate


def with_refiner(generate: Callable[[str, int], list[Image.Image]], refiner: str | Path, strength: float, steps: int,
                 guidance: float) -> Callable[[str, int], list[Image.Image]]:
    """`generate` followed by a motion-module refiner (an AnimateDiff folder: models/refiners/tiny-shapes-motion) as
    video-to-video at `strength`: the draft's motion kept, its shapes redrawn by the image model's UNet."""
    import torch
    from diffusers import AnimateDiffPipeline, AnimateDiffVideoToVideoPipeline

    base = AnimateDiffPipeline.from_pretrained(str(refiner), dtype=torch.float32)
    pipe = AnimateDiffVideoToVideoPipeline.from_pipe(base)
    pipe.set_progress_bar_config(disable=True)

    def refined(prompt: str, seed: int) -> list[Image.Image]:
        return pipe(
            video=generate(prompt, seed), prompt=prompt, strength=strength, num_inference_steps=steps,
            guidance_scale=guidance, generator=torch.Generator().manual_seed(seed), output_type="pil",
        ).frames[0]  # fmt: skip

    return refined


def refiner_for(args: argparse.Namespace, vocabulary: dict[str, Any], model: Path) -> Any:
    """The refine pass evaluated: --refine DIR (at --strength), else the model's own (its vocabulary's, as the app runs
    it: pipelines.video.refine), none with --no-refine."""
    from pipelines.video.refine import RefinerSpec, read_spec

    if getattr(args, "no_refine", False):
        return None
    if getattr(args, "refine", None):
        return RefinerSpec(Path(args.refine), args.strength, REFINE_GUIDANCE)
    return read_spec(vocabulary, model)


def run_video(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation for `python -m models.eval_video` and `python -m models.eval --video`: prints the summary,
    saves the contact sheet (--out DIR, or eval's --grid PATH) and returns the report (JSON-ready)."""
    model = VIDEO_DIR if getattr(args, "model", None) in (None, "default") else Path(args.model)
    from pipelines.run.model_setup import read_vocabulary

    vocabulary = read_vocabulary(str(model))
    steps = args.steps or int(vocabulary.get("default_steps") or 20)
    guidance = getattr(args, "guidance", None)
    guidance = float(vocabulary.get("default_guidance_scale") or GUIDANCE) if guidance is None else guidance
    generate = load_generator(model, steps, guidance)
    refine = {}
    spec = refiner_for(args, vocabulary, model)
    if spec is not None:  # the model's own refine pass, as the app runs it, or --refine's
        refine = {"refiner": str(spec.path), "strength": spec.strength, "refiner_guidance": spec.guidance}
        generate = with_refiner(generate, spec.path, spec.strength, steps, spec.guidance)
    report = evaluate(generate, args.n, args.seed)
    clips = report.pop("_clips")
    report = {"model": str(model), "steps": steps, "guidance_scale": guidance, **refine, "self_check": self_check(), **report}
    print_summary(report)
    out = getattr(args, "out", None)
    grid = getattr(args, "grid", None)
    sheet = Path(grid) if grid and not out else Path(out or OUT_DIR) / "contact_sheet.png"
    save_sheet(clips, report["rows"], sheet)
    print(f"contact sheet: {sheet}")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m models.eval_video", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(VIDEO_DIR), help="a video model folder (default: tiny-shapes-video)")
    parser.add_argument("--n", type=int, default=60, help="number of clips (prompts and seeds from the RNG)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="default: the model's (vocabulary.json), else 20")
    parser.add_argument("--guidance", type=float, default=None, help=f"default: the model's, else {GUIDANCE}")
    parser.add_argument("--refine", default=None, help="a motion-module refiner folder, run as video-to-video after "
                        "the model (default: the model's own refiner, its vocabulary's)")
    parser.add_argument("--strength", type=float, default=0.65, help="--refine: how much of the draft is redrawn")
    parser.add_argument("--no-refine", action="store_true", help="the model's clips as drafted, without its refiner")
    parser.add_argument("--out", default=str(OUT_DIR), help="folder for the contact sheet")
    parser.add_argument("--json", nargs="?", const="-", default=None, help="the report as JSON: to stdout, or to PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = run_video(args)
    if args.json == "-":
        print(json.dumps(report, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
