"""Backbones behind one interface (backbone.Backbone, build_backbone): torchvision ResNets, timm features_only
models, visiontf's ViTs, ViTDet's simple feature pyramid, IDEA-Research/DINO's Swin."""
