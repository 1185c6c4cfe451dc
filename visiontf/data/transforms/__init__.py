"""The augmentation pipelines (DETR's and mmsegmentation's, in albumentations) and MATLAB's bicubic resize."""
