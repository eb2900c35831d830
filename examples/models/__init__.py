"""Single-device reference models: GPT, Llama-style decoder, MLP, ResNet-style conv net."""
