"""VQGAN (taming-transformers): the tokenizer, its blocks, quantizer and discriminator, and the GPT over its codes."""
