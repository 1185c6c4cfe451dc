"""visiontf.tasks.classification.classification_task."""
