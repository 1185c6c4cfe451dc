"""DETR (facebookresearch/detr): the model, its weights' conversion, the mask head and the panoptic models."""
