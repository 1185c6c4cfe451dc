"""Dataset files on disk: COCO annotations and masks, detection layouts and YOLO labels, image ids,
restoration and segmentation layouts, segmentation label tables."""
