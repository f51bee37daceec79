"""Stage `edit`: train `models/tiny-shapes-edit`, an InstructPix2Pix-style instruction editor.

    python -m models.train.train edit [--steps N]       # train (resumable), then export
    python -m models.train.train edit-export            # export the last checkpoint again

Like InstructPix2Pix (Brooks et al. 2023), the editor is the text-to-image model fine-tuned with
the input image's latents concatenated to the noisy latents (UNet `in_channels` 4 -> 8; the new
input weights start at zero, so training starts from tiny-shapes' own behaviour). The VAE is
tiny-shapes' (frozen: it already encodes this world), the text encoder starts from tiny-shapes'
and learns the instruction words, which the tokenizer adds after the scene words. Conditioning
is dropped as the paper does (5 % text, 5 % image, 5 % both) so that the pipeline's two guidance
scales work. The result loads with diffusers' `StableDiffusionInstructPix2PixPipeline`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from . import configs, edit_world
from .common import (
    EMA,
    MODELS_DIR,
    RUNS,
    SEED,
    load_checkpoint,
    lr_at,
    nest_clip_keys,
    progress,
    save_checkpoint,
    to_tensor,
    tokenize,
)
from .tokenizer import WORDS, build_tokenizer
from .world import render_batch

log = logging.getLogger(__name__)

BASE = MODELS_DIR / "tiny-shapes"
EDIT_OUT = MODELS_DIR / "tiny-shapes-edit"
EDIT_WORDS = (*WORDS, *edit_world.WORDS)
BATCH = 64
CONV_IN_LR_FACTOR = 4
GROUP_LR = (1.0, CONV_IN_LR_FACTOR)  # the optimizer's groups: the rest, the UNet's input layer
DROP = 0.05  # per condition, as InstructPix2Pix
NOOP_FRACTION = 0.2  # of training pairs; "make it red" when it is red must keep the image


def edit_tokenizer():
    return build_tokenizer(EDIT_WORDS)


@dataclass(frozen=True)
class PairSet:
    """One seeded set of training pairs. With `conflict_fraction`, each draw is that often an extra
    cannot-apply instruction naming the other region's colour together with the same scene's
    applicable edit of that kind (`edit_world.conflict_pair`), else a random edit."""

    n: int
    conflict_fraction: float = 0.0


PAIR_SETS = (PairSet(32_000), PairSet(32_000), PairSet(12_000, 0.2))


@dataclass(frozen=True)
class Phase:
    """One stretch of the schedule: its own cosine learning rate, data and noise levels.

    Phase 1 teaches the editing task from tiny-shapes' weights. Phase 2 restarts the rate on twice
    the pairs and draws three quarters of its noise levels from the upper half: the shape's and the
    background's colours are decided there (at 20 steps the first sampling steps are t = 999, 949,
    ...), and after phase 1 that is where the error was (x0 error 0.079 at t = 980 vs 0.004 at
    t = 400), while plain v-loss at low noise is mostly noise-estimation error that no output shows
    (v-loss 0.068 at t = 50 for an x0 error of 0.0006). It runs 6,000 steps: with 4,000 the
    finished editor kept the shape's colour on background and shape edits 96.9 % of the time at
    the evaluation's seed 0 (124 of 128, one short of 97 %); with 6,000, 98.4 % / 99.2 % (drawn /
    generated inputs), and across seeds 0-3 all-three rose from 96.9 % / 96.6 % to 97.5 % / 98.5 %.
    More steps as a restart at the end do not work (README: a fresh optimizer at 1e-4 undid the
    editor), so they are here, on phase 2's own optimizer and cosine.

    Phase 3 is for the instructions that cannot apply: after phase 2 a shape or background colour
    naming the other region's colour kept the image only 52 times in 100 (held-out). It draws from
    its own set, where one pair in six is such an instruction and one in six the same scene's edit
    that applies (`edit_world.conflict_pair`), at half phase 2's rate: 73 in 100 then kept it.
    Without the partners (three pairs in ten cannot apply) 84 did, but background edits that apply
    started to recolour the shape instead; at phase 2's rate, or with three in four of the extra
    ones of the background kind, it did no better (64, 77).

    Phase 4 (`from_ema`) starts from the EMA weights, the ones phase 3 exports, with a fresh
    optimizer, and runs phase 3's data again at half its rate; its own EMA (time constant 500
    steps) keeps about a third of where it started. Held-out (seed 99), cannot-apply instructions
    naming the other region's colour then kept the image 83 times in 100 instead of 71, with
    all-three on random pairs 97.3 % / 95.7 % (drawn / generated inputs) instead of 96.7 % / 95.7 %.
    Because its start is an exported editor, `edit-from-export` can run it alone (see its docstring).
    Phases 3 and 4 were tuned, and their figures here taken, when phase 2 ran 4,000 steps.
    """

    steps: int
    lr: float
    sets: tuple[int, int]  # it draws from PAIR_SETS[first:stop] (one range of the concatenated pairs)
    high_noise_share: float  # of the batch, t drawn from the upper half [500, 1000)
    from_ema: bool = False  # starts from the EMA weights with a fresh optimizer (phase 4)


PHASES = (
    Phase(3000, 3e-4, (0, 1), 0.0),
    Phase(6000, 2e-4, (0, 2), 0.5),
    Phase(800, 1e-4, (2, 3), 0.5),
    Phase(600, 5e-5, (2, 3), 0.5, from_ema=True),
)
DEFAULT_STEPS = sum(p.steps for p in PHASES)  # train.py DEFAULT_STEPS["edit"]


def phase_at(step: int) -> tuple[Phase, int]:
    """The phase a global step belongs to and the step within it (the last phase runs on)."""
    for phase in PHASES[:-1]:
        if step < phase.steps:
            return phase, step
        step -= phase.steps
    return PHASES[-1], step


def pair_range(sets: tuple[int, int]) -> tuple[int, int]:
    """The indexes of PAIR_SETS[first:stop] in the concatenated pairs."""
    sizes = [s.n for s in PAIR_SETS]
    return sum(sizes[: sets[0]]), sum(sizes[: sets[1]])


def _random_edits(pairs: PairSet, rng: random.Random) -> list[edit_world.Edit]:
    if not pairs.conflict_fraction:  # the sets without conflicts keep their original random stream
        return [edit_world.random_edit(rng, NOOP_FRACTION) for _ in range(pairs.n)]
    edits: list[edit_world.Edit] = []
    while len(edits) < pairs.n:
        if rng.random() < pairs.conflict_fraction:
            edits.extend(edit_world.conflict_pair(rng))
        else:
            edits.append(edit_world.random_edit(rng, NOOP_FRACTION))
    return edits[: pairs.n]


def encode_pairs(vae, part: int = 0) -> dict:
    """PAIR_SETS[part]: seeded (scene, instruction, result) examples, both images encoded once
    (cached in runs/); each part is an independent seeded set (part 0 is phase 1's data)."""
    pairs = PAIR_SETS[part]
    name = f"edit-pairs-{pairs.n}" + (f"-{part}" if part else "")
    name += f"-c{round(pairs.conflict_fraction * 100)}" if pairs.conflict_fraction else ""
    cache = RUNS / f"{name}.pt"
    if cache.exists():
        return torch.load(cache)
    rng = random.Random(f"{SEED}-edit-data" if part == 0 else f"{SEED}-edit-data-{part}")
    edits = _random_edits(pairs, rng)
    src_mean, tgt_mean, tgt_std = [], [], []
    with torch.no_grad():
        for i in tqdm(range(0, pairs.n, 256), desc="encode edit pairs"):
            chunk = edits[i : i + 256]
            src = vae.encode(to_tensor(render_batch([e.source for e in chunk]))).latent_dist
            tgt = vae.encode(to_tensor(render_batch([e.target for e in chunk]))).latent_dist
            src_mean.append(src.mean.half())
            tgt_mean.append(tgt.mean.half())
            tgt_std.append(tgt.std.half())
    data = {
        "source": torch.cat(src_mean),
        "target_mean": torch.cat(tgt_mean),
        "target_std": torch.cat(tgt_std),
        "instructions": [e.instruction for e in edits],
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, cache)
    return data


def _widen_conv_in(unet):
    """The tiny-shapes UNet with 8 input channels; the 4 new ones (the input image) start at zero."""
    from diffusers import UNet2DConditionModel

    wide = UNet2DConditionModel.from_config({**unet.config, "in_channels": 8})
    state = unet.state_dict()
    weight = state["conv_in.weight"]
    state["conv_in.weight"] = torch.cat([weight, torch.zeros_like(weight)], dim=1)
    wide.load_state_dict(state)
    return wide


def _grow_text_encoder(text_encoder, old_tokenizer, new_tokenizer):
    """tiny-shapes' text encoder with the new words' embeddings added (old tokens keep theirs)."""
    grown = configs.make_text_encoder(
        len(new_tokenizer), new_tokenizer.bos_token_id, new_tokenizer.eos_token_id, new_tokenizer.pad_token_id
    )
    old_rows = text_encoder.get_input_embeddings().weight.detach()
    state = {k: v for k, v in text_encoder.state_dict().items() if not k.endswith("token_embedding.weight")}
    rows = grown.get_input_embeddings().weight.detach().clone()
    old_vocab = old_tokenizer.get_vocab()
    for token, new_id in new_tokenizer.get_vocab().items():
        if token in old_vocab:
            rows[new_id] = old_rows[old_vocab[token]]
    missing = grown.load_state_dict(state, strict=False).missing_keys
    if len(missing) != 1:  # only the token embedding, set below
        raise RuntimeError(f"text encoder: unexpected missing weights {missing}")
    grown.get_input_embeddings().weight.data.copy_(rows)
    return grown


def build_models():
    """(vae, tokenizer, text encoder, 8-channel UNet), initialised from tiny-shapes."""
    from diffusers import StableDiffusionPipeline

    base = StableDiffusionPipeline.from_pretrained(BASE)
    tokenizer = edit_tokenizer()
    text_encoder = _grow_text_encoder(base.text_encoder, base.tokenizer, tokenizer)
    return base.vae.eval(), tokenizer, text_encoder, _widen_conv_in(base.unet)


def edit_loss(unet, text_encoder, scheduler, batch: dict, generator, high_noise_share: float = 0.0) -> torch.Tensor:
    """Plain v-prediction loss on the result's latents given the input's.

    Not min-SNR weighted as tiny-shapes was: that weight (min(snr, 5) / (snr + 1)) is ~0 at high
    noise, exactly the steps where an editor must take the layout and colours from the input
    image. With it the image channels barely learned (600 steps: loss at t=950 0.30 with the
    image, 0.40 without).
    """
    latents, image, ids = batch["latents"], batch["image"], batch["ids"]
    noise = torch.randn(latents.shape, generator=generator)
    total = scheduler.config.num_train_timesteps
    t = torch.randint(0, total, (latents.shape[0],), generator=generator)
    if high_noise_share:  # drawn after `t` so that phase 1's random stream is unchanged
        high = torch.rand(latents.shape[0], generator=generator) < high_noise_share
        t = torch.where(high, torch.randint(total // 2, total, t.shape, generator=generator), t)
    noisy = scheduler.add_noise(latents, noise, t)
    target = scheduler.get_velocity(latents, noise, t)
    pred = unet(torch.cat([noisy, image], dim=1), t, text_encoder(ids)[0]).sample
    return (pred - target).pow(2).mean()


def sample_batch(
    data: dict, ids_all: torch.Tensor, empty_ids: torch.Tensor, scale: float, gen, span: tuple[int, int] | None = None
) -> dict:
    """A random batch of the pairs in `span` (default all) with InstructPix2Pix's condition dropout
    (the image latents unscaled, as the pipeline passes them)."""
    first, stop = span or (0, len(ids_all))
    idx = torch.randint(first, stop, (BATCH,), generator=gen)
    mean, std = data["target_mean"][idx].float(), data["target_std"][idx].float()
    latents = (mean + std * torch.randn(mean.shape, generator=gen)) * scale
    image = data["source"][idx].float()
    ids = ids_all[idx].clone()
    r = torch.rand(BATCH, generator=gen)
    ids[r < 2 * DROP] = empty_ids  # text dropped: [0, 0.05) alone, [0.05, 0.1) with the image
    image[(r >= DROP) & (r < 3 * DROP)] = 0.0  # image dropped: [0.05, 0.1) with the text, [0.1, 0.15) alone
    return {"latents": latents, "image": image, "ids": ids}


def load_data(vae, tokenizer) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Every phase's pairs, concatenated in PAIR_SETS order (a phase draws from a range of them)."""
    parts = [encode_pairs(vae, part) for part in range(len(PAIR_SETS))]
    data = {key: torch.cat([d[key] for d in parts]) for key in ("source", "target_mean", "target_std")}
    instructions = [i for d in parts for i in d["instructions"]]
    return data, tokenize(tokenizer, instructions), tokenize(tokenizer, [""])[0]


def _optimizer(unet, params):
    conv_in = {id(p) for p in unet.conv_in.parameters()}
    groups = [  # the input layer learns the new image channels from zero: a faster rate there (GROUP_LR)
        {"params": [p for p in params if id(p) not in conv_in]},
        {"params": list(unet.conv_in.parameters())},
    ]
    return torch.optim.AdamW(groups, lr=PHASES[0].lr, weight_decay=0.01)


def train_edit(steps: int = DEFAULT_STEPS) -> None:
    """Phases in order, on one optimizer and one EMA; `steps` stops early on the same schedule."""
    out = RUNS / "edit"
    vae, tokenizer, text_encoder, unet = build_models()
    data, ids_all, empty_ids = load_data(vae, tokenizer)
    params = [*unet.parameters(), *text_encoder.parameters()]
    opt = _optimizer(unet, params)
    ema = EMA(params, decay=0.998)
    scheduler = configs.make_train_scheduler()
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        unet.load_state_dict(ckpt["unet"])
        text_encoder.load_state_dict(ckpt["text_encoder"])
        opt.load_state_dict(ckpt["opt"])
        ema.shadow = ckpt["ema"]
        start = ckpt["step"]
        log.info("edit: resuming at step %d", start)
    unet.train()
    text_encoder.train()
    bar = progress(steps, start, "edit")
    for step in range(start, steps):
        phase, local = phase_at(step)
        if phase.from_ema and local == 0:  # again on a resume at this step: the same state either way
            ema.copy_to(params)
            opt = _optimizer(unet, params)
        gen = torch.Generator().manual_seed(SEED * 300_000 + step)
        batch = sample_batch(data, ids_all, empty_ids, vae.config.scaling_factor, gen, pair_range(phase.sets))
        for group, factor in zip(opt.param_groups, GROUP_LR, strict=True):
            group["lr"] = lr_at(local, phase.steps, phase.lr * factor, warmup=100)
        loss = edit_loss(unet, text_encoder, scheduler, batch, gen, phase.high_noise_share)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update(params, step)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            state = {"unet": unet.state_dict(), "text_encoder": text_encoder.state_dict()}
            save_checkpoint(out / "ckpt.pt", **state, opt=opt.state_dict(), ema=ema.shadow, step=step + 1)
    bar.close()
    export_edit()


def checkpoint_from_export(folder: Path = EDIT_OUT) -> Path:
    """A checkpoint at the start of the first `from_ema` phase holding `folder`'s weights as its EMA,
    so that `edit` runs the last phase from them in minutes instead of phases 1-3 (about 100 min).
    From a phase-3 editor that is exactly what a whole run does (checked bit for bit with the
    4,000-step recipe's phase-3 editor in git history); from the shipped editor it trains on."""
    from diffusers import StableDiffusionInstructPix2PixPipeline

    path = RUNS / "edit" / "ckpt.pt"
    if path.exists():
        raise SystemExit(f"edit-from-export: {path} exists; move it away first (it is a training run's state)")
    start = next((sum(p.steps for p in PHASES[:i]) for i, p in enumerate(PHASES) if p.from_ema), None)
    if start is None:
        raise SystemExit("edit-from-export: no phase starts from the EMA weights")
    shipped = StableDiffusionInstructPix2PixPipeline.from_pretrained(folder)
    _vae, _tokenizer, text_encoder, unet = build_models()
    unet.load_state_dict(shipped.unet.state_dict())
    text_encoder.load_state_dict(shipped.text_encoder.state_dict())
    params = [*unet.parameters(), *text_encoder.parameters()]
    state = {"unet": unet.state_dict(), "text_encoder": text_encoder.state_dict()}
    opt = _optimizer(unet, params).state_dict()  # replaced when the phase starts anyway
    save_checkpoint(path, **state, opt=opt, ema=EMA(params).shadow, step=start)
    log.info("edit-from-export: %s at step %d from %s", path, start, folder)
    return path


def export_edit(out: Path = EDIT_OUT) -> Path:
    """The EMA weights as a StableDiffusionInstructPix2PixPipeline folder, with its vocabulary."""
    from diffusers import StableDiffusionInstructPix2PixPipeline

    ckpt = load_checkpoint(RUNS / "edit" / "ckpt.pt")
    if ckpt is None:
        raise SystemExit("edit-export: no checkpoint; run the edit stage first")
    vae, tokenizer, text_encoder, unet = build_models()
    unet.load_state_dict(ckpt["unet"])
    text_encoder.load_state_dict(ckpt["text_encoder"])
    ema = EMA([])
    ema.shadow = ckpt["ema"]
    ema.copy_to([*unet.parameters(), *text_encoder.parameters()])
    pipe = StableDiffusionInstructPix2PixPipeline(
        vae=vae, text_encoder=text_encoder.eval(), tokenizer=tokenizer, unet=unet.eval(),
        scheduler=configs.make_sample_scheduler(), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )  # fmt: skip
    pipe.save_pretrained(out, safe_serialization=True)
    nest_clip_keys(out)
    write_edit_vocabulary(out)
    log.info("edit-export: wrote %s (trained %d steps)", out, ckpt["step"])
    return out


EDIT_DEFAULTS = {"default_steps": 20, "default_guidance_scale": 3.0, "default_image_guidance": 2.5}


def write_edit_vocabulary(folder: Path) -> None:
    """What the UI shows beside the instruction box: the phrasings, the values, examples, defaults."""
    import json

    from .world import COLORS, SHAPES

    vocab = {
        "task": "edit",
        "instructions": {kind: list(p) for kind, p in edit_world.PHRASINGS.items()},
        "colors": list(COLORS),
        "shapes": list(SHAPES),
        "examples": list(edit_world.EXAMPLES),
        "notes": "Edits one tiny-shapes image (64x64): the shape's colour, the background's colour or the shape, "
        "keeping the rest (right in about 98 edits of 100 that apply; the README has the figures). An instruction "
        "that cannot apply (a background in the shape's own colour) should keep the image; about nine in ten do.",
        **EDIT_DEFAULTS,
    }
    (folder / "vocabulary.json").write_text(json.dumps(vocab, indent=2) + "\n")
