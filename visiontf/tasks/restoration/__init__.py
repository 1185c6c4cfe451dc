"""visiontf.tasks.restoration.restoration_task."""
