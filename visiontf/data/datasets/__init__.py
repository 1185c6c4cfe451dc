"""The torch Datasets behind the data modules: COCO detection, COCO panoptic, restoration, segmentation."""
