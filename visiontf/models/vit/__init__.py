"""ViT and DeiT (timm's layout and API) and the depth-estimation example built on them."""
