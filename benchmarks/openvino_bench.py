"""`python -m benchmarks speed --runtime openvino`: the OpenVINO runtime against torch eager, and the peer.

    python -m benchmarks speed --runtime openvino --steps 20 --json openvino.json
    python -m benchmarks speed --runtime openvino --no-peer        # without optimum-intel
    python -m benchmarks speed --runtime openvino --model tiny-shapes-fast   # the few-step case (LCM, 4 steps)

One process measures torch eager (`plain`), OpenVINO's first load (conversion into a fresh cache:
`openvino`) and its cached load (`openvino-cached`, a restart, OPENVINO_SHAPES=auto) at 1 image, then torch
and cached OpenVINO at 4 images; each batch also with dynamic and static shapes and int8 and w8a8 weights
(benchmarks.speed's medians of --repeats after a warm-up; peak memory sampled the same way for all). The peer, optimum-intel's OVStableDiffusionPipeline exported from the same
folder, runs in a venv of its own (benchmarks/requirements-openvino-peer.txt, built on first use in
--peer-venv) through benchmarks/openvino_peer.py, with the same steps, guidance, size, batches and repeats.
A recipe (`--model tiny-shapes-fast`) is first saved as a plain folder that both load (`plain_folder`):
its LoRAs fused, its sampler's scheduler, its steps and guidance in vocabulary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import speed

HERE = Path(__file__).resolve().parent
PEER_REQUIREMENTS = HERE / "requirements-openvino-peer.txt"
PEER_SCRIPT = HERE / "openvino_peer.py"
PEER_VENV = Path.home() / ".cache" / "diffusion-anywhere" / "openvino-peer-venv"
BATCHES = (1, 4)
COMPRESSED = ("int8", "w8a8")  # the OPENVINO_WEIGHTS modes measured beside fp32
SHAPES = ("dynamic", "static")  # the OPENVINO_SHAPES measured beside auto (the default)


def ours(args: argparse.Namespace) -> dict[str, Any]:
    """benchmarks.speed's report at 1 image (torch, first and cached OpenVINO load) and at 4 (torch, cached)."""
    reports = {}
    for images, options in ((1, "openvino,openvino-cached,openvino-dynamic,openvino-static,openvino-int8,openvino-w8a8"),
                            (4, "openvino-cached,openvino-dynamic,openvino-static,openvino-int8,openvino-w8a8")):
        run_args = argparse.Namespace(**{**vars(args), "images": images, "options": options, "quantization": None})
        reports[str(images)] = speed.run(run_args)
        print(speed.format_table(reports[str(images)]), end="\n\n", flush=True)
    return reports


def build_peer(venv: Path) -> Path:
    """The peer venv's python, built (about 2-3 minutes, ~1.5 GB) where it is missing."""
    python = venv / "bin" / "python"
    if python.is_file():
        return python
    print(f"... building the optimum-intel venv in {venv} (once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CONSTRAINT": ""}  # the peer's pins are not the app's
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(PEER_REQUIREMENTS)]
    subprocess.run(pip, check=True, env=env)
    return python


def plain_folder(model: str, root: Path) -> str:
    """`model` itself, or for a recipe a folder under `root` that ours and the peer load alike: the recipe's
    source with its LoRAs fused at their scales, its sampler's scheduler, and the source's vocabulary.json
    with the recipe's defaults (steps, guidance) over it."""
    from diffusers import DiffusionPipeline

    from pipelines.run.model_setup import read_vocabulary
    from pipelines.sampling import samplers
    from pipelines.weights import recipes

    found = recipes.find(model)
    if found is None:
        return model
    recipe = recipes.load(found)
    source = recipe.resolve(recipe.source)
    pipe = DiffusionPipeline.from_pretrained(source)
    names = [f"lora{i}" for i in range(len(recipe.loras))]
    for name, lora in zip(names, recipe.loras, strict=True):
        pipe.load_lora_weights(recipe.resolve(lora.path), adapter_name=name)
    if names:
        pipe.set_adapters(names, [lora.scale for lora in recipe.loras])
        pipe.fuse_lora(adapter_names=names)
        pipe.unload_lora_weights()
    if sampler := recipe.defaults.get("sampler"):
        pipe.scheduler = samplers.build(pipe.scheduler, sampler)
    out = root / recipe.name
    pipe.save_pretrained(out)
    vocabulary = {**read_vocabulary(source), **recipe.ui_vocabulary()}
    (out / "vocabulary.json").write_text(json.dumps(vocabulary, indent=1) + "\n")
    return str(out)


def peer(args: argparse.Namespace, steps: int, size: int, guidance: float) -> dict[str, Any]:
    """The peer's JSON line (export and cached-load seconds, images/s per batch, peak RSS)."""
    python = build_peer(Path(args.peer_venv) if args.peer_venv else PEER_VENV)
    with tempfile.TemporaryDirectory(prefix="openvino-peer-") as out:
        command = [
            str(python), str(PEER_SCRIPT), "--model", str(args.model), "--out", out, "--steps", str(steps),
            "--batches", ",".join(map(str, BATCHES)), "--size", str(size), "--repeats", str(args.repeats),
            "--guidance", str(guidance),
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
        done = subprocess.run(command, check=True, env=env, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(reports: dict[str, Any], peer_row: dict[str, Any] | None) -> dict[str, Any]:
    """The issue's figures: images/s and ratios per batch, load seconds, peak memory, PSNR vs torch."""
    one = reports["1"]["results"]
    rows: dict[str, Any] = {"images_per_s": {}, "peer": peer_row}
    for images in BATCHES:
        results = reports[str(images)]["results"]
        torch_ips = 1 / results["plain"]["per_image_s"]["median"]
        ov_ips = 1 / results["openvino-cached"]["per_image_s"]["median"]  # OPENVINO_SHAPES=auto, the default
        row = {"torch": torch_ips, "openvino": ov_ips, "openvino_vs_torch": ov_ips / torch_ips}
        if peer_row:
            row["optimum_intel"] = peer_row["images_per_s"][str(images)]
            row["openvino_vs_optimum_intel"] = ov_ips / row["optimum_intel"]
        for shapes in SHAPES:
            ips = 1 / results[f"openvino-{shapes}"]["per_image_s"]["median"]
            row.update({f"openvino_{shapes}": ips, f"openvino_{shapes}_vs_torch": ips / torch_ips})
            if peer_row:
                row[f"openvino_{shapes}_vs_optimum_intel"] = ips / row["optimum_intel"]
        for mode in COMPRESSED:  # OPENVINO_WEIGHTS=int8 (weights) and w8a8 (weights and activations)
            ips = 1 / results[f"openvino-{mode}"]["per_image_s"]["median"]
            row.update({f"openvino_{mode}": ips, f"openvino_{mode}_vs_torch": ips / torch_ips, f"{mode}_vs_fp32": ips / ov_ips})
            if peer_row:
                row[f"openvino_{mode}_vs_optimum_intel"] = ips / row["optimum_intel"]
        rows["images_per_s"][str(images)] = row
    four = reports["4"]["results"]
    rows.update(
        torch_load_s=one["plain"]["load_s"],
        first_load_s=one["openvino"]["load_s"],
        cached_load_s=one["openvino-cached"]["load_s"],
        peak_memory={
            "torch": four["plain"].get("peak_memory"),
            "openvino": four["openvino-cached"].get("peak_memory"),
            "openvino_static": four["openvino-static"].get("peak_memory"),
        },
        peak_memory_vs_torch=four["openvino-cached"].get("peak_memory_vs_plain"),
        peak_memory_static_vs_torch=four["openvino-static"].get("peak_memory_vs_plain"),
        **{f"{mode}_psnr_vs_torch": min(r[f"openvino-{mode}"]["psnr_vs_plain"] or float("inf") for r in (one, four)) for mode in COMPRESSED},
        **{f"{mode}_graph_bytes": one[f"openvino-{mode}"].get("runtime_weights") for mode in COMPRESSED},
        psnr_vs_torch=min(
            r[name]["psnr_vs_plain"] or float("inf")
            for r in (reports["1"]["results"], four)
            for name in ("openvino-cached", *(f"openvino-{shapes}" for shapes in SHAPES))
        ),
    )
    return rows


def format_summary(s: dict[str, Any]) -> str:
    peer_row = s["peer"]
    lines = ["OpenVINO vs torch eager (this process) and optimum-intel (its own venv):", ""]
    lines.append(f"{'images/s':<20} {'torch':>8} {'openvino':>9} {'ratio':>7} {'optimum-intel':>14} {'ours/peer':>10}")
    for images, r in s["images_per_s"].items():
        modes = (*SHAPES, *COMPRESSED)
        for label, key in (("auto", "openvino"), *((m, f"openvino_{m}") for m in modes)):
            peer_cells = f"{r['optimum_intel']:>14.3f} {r[key + '_vs_optimum_intel']:>9.2f}x" if peer_row else ""
            lines.append(
                f"{images + ' image(s), ' + label:<20} {r['torch']:>8.3f} {r[key]:>9.3f} "
                f"{r[key + '_vs_torch']:>6.2f}x " + peer_cells
            )
    lines += [
        "",
        f"load s: torch {s['torch_load_s']:.1f}, OpenVINO first (converting) {s['first_load_s']:.1f}, "
        f"cached {s['cached_load_s']:.1f}"
        + (f"; optimum-intel export {peer_row['export_s']:.1f}, cached {peer_row['cached_load_s']:.1f}" if peer_row else ""),
        *([f"optimum-intel's scheduler: {peer_row.get('scheduler')}; images/s per precision (the faster is the bar): "
           + "; ".join(f"{p} " + " / ".join(f"{v:.2f}" for v in ips.values()) for p, ips in peer_row.get("by_precision", {}).items())]
          if peer_row else []),
    ]  # fmt: skip
    memory = s["peak_memory"]
    if memory["torch"] and memory["openvino"]:
        lines.append(
            f"peak memory at 4 images: torch {memory['torch'] / 2**20:.0f} MiB, OpenVINO {memory['openvino'] / 2**20:.0f} "
            f"MiB ({s['peak_memory_vs_torch']:.2f}x), static {memory['openvino_static'] / 2**20:.0f} MiB "
            f"({s['peak_memory_static_vs_torch']:.2f}x)"
            + (f"; optimum-intel process peak RSS {peer_row['peak_rss_mb']:.0f} MiB" if peer_row else "")
        )
    lines.append(f"PSNR vs torch fp32, same seeds: {s['psnr_vs_torch']:.1f} dB (the parity bar: 40)")
    for mode in COMPRESSED:
        lines.append(f"{mode}: PSNR vs torch fp32 {s[f'{mode}_psnr_vs_torch']:.1f} dB (the bar: 30); {s[f'{mode}_graph_bytes']}")
    return "\n".join(lines)


def native_size(model: Path) -> int:
    """The side the app's requests use by default (diffusers': the UNet's sample size x the VAE's factor)."""
    unet = json.loads((model / "unet" / "config.json").read_text())
    vae = json.loads((model / "vae" / "config.json").read_text())
    return int(unet["sample_size"]) * 2 ** (len(vae["block_out_channels"]) - 1)


def main(args: argparse.Namespace) -> int:
    import logging

    from pipelines.run.model_setup import read_vocabulary
    from pipelines.weights.loading import quiet_load_progress_bars

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    quiet_load_progress_bars()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="openvino-bench-") as root:
        args.model = plain_folder(args.model, Path(root))
        vocabulary = read_vocabulary(args.model)
        steps = args.steps or int(vocabulary.get("default_steps", 20))
        args.steps = steps
        reports = ours(args)
        size = native_size(Path(args.model))
        guidance = float(vocabulary.get("default_guidance_scale", 4.0))  # what benchmarks.suite's requests use
        peer_row = None if args.no_peer else peer(args, steps, size, guidance)
    figures = summary(reports, peer_row)
    print(format_summary(figures))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": figures, "reports": reports}, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0
