"""IPT (huawei-noah/Pretrained-IPT): the model, its weights' conversion, tiled inference."""
