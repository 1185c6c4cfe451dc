"""visiontf.tasks.depth.depth_task."""
