"""Where the weights come from and what is done to them: loading, recipes, the catalog, LoRA,
hashes, quantization, the OpenVINO runtime and the tiny autoencoder.

Owns: finding and loading a diffusers pipeline (`loading`), model recipes (`recipes`), the models a
server offers (`catalog`), LoRA adapters (`lora`), A1111's model and LoRA hashes (`hashing`),
quantized checkpoints (`quantization`), the networks as OpenVINO graphs (`openvino`), TINY_VAE's tiny
autoencoder in place of the model's VAE (`tiny_vae`).

May import: schema, sampling, devices.
"""
