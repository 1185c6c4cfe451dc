"""visiontf.tasks.detection.detection_task."""
