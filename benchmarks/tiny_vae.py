"""`python -m benchmarks.tiny_vae`: what TINY_VAE saves on this machine, at SD 1.5's sizes.

    python -m benchmarks.tiny_vae                         # decode only: ~1 min on 2 cores
    python -m benchmarks.tiny_vae --end-to-end --json tiny-vae.json   # + a 4-step LCM request (~6 min)

No download: the networks are random, built with SD 1.5's configurations (AutoencoderKL 84 M parameters, the
UNet 860 M, CLIP ViT-L's text encoder) and TAESD's (diffusers' AutoencoderTiny defaults, 2.4 M), which is all
that speed depends on.
- decode: one `--size` image from its latents, AutoencoderKL against AutoencoderTiny, in torch and (when installed)
  as OpenVINO graphs (f32, as the app compiles them); medians of `--repeats` after a warm-up.
- `--end-to-end`: one text-to-image request through `ImagePipeline.generate` (LCM, 4 steps, guidance 1: the
  few-step case FastSD CPU users run), the model's VAE against TINY_VAE, in torch.
Ratios are printed from one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SD15_VAE = {
    "block_out_channels": (128, 256, 512, 512), "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4, "layers_per_block": 2, "latent_channels": 4, "sample_size": 512,
    "scaling_factor": 0.18215,
}  # fmt: skip


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: first-call costs outside the measurement
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def decoders() -> dict[str, torch.nn.Module]:
    from diffusers import AutoencoderKL, AutoencoderTiny

    torch.manual_seed(0)
    return {"AutoencoderKL": AutoencoderKL(**SD15_VAE).eval(), "AutoencoderTiny": AutoencoderTiny().eval()}


def decode_times(size: int, repeats: int) -> dict[str, dict[str, float]]:
    """Seconds to decode one `size` px image, per VAE, in torch and as an OpenVINO graph (when installed)."""
    latents = torch.randn(1, 4, size // 8, size // 8)
    out: dict[str, dict[str, float]] = {}
    for name, vae in decoders().items():
        with torch.inference_mode():
            out[name] = {"torch": median_seconds(lambda vae=vae: vae.decode(latents), repeats)}
        compiled = _openvino_decoder(vae, latents)
        if compiled is not None:
            out[name]["openvino"] = median_seconds(lambda c=compiled: c([latents.numpy()]), repeats)
    return out


def _openvino_decoder(vae: torch.nn.Module, latents: torch.Tensor) -> Any:
    """The VAE's decoder converted and compiled as the app does (f32 on the CPU), None without openvino."""
    try:
        import openvino as ov
    except ImportError:
        return None
    with torch.no_grad():
        model = ov.convert_model(vae.decoder, example_input=(latents,))
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": torch.get_num_threads()}
    return ov.Core().compile_model(model, "CPU", config)


def random_sd15(root: Path) -> tuple[Any, Path]:
    """A random SD 1.5-architecture pipeline (LCM scheduler) and a random TAESD folder for TINY_VAE."""
    from diffusers import AutoencoderKL, AutoencoderTiny, LCMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from models.train.tokenizer import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer(max_length=77)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77))  # fmt: skip
    pipe = StableDiffusionPipeline(
        vae=AutoencoderKL(**SD15_VAE).eval(), text_encoder=text.eval(), tokenizer=tokenizer,
        unet=UNet2DConditionModel(cross_attention_dim=768, sample_size=64).eval(), scheduler=LCMScheduler(steps_offset=1),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    AutoencoderTiny().save_pretrained(root / "taesd")
    return pipe, root / "taesd"


def end_to_end(size: int, repeats: int) -> dict[str, float]:
    """Seconds per 1-image request (LCM, 4 steps, guidance 1), the model's VAE against TINY_VAE."""
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline
    from pipelines.run.options import PipelineOptions

    request = GenerationRequest(prompt="a red circle", steps=4, guidance_scale=1.0, seed=0, width=size, height=size)
    out = {}
    with tempfile.TemporaryDirectory(prefix="tiny-vae-bench-") as tmp:
        pipe, taesd = random_sd15(Path(tmp))
        own_vae = pipe.vae
        for label, setting in (("model's VAE", ""), ("TINY_VAE", str(taesd))):
            pipe.register_modules(vae=own_vae)
            opts = PipelineOptions(runtime="torch", compile="off", tiny_vae=setting)
            model = ImagePipeline.from_loaded(pipe, DeviceManager("cpu"), opts, "random-sd15")
            out[label] = median_seconds(lambda m=model: m.generate(request), repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiny_vae", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--end-to-end", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"size": args.size, "threads": torch.get_num_threads(), "decode_s": decode_times(args.size, args.repeats)}
    kl, tiny = report["decode_s"]["AutoencoderKL"], report["decode_s"]["AutoencoderTiny"]
    for runtime in kl:
        print(f"decode {args.size} px, {runtime}: AutoencoderKL {kl[runtime]:.3f} s, AutoencoderTiny {tiny[runtime]:.3f} s "
              f"({kl[runtime] / tiny[runtime]:.1f}x)")  # fmt: skip
    if args.end_to_end:
        report["request_s"] = times = end_to_end(args.size, args.repeats)
        own, tiny_s = times["model's VAE"], times["TINY_VAE"]
        print(f"request {args.size} px, LCM 4 steps, torch: model's VAE {own:.2f} s, TINY_VAE {tiny_s:.2f} s ({own / tiny_s:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
