"""visiontf.tasks.segmentation.segmentation_task."""
