"""PNG info coverage on other tools' real images: how many of their reference fields `read_png_info`
reads back, per tool, and whether any file makes it raise (issue 57's "PNG info >= 95 %").

The images are the test samples of two public metadata readers, not copied here (113 MB):

- enslo/sd-metadata (MIT) `samples/{png,jpg,webp}/` @ 0270638ac6d09b2f4a53363b97fc3114f6eb0c88: 16 tools
  (A1111 sd-webui, Forge, Forge Classic, Forge Neo, reForge, EasyReforge, SD.Next, Civitai, ComfyUI,
  Hugging Face Space, InvokeAI, NovelAI, Ruined Fooocus, Stability Matrix, SwarmUI, TensorArt); the
  reference values are its own tests' expectations (`packages/core/tests/samples/parsers/*.test.ts`).
- d3x-at/sd-parsers (MIT) `tests/resources/parsers/` @ 0949676c24a5bbaf26ef0aa8c362132b7b27cb5b
  (A1111 incl. stealth alpha-channel metadata, ComfyUI, Fooocus, InvokeAI, NovelAI); reference values
  from its tests' parametrisations (`tests/test_*.py`, `tests/resources/parsers/*/*.py`).

Fields counted (those the Generate form takes): prompt, negative_prompt, width, height, model,
model_hash, sampler (with its schedule, compared as our sampler: "euler_ancestral" + "karras" is
"Euler a Karras" on both sides), steps, guidance_scale, seed. Prompts are compared with `<lora:..>` tags
removed, line ends and runs of spaces made one space, and trailing commas/spaces dropped; a model by
its file stem; a hash by its leading digits (A1111's 10 against a full SHA-256). A crash is any
exception but ValueError ("no parameters"); every other file in the sample folders (no metadata,
GIMP, C2PA) is read too, for crashes only.

Run (the snapshots are bare git dirs, as the `fetch` tool leaves them, or checkouts):
    python benchmarks/pnginfo_coverage.py --sd-metadata /work/.mirror/enslo+sd-metadata/repo \
        --sd-parsers /work/.mirror/d3x-at+sd-parsers/repo [--json out.json] [--misses]

It also writes WRITER_CASES with our A1111 writer and counts the fields A1111's own parser
(tests/a1111_infotext.py) reads back as they were written.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.pnginfo.read import read_png_info
from pipelines.sampling.samplers import from_any

SD_METADATA_COMMIT = "0270638ac6d09b2f4a53363b97fc3114f6eb0c88"
SD_PARSERS_COMMIT = "0949676c24a5bbaf26ef0aa8c362132b7b27cb5b"

# sd-metadata: file under samples/ -> (tool, reference fields), from its sample tests' `toEqual` values
SD_METADATA = {
    "png/sd-webui.png": ("sd-webui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 7, "seed": 3782896554}),
    "png/sd-webui-hires.png": ("sd-webui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 5.5, "seed": 3888671826}),
    "png/forge.png": ("forge", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler", "Karras"], "steps": 25, "guidance_scale": 5, "seed": 747066619}),
    "png/forge-classic.png": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 1239240392}),
    "png/forge-classic-hires.png": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 2301589892}),
    "png/forge-classic-adetailer.png": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality,\n1girl, solo, hatsune miku, cowboy shot, dutch angle, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiNSFWIllustrious_v140", "model_hash": "c9b4dab236", "sampler": ["Euler a", "Automatic"], "steps": 24, "guidance_scale": 4, "seed": 4179307297}),
    "png/forge-neo.png": ("forge-neo", {"prompt": "general, masterpiece, best quality, amazing quality,\n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler a", "Automatic"], "steps": 24, "guidance_scale": 6, "seed": 4179307297}),
    "png/forge-neo-hires.png": ("forge-neo", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku,", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler a", "Automatic"], "steps": 24, "guidance_scale": 6, "seed": 449383496}),
    "png/forge-neo-adetailer.png": ("forge-neo", {"prompt": "general, masterpiece, best quality, amazing quality,\n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiNSFWIllustrious_v140", "model_hash": "c9b4dab236", "sampler": ["Euler a", "Automatic"], "steps": 24, "guidance_scale": 4, "seed": 4179307297}),
    "png/reforge.png": ("reforge", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 270740395}),
    "png/reforge-hires.png": ("reforge", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 879759072}),
    "jpg/reforge.jpeg": ("reforge", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 584157617}),
    "jpg/reforge-hires.jpeg": ("reforge", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 3494396176}),
    "webp/reforge-hires.webp": ("reforge", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 1010990389}),
    "png/easy-reforge.png": ("easy-reforge", {"prompt": "1girl, solo, hatsune miku, テスト, \n<lora:NoobV065sHyperDmd:1> masterpiece, best quality, very aesthetic, absurdres, newest, safe", "negative_prompt": "bad anatomy, worst quality, low quality", "width": 1024, "height": 1024, "model": "copycatNoob_v11", "model_hash": "6c015a2deb", "sampler": ["LCM", "SGM Uniform"], "steps": 4, "guidance_scale": 1, "seed": 2582194946}),
    "png/sd-next.png": ("sd-next", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DDIM", None], "steps": 20, "guidance_scale": 6, "seed": 2427651458}),
    "png/sd-next-hires.png": ("sd-next", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DDIM", None], "steps": 20, "guidance_scale": 6, "seed": 1968293115}),
    "jpg/sd-webui.jpg": ("sd-webui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 5.5, "seed": 3623174757}),
    "jpg/forge-classic.jpeg": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 2547514258}),
    "jpg/forge-classic-hires.jpeg": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 3452054396}),
    "jpg/forge-neo.jpeg": ("forge-neo", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku,", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler a", "Automatic"], "steps": 24, "guidance_scale": 6, "seed": 2417156106}),
    "jpg/civitai.jpeg": ("civitai", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "sampler": ["Euler a", None], "steps": 25, "guidance_scale": 5, "seed": 1311178179}),
    "jpg/sd-next.jpg": ("sd-next", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler a", None], "steps": 20, "guidance_scale": 6, "seed": 899700607}),
    "jpg/sd-next-hires.jpg": ("sd-next", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DDIM", None], "steps": 20, "guidance_scale": 6, "seed": 3970581939}),
    "webp/sd-webui.webp": ("sd-webui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 5.5, "seed": 1028435836}),
    "webp/forge-classic.webp": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 2630661657}),
    "webp/forge-classic-hires.webp": ("forge-classic", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DPM++ 2M", "Karras"], "steps": 20, "guidance_scale": 6, "seed": 2991931972}),
    "webp/forge-neo.webp": ("forge-neo", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku,", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler a", "Automatic"], "steps": 24, "guidance_scale": 6, "seed": 2056443400}),
    "webp/sd-next.webp": ("sd-next", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["DDIM", None], "steps": 20, "guidance_scale": 6, "seed": 3014033436}),
    "webp/sd-next-hires.webp": ("sd-next", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "45a21ea00a", "sampler": ["Euler a", None], "steps": 20, "guidance_scale": 6, "seed": 1755251313}),
    "png/comfyui.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 422847914351919}),
    "png/comfyui-hires.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 1116526567339338}),
    "png/comfyui-upscale.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 511796159331902}),
    "png/comfyui-low-denoise.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, 4k, very aesthetic, ultra-detailed, (pixel art, dithering, pixelated, sprite art, 8-bit:1.2), \n1girl, solo, hatsune miku, cowboy shot, #テスト \n", "negative_prompt": "modern, recent, old, oldest, anime, illustration, cartoon, graphic, text, painting, crayon, graphite, abstract, glitch, deformed, mutated, ugly, disfigured, long body, lowres, bad anatomy, bad hands, missing fingers, extra digits, fewer digits, cropped, very displeasing, (worst quality, bad quality:1.2), sketch, jpeg artifacts, signature, watermark, username, signature, simple background, conjoined, bad ai-generated, \n", "width": 1024, "height": 1024, "model": "novaPixelsXL_v30.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 40, "guidance_scale": 5, "seed": 667022537790957}),
    "png/comfyui-saveimage-plus.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 434067965194649}),
    "png/comfyui-save-image-extended.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 779742380066441}),
    "png/comfyui-saveimagewithmetadata.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 38802053347333}),
    "png/comfyui-comfy-image-saver.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 106744160813738}),
    "png/comfyui-comfyroll.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiNSFWIllustrious_v140.safetensors", "sampler": ["euler_ancestral", "normal"], "steps": 30, "guidance_scale": 6, "seed": 942975376742792}),
    "png/comfyui-group-nodes.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 1038684211150939}),
    "png/comfyui-rgthree.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 963381484256655}),
    "png/comfyui-anima.png": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, holding sign, cowboy shot, looking at viewer, smile.\nA Beautiful and high quality anime illustrations.\nShe's holding a rectangular sign out in front of her that reads \"初音ミク\".\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1216, "height": 832, "model": "anima-preview.safetensors", "sampler": ["euler", "beta"], "steps": 24, "guidance_scale": 5, "seed": 662066908990052}),
    "png/krea2.png": ("comfyui", {"prompt": "初音ミクのポートレート。美麗な2Dアニメイラスト。白背景。", "model": "krea2_turbo_int8_convrot.safetensors", "sampler": ["euler", "simple"], "steps": 8, "guidance_scale": 1, "seed": 371644226245214}),
    "webp/comfyui-saveimage-plus.webp": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 453851843419278}),
    "webp/comfyui-save-image-extended.webp": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 602057552457611}),
    "webp/comfyui-animated-webp.webp": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 270932924124066}),
    "webp/comfyui-saveimagewithmetadata.webp": ("sd-webui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku,", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "model_hash": "45a21ea00a", "sampler": ["Euler a", None], "steps": 20, "guidance_scale": 5, "seed": 827555711811618}),
    "webp/comfyui-comfy-image-saver.webp": ("sd-webui", {"prompt": "unknown", "negative_prompt": "unknown", "width": 512, "height": 512, "model": "JANKUV5NSFWTrainedNoobai_v50", "model_hash": "217daae812", "sampler": ["euler_simple", None], "steps": 20, "guidance_scale": 8, "seed": 0}),
    "jpg/comfyui-saveimage-plus.jpg": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 577723948579568}),
    "jpg/comfyui-save-image-extended.jpeg": ("comfyui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, ", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 813617545434765}),
    "jpg/comfyui-saveimagewithmetadata.jpeg": ("sd-webui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku,", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "model_hash": "45a21ea00a", "sampler": ["euler_ancestral_karras", None], "steps": 20, "guidance_scale": 5, "seed": 347382230306562}),
    "jpg/comfyui-comfy-image-saver.jpeg": ("sd-webui", {"prompt": "unknown", "negative_prompt": "unknown", "width": 512, "height": 512, "model": "JANKUV5NSFWTrainedNoobai_v50", "model_hash": "217daae812", "sampler": ["euler_simple", None], "steps": 20, "guidance_scale": 8, "seed": 0}),
    "jpg/civitai-hires.jpg": ("civitai", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1536, "height": 1536, "model": "urn:air:sdxl:checkpoint:civitai:827184@2514310", "sampler": ["euler_ancestral", "normal"], "steps": 25, "guidance_scale": 5, "seed": 1311178179}),
    "jpg/civitai-upscale.jpg": ("civitai", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "Illustrious", "sampler": ["Euler a", None], "steps": 25, "guidance_scale": 5, "seed": 1311178179}),
    "png/huggingface-space-upscale.png": ("hf-space", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "WAI NSFW illustrious SDXL v16", "model_hash": "BDB59BAC77D94AE7A55FF893170F9554C3F349E48A1B73C0C17C0B7C6F4D41A2", "sampler": ["DPM++ 2M Karras", None], "steps": 20, "guidance_scale": 5.5, "seed": 1971450810}),
    "png/huggingface-space.png": ("hf-space", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "WAI NSFW illustrious SDXL v16", "model_hash": "BDB59BAC77D94AE7A55FF893170F9554C3F349E48A1B73C0C17C0B7C6F4D41A2", "sampler": ["DPM++ 2M Karras", None], "steps": 24, "guidance_scale": 5.5, "seed": 443800072}),
    "png/invokeai.png": ("invokeai", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "model_hash": "blake3:7c1631b481e1566448f49db7e3b67a8a9d04742fa3c7d4548a0c81b619160c56", "sampler": ["euler_a", None], "steps": 24, "guidance_scale": 6, "seed": 3951921344}),
    "png/invokeai-hires.png": ("invokeai", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, テスト\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \n", "width": 2048, "height": 2048, "model": "waiIllustriousSDXL_v160", "model_hash": "blake3:7c1631b481e1566448f49db7e3b67a8a9d04742fa3c7d4548a0c81b619160c56", "sampler": ["kdpm_2", None], "steps": 24, "guidance_scale": 2, "seed": 1731018819}),
    "png/novelai-curated.png": ("novelai", {"prompt": "1girl, solo, hatsune miku, #テスト, very aesthetic, masterpiece, no text, -0.8::feet::, rating:general", "negative_prompt": "blurry, lowres, upscaled, artistic error, scan artifacts, jpeg artifacts, logo, too many watermarks, negative space, blank page", "width": 1024, "height": 1024, "sampler": ["k_euler_ancestral", "karras"], "steps": 23, "guidance_scale": 5, "seed": 2156638429}),
    "png/novelai-full.png": ("novelai", {"prompt": "1girl, solo, hatsune miku, #テスト, very aesthetic, masterpiece, no text", "negative_prompt": "nsfw, lowres, artistic error, film grain, scan artifacts, worst quality, bad quality, jpeg artifacts, very displeasing, chromatic aberration, dithering, halftone, screentone, multiple views, logo, too many watermarks, negative space, blank page", "width": 832, "height": 1216, "sampler": ["k_euler_ancestral", "karras"], "steps": 28, "guidance_scale": 5, "seed": 2043807047}),
    "png/novelai-full-3char.png": ("novelai", {"prompt": "2girls, 1boy, dancing, #テスト\nwhite background, , very aesthetic, masterpiece, no text", "negative_prompt": "nsfw, lowres, artistic error, film grain, scan artifacts, worst quality, bad quality, jpeg artifacts, very displeasing, chromatic aberration, dithering, halftone, screentone, multiple views, logo, too many watermarks, negative space, blank page", "width": 1024, "height": 1024, "sampler": ["k_euler_ancestral", "karras"], "steps": 28, "guidance_scale": 5, "seed": 1702945580}),
    "webp/novelai-curated.webp": ("novelai", {"prompt": "1girl, solo, hatsune miku, #テスト, very aesthetic, masterpiece, no text, -0.8::feet::, rating:general", "negative_prompt": "blurry, lowres, upscaled, artistic error, scan artifacts, jpeg artifacts, logo, too many watermarks, negative space, blank page", "width": 1024, "height": 1024, "sampler": ["k_euler_ancestral", "karras"], "steps": 23, "guidance_scale": 5, "seed": 880673757}),
    "webp/novelai-full-3char.webp": ("novelai", {"prompt": "2girls, 1boy, dancing, #テスト\nwhite background, , very aesthetic, masterpiece, no text", "negative_prompt": "nsfw, lowres, artistic error, film grain, scan artifacts, worst quality, bad quality, jpeg artifacts, very displeasing, chromatic aberration, dithering, halftone, screentone, multiple views, logo, too many watermarks, negative space, blank page", "width": 1024, "height": 1024, "sampler": ["k_euler_ancestral", "karras"], "steps": 28, "guidance_scale": 5, "seed": 447042893}),
    "png/ruined-fooocus.png": ("ruined-fooocus", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor,", "width": 1024, "height": 1024, "model": "waiNSFWIllustrious_v150.safetensors", "model_hash": "BEFC694A296F75E996488EBF9F9DB8A1493BD059B6E704B975829E87D5AEB4FA", "sampler": ["dpmpp_2m_sde_gpu", "karras"], "steps": 30, "guidance_scale": 8, "seed": 2020047614}),
    "png/stability-matrix.png": ("stability-matrix", {"prompt": "general, masterpiece, best quality, amazing quality, \r\n1girl, solo, hatsune miku, #テスト\r\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \r\n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "model_hash": "A5F58EB1C33616C4F06BCA55AF39876A7B817913CD829CAA8ACB111B770C85CC", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 395309383}),
    "png/stability-matrix-hires.png": ("stability-matrix", {"prompt": "general, masterpiece, best quality, amazing quality, \r\n1girl, solo, hatsune miku, #テスト\r\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \r\n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "model_hash": "A5F58EB1C33616C4F06BCA55AF39876A7B817913CD829CAA8ACB111B770C85CC", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 2073041550}),
    "png/stability-matrix-upscale.png": ("stability-matrix", {"prompt": "general, masterpiece, best quality, amazing quality, \r\n1girl, solo, hatsune miku, #テスト\r\n", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, \r\n", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160.safetensors", "model_hash": "A5F58EB1C33616C4F06BCA55AF39876A7B817913CD829CAA8ACB111B770C85CC", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 5, "seed": 963022979}),
    "png/swarmui.png": ("swarmui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, ", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 7, "seed": 2083100758}),
    "png/swarmui-hires.png": ("swarmui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, ", "width": 768, "height": 768, "model": "waiIllustriousSDXL_v160", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 7, "seed": 733776228}),
    "png/swarmui-upscale.png": ("swarmui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, ", "width": 1536, "height": 1536, "model": "waiIllustriousSDXL_v160", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 7, "seed": 1741309074}),
    "jpg/swarmui.jpg": ("swarmui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, ", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 7, "seed": 697543491}),
    "webp/swarmui.webp": ("swarmui", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, ", "width": 1024, "height": 1024, "model": "waiIllustriousSDXL_v160", "sampler": ["euler_ancestral", "karras"], "steps": 20, "guidance_scale": 7, "seed": 830680752}),
    "png/tensorart.png": ("tensorart", {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト", "negative_prompt": "bad quality, worst quality, worst detail, sketch, censor, ", "width": 1024, "height": 1024, "model": "WAI-Nsfw-Illustrious-16", "model_hash": "A5F58EB1C33616C4F06BCA55AF39876A7B817913CD829CAA8ACB111B770C85CC", "sampler": ["euler_ancestral", "karras"], "steps": 25, "guidance_scale": 7, "seed": 3036459311}),
}  # fmt: skip

_DUCK = {"prompt": "photo of a duck", "negative_prompt": "monochrome", "width": 512, "height": 400,
         "model": "realistic_realisticVisionV20_v20", "model_hash": "c0d1994c73", "sampler": ["UniPC", None],
         "steps": 15, "guidance_scale": 5, "seed": 235284042}  # fmt: skip
_INVOKE2 = {
    "prompt": "professional full body photo of young woman, hyper long brunette hair, elegant hair, wearing a bikini "
    "top and asymmetric short skirt, curvy body, long legs, (imperfect skin), detailed skin, intense freckles, super "
    "long eye lashes, at night, outside, city background, 8k ultra detailed, realistic, high quality, film grain, low "
    "contrast", "negative_prompt": "rendering, glowing eyes, skinny", "sampler": ["k_lms", None], "steps": 50,
    "guidance_scale": 5, "seed": 2980747362, "width": 512, "height": 768,
}  # fmt: skip
_NAI_NEG = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, worst quality, "
    "low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry, lowres, bad anatomy, bad "
    "hands, text, error, missing fingers, extra digit, fewer digits, cropped, worst quality, low quality, normal "
    "quality, jpeg artifacts, signature, watermark, username, blurry"
)

# sd-parsers: file under tests/resources/parsers/ -> (tool, reference fields), from its tests
SD_PARSERS = {
    "AUTOMATIC1111/automatic1111_cropped.png": ("sd-webui", _DUCK),
    "AUTOMATIC1111/automatic1111_cropped.jpg": ("sd-webui", _DUCK),
    "AUTOMATIC1111/automatic1111_stealth.png": ("sd-webui", {
        "prompt": "a circle", "negative_prompt": "a square", "width": 64, "height": 64,
        "model": "realisticVisionV51_v51VAE", "model_hash": "15012c538f", "sampler": ["Euler", "Automatic"],
        "steps": 20, "guidance_scale": 7, "seed": 2015833630}),
    "ComfyUI/img2img_cropped.png": ("comfyui", {
        "prompt": "photograph of victorian woman with wings, sky clouds, meadow grass",
        "negative_prompt": "watermark, text", "model": "v1-5-pruned-emaonly.ckpt", "sampler": ["sample_dpmpp_2m", "normal"],
        "steps": 20, "guidance_scale": 8, "seed": 280823642470253}),
    "Fooocus/fooocus1_cropped.png": ("fooocus", {
        "prompt": "a smiling goldfish", "width": 768, "height": 1280, "model": "juggernautXL_v8Rundiffusion",
        "model_hash": "aeb7e9e689", "sampler": ["dpmpp_2m_sde_gpu", "karras"], "steps": 30, "guidance_scale": 4,
        "seed": 6952411511246973023}),
    "InvokeAI/invokeai_imeta1.png": ("invokeai", {
        "prompt": "digital artwork, oil painting. painterly brushstrokes, holidays,",
        "negative_prompt": "grainy+, photo, oversaturated, overexposed, blurry, compressed jpg+, noisy++, unfocused , "
        "black and white", "width": 1024, "height": 1024, "model": "juggernautXL", "sampler": ["euler", None],
        "steps": 35, "guidance_scale": 8, "seed": 3293022630}),
    "InvokeAI/invokeai_sdmeta1.png": ("invokeai", {
        **_INVOKE2, "model": "deliberateForInvoke_v08",
        "model_hash": "56d1442a0feefd64836a19ac8e3527ec71c884fc962e246ddf67b03e42921272"}),
    "InvokeAI/invokeai_dream1.png": ("invokeai", _INVOKE2),
    "NovelAI/novelai1_cropped.png": ("novelai", {
        "prompt": "masterpiece, best quality,  cat, space, icon", "negative_prompt": _NAI_NEG, "model": "Stable Diffusion",
        "model_hash": "1D44365E", "sampler": ["k_euler_ancestral", None], "steps": 50, "guidance_scale": 10,
        "seed": 2253955223}),
}  # fmt: skip

_LORA = re.compile(r"<lora:[^>]*>")


def _prompt(value: Any) -> str:
    text = _LORA.sub("", str(value)).replace("\r\n", "\n")
    return re.sub(r"[\s,]+$", "", re.sub(r"\s+", " ", text)).strip()


def _stem(value: Any) -> str:
    name = str(value).replace("\\", "/").rsplit("/", 1)[-1]
    for ext in (".safetensors", ".ckpt", ".pt", ".gguf", ".sft", ".bin"):
        name = name.removesuffix(ext)
    return name.lower()


def _hash(value: Any) -> str:
    return re.sub(r"^(0x|blake3:|sha256:)", "", str(value).strip().lower())


def _sampler(name: Any, schedule: Any) -> str:
    resolved = from_any(str(name), schedule if isinstance(schedule, str) else None)
    return resolved.sampler.lower()


def matches(field: str, expected: Any, params: dict[str, Any]) -> bool:
    """Whether our reading of `field` is the reference value (see the module's rules)."""
    if field == "sampler":
        got = params.get("sampler_as_written") or params.get("sampler")
        return got is not None and _sampler(params.get("sampler"), params.get("schedule")) == _sampler(*expected)
    got = params.get(field)
    if got is None or got == "":
        return False
    if field in ("prompt", "negative_prompt"):
        return _prompt(got) == _prompt(expected)
    if field == "model":
        return _stem(got) == _stem(expected)
    if field == "model_hash":
        mine, theirs = _hash(got), _hash(expected)
        return min(len(mine), len(theirs)) >= 8 and (mine.startswith(theirs) or theirs.startswith(mine))
    try:
        return float(got) == float(expected)
    except (TypeError, ValueError):
        return False


def _files(root: Path, under: str) -> dict[str, Path]:
    """{path under `under`: a readable file}: a checkout's files, or a bare git dir's blobs written out."""
    if (root / under).is_dir():
        return {str(p.relative_to(root / under)): p for p in (root / under).rglob("*") if p.is_file()}
    names = subprocess.run(["git", "--git-dir", str(root), "ls-tree", "-r", "--name-only", "HEAD", under],
                           check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    out_dir = Path(tempfile.gettempdir()) / "pnginfo-coverage" / root.name
    found = {}
    for name in names:
        rel = name.removeprefix(under).lstrip("/")
        target = out_dir / under / rel
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            blob = subprocess.run(["git", "--git-dir", str(root), "show", f"HEAD:{name}"], capture_output=True)
            if blob.returncode:  # a snapshot may list a large file without holding it
                continue
            target.write_bytes(blob.stdout)
        found[rel] = target
    return found


def _read(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(parameters, None), (None, "refused: ...") or (None, "CRASH: ...")."""
    try:
        return read_png_info(path)["parameters"], None
    except ValueError as exc:
        return None, f"refused: {exc}"[:200]
    except Exception as exc:  # a crash is what is measured
        return None, f"CRASH: {type(exc).__name__}: {exc}"[:200]


def measure(sets: list[tuple[dict[str, Path], dict[str, tuple[str, dict]]]]) -> dict[str, Any]:
    tools: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # read, total, files
    misses, crashes, files = [], [], 0
    for found, table in sets:
        for rel, path in sorted(found.items()):
            if path.suffix.lower() not in (".png", ".jpg", ".jpeg", ".webp"):
                continue
            files += 1
            params, problem = _read(path)
            if problem and problem.startswith("CRASH"):
                crashes.append(f"{rel}: {problem}")
            if rel not in table:
                continue
            tool, expected = table[rel]
            tools[tool][2] += 1
            for field, value in expected.items():
                ok = params is not None and matches(field, value, params)
                tools[tool][0] += ok
                tools[tool][1] += 1
                if not ok:
                    got = None if params is None else params.get(field)
                    misses.append(f"{rel} {field}: want {str(value)[:60]!r} got {str(got)[:60]!r}"
                                  + (f" ({problem})" if problem else ""))  # fmt: skip
    read, total = sum(t[0] for t in tools.values()), sum(t[1] for t in tools.values())
    return {"read": read, "total": total, "files": files, "reference_files": sum(t[2] for t in tools.values()),
            "tools": {k: {"read": v[0], "total": v[1], "files": v[2]} for k, v in sorted(tools.items())},
            "crashes": crashes, "misses": misses}  # fmt: skip


# What our writer writes, read back by A1111's own parser (tests/a1111_infotext.py: v1.10's
# parse_generation_parameters): plain, LoRAs with hashes, hires fix, text with commas, quotes, colons,
# line breaks and non-Latin letters, a 64-bit seed, every sampler family's schedule.
WRITER_CASES = [
    {"prompt": "a red circle", "negative_prompt": "", "steps": 20, "sampler": "Euler a", "guidance_scale": 7.0,
     "seed": 1, "width": 512, "height": 512, "model": "sd15"},
    {"prompt": 'a "red" circle,\non blue: (glossy:1.2), テスト', "negative_prompt": "green, dark\nblurry", "steps": 30,
     "sampler": "DPM++ 2M Karras", "guidance_scale": 4.5, "seed": 2**64 - 1, "width": 64, "height": 48,
     "model": "tiny: shapes, v1", "model_hash": "0123456789", "loras": {"outline": 0.8, "ink, v2": 1.0},
     "lora_hashes": {"outline": "89abcdef0123", "ink, v2": "0123456789ab"}, "clip_skip": 2},
    {"prompt": "a castle", "negative_prompt": "fog", "steps": 25, "sampler": "DPM++ 2M SDE", "guidance_scale": 5.0,
     "seed": 42, "width": 1024, "height": 768, "model": "sdxl", "strength": 0.45, "guidance_rescale": 0.7,
     "hires_scale": 1.5, "hires_steps": 10, "hires_upscaler": "Latent"},
    {"prompt": "flow", "negative_prompt": "", "steps": 4, "sampler": "Euler", "guidance_scale": 1.0, "seed": 0,
     "width": 1024, "height": 1024, "model": "flux1-schnell"},
]  # fmt: skip
_WRITTEN = {"Steps": "steps", "CFG scale": "guidance_scale", "Seed": "seed", "Model": "model", "Model hash": "model_hash",
            "Clip skip": "clip_skip", "Denoising strength": "strength", "CFG rescale": "guidance_rescale",
            "Hires upscale": "hires_scale", "Hires steps": "hires_steps", "Hires upscaler": "hires_upscaler"}  # fmt: skip


def writer_recovery() -> tuple[int, int, list[str]]:
    """(fields A1111 reads back as written, fields written, what it misread) over WRITER_CASES."""
    from pipelines.pnginfo.write import a1111_parameters
    from tests.a1111_infotext import get_sampler_and_scheduler, parse_generation_parameters

    read, total, misread = 0, 0, []
    for meta in WRITER_CASES:
        res = parse_generation_parameters(a1111_parameters(meta))
        lora_tags = "".join(f" <lora:{n}:{w:g}>" for n, w in (meta.get("loras") or {}).items())
        checks = {"Prompt": res.get("Prompt") == meta["prompt"] + lora_tags,
                  "Negative prompt": res.get("Negative prompt") == meta["negative_prompt"],
                  "Size": (res.get("Size-1"), res.get("Size-2")) == (str(meta["width"]), str(meta["height"])),
                  "Sampler": from_any(*get_sampler_and_scheduler(res.get("Sampler"), res.get("Schedule type"))).sampler
                  == meta["sampler"]}  # fmt: skip
        for key, field in _WRITTEN.items():
            if field in meta:
                got, want = res.get(key), meta[field]
                checks[key] = str(got) == str(want) or (_is_number(got) and float(got) == float(want))
        if meta.get("lora_hashes"):
            hashes = ", ".join(f"{n}: {h}" for n, h in meta["lora_hashes"].items())
            checks["Lora hashes"] = res.get("Lora hashes") == hashes
        read += sum(checks.values())
        total += len(checks)
        misread += [f"{meta['prompt'][:20]!r}: {key}" for key, ok in checks.items() if not ok]
    return read, total, misread


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sd-metadata", type=Path, required=True, help="enslo/sd-metadata (git dir or checkout)")
    parser.add_argument("--sd-parsers", type=Path, required=True, help="d3x-at/sd-parsers (git dir or checkout)")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--misses", action="store_true", help="list every field not read")
    args = parser.parse_args()
    sets = [(_files(args.sd_metadata, "samples"), SD_METADATA),
            (_files(args.sd_parsers, "tests/resources"), {f"parsers/{k}": v for k, v in SD_PARSERS.items()})]  # fmt: skip
    missing = [k for found, table in sets for k in table if k not in found]
    if missing:  # left out of the count, and said
        print(f"reference files not in the snapshots (not counted): {', '.join(missing)}")
    result = measure(sets)
    for tool, t in result["tools"].items():
        print(f"{tool:18} {t['read']:4}/{t['total']:<4} ({t['files']} files)")
    share = result["read"] / result["total"]
    print(f"fields read: {result['read']}/{result['total']} ({share:.1%}) from {result['reference_files']} reference "
          f"files; {result['files']} files read, {len(result['crashes'])} crashes")  # fmt: skip
    for line in result["crashes"] + (result["misses"] if args.misses else []):
        print("  " + line)
    written, total, misread = writer_recovery()
    result["writer"] = {"read": written, "total": total, "misread": misread}
    print(f"A1111's parser reads back {written}/{total} ({written / total:.1%}) of the fields our writer writes"
          + (f"; misread: {', '.join(misread)}" if misread else ""))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
