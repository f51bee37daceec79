"""The peer of `python -m benchmarks speed --runtime openvino`: optimum-intel's OVStableDiffusionPipeline
(what FastSD CPU builds on) exported from the same diffusers folder and timed on the same machine, at
OpenVINO's default precision for the device (bf16 on a CPU with AVX512_BF16 or AMX: what its users get) and at
f32 (the app's); the faster of the two per batch is the bar.

Runs in a venv of its own (benchmarks/requirements-openvino-peer.txt; benchmarks.openvino_bench builds
it): optimum-intel 2.2.0 cannot be imported beside the app's pins. Imports nothing of the app. Prints
one JSON line to stdout (export and cached-load seconds, images/s per batch as the median of
--repeats after a warm-up, peak RSS); logs go to stderr.
"""

import argparse
import contextlib
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OPENVINO_TELEMETRY_DISABLE", "1")  # hint only; no network anyway

PROMPT = "a red circle on a blue background"


def _versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in (
        "torch",
        "transformers",
        "diffusers",
        "huggingface_hub",
        "optimum",
        "optimum-intel",
        "openvino",
        "nncf",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _prepare_out(path):
    if os.path.isdir(path) and os.listdir(path):
        if not os.path.exists(os.path.join(path, "model_index.json")):
            raise SystemExit(f"--out {path} exists, is not empty and is not a previous export; refusing to delete it")
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)


def _vae_scale_factor(model_dir):
    # SD convention: 2 ** (len(vae.block_out_channels) - 1); tiny-shapes has 3 blocks -> 4 (not the usual 8).
    with open(os.path.join(model_dir, "vae", "config.json")) as f:
        return 2 ** (len(json.load(f)["block_out_channels"]) - 1)


def _stage_model(model_dir):
    """transformers >= ~5.2x saves CLIPTextModel weights without the `text_model.` prefix; transformers 5.5.x
    (the newest optimum-intel 2.2.0 allows) then reports every weight MISSING and silently randomises the text
    encoder. If that layout is detected, build a /tmp/peer-stage-* copy of the pipeline folder (symlinks for every
    other entry) whose text_encoder/model.safetensors has the prefix added. Returns (dir_to_export, tmpdir_or_None).
    """
    import tempfile

    from safetensors import safe_open
    from safetensors.torch import save_file

    te = os.path.join(model_dir, "text_encoder", "model.safetensors")
    if not os.path.exists(te):
        return model_dir, None
    with safe_open(te, "pt") as f:
        keys = list(f.keys())
        if all(k.startswith("text_model.") for k in keys):
            return model_dir, None
        tensors = {("text_model." + k if not k.startswith("text_model.") else k): f.get_tensor(k) for k in keys}
    stage = tempfile.mkdtemp(prefix="peer-stage-", dir="/tmp")
    for name in os.listdir(model_dir):
        if name != "text_encoder":
            os.symlink(os.path.join(os.path.abspath(model_dir), name), os.path.join(stage, name))
    os.makedirs(os.path.join(stage, "text_encoder"))
    for name in os.listdir(os.path.join(model_dir, "text_encoder")):
        if name != "model.safetensors":
            os.symlink(
                os.path.join(os.path.abspath(model_dir), "text_encoder", name),
                os.path.join(stage, "text_encoder", name),
            )
    save_file(tensors, os.path.join(stage, "text_encoder", "model.safetensors"), metadata={"format": "pt"})
    print(
        f"[peer_bench] staged {model_dir} -> {stage} (added text_model. prefix to {len(keys)} text-encoder keys)",
        file=sys.stderr,
    )
    return stage, stage


def _parser():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--guidance", type=float, default=4.0, help="as the app's request (1: no CFG, one UNet call a step)")
    ap.add_argument("--precisions", default="default,f32", help="INFERENCE_PRECISION_HINT per run: 'default' is "
                    "OpenVINO's own choice for the device (what an optimum-intel user gets: bf16 on a CPU with "
                    "AVX512_BF16 or AMX), f32 the app's")  # fmt: skip
    return ap


def _export(args):
    """Export seconds: the folder converted by optimum-intel and saved to --out."""
    from optimum.intel import OVStableDiffusionPipeline

    _prepare_out(args.out)
    src, stage = _stage_model(args.model)  # not timed
    t0 = time.perf_counter()
    pipe = OVStableDiffusionPipeline.from_pretrained(src, export=True, device=args.device)
    pipe.save_pretrained(args.out)
    export_s = time.perf_counter() - t0
    if stage:
        shutil.rmtree(stage, ignore_errors=True)
    del pipe
    gc.collect()
    return export_s


def _load(args, precision):
    """(pipeline loaded from the saved export at `precision`, cached-load seconds, the precision it runs)."""
    from optimum.intel import OVStableDiffusionPipeline

    expected_vsf = _vae_scale_factor(args.model)
    ov_config = {} if precision == "default" else {"INFERENCE_PRECISION_HINT": precision}
    t0 = time.perf_counter()  # a fresh load of the saved export (includes OpenVINO compile for the device)
    pipe = OVStableDiffusionPipeline.from_pretrained(args.out, device=args.device, ov_config=ov_config)
    cached_load_s = time.perf_counter() - t0
    pipe.set_progress_bar_config(disable=True)
    # diffusers derives vae_scale_factor from the VAE config; make sure optimum's wrapper got the model's (4)
    if getattr(pipe, "vae_scale_factor", None) != expected_vsf:
        print(f"[peer_bench] fixing vae_scale_factor -> {expected_vsf}", file=sys.stderr)
        pipe.vae_scale_factor = expected_vsf
        if hasattr(pipe, "image_processor"):
            pipe.image_processor.config.vae_scale_factor = expected_vsf
    ran = str(pipe.unet.request.get_property("INFERENCE_PRECISION_HINT"))  # "<Type: 'bfloat16'>"
    return pipe, cached_load_s, ran.split("'")[1] if "'" in ran else ran


def _images_per_s(pipe, args, n):
    """Median images/s of --repeats calls at `n` images per prompt, after a warm-up call."""
    import torch

    def call():
        g = torch.Generator("cpu").manual_seed(args.seed)
        return pipe(PROMPT, num_images_per_prompt=n, height=args.size, width=args.size,
                    num_inference_steps=args.steps, guidance_scale=args.guidance, generator=g).images  # fmt: skip

    imgs = call()  # warm-up
    if len(imgs) != n or any(im.size != (args.size, args.size) for im in imgs):
        raise RuntimeError(f"unexpected output: {len(imgs)} images of sizes {[im.size for im in imgs]}")
    imgs[0].save(os.path.join(args.out, f"peer_sample_b{n}.png"))
    seconds = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - t0)
    median = statistics.median(seconds)  # as benchmarks.speed reports the app's
    print(f"[peer_bench] batch={n} median={median:.4f}s images/s={n / median:.3f}", file=sys.stderr)
    return n / median


def main():
    args = _parser().parse_args()
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    real_stdout = sys.stdout
    by_precision, loads = {}, {}
    with contextlib.redirect_stdout(sys.stderr):
        export_s = _export(args)
        for precision in args.precisions.split(","):
            pipe, loads[precision], ran = _load(args, precision)
            ips = {str(n): round(_images_per_s(pipe, args, n), 3) for n in batches}
            by_precision[f"{precision} ({ran})" if precision == "default" else precision] = ips
            scheduler = type(pipe.scheduler).__name__  # the folder's (a recipe's sampler: LCMScheduler)
            del pipe
            gc.collect()
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    result = {
        "versions": _versions(),
        "scheduler": scheduler,
        "export_s": round(export_s, 3),
        "cached_load_s": round(loads[next(iter(loads))], 3),
        # per batch, the fastest of the precisions run: the bar ours is held to
        "images_per_s": {str(n): max(ips[str(n)] for ips in by_precision.values()) for n in batches},
        "by_precision": by_precision,
        "peak_rss_mb": round(peak_rss_mb, 1),
    }
    print(json.dumps(result), file=real_stdout, flush=True)


if __name__ == "__main__":
    main()
