"""Refine the LCM-LoRA on the teacher's own answers: consistency distillation with the ODE solved to its end.

    python -m models.train.train lcm-refine [--steps N]   # writes models/loras/tiny-shapes-lcm.safetensors

LCM's target (`lcm.py`) is the student itself one teacher step later: a bootstrap that converges slowly, and
3,000 steps of it left soft, wobbly shape edges (77 % of scenes all right at 4 steps against 99.5 % for the
teacher at 20). Here the target is what the consistency function is defined to return: the end of the
teacher's probability-flow ODE from the noised latent, solved by guided DDIM (CFG 4, as in `lcm.py`) in
steps of at most 50 timesteps. The start points are the timesteps the LCM sampler visits at 2, 3, 4, 6 and 8
steps (`LCMScheduler`, 50 original steps, trailing), half the samples on the 4-step ones the recipe uses;
each start is a data latent noised to that timestep, which is what the sampler's re-noising gives when the
student is right. After SIZES_FROM steps at 64², half the batches come from the other sizes tiny-shapes was
fine-tuned at (sizes.py), so the fast model holds there too. The pairs are solved once (cached in runs/), then the LoRA, warm-started from the `lcm`
stage, regresses to them (pseudo-Huber, the same boundary scalings). Same LoRA layout, so the export, the
recipe and the loader are unchanged.
"""

from __future__ import annotations

import itertools
import logging
import random

import torch

from .common import (
    RUNS,
    SEED,
    copy_lora,
    load_checkpoint,
    lr_at,
    progress,
    resume_lora,
    save_checkpoint,
    to_tensor,
)
from .lcm import DATASET, HUBER_C, Distiller, encode, prompt_table, student

log = logging.getLogger(__name__)

FOUR_STEP = (999, 759, 499, 259)  # LCMScheduler.set_timesteps(4) on tiny-shapes' config
OTHERS = (879, 839, 679, 639, 379, 339, 179, 139)  # the rest of 2, 3, 6 and 8 steps' timesteps
PER_T = {**dict.fromkeys(FOUR_STEP, 600), **dict.fromkeys(OTHERS, 200)}  # 4,000 pairs at 64²
# Then the other sizes tiny-shapes was fine-tuned at (models/train/sizes.py), fewer pairs each: from SIZES_FROM on,
# half the steps draw a batch at 64² and half at one of these, with as many latent cells in each batch.
SIZES = ((96, 96), (128, 128), (128, 64), (64, 128))
PER_T_SIZES = {**dict.fromkeys(FOUR_STEP, 80), **dict.fromkeys(OTHERS, 20)}  # 480 pairs a size
SIZES_FROM, LR_2 = 1500, 1.5e-4
SOLVER_STRIDE = 50  # the teacher's DDIM steps span at most this many timesteps (20 steps from 999)
BATCH, LR = 32, 3e-4


class Teacher(Distiller):
    """The guided teacher's DDIM solve from (x, t) to the clean latent."""

    @torch.no_grad()
    def solve(self, x: torch.Tensor, t: int, cond: torch.Tensor) -> torch.Tensor:
        n = -(-t // SOLVER_STRIDE)  # ceil
        times = torch.linspace(t, 0, n + 1).round().long().tolist()
        for now, nxt in itertools.pairwise(times):
            x = self._teacher_step(x, torch.full((len(x),), now), torch.full((len(x),), nxt), cond)
        return self._guided(x, torch.zeros(len(x), dtype=torch.long), cond)[0]  # timestep 0 to the clean latent


def sized_data(pipe, size: tuple[int, int], n: int, prompts: list[str]) -> tuple[dict, torch.Tensor]:
    """`n` seeded scenes drawn at `size` and encoded as the app's VAE does (sizes.encode), with prompt indices."""
    from .sizes import encode as encode_sized
    from .world import random_scene, render_batch

    rng = random.Random(f"{SEED}-lcm-refine-{size}")
    scenes = [random_scene(rng) for _ in range(n)]
    means = [encode_sized(pipe.vae, to_tensor(render_batch(scenes[i : i + 64], size)))[0] for i in range(0, n, 64)]
    return {"mean": torch.cat(means)}, torch.tensor([prompts.index(s.prompt) for s in scenes])


def solve_pairs(pipe, teacher: Teacher, data: dict, which: torch.Tensor, per_t: dict = PER_T, name: str = "") -> dict:
    """(start latent, timestep, prompt index, the teacher's clean latent) for `per_t`; cached in runs/."""
    cache = RUNS / f"lcm-refine-pairs-{sum(per_t.values())}{name}.pt"
    if cache.exists():
        return torch.load(cache)
    gen = torch.Generator().manual_seed(SEED * 7_000 + len(name))
    scale = pipe.vae.config.scaling_factor
    parts: dict[str, list] = {"x": [], "t": [], "idx": [], "target": []}
    bar = progress(sum(per_t.values()), 0, f"lcm-refine pairs{name}")
    for t, count in per_t.items():
        for start in range(0, count, 128):
            pick = torch.randint(0, len(data["mean"]), (min(128, count - start),), generator=gen)
            latents = data["mean"][pick].float() * scale
            steps = torch.full((len(pick),), t)
            x = teacher._coef(teacher.alpha, steps) * latents + teacher._coef(teacher.sigma, steps) * torch.randn(latents.shape, generator=gen)
            parts["target"].append(teacher.solve(x, t, teacher.embeds[which[pick]]))
            parts["x"].append(x)
            parts["t"].append(steps)
            parts["idx"].append(which[pick])
            bar.update(len(pick))
    bar.close()
    pairs = {k: torch.cat(v) for k, v in parts.items()}
    torch.save(pairs, cache)
    return pairs


def train_lcm_refine(steps: int) -> None:
    from .lcm import export_lcm

    out = RUNS / "lcm-refine"
    pipe = student()
    params = [p for p in pipe.unet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    start = resume_lora(out / "ckpt.pt", params, opt, "lcm-refine")
    if start == 0:
        warm = load_checkpoint(RUNS / "lcm" / "ckpt.pt")
        if warm is None:
            raise SystemExit("lcm-refine: no lcm checkpoint to start from; run the lcm stage first")
        copy_lora(params, warm["lora"])
    data = encode(pipe.vae, DATASET)
    prompts, which, embeds, empty = prompt_table(pipe, data["prompts"])
    teacher = Teacher(pipe, embeds, empty)
    groups = [solve_pairs(pipe, teacher, data, which)]
    if steps > SIZES_FROM:
        for w, h in SIZES:
            sized, sized_which = sized_data(pipe, (w, h), 400, prompts)
            groups.append(solve_pairs(pipe, teacher, sized, sized_which, PER_T_SIZES, f"-{w}x{h}"))
    pipe.unet.train()
    bar = progress(steps, start, "lcm-refine")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 400_000 + step)
        late = step >= SIZES_FROM
        pairs = groups[0] if not late or step % 2 == 0 else groups[1 + (step // 2) % len(SIZES)]
        cells = pairs["x"].shape[-1] * pairs["x"].shape[-2]
        pick = torch.randint(0, len(pairs["t"]), (max(4, BATCH * 256 // cells),), generator=gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step - SIZES_FROM, steps - SIZES_FROM, LR_2, warmup=50) if late else lr_at(step, SIZES_FROM, LR, warmup=50)
        pred = teacher._consistency(pairs["x"][pick], pairs["t"][pick], embeds[pairs["idx"][pick]])
        loss = (((pred - pairs["target"][pick]) ** 2 + HUBER_C**2).sqrt() - HUBER_C).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.5f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", lora=[p.detach().clone() for p in params], opt=opt.state_dict(), step=step + 1)
    bar.close()
    export_lcm(out)
