"""`python -m benchmarks.quant_bench [--json out.json]`: what GGUF quantization costs and saves, on the
tiny model families (tests/families.py) on the CPU.

For each family whose transformer diffusers can read from a single file (Flux, SD3, Qwen-Image), the
tiny transformer is written to GGUF at Q8_0 and Q4_0 with the `gguf` package, as llama.cpp / city96
files are: the weights of Linear layers whose width is a multiple of 32 quantized, biases, norms and
other tensors kept F32. Tensor names are diffusers' own (diffusers loads them without conversion).
Printed per family and type: quantized tensors' bytes / their fp32 bytes, whole-file bytes / the fp32
safetensors file, and the image PSNR vs the plain fp32 model (same seed, through the app's
ImagePipeline with MODEL_ID=<file>.gguf and BASE_MODEL=<folder>).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import parity

FAMILIES = ("flux", "sd3", "qwen-image")
QTYPES = ("Q8_0", "Q4_0")
BLOCK = 32  # values per Q8_0 / Q4_0 block: a row must be a whole number of blocks


def quantizable(model: torch.nn.Module) -> set[str]:
    """State-dict names of Linear weights whose rows are whole blocks (diffusers' GGUF loader swaps
    only Linear layers; everything else stays F32, as in llama.cpp / city96 files)."""
    return {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module.weight.shape[-1] % BLOCK == 0
    }


def write_gguf(model: torch.nn.Module, path: Path, qtype: str, arch: str = "diffusers") -> dict[str, Any]:
    """Write `model`'s state dict (diffusers' names) to `path` at `qtype`; the bytes it saved."""
    return write_state(model.state_dict(), quantizable(model), path, qtype, arch)


def write_state(state: dict[str, torch.Tensor], chosen: set[str], path: Path, qtype: str, arch: str) -> dict[str, Any]:
    """Write `state` to a GGUF file, the tensors named in `chosen` quantized at `qtype`, the rest F32."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(path), arch)
    stats = {"quantized_tensors": 0, "kept_tensors": 0, "quantized_fp32_bytes": 0, "quantized_bytes": 0}
    for name, tensor in state.items():
        array = tensor.detach().float().cpu().numpy()
        if name in chosen:
            packed = gguf.quants.quantize(array, kind)
            writer.add_tensor(name, packed, raw_dtype=kind)
            stats["quantized_tensors"] += 1
            stats["quantized_fp32_bytes"] += array.nbytes
            stats["quantized_bytes"] += packed.nbytes
        else:
            writer.add_tensor(name, array)
            stats["kept_tensors"] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    stats["file_bytes"] = path.stat().st_size
    return stats


psnr = functools.partial(parity.psnr, peak=255.0)  # of two 8-bit images, in dB (inf when equal)


def build_family(name: str, root: Path) -> Path:
    from tests import families

    return families.build(name, root / name)


def fixtures(name: str, root: Path, qtypes=QTYPES) -> dict[str, Any]:
    """The family's tiny folder and its transformer as GGUF files: {"folder", qtype: {"path", stats}}."""
    import diffusers

    folder = build_family(name, root)
    class_name = diffusers.DiffusionPipeline.load_config(folder)["transformer"][1]
    transformer = getattr(diffusers, class_name).from_pretrained(folder / "transformer", dtype=torch.float32)
    fp32_file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    out: dict[str, Any] = {"folder": folder}
    for qtype in qtypes:
        path = root / f"{name}-transformer-{qtype}.gguf"
        stats = write_gguf(transformer, path, qtype)
        stats["quantized_ratio"] = stats["quantized_bytes"] / stats["quantized_fp32_bytes"]
        stats["file_ratio"] = stats["file_bytes"] / fp32_file.stat().st_size
        out[qtype] = {"path": path, "stats": stats}
    return out


def render(pipeline: Any, seed: int = 7) -> np.ndarray:
    """One image of the tiny model (2 steps, 64x48) as uint8 pixels."""
    from pipelines import GenerationRequest

    request = GenerationRequest(prompt="a red circle on a blue background", steps=2, seed=seed, width=64, height=48)
    return np.asarray(pipeline.generate(request).images[0], dtype=np.uint8)


def load(model_id: str, **options: Any) -> Any:
    from devices import DeviceManager
    from pipelines import ImagePipeline

    return ImagePipeline.from_pretrained(model_id, DeviceManager("cpu"), memory_mode="off", **options)


def measure(name: str, root: Path) -> dict[str, Any]:
    """Ratios and PSNR of each GGUF type of one family, vs its plain fp32 model."""
    made = fixtures(name, root)
    plain = render(load(str(made["folder"])))
    result: dict[str, Any] = {}
    for qtype in QTYPES:
        pipeline = load(str(made[qtype]["path"]), base_model=str(made["folder"]))
        info = pipeline.model_info()
        result[qtype] = {
            **made[qtype]["stats"],
            "psnr_db": psnr(plain, render(pipeline)),
            "reported": info.quantization.get("transformer", ""),
            "transformer_bytes": info.component_bytes.get("transformer"),
        }
    return result


def measure_setting(name: str, root: Path, setting: str) -> dict[str, Any]:
    """PSNR, report and per-component bytes of one QUANTIZATION setting (torchao, fp8...) vs plain."""
    folder = build_family(name, root)
    plain = load(str(folder))
    quantized = load(str(folder), quantization=setting)
    info = quantized.model_info()
    return {
        "setting": setting,
        "psnr_db": psnr(render(plain), render(quantized)),
        "reported": info.quantization,
        "component_bytes": info.component_bytes,
        "plain_component_bytes": plain.model_info().component_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quant_bench", description=__doc__)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--quantization", default=None, help="measure this QUANTIZATION setting instead of GGUF")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # the figures, not the loaders' notices
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families.split(","):
            if args.quantization:
                results[name] = measure_setting(name, Path(tmp), args.quantization)
            else:
                results[name] = measure(name, Path(tmp))
    if args.quantization:
        print(json.dumps(results, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
        return 0
    print(f"{'family':<11}{'type':<6}{'quantized/fp32':>15}{'file/fp32':>11}{'PSNR dB':>9}  reported")
    for name, by_type in results.items():
        for qtype, r in by_type.items():
            print(
                f"{name:<11}{qtype:<6}{r['quantized_ratio']:>15.4f}{r['file_ratio']:>11.4f}"
                f"{r['psnr_db']:>9.2f}  {r['reported']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
