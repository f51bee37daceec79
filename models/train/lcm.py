"""Distil tiny-shapes into a few-step model: an LCM-LoRA (Luo et al. 2023, "LCM-LoRA"), the recipe of
diffusers' `examples/consistency_distillation/train_lcm_distill_lora_sd_wds.py` restated for this world.

    python -m models.train.train lcm [--steps N]     # writes models/loras/tiny-shapes-lcm.safetensors

The teacher is tiny-shapes itself (its LoRA layers off), run with classifier-free guidance at the
model's own default scale (4, so `w` = 3): one DDIM step of the teacher on the 50-step grid the LCM
scheduler samples from (t -> t - 20) gives the point the student's consistency function must map to
the same clean image as it maps the start. The student is the same UNet with a LoRA; its target is
itself one step later, without gradient (LCM-LoRA keeps no EMA twin). Boundary scalings and the
pseudo-Huber loss (c = 0.001) are the script's; the prediction type is the model's v-prediction.

The shipped LoRA is this stage refined on the teacher's solved ODE ends (`lcm_refine.py`, `lcm-refine`), loaded fused by the `tiny-shapes-fast` recipe (models/recipes/tiny-shapes-fast.json):
4 steps, LCM sampler, guidance 1 (off: the teacher's guidance is distilled in, so each step is one
UNet call instead of two).
"""

from __future__ import annotations

import logging
import random

import torch

from .common import (
    MODEL_OUT,
    MODELS_DIR,
    RUNS,
    SEED,
    copy_lora,
    load_checkpoint,
    lr_at,
    progress,
    resume_lora,
    save_checkpoint,
    to_tensor,
    tokenize,
)
from .world import random_scene, render_batch

log = logging.getLogger(__name__)

LCM_OUT = MODELS_DIR / "loras"
LCM_NAME = "tiny-shapes-lcm.safetensors"
BATCH, LR, RANK = 32, 1e-3, 32
# Two cosine cycles: 1e-3 for the first PHASE steps, then 3e-4 (a restart with a lower peak) to the end. The
# first cycle alone left shapes wrong in 1 image of 5 at 4 steps (and more at 8: the low-noise end was not yet
# consistent); the second settles it. (The shipped run's first 200 steps ran under a 2000-step first cycle.)
PHASE, LR_2 = 1000, 3e-4
DATASET = 16_000
DDIM_STEPS = 50  # the grid of the teacher's solver = the LCM scheduler's original_inference_steps
GUIDANCE_W = 3.0  # CFG scale 4 (the model's default) as LCM's w = scale - 1
HUBER_C = 0.001
TIMESTEP_SCALING = 10.0  # LCMScheduler's default


def boundary_scalings(t: torch.Tensor, sigma_data: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_skip, c_out) of the consistency function at timesteps t (LCMScheduler's own formula)."""
    scaled = t.float() * TIMESTEP_SCALING
    c_skip = sigma_data**2 / (scaled**2 + sigma_data**2)
    c_out = scaled / (scaled**2 + sigma_data**2) ** 0.5
    return c_skip.view(-1, 1, 1, 1), c_out.view(-1, 1, 1, 1)


def _x0_eps(v: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean image and noise from a v-prediction."""
    return alpha * x - sigma * v, alpha * v + sigma * x


def encode(vae, n: int) -> dict:
    """`n` seeded scenes of the base world, encoded once (cached in runs/ for resumes)."""
    cache = RUNS / f"latents-lcm-{n}.pt"
    if cache.exists():
        return torch.load(cache)
    rng = random.Random(f"{SEED}-data-lcm")
    scenes = [random_scene(rng) for _ in range(n)]
    means = []
    with torch.no_grad():
        for i in range(0, n, 256):
            means.append(vae.encode(to_tensor(render_batch(scenes[i : i + 256]))).latent_dist.mean.half())
    data = {"mean": torch.cat(means), "prompts": [s.prompt for s in scenes]}
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, cache)
    return data


class Distiller:
    """One LCM-LoRA step: the student's consistency output at t, the target at the teacher's t - 20."""

    def __init__(self, pipe, embeds: torch.Tensor, empty: torch.Tensor):
        self.unet, self.embeds, self.empty = pipe.unet, embeds, empty
        alphas = pipe.scheduler.alphas_cumprod
        self.alpha, self.sigma = alphas.sqrt(), (1 - alphas).sqrt()
        self.step_ratio = pipe.scheduler.config.num_train_timesteps // DDIM_STEPS
        self.grid = torch.arange(1, DDIM_STEPS + 1) * self.step_ratio - 1  # 19, 39, ..., 999

    def _coef(self, table: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return table[t].view(-1, 1, 1, 1)

    def _consistency(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        c_skip, c_out = boundary_scalings(t)
        x0, _ = _x0_eps(self.unet(x, t, cond).sample, x, self._coef(self.alpha, t), self._coef(self.sigma, t))
        return c_skip * x + c_out * x0

    @torch.no_grad()
    def _guided(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The guided teacher's (the LoRA off) clean image and noise at t."""
        self.unet.disable_adapters()
        try:
            v = self.unet(torch.cat([x, x]), torch.cat([t, t]), torch.cat([cond, self.empty.expand_as(cond)])).sample
        finally:
            self.unet.enable_adapters()
        alpha, sigma = self._coef(self.alpha, t), self._coef(self.sigma, t)
        (x0_c, x0_u), (eps_c, eps_u) = (z.chunk(2) for z in _x0_eps(v, torch.cat([x, x]), alpha.repeat(2, 1, 1, 1), sigma.repeat(2, 1, 1, 1)))
        return x0_c + GUIDANCE_W * (x0_c - x0_u), eps_c + GUIDANCE_W * (eps_c - eps_u)

    @torch.no_grad()
    def _teacher_step(self, x: torch.Tensor, t: torch.Tensor, prev: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """One DDIM step of the guided teacher from t to prev."""
        x0, eps = self._guided(x, t, cond)
        return self._coef(self.alpha, prev) * x0 + self._coef(self.sigma, prev) * eps

    def loss(self, latents: torch.Tensor, idx: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        cond = self.embeds[idx]
        index = torch.randint(0, DDIM_STEPS, (len(latents),), generator=gen)
        start = self.grid[index]
        prev = (start - self.step_ratio).clamp(min=0)
        noise = torch.randn(latents.shape, generator=gen)
        x = self._coef(self.alpha, start) * latents + self._coef(self.sigma, start) * noise
        pred = self._consistency(x, start, cond)
        x_prev = self._teacher_step(x, start, prev, cond)
        with torch.no_grad():
            target = self._consistency(x_prev, prev, cond)
        return (((pred.float() - target.float()) ** 2 + HUBER_C**2).sqrt() - HUBER_C).mean()


LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2",
                "conv1", "conv2", "conv_shortcut", "time_emb_proj"]  # fmt: skip


def student(path=MODEL_OUT):
    """tiny-shapes with the LCM-LoRA's layers (seeded init), everything but the LoRA frozen."""
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig

    pipe = StableDiffusionPipeline.from_pretrained(path)
    for module in (pipe.unet, pipe.text_encoder, pipe.vae):
        module.requires_grad_(False)
    torch.manual_seed(SEED)
    pipe.unet.add_adapter(LoraConfig(r=RANK, lora_alpha=RANK, init_lora_weights="gaussian", target_modules=LORA_TARGETS))
    return pipe


def prompt_table(pipe, scene_prompts: list[str]) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the distinct prompts, each scene's index among them, their text embeddings, the empty prompt's): the world
    has a few hundred prompts and the text encoder stays frozen, so its outputs are computed once."""
    prompts = sorted(set(scene_prompts))
    which = torch.tensor([prompts.index(p) for p in scene_prompts])
    with torch.no_grad():
        embeds = pipe.text_encoder(tokenize(pipe.tokenizer, prompts))[0]
        empty = pipe.text_encoder(tokenize(pipe.tokenizer, [""]))[0]
    return prompts, which, embeds, empty


def train_lcm(steps: int) -> None:
    out = RUNS / "lcm"
    pipe = student()
    data = encode(pipe.vae, DATASET)
    scale = pipe.vae.config.scaling_factor
    _, which, embeds, empty = prompt_table(pipe, data["prompts"])
    params = [p for p in pipe.unet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    distiller = Distiller(pipe, embeds, empty)
    start = resume_lora(out / "ckpt.pt", params, opt, "lcm")
    pipe.unet.train()
    bar = progress(steps, start, "lcm")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 300_000 + step)
        idx = torch.randint(0, DATASET, (BATCH,), generator=gen)
        latents = data["mean"][idx].float() * scale
        for group in opt.param_groups:
            group["lr"] = lr_at(step, PHASE, LR, warmup=50) if step < PHASE else lr_at(step - PHASE, steps - PHASE, LR_2, warmup=50)
        loss = distiller.loss(latents, which[idx], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.5f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", lora=[p.detach().clone() for p in params], opt=opt.state_dict(), step=step + 1)
    bar.close()
    export_lcm()


def export_lcm(run=RUNS / "lcm") -> None:
    """The last checkpoint of `run` (this stage's, or lcm_refine's) as models/loras/tiny-shapes-lcm.safetensors, in
    float16 (half the bytes; the loader casts it to the model's dtype: images within 1/255 of the float32 LoRA's)."""
    from diffusers import StableDiffusionPipeline
    from peft.utils import get_peft_model_state_dict

    ckpt = load_checkpoint(run / "ckpt.pt")
    if ckpt is None:
        raise SystemExit(f"lcm export: no checkpoint in {run}; run its stage first")
    pipe = student()
    copy_lora([p for p in pipe.unet.parameters() if p.requires_grad], ckpt["lora"])
    layers = {k: v.half() for k, v in get_peft_model_state_dict(pipe.unet).items()}
    LCM_OUT.mkdir(parents=True, exist_ok=True)
    StableDiffusionPipeline.save_lora_weights(LCM_OUT, unet_lora_layers=layers, weight_name=LCM_NAME)
    log.info("lcm: wrote %s (%s, trained %d steps)", LCM_OUT / LCM_NAME, run.name, ckpt["step"])
