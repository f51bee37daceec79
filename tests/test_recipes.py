"""Model recipes: schema, every shipped recipe, and the whole mechanism offline (custom pipeline
file + extra components + defaults + LoRA) on a tiny HiDream-style model."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.sampling.samplers import BY_NAME
from pipelines.weights import recipes
from tests import families

# A custom pipeline file, as HiDream-E1 ships one: an editing pipeline on HiDream's components.
CUSTOM_PIPELINE = '''
from diffusers import HiDreamImagePipeline


class TinyHiDreamEditingPipeline(HiDreamImagePipeline):
    """Takes an image and an image guidance, as HiDream-E1's editing pipeline does."""

    calls = []

    def __call__(self, prompt=None, image=None, image_guidance_scale=1.0, callback_on_step_end=None, **kwargs):
        type(self).calls.append({"image": image, "image_guidance_scale": image_guidance_scale, "prompt": prompt})
        return super().__call__(prompt=prompt, callback_on_step_end=callback_on_step_end, **kwargs)
'''


@pytest.mark.parametrize("path", sorted(recipes.RECIPES_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_recipe_validates(path):
    recipe = recipes.load(path)
    assert recipe.name == path.stem
    assert recipe.defaults.get("sampler") in (None, *BY_NAME)
    if recipe.custom_pipeline:
        assert recipe.custom_pipeline.startswith("custom/")  # docs/models.md: the folder for trusted code


def test_the_shipped_recipes_cover_the_models_users_ask_for():
    names = set(recipes.available())
    assert {"hidream-e1.1", "hidream-e1-full", "hidream-i1-full", "flux.1-dev", "flux.1-schnell",
            "flux.1-kontext-dev", "sd3.5-large", "sdxl-base", "qwen-image", "qwen-image-edit",
            "tiny-shapes"} <= names  # fmt: skip


GOOD = {"name": "x", "source": "some/model"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"source": None}, "source: required"),
        ({"colour": "red"}, "unknown field(s) colour"),
        ({"dtype": "float8"}, "dtype: 'float8'"),
        ({"task": "audio"}, "task: 'audio'"),
        ({"pipeline_class": "FluxPipeline", "custom_pipeline": "x.py"}, "give one, not both"),
        ({"components": {"text_encoder_4": {"source": "a"}}}, "components.text_encoder_4.class: required"),
        ({"components": {"te": {"source": "a", "class": "os.system"}}}, "components.te.class"),
        ({"defaults": {"steps": "many"}}, "defaults.steps: expected int"),
        ({"defaults": {"cfg": 3}}, "defaults.cfg: unknown"),
        ({"defaults": {"guidance_end": 1.5}}, "defaults.guidance_end: 1.5 is out of range"),
        ({"loras": [{"path": "style.ckpt"}]}, "loras[0].path: a .safetensors file"),
    ],
)
def test_bad_recipes_name_the_field(change, field):
    with pytest.raises(recipes.RecipeError) as err:
        recipes.parse({**GOOD, **change}, "bad.json")
    assert field in str(err.value) and "bad.json" in str(err.value)


def test_model_id_takes_a_recipe_name():
    pipe = ImagePipeline.from_pretrained("tiny-shapes", device_manager=DeviceManager("cpu"), memory_mode="off")
    assert pipe.model_name == "tiny-shapes" and pipe.recipe is not None
    assert pipe.model_info().default_steps == 20
    assert len(pipe.generate(GenerationRequest(prompt="a red circle on a blue background", steps=2, seed=1)).images) == 1


@pytest.fixture(scope="module")
def hidream_recipe(tmp_path_factory):
    """A HiDream-style model without its Llama (loaded from its own folder), a custom pipeline file,
    a LoRA and defaults, all in one recipe folder."""
    from diffusers import DiffusionPipeline
    from peft import LoraConfig, get_peft_model_state_dict

    root = tmp_path_factory.mktemp("recipe")
    model = families.build("hidream-i1", root / "hidream")
    full = DiffusionPipeline.from_pretrained(model)
    llama = root / "llama"
    full.text_encoder_4.save_pretrained(llama)
    full.tokenizer_4.save_pretrained(llama)
    torch.manual_seed(0)
    full.transformer.add_adapter(
        LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False), "tmp"
    )
    layers = get_peft_model_state_dict(full.transformer, adapter_name="tmp")
    type(full).save_lora_weights(root, transformer_lora_layers=layers, weight_name="detail.safetensors")
    index = json.loads((model / "model_index.json").read_text())
    index["text_encoder_4"] = index["tokenizer_4"] = [None, None]  # the base repo lacks the Llama
    (model / "model_index.json").write_text(json.dumps(index))
    (root / "custom").mkdir()
    (root / "custom" / "editing.py").write_text(CUSTOM_PIPELINE)
    recipe = {
        "name": "tiny-hidream-e1", "source": "hidream", "custom_pipeline": "custom/editing.py",
        "components": {
            "tokenizer_4": {"source": "llama", "class": "transformers.PreTrainedTokenizerFast"},
            "text_encoder_4": {"source": "llama", "class": "transformers.LlamaForCausalLM",
                               "kwargs": {"output_hidden_states": True}},
        },
        "dtype": "bfloat16", "task": "edit", "loras": [{"path": "detail.safetensors", "scale": 0.8}],
        "defaults": {"steps": 3, "guidance": 5.0, "image_guidance": 4.0, "guidance_end": 0.5}, "notes": "Describe the change.",
    }  # fmt: skip
    path = root / "tiny-hidream-e1.json"
    path.write_text(json.dumps(recipe))
    return path


@pytest.mark.slow  # 103 s on 2 shared cores
def test_recipe_end_to_end_custom_pipeline_extra_components_defaults_lora(hidream_recipe):
    pipe = ImagePipeline.from_pretrained(str(hidream_recipe), device_manager=DeviceManager("cpu"), memory_mode="off")
    raw = pipe.diffusers_pipeline
    assert type(raw).__name__ == "TinyHiDreamEditingPipeline"
    assert type(raw.text_encoder_4).__name__ == "LlamaForCausalLM" and raw.text_encoder_4.dtype == torch.float32
    info = pipe.model_info()
    assert (info.model_name, info.default_steps, info.default_guidance) == ("tiny-hidream-e1", 3, 5.0)
    assert (info.default_image_guidance, info.notes, info.text_to_image, info.edit) == (4.0, "Describe the change.", False, True)
    assert info.default_guidance_end == 1.0 and not info.guidance_end  # the recipe's 0.5 cannot apply here
    with pytest.raises(ValueError, match="needs an input image"):
        pipe.generate(GenerationRequest(prompt="a cat", steps=1, seed=1))
    request = GenerationRequest(
        prompt="make it red", steps=info.default_steps, seed=3, image_guidance_scale=info.default_image_guidance,
        init_images=[Image.new("RGB", (48, 48), "blue")],
    )
    result = pipe.generate(request)
    assert len(result.images) == 1 and result.metadata[0]["model"] == "tiny-hidream-e1"
    assert "guidance_end" not in result.metadata[0] and not any("guidance end" in w for w in result.warnings)
    call = type(raw).calls[-1]
    assert call["image_guidance_scale"] == 4.0 and len(call["image"]) == 1 and call["prompt"] == ["make it red"]
    assert raw.get_active_adapters() == ["detail"]  # the recipe's LoRA stays on
    assert pipe.base_loras == {"detail": 0.8}


def test_a_recipe_lora_with_fuse_is_merged_into_the_weights_at_its_scale(hidream_recipe):
    """Compared on the weights: the random tiny model's images are too chaotic to tell a fused LoRA
    from an active one (float rounding of W'x vs Wx + BAx moves every pixel)."""
    recipe = {**json.loads(hidream_recipe.read_text()), "dtype": "float32"}
    transformers = {}
    for name, loras in (("base", []), ("fused", [{**recipe["loras"][0], "fuse": True}]), ("active", recipe["loras"])):
        path = hidream_recipe.with_name(f"tiny-hidream-{name}.json")
        path.write_text(json.dumps({**recipe, "loras": loras}))
        pipe = ImagePipeline.from_pretrained(str(path), device_manager=DeviceManager("cpu"), memory_mode="off")
        if name == "fused":
            assert pipe.base_loras == {} and not pipe.diffusers_pipeline.get_active_adapters()  # nothing to switch off
        transformers[name] = dict(pipe.diffusers_pipeline.transformer.named_modules())
    layers = [(n, m) for n, m in transformers["active"].items() if "detail" in getattr(m, "lora_A", {})]
    assert layers
    for name, layer in layers:
        delta = (layer.lora_B["detail"].weight @ layer.lora_A["detail"].weight) * layer.scaling["detail"]
        merged = transformers["fused"][name].weight - transformers["base"][name].weight
        assert torch.allclose(merged, 0.8 * delta, atol=1e-6), name  # the recipe's scale, 0.8
        assert delta.abs().max() > 1e-2  # the LoRA is not a no-op
